"""`python -m rspo archive pack|unpack|verify|merge|relabel`: a preset's run files as a compact,
checksummed archive (of a selection of seeds: a piece of the study), such an archive checked and
unpacked into results/<preset> (`rspo.archive`), the pieces of a study merged into one archive, or an
archive given the preset of its study as its regime search grew (`rspo.archive_pieces`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rspo.archive import ArchiveError, pack, unpack, verify
from rspo.archive_pieces import merge, relabel
from rspo.commands import preset_path
from rspo.config import ConfigError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="rspo archive", description="A preset's run files as a compact, checksummed archive."
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="write DIR/archive.json and DIR/runs.tar.xz from results/<preset>")
    p.add_argument("--preset", required=True, help="configs/<p>.yaml or a preset name")
    p.add_argument("--out", required=True, help="archive folder")
    p.add_argument("--results", default="", help="results folder (default: results/<preset>)")
    p.add_argument("--full", action="store_true", help="the whole grid (presets with default_families)")
    p.add_argument("--families", nargs="+", help="these grid families instead of the preset's default_families")
    p.add_argument("--trials", default="", help="also ship this trials.jsonl")
    p.add_argument(
        "--seeds", nargs="+", type=int, default=None, help="pack these seeds only: a piece of the study (see merge)"
    )
    u = sub.add_parser("unpack", help="check an archive and write its files into results/<preset>")
    u.add_argument("archive", help="archive folder (holding archive.json)")
    u.add_argument("--preset", required=True, help="configs/<p>.yaml or a preset name")
    u.add_argument("--into", default="", help="results folder (default: results/<preset>)")
    mg = sub.add_parser("merge", help="one archive from the archives of a study's pieces (pack --seeds)")
    mg.add_argument("pieces", nargs="+", help="archive folders of the pieces")
    mg.add_argument("--out", required=True, help="the merged archive's folder")
    r = sub.add_parser(
        "relabel", help="give an archive a later version of its preset (the regime search grew): same runs"
    )
    r.add_argument("archive", help="archive folder (holding archive.json and its preset copy)")
    r.add_argument("--preset", required=True, help="the preset file it is relabelled with (configs/<p>.yaml)")
    v = sub.add_parser("verify", help="check an archive against the preset without writing anything")
    v.add_argument("archive")
    v.add_argument("--preset", required=True, help="configs/<p>.yaml or a preset name")
    args = ap.parse_args(argv)
    if args.cmd == "relabel":
        try:
            m = relabel(args.archive, preset_path(args.preset))
        except (ArchiveError, ConfigError, OSError) as e:
            print(f"rspo archive: {e}", file=sys.stderr)
            return 2
        print(
            json.dumps(
                {
                    "archive": args.archive,
                    "preset_digest": m["preset_digest"],
                    "relabelled": len(m.get("relabelled", [])),
                }
            )
        )
        return 0
    if args.cmd == "merge":
        try:
            m = merge(args.pieces, args.out)
        except (ArchiveError, OSError) as e:
            print(f"rspo archive: {e}", file=sys.stderr)
            return 2
        print(
            json.dumps({"archive": args.out, "pieces": len(args.pieces), "runs": len(m["runs"]), "seeds": m["seeds"]})
        )
        return 0
    from rspo.plan import Plan
    from rspo.tracking import REPO_ROOT

    try:
        plan = Plan.from_file(
            preset_path(args.preset),
            getattr(args, "seeds", None),
            full=getattr(args, "full", False),
            families=getattr(args, "families", None),
        )
        results = REPO_ROOT / "results" / plan.name
        if args.cmd == "pack":
            m = pack(
                plan,
                Path(args.results) if args.results else results,
                args.out,
                args.trials or None,
                preset_file=preset_path(args.preset),
            )
            size = m["bundle"]["bytes"]
            print(json.dumps({"archive": args.out, "runs": len(m["runs"]), "files": len(m["members"]), "bytes": size}))
        elif args.cmd == "unpack":
            m = unpack(args.archive, plan.preset, Path(args.into) if args.into else results)
            print(json.dumps({"unpacked": len(m["members"]), "into": str(Path(args.into) if args.into else results)}))
        else:
            m = verify(args.archive, plan.preset)
            print(json.dumps({"archive": args.archive, "ok": True, "runs": len(m["runs"])}))
    except (ArchiveError, ConfigError, OSError) as e:
        print(f"rspo archive: {e}", file=sys.stderr)
        return 2
    return 0
