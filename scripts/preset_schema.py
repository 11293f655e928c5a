"""Write the generated `$defs` of workflow/schemas/preset.schema.yaml (the `rl` sections from
rspo/config.py's dataclasses, the `eval` sections from rspo/eval_config.py's, the `countdown`
generator's from rspo.data.countdown.CountdownConfig: their types, constraints and docstrings,
rspo.constraints). Run it after changing a setting; tests/test_presets.py runs it with --check and
fails while the file differs from what this writes.

    python scripts/preset_schema.py           # rewrite the generated block
    python scripts/preset_schema.py --check   # exit 1 if it is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rspo.config import rl_schema
from rspo.constraints import section_schema, with_generated_block
from rspo.data.countdown import CountdownConfig
from rspo.eval_config import eval_schema

SCHEMA = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "preset.schema.yaml"


def generated_defs() -> dict[str, dict[str, Any]]:
    """The ``$defs`` of the schema file that are generated from the dataclasses."""
    countdown = {
        "description": "Countdown generator (rspo.data.countdown.CountdownConfig).",
        **section_schema(CountdownConfig),
    }
    return {"rl": rl_schema(), "eval": eval_schema(), "countdown": countdown}


def main(argv: list[str]) -> int:
    text = SCHEMA.read_text(encoding="utf-8")
    new = with_generated_block(text, generated_defs())
    if "--check" in argv:
        if new != text:
            print(f"{SCHEMA} is out of date: run python scripts/preset_schema.py", file=sys.stderr)
            return 1
        return 0
    SCHEMA.write_text(new, encoding="utf-8")
    print(f"wrote {SCHEMA}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
