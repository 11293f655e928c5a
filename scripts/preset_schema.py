"""Write workflow/schemas/preset.schema.yaml, whole, from the dataclasses of the preset's sections
(rspo.study_config.preset_schema: the study-level sections of rspo/study_config.py, the `rl`
sections of rspo/config.py, the `eval` sections of rspo/eval_config.py, the pretraining's of
rspo/pretrain_config.py, the Countdown generator's; their types, constraints and docstrings,
rspo.constraints). Run it after changing a setting; tests/test_presets.py runs it with --check and
fails while the file differs from what this writes.

    python scripts/preset_schema.py           # rewrite the file
    python scripts/preset_schema.py --check   # exit 1 if it is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path

from rspo.constraints import schema_file_text
from rspo.data.countdown import CountdownConfig
from rspo.study_config import preset_schema

SCHEMA = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "preset.schema.yaml"


def main(argv: list[str]) -> int:
    new = schema_file_text(preset_schema(CountdownConfig))
    if "--check" in argv:
        if not SCHEMA.is_file() or SCHEMA.read_text(encoding="utf-8") != new:
            print(f"{SCHEMA} is out of date: run python scripts/preset_schema.py", file=sys.stderr)
            return 1
        return 0
    SCHEMA.write_text(new, encoding="utf-8")
    print(f"wrote {SCHEMA}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
