"""The result tables of the README and of docs/*.md are copies of the committed table files, never
typed by hand.

A block in README.md or a docs/*.md page between

    <!-- table: docs/results/small/tables/table_countdown.md -->
    ...
    <!-- end table -->

holds exactly that file's content. `python scripts/readme_tables.py` rewrites every block from its
file; `--check` only says which blocks differ (exit 1), as tests/test_readme.py does.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- table: (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- end table -->)", re.S)


def blocks(text: str) -> list[tuple[str, str]]:
    """(file path, the block's current content) of every table block."""
    return [(m.group("path"), m.group("body")) for m in BLOCK.finditer(text)]


def refreshed(text: str, root: Path = ROOT) -> str:
    def fill(m: re.Match) -> str:
        path = root / m.group("path")
        if not path.is_file():
            raise FileNotFoundError(f"README table block names {m.group('path')}, which does not exist")
        body = path.read_text()
        return m.group(1) + body + ("" if body.endswith("\n") else "\n") + m.group(4)

    return BLOCK.sub(fill, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a block differs from its file")
    args = ap.parse_args(argv)
    stale_any = False
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        new = refreshed(text)
        rel = page.relative_to(ROOT)
        if args.check:
            stale = [p for (p, a), (_, b) in zip(blocks(text), blocks(new)) if a != b]
            for p in stale:
                print(f"{rel}: the table block of {p} differs from the file", file=sys.stderr)
            stale_any |= bool(stale)
            continue
        if new != text:
            page.write_text(new)
        if blocks(new):
            print(f"{rel}: {len(blocks(new))} table blocks from their files")
    return 1 if stale_any else 0


if __name__ == "__main__":
    raise SystemExit(main())
