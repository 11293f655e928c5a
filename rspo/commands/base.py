"""`python -m rspo base install|check|pin`: the committed base model a preset pins (rspo.base_pin).

python -m rspo base install --preset configs/small.yaml --out results/small/models/base
python -m rspo base check --preset configs/small.yaml --model results/small/models/base
python -m rspo base pin --preset configs/small.yaml --from results/small/models/base
"""

from __future__ import annotations

import argparse
import json
import sys

from rspo import base_pin
from rspo.method import ConfigError
from rspo.preset import Preset


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="rspo base", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="action", required=True)
    inst = sub.add_parser("install", help="copy the pinned base into a folder (digest checked; marker last)")
    inst.add_argument("--preset", required=True, help="the preset file that pins its base (base_model:)")
    inst.add_argument("--out", required=True, help="the folder to fill (the workflow's results/<preset>/models/base)")
    chk = sub.add_parser("check", help="exit 2 unless a folder's weights are the pinned ones")
    chk.add_argument("--preset", required=True, help="the preset file that pins its base (base_model:)")
    chk.add_argument("--model", required=True, help="the base model folder to check")
    pn = sub.add_parser("pin", help="make a pretrained folder the preset's base (copies it, rewrites sha256)")
    pn.add_argument("--preset", required=True, help="the preset file whose base_model.sha256 line is rewritten")
    pn.add_argument("--from", dest="source", required=True, help="a finished `rspo pretrain` output folder")
    args = ap.parse_args(argv)
    try:
        if args.action == "install":
            preset = Preset.load(args.preset)
            out = base_pin.install(preset, args.out)  # its digest checked against the pin's
            print(json.dumps({"installed": str(out), "sha256": preset.base_pin.sha256}))
        elif args.action == "check":
            preset = Preset.load(args.preset)
            base_pin.check(preset, args.model)
            pinned = preset.base_pin.sha256 if preset.base_pin else base_pin.weights_sha256(args.model)
            print(json.dumps({"model": args.model, "sha256": pinned, "pinned": preset.base_pin is not None}))
        else:
            new = base_pin.pin(args.preset, args.source)
            print(json.dumps({"pinned": str(base_pin.pinned_dir(Preset.load(args.preset))), "sha256": new}))
    except (ConfigError, FileNotFoundError) as e:
        print(f"rspo base: {e}", file=sys.stderr)
        return 2
    return 0
