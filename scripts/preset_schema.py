"""Write the `rl` sections of workflow/schemas/preset.schema.yaml from rspo/config.py's dataclasses
(their types, constraints and docstrings: rspo.constraints). Run it after changing a setting;
tests/test_presets.py fails while the file differs from what this writes.

    python scripts/preset_schema.py           # rewrite the generated block
    python scripts/preset_schema.py --check   # exit 1 if it is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path

from rspo.config import rl_schema
from rspo.constraints import with_generated_block

SCHEMA = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "preset.schema.yaml"


def main(argv: list[str]) -> int:
    text = SCHEMA.read_text(encoding="utf-8")
    new = with_generated_block(text, "rl", rl_schema())
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
