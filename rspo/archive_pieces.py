"""`python -m rspo archive merge|relabel`: the archives of a study run in pieces, merged into one; an
archive relabelled with the preset of a study whose regime search grew (rspo.archive holds the format,
``pack``, ``unpack`` and ``verify``).

A study too long for one machine runs in pieces split by seed (both arms of a paired difference run
on the same machine): each piece is packed with ``--seeds``; its manifest records the seeds, the
commit and the base model's weights (``bases``: sha256 of each base pretrained here, where the
weights are in the results). ``merge`` builds one archive from pieces and refuses pieces of
different studies (preset name, digest, grid selection), from different bases, a run present in two
pieces, or two versions of one shared file. A study may grow by a family after its pieces were packed:
the new family's piece (``pack --families``, under a preset that differs only in ``default_families``
and the regime search's sweep files, ``GROWS``, and in what no report job reads) comes last, may hold
the paired arm's runs with the same bytes, and the merged archive is of its preset.

``relabel`` gives an archive the preset of its study as that grew without new runs (a later round of
the regime search named in ``regime_trials:``, the committed base moved within the repository): the
bundle and its members stay as they are (checked first), the preset copy and the manifest's digest
become the new preset's, and the manifest lists each relabelling (from and to which digest, the
sections that changed, when, at which commit). A preset that differs in anything a report reads
beyond ``GROWS`` is refused: that study needs its runs packed again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rspo.archive import (
    BUNDLE,
    MANIFEST,
    ArchiveError,
    own_preset,
    read_manifest,
    sha256_of,
    stream_members,
    tar_bundle,
)
from rspo.preset import Preset

REMEASURED = ("bench.json", "eval/base/")
"""Members every piece of a study measures again (timings, the base model's evaluation and its wall
time), so two pieces' versions differ even on one machine: a merge keeps the first piece's."""


def _same_run(run: str, a: dict[str, str], b: dict[str, str]) -> bool:
    """Whether two pieces' manifests (path -> sha256) hold run ``run`` with the same files and bytes."""
    mine = lambda files: {p: h for p, h in files.items() if p.startswith((f"runs/{run}/", f"eval/{run}/"))}  # noqa: E731
    return mine(a) == mine(b)


GROWS = ("default_families", "regime_trials")
"""What a study may add between its pieces: a family of runs, and the later rounds of its regime search
(the sweep files whose records the claims table reads). Never its primary family, fixed before its
first run."""


def _differ(mine: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """The preset sections in which two presets of one study differ, less those no report job reads
    (rspo.plan.NOT_READ: resources, threads, MLflow, where the committed base sits: the bases
    themselves are compared by their weights' sha256)."""
    from rspo.plan import NOT_READ

    return sorted(k for k in set(mine) | set(theirs) if k not in NOT_READ["report"] and mine.get(k) != theirs.get(k))


def _check_growth(manifests: list[tuple[Path, dict[str, Any]]]) -> None:
    """Pieces of a study that grew after its first pieces were packed: each piece's preset (its copy
    beside the bundle) is the last piece's but for ``GROWS`` and the sections no report job reads
    (rspo.plan.NOT_READ: resources, threads, MLflow, where the committed base sits; the bases
    themselves are compared by their weights' sha256), and the last
    piece's preset selects every family any piece ran (its default selection, or the ``--families``
    it was packed with). Raises ArchiveError naming what differs."""
    from rspo.plan import preset_digest

    last_path, last = manifests[-1]
    presets = {}
    for path, m in manifests:
        kept = own_preset(path, m["preset"])
        if kept is None:
            raise ArchiveError(f"{path}: a piece of another preset version has no copy of its preset to compare")
        presets[path] = Preset.load(kept).data
        if preset_digest(presets[path], "report") != m["preset_digest"]:
            raise ArchiveError(
                f"{path} and {last_path} are pieces of different studies: preset_digest {m['preset_digest']!r} "
                f"is not that of the piece's own preset copy {kept}"
            )
    final = presets[last_path]
    selected = set(final.get("default_families") or [])
    for path, m in manifests:
        mine = presets[path]
        differ = [k for k in _differ(mine, final) if k not in GROWS]
        if differ:
            raise ArchiveError(
                f"{path} and {last_path} are pieces of different studies: their presets differ in "
                f"{', '.join(differ)} (pieces may differ only in {' and '.join(GROWS)}: a study that grew)"
            )
        ran = set(m.get("families") or presets[path].get("default_families") or [])
        if not ran <= selected:
            raise ArchiveError(
                f"{path} ran families {sorted(ran - selected)} that the last piece's preset ({last_path}) "
                f"does not select (default_families {sorted(selected)}): the newest preset comes last"
            )


def merge(pieces: list[str | Path], out: str | Path) -> dict[str, Any]:
    """One archive in ``out`` from archives of pieces of one study (``pack`` with a seed selection),
    each checked whole first: refused when the pieces come from other presets or other versions of
    one (name, digest, grid selection), from other base models (``bases``: the weights' sha256), when
    a run is in two pieces, or when two pieces hold different bytes under one path, except the files
    every piece measures anew (``REMEASURED``: the benchmark's timings, the base model's evaluation with
    its wall time): of those the first piece's is kept and the others' sha256 are listed under
    ``shared`` (the pieces' own archives keep them). The merged manifest lists each piece (seeds,
    commit, when packed); the preset copy of the first piece is kept.

    A study may grow by a family after its first pieces were packed (the stop-gradient arm beside the
    shipped plug-in runs): a piece packed with ``--families`` under a preset that differs from the
    earlier pieces' only in ``GROWS`` and what no report reads comes last (``_check_growth``), and may hold runs of
    earlier pieces with the same bytes (the paired arm it was trained beside, copied from the shipped
    archive); the merged archive is of the last piece's preset, its default selection."""
    import shutil
    import tempfile

    from rspo.tracking import utc_now

    if len(pieces) < 2:
        raise ArchiveError("merge needs two pieces or more")
    manifests = [(Path(p), read_manifest(p)) for p in pieces]
    first_path, first = manifests[0]
    last_path, last = manifests[-1]
    grown = any(m.get(k) != last.get(k) for _, m in manifests for k in ("preset_digest", "families"))
    for path, m in manifests[1:]:
        for key in ("preset", "full") if grown else ("preset", "preset_digest", "full", "families"):
            if m.get(key) != first.get(key):
                raise ArchiveError(
                    f"{path} and {first_path} are pieces of different studies: "
                    f"{key} {m.get(key)!r} vs {first.get(key)!r}"
                )
    if grown:
        _check_growth(manifests)
    for path, m in manifests[1:]:
        bases = m.get("bases") or {}
        for base, digest in (first.get("bases") or {}).items():
            if base in bases and bases[base] != digest:
                raise ArchiveError(
                    f"{path} and {first_path} started from different base models ({base}: weights sha256 "
                    f"{bases[base][:12]} vs {digest[:12]}): their paired runs are not one study"
                )
    owner: dict[str, Path] = {}
    files = {path: {e["path"]: e["sha256"] for e in m["members"]} for path, m in manifests}
    for path, m in manifests:
        for run in m["runs"]:
            if run in owner and not (grown and _same_run(run, files[owner[run]], files[path])):
                raise ArchiveError(f"run {run} is in two pieces: {owner[run]} and {path}")
            owner.setdefault(run, path)
    entries: dict[str, dict[str, Any]] = {}
    source: dict[str, Path] = {}  # member -> the piece whose bytes the merged archive keeps
    shared: dict[str, dict[str, Any]] = {}  # measured anew by several pieces: the versions not kept
    for path, m in manifests:
        for e in m["members"]:
            seen = entries.get(e["path"])
            if seen is None:
                entries[e["path"]], source[e["path"]] = e, path
            elif seen["sha256"] != e["sha256"]:
                if not e["path"].startswith(REMEASURED):
                    raise ArchiveError(
                        f"the pieces hold different versions of {e['path']} ({path} and {source[e['path']]})"
                    )
                record = shared.setdefault(e["path"], {"kept": str(source[e["path"]]), "others": []})
                record["others"].append({"piece": str(path), "sha256": e["sha256"]})
    datasets: dict[str, Any] = {}
    for path, m in manifests:
        for rel, ds in (m.get("datasets") or {}).items():
            if rel in datasets and datasets[rel].get("sha256") != ds.get("sha256"):
                raise ArchiveError(f"the pieces used different data files {rel} ({path} and another piece)")
            datasets[rel] = ds
    with tempfile.TemporaryDirectory(prefix="rspo-merge-") as staging:
        staging = Path(staging)
        handles: dict[str, Any] = {}

        def sink(rel: str, chunk: bytes) -> None:
            if rel not in handles:
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                handles[rel] = (staging / rel).open("wb")
            handles[rel].write(chunk)

        try:
            for path, m in manifests:  # every member checked against its piece's manifest
                stream_members(path, m, lambda rel, chunk, path=path: sink(rel, chunk) if source[rel] == path else None)
                for f in handles.values():
                    f.close()
                handles.clear()
        finally:
            for f in handles.values():
                f.close()
        for rel in entries:
            (staging / rel).touch()  # an empty member has no chunk
        bundle, merged = tar_bundle(
            {rel: staging / rel for rel in entries}, {rel: e["mtime"] for rel, e in entries.items()}
        )
    header = last if grown else first
    manifest = {
        **{k: header[k] for k in ("format", "version", "preset", "preset_digest", "full")},
        "families": None if grown else first["families"],
        "seeds": sorted({s for _, m in manifests for s in m.get("seeds", [])}),
        "git_commit": sorted({m.get("git_commit") for _, m in manifests if m.get("git_commit")}),
        "packed": utc_now(),
        "pieces": [
            {"seeds": m.get("seeds"), "git_commit": m.get("git_commit"), "packed": m.get("packed"), "from": str(path)}
            for path, m in manifests
        ],
        "runs": sorted(owner),
        "evals": sorted({ev for _, m in manifests for ev in m.get("evals", [])}),
        "bundle": {"file": BUNDLE, "bytes": len(bundle), "sha256": sha256_of(bundle)},
        "members": merged,
        "datasets": datasets,
        "bases": {k: v for _, m in manifests for k, v in (m.get("bases") or {}).items()},
        **({"shared": shared} if shared else {}),
    }
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    kept = own_preset(last_path if grown else first_path, first["preset"])
    if kept is not None:
        shutil.copyfile(kept, out / kept.name)
    (out / BUNDLE).write_bytes(bundle)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


RELABELS = ("regime_trials",)
"""What ``relabel`` may change in an archive's preset: the regime search's sweep files (a later round,
or its records moved), beside what no report job reads. A new family needs its runs: a piece, merged."""


def relabel(archive: str | Path, preset_file: str | Path) -> dict[str, Any]:
    """Give the archive in ``archive`` the preset in ``preset_file``, a later version of the one it was
    packed from that differs only in ``RELABELS`` and what no report job reads: the bundle is checked
    whole and left as it is; the preset copy beside it becomes ``preset_file``'s text, the manifest's
    ``preset_digest`` the new preset's, and ``relabelled`` lists each relabelling (from and to which
    digest, the sections that changed, when, at which commit). -> the new manifest (unchanged, and
    nothing written, when the preset is the archive's own)."""
    from rspo.jsonl import write_atomic
    from rspo.plan import preset_digest
    from rspo.tracking import git_commit, utc_now

    archive = Path(archive)
    m = read_manifest(archive)
    kept = own_preset(archive, m["preset"])
    if kept is None:
        raise ArchiveError(f"{archive}: no copy of the preset it was packed from ({m['preset']}.yaml) to compare with")
    old = Preset.load(kept).data
    if preset_digest(old, "report") != m["preset_digest"]:
        raise ArchiveError(f"{archive}: its preset copy {kept} is not the preset its manifest names (digest)")
    new_preset = Preset.load(preset_file)
    if new_preset.name != m["preset"]:
        raise ArchiveError(f"{archive} is an archive of preset {m['preset']!r}, not of {new_preset.name!r}")
    new = new_preset.data
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    refused = [k for k in _differ(old, new) if k not in RELABELS]
    if refused:
        raise ArchiveError(
            f"{preset_file} differs from {kept} in {', '.join(refused)}: an archive is relabelled only for "
            f"{' and '.join(RELABELS)} (and what no report reads); pack its runs again under the new preset"
        )
    if not changed:
        return m
    stream_members(archive, m)  # every member checked before the archive is given another preset
    digest = preset_digest(new, "report")
    when = utc_now()
    entry = {"from": m["preset_digest"], "to": digest, "changed": changed, "when": when, "git_commit": git_commit()}
    m = {**m, "preset_digest": digest, "relabelled": [*m.get("relabelled", []), entry]}
    write_atomic(kept, Path(preset_file).read_text())
    write_atomic(archive / MANIFEST, json.dumps(m, indent=1) + "\n")
    return m
