"""`python -m rspo archive pack|unpack|verify|merge`: a preset's run files as a compact, checksummed
archive; a study run in pieces (``pack --seeds``) merged into one (``merge``).

An archive lets someone without the compute (or a colleague without a GPU) rebuild every table and
figure of a study and browse its runs in MLflow, from exactly the files the report rules read:

- ``runs/<run>/{metrics.jsonl, config.json, run.json, final.json}`` of every RL run (the per-step
  metrics, the resolved config, the run's identity and summary);
- ``eval/<model>/<task>.json`` of every evaluation (per-split accuracy and the per-problem scores);
- ``bench.json`` and ``speed.json`` when the study made them;
- ``models/<base>/{pretrain.json, rspo_meta.json}`` and ``models/<base>.work/metrics.jsonl`` of each
  pretrained base (its MLflow run; no weights);
- ``trials.jsonl``, the regime trials, when given (``--trials``).

Layout of an archive folder ``DIR``: ``DIR/archive.json`` (the manifest), ``DIR/runs.tar.xz``
(the files, paths relative to ``results/<preset>/``) and ``DIR/<preset>.yaml``, the preset file the
runs were made from (its digest is the manifest's): an archive stays readable after the preset in
configs/ moves on (more seeds, another evaluation size), and archive mode plans from its copy. The
manifest holds the format and its version, the preset's name and digest (rspo.plan
``preset_digest``: every section the report rules read), the git commit that packed it, the runs
and evaluations it holds, and per file its path, rows (lines), bytes and sha256, plus the data
files the runs used (name, rows, sha256: what MLflow's dataset inputs record; the data
themselves are not shipped, ``rspo generate`` rebuilds them).

A study too long for one machine runs in pieces split by seed (both arms of a paired difference run
on the same machine): each piece is packed with ``--seeds``; its manifest records the seeds, the
commit and the base model's weights (``bases``: sha256 of each base pretrained here, where the
weights are in the results). ``merge`` builds one archive from pieces and refuses pieces of
different studies (preset name, digest, grid selection), from different bases, a run present in two
pieces, or two versions of one shared file. A study may grow by a family after its pieces were packed:
the new family's piece (``pack --families``, under a preset that differs only in ``default_families``
and the regime search's records, ``GROWS``) comes last, may hold the paired arm's runs with the same
bytes, and the merged archive is of its preset.

``unpack`` checks everything before it writes anything: the format and version, that the archive
is of this preset (name and digest), the bundle's size and sha256, each member's tar header against
its manifest entry (listed, a regular file, the declared size: checked before its data is read, so
a bundle that expands beyond what it declares is refused without being expanded), then each
member's sha256 and rows while it streams into a staging folder (memory: one 1 MiB chunk); then
it writes the members into ``results/<preset>/`` (a file already there with other content is
refused, nothing is overwritten) and ``results/<preset>/archive.json``. Under Snakemake the switch
``--config archive=DIR`` does this as its only job (rule ``unpack_archive``) and builds the report
targets without planning any pretrain, train or evaluate job (workflow/rules/common.smk).
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import tarfile
import time
from pathlib import Path
from typing import Any

from rspo.preset import Preset
from rspo.run_record import RUN_FILES, RunRecord

FORMAT = "rspo-run-archive"
VERSION = 1
MANIFEST = "archive.json"
BUNDLE = "runs.tar.xz"
OPTIONAL_TOP = ("bench.json", "speed.json")


class ArchiveError(ValueError):
    pass


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _rows(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


# ---------------------------------------------------------------------------- pack


def members_of(plan, results: Path, trials: Path | None = None) -> dict[str, Path]:
    """Archive path -> file, for everything the report rules and ``mlflow-sync`` read of ``plan``."""
    out: dict[str, Path] = {}
    missing: list[str] = []

    def add(rel: str, required: bool = True) -> None:
        path = results / rel
        if path.is_file():
            out[rel] = path
        elif required:
            missing.append(rel)

    for name in plan.runs:
        for f in RUN_FILES:
            add(f"runs/{name}/{f}")
    for task in plan.tasks:
        for name in ["base", *plan.runs_of_task(task)]:
            add(f"eval/{name}/{task}.json", required=(task == "countdown") or bool(plan.main_tasks))
        if not plan.hub_model(task):
            base = plan.base_dir(task)
            for rel in (f"models/{base}/pretrain.json", f"models/{base}/rspo_meta.json"):
                add(rel)
            add(f"models/{base}.work/metrics.jsonl", required=False)
    for f in OPTIONAL_TOP:
        add(f, required=(f == "bench.json" and plan.available("table_efficiency")))
    if missing:
        shown = ", ".join(missing[:8]) + (f" (and {len(missing) - 8} more)" if len(missing) > 8 else "")
        raise ArchiveError(f"{results}: the preset's run files are incomplete, missing {shown}")
    if trials is not None:
        if not trials.is_file():
            raise ArchiveError(f"--trials {trials}: no such file")
        out["trials.jsonl"] = trials
    return out


def _datasets(members: dict[str, Path], results: Path) -> dict[str, dict[str, Any]]:
    """The data files the runs and evaluations used: what MLflow's dataset inputs record."""
    from rspo.mlflow_sync import repo_relative
    from rspo.tracking import REPO_ROOT, file_dataset

    paths: set[str] = set()
    for rel, path in members.items():
        if rel.endswith("/config.json"):
            data = RunRecord(path.parent).config.get("data") or {}
            paths.add(data.get("train_path", ""))
            paths.update((data.get("val_paths") or {}).values())
        elif rel.startswith("eval/") and rel.endswith("/countdown.json"):
            for split in json.loads(path.read_text()).get("splits") or {}:
                paths.add(str(results / "data" / "countdown" / f"{split}.jsonl"))
    out = {}
    for p in sorted(x for x in paths if x):
        f = Path(p) if Path(p).is_absolute() or Path(p).is_file() else REPO_ROOT / p
        if not f.is_file():
            continue
        ds = file_dataset(f)
        rel = repo_relative(f, results)
        out[rel] = {"name": ds.name, "digest": ds.digest, **json.loads(ds.profile)}
    return out


def own_preset(archive: str | Path, name: str) -> Path | None:
    """The archive's copy of the preset it was packed from (``DIR/<name>.yaml``), if it has one."""
    path = Path(archive) / f"{name}.yaml"
    return path if path.is_file() else None


def unpacked_preset(results: str | Path, name: str) -> Path | None:
    """The preset an archive unpacked into ``results`` was packed from (its copy in the archive
    folder ``unpack`` recorded as the manifest's source), if it has one."""
    try:
        source = json.loads((Path(results) / MANIFEST).read_text()).get("source")
    except (OSError, ValueError):
        return None
    return own_preset(source, name) if source else None


def _bundle(members: dict[str, Path], mtimes: dict[str, int] | None = None) -> tuple[bytes, list[dict[str, Any]]]:
    """The xz tar of ``members`` (archive path -> file), sorted by path, and their manifest entries;
    each member's mtime is ``mtimes``' or its file's (when the job wrote it: mlflow-sync's run times)."""
    entries = []
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", preset=9) as tar:
        for rel in sorted(members):
            data = members[rel].read_bytes()
            mtime = (mtimes or {}).get(rel, int(members[rel].stat().st_mtime))
            entries.append(
                {"path": rel, "rows": _rows(data), "bytes": len(data), "sha256": _sha256(data), "mtime": mtime}
            )
            info = tarfile.TarInfo(rel)
            info.size, info.mtime, info.mode = len(data), mtime, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), entries


def reproducible_tar(members: dict[str, Path]) -> bytes:
    """The xz tar of ``members`` (archive path -> file), sorted, every mtime 0 and mode 0644: the same
    files give the same bytes (rspo sweep's per-step pack)."""
    return _bundle(members, dict.fromkeys(members, 0))[0]


def base_digests(plan, results: Path) -> dict[str, str]:
    """{base folder: sha256 of its weights} of the bases pretrained here whose weights are in
    ``results`` (what a piece of a study started from; pieces from other bases are not merged)."""
    out = {}
    for task in plan.tasks:
        if plan.hub_model(task):
            continue
        weights = results / "models" / plan.base_dir(task) / "model.safetensors"
        if weights.is_file():
            out[plan.base_dir(task)] = _file_sha256(weights)
    return out


def pack(
    plan,
    results: str | Path,
    out: str | Path,
    trials: str | Path | None = None,
    preset_file: str | Path | None = None,
) -> dict[str, Any]:
    """Write ``out/archive.json`` and ``out/runs.tar.xz`` from ``results`` (results/<preset>), and
    ``out/<preset>.yaml``, a copy of ``preset_file`` (the preset the runs were made from), when given.
    A plan with a selection of seeds packs a piece of the study (``merge`` joins pieces)."""
    from rspo.plan import preset_digest
    from rspo.tracking import git_commit

    results = Path(results)
    members = members_of(plan, results, Path(trials) if trials else None)
    bundle, entries = _bundle(members)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "preset": plan.name,
        "preset_digest": preset_digest(plan.preset, "report"),
        "full": plan.full,
        "families": plan.selection,
        "seeds": plan.seeds,
        "git_commit": git_commit(),
        "packed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": sorted(plan.runs),
        "evals": sorted(
            e["path"].removeprefix("eval/").removesuffix(".json") for e in entries if e["path"].startswith("eval/")
        ),
        "bundle": {"file": BUNDLE, "bytes": len(bundle), "sha256": _sha256(bundle)},
        "members": entries,
        "datasets": _datasets(members, results),
        "bases": base_digests(plan, results),
    }
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if preset_file is not None:
        text = Path(preset_file).read_text()
        if preset_digest(Preset.load(preset_file).data, "report") != manifest["preset_digest"]:
            raise ArchiveError(f"{preset_file} is not the preset these runs were planned from")
        (out / f"{plan.name}.yaml").write_text(text)
    (out / BUNDLE).write_bytes(bundle)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


# ---------------------------------------------------------------------------- read and check


def read_manifest(archive: str | Path, preset: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest of an archive folder, checked against the format and (if given) the preset."""
    from rspo.plan import preset_digest

    path = Path(archive) / MANIFEST
    if not path.is_file():
        raise ArchiveError(f"{archive}: not a run archive (no {MANIFEST})")
    try:
        m = json.loads(path.read_text())
    except ValueError as e:
        raise ArchiveError(f"{path}: unreadable manifest ({e})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise ArchiveError(
            f"{path}: not an rspo run archive (format {m.get('format') if isinstance(m, dict) else m!r})"
        )
    if m.get("version") != VERSION:
        raise ArchiveError(
            f"{path}: archive format version {m.get('version')!r}; this version of rspo reads version {VERSION}"
        )
    for key in ("preset", "preset_digest", "members", "bundle", "runs"):
        if key not in m:
            raise ArchiveError(f"{path}: manifest has no {key!r}")
    if preset is not None:
        name = Preset(preset).name
        if m["preset"] != name:
            raise ArchiveError(f"{archive} is an archive of preset {m['preset']!r}, not of {name!r}")
        digest = preset_digest(preset, "report")
        if m["preset_digest"] != digest:
            kept = own_preset(archive, name)
            raise ArchiveError(
                f"{archive} was packed from another version of preset {name!r} (digest {m['preset_digest']}, "
                f"this one {digest}): its runs do not belong to the preset as it is"
                + (f"; read it with the preset it was packed from, {kept}" if kept else "")
            )
    return m


CHUNK = 1 << 20  # bytes read from a member at a time: memory is bounded by this, not by the bundle


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _checked_bundle(archive: Path, m: dict[str, Any]) -> Path:
    """The bundle's path once its size and sha256 match the manifest (read in chunks, before any
    decompression: a bundle larger than declared is refused without hashing it)."""
    bundle_path = archive / m["bundle"]["file"]
    if not bundle_path.is_file():
        raise ArchiveError(f"{archive}: the bundle {m['bundle']['file']} is missing")
    size, declared = bundle_path.stat().st_size, m["bundle"].get("bytes")
    if size != declared:
        raise ArchiveError(f"{bundle_path}: {size} bytes, the manifest says {declared} (damaged or replaced)")
    if _file_sha256(bundle_path) != m["bundle"]["sha256"]:
        raise ArchiveError(f"{bundle_path}: sha256 does not match the manifest (damaged or replaced)")
    return bundle_path


def _stream_members(archive: Path, m: dict[str, Any], sink=None) -> None:
    """Check every member against the manifest while streaming it; ``sink(rel, chunk)`` receives
    its bytes. A member's tar header (type, name, size) is compared with its manifest entry before
    any of its data is read, so a member the manifest does not list, or one of another size, is
    refused without being expanded; sha256 and rows are computed chunk by chunk."""
    bundle_path = _checked_bundle(archive, m)
    declared = {e["path"]: e for e in m["members"]}
    seen: set[str] = set()
    try:
        with tarfile.open(bundle_path, mode="r|xz") as tar:  # a stream: members in order, no index
            for info in tar:
                name = info.name
                if not info.isfile() or name.startswith("/") or ".." in Path(name).parts:
                    raise ArchiveError(f"{bundle_path}: unexpected member {name!r}")
                entry = declared.get(name)
                if entry is None:
                    raise ArchiveError(
                        f"{archive}: the bundle holds {name} ({info.size} bytes), which the manifest does not list"
                    )
                if name in seen:
                    raise ArchiveError(f"{archive}: member {name} appears twice in the bundle")
                if info.size != entry["bytes"]:
                    raise ArchiveError(
                        f"{archive}: member {name} is {info.size} bytes in the bundle, the manifest says "
                        f"{entry['bytes']} (refused before reading it)"
                    )
                f = tar.extractfile(info)
                h, rows, n, last = hashlib.sha256(), 0, 0, b""
                while chunk := f.read(CHUNK):  # at most info.size bytes in all: the declared size
                    n += len(chunk)
                    h.update(chunk)
                    rows += chunk.count(b"\n")
                    last = chunk[-1:]
                    if sink is not None:
                        sink(name, chunk)
                rows += 1 if n and last != b"\n" else 0
                if n != entry["bytes"]:
                    raise ArchiveError(f"{archive}: member {name} ends after {n} of {entry['bytes']} bytes")
                if h.hexdigest() != entry["sha256"]:
                    raise ArchiveError(f"{archive}: member {name} is corrupt (sha256 does not match the manifest)")
                if rows != entry["rows"]:
                    raise ArchiveError(f"{archive}: member {name} has {rows} rows, the manifest says {entry['rows']}")
                seen.add(name)
    except (tarfile.TarError, EOFError, OSError, lzma.LZMAError) as e:
        raise ArchiveError(f"{bundle_path}: unreadable ({e})") from None
    missing = [rel for rel in declared if rel not in seen]
    if missing:
        raise ArchiveError(f"{archive}: member {missing[0]} is listed in the manifest but missing from the bundle")


def verify(archive: str | Path, preset: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check an archive without writing anything; -> its manifest."""
    m = read_manifest(archive, preset)
    _stream_members(Path(archive), m)
    return m


def unpack(archive: str | Path, preset: dict[str, Any], into: str | Path) -> dict[str, Any]:
    """Check the archive, then write its members into ``into`` (results/<preset>) and the
    manifest as ``into/archive.json``; -> the manifest. Members are streamed into a staging folder
    outside ``into`` and checked there; nothing is written into ``into`` unless every check passes;
    a file already there with other content is refused (delete it, or unpack elsewhere)."""
    import shutil
    import tempfile

    archive, into = Path(archive), Path(into)
    m = read_manifest(archive, preset)
    clash = [
        e["path"]
        for e in m["members"]
        if (into / e["path"]).is_file() and _file_sha256(into / e["path"]) != e["sha256"]
    ]
    if clash:
        raise ArchiveError(
            f"{into} already holds other versions of {len(clash)} archive files ({', '.join(clash[:4])}...): "
            "results of another run; move them away or unpack into another folder"
        )
    with tempfile.TemporaryDirectory(prefix="rspo-unpack-") as staging:
        staging = Path(staging)
        handles: dict[str, Any] = {}

        def sink(rel: str, chunk: bytes) -> None:
            if rel not in handles:
                for f in handles.values():
                    f.close()
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                handles[rel] = (staging / rel).open("wb")
            handles[rel].write(chunk)

        try:
            _stream_members(archive, m, sink)
        finally:
            for f in handles.values():
                f.close()
        for e in m["members"]:
            rel, dst = e["path"], into / e["path"]
            if dst.is_file():
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(f".{dst.name}.unpacking")
            src = staging / rel
            if src.is_file():
                shutil.copyfile(src, tmp)
            else:  # an empty member: no chunk reached the sink
                tmp.write_bytes(b"")
            tmp.rename(dst)  # a member exists whole or not at all
    (into / MANIFEST).write_text(json.dumps({**m, "source": str(archive.resolve())}, indent=1) + "\n")
    return m


# ---------------------------------------------------------------------------- pieces

REMEASURED = ("bench.json", "eval/base/")
"""Members every piece of a study measures again (timings, the base model's evaluation and its wall
time), so two pieces' versions differ even on one machine: a merge keeps the first piece's."""


def _same_run(run: str, a: dict[str, str], b: dict[str, str]) -> bool:
    """Whether two pieces' manifests (path -> sha256) hold run ``run`` with the same files and bytes."""
    mine = lambda files: {p: h for p, h in files.items() if p.startswith((f"runs/{run}/", f"eval/{run}/"))}  # noqa: E731
    return mine(a) == mine(b)


GROWS = ("default_families", "regime_trials")
"""What a study may add between its pieces: a family of runs, and the later rounds of its regime search
(the records the claims table reads). Never its primary family, fixed before its first run."""


def _check_growth(manifests: list[tuple[Path, dict[str, Any]]]) -> None:
    """Pieces of a study that grew after its first pieces were packed: each piece's preset (its copy
    beside the bundle) is the last piece's but for ``GROWS``, and the last
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
        differ = sorted(k for k in set(mine) | set(final) if k not in GROWS and mine.get(k) != final.get(k))
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
    earlier pieces' only in ``default_families`` comes last (``_check_growth``), and may hold runs of
    earlier pieces with the same bytes (the paired arm it was trained beside, copied from the shipped
    archive); the merged archive is of the last piece's preset, its default selection."""
    import shutil
    import tempfile

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
                _stream_members(
                    path, m, lambda rel, chunk, path=path: sink(rel, chunk) if source[rel] == path else None
                )
                for f in handles.values():
                    f.close()
                handles.clear()
        finally:
            for f in handles.values():
                f.close()
        for rel in entries:
            (staging / rel).touch()  # an empty member has no chunk
        bundle, merged = _bundle(
            {rel: staging / rel for rel in entries}, {rel: e["mtime"] for rel, e in entries.items()}
        )
    header = last if grown else first
    manifest = {
        **{k: header[k] for k in ("format", "version", "preset", "preset_digest", "full")},
        "families": None if grown else first["families"],
        "seeds": sorted({s for _, m in manifests for s in m.get("seeds", [])}),
        "git_commit": sorted({m.get("git_commit") for _, m in manifests if m.get("git_commit")}),
        "packed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "pieces": [
            {"seeds": m.get("seeds"), "git_commit": m.get("git_commit"), "packed": m.get("packed"), "from": str(path)}
            for path, m in manifests
        ],
        "runs": sorted(owner),
        "evals": sorted({ev for _, m in manifests for ev in m.get("evals", [])}),
        "bundle": {"file": BUNDLE, "bytes": len(bundle), "sha256": _sha256(bundle)},
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


# ---------------------------------------------------------------------------- command line
