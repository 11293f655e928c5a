"""`python -m rspo archive pack|unpack|verify`: a preset's run files as a compact, checksummed
archive (a study run in pieces, ``pack --seeds``, is merged into one by rspo.archive_pieces).

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

A study run in pieces (``pack --seeds``) is merged into one archive by rspo.archive_pieces, which also
relabels an archive whose study's regime search grew.

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


def sha256_of(data: bytes) -> str:
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


def tar_bundle(members: dict[str, Path], mtimes: dict[str, int] | None = None) -> tuple[bytes, list[dict[str, Any]]]:
    """The xz tar of ``members`` (archive path -> file), sorted by path, and their manifest entries;
    each member's mtime is ``mtimes``' or its file's (when the job wrote it: mlflow-sync's run times)."""
    entries = []
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", preset=9) as tar:
        for rel in sorted(members):
            data = members[rel].read_bytes()
            mtime = (mtimes or {}).get(rel, int(members[rel].stat().st_mtime))
            entries.append(
                {"path": rel, "rows": _rows(data), "bytes": len(data), "sha256": sha256_of(data), "mtime": mtime}
            )
            info = tarfile.TarInfo(rel)
            info.size, info.mtime, info.mode = len(data), mtime, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), entries


def reproducible_tar(members: dict[str, Path]) -> bytes:
    """The xz tar of ``members`` (archive path -> file), sorted, every mtime 0 and mode 0644: the same
    files give the same bytes (rspo sweep's per-step pack)."""
    return tar_bundle(members, dict.fromkeys(members, 0))[0]


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
    from rspo.tracking import git_commit, utc_now

    results = Path(results)
    members = members_of(plan, results, Path(trials) if trials else None)
    bundle, entries = tar_bundle(members)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "preset": plan.name,
        "preset_digest": preset_digest(plan.preset, "report"),
        "full": plan.full,
        "families": plan.selection,
        "seeds": plan.seeds,
        "git_commit": git_commit(),
        "packed": utc_now(),
        "runs": sorted(plan.runs),
        "evals": sorted(
            e["path"].removeprefix("eval/").removesuffix(".json") for e in entries if e["path"].startswith("eval/")
        ),
        "bundle": {"file": BUNDLE, "bytes": len(bundle), "sha256": sha256_of(bundle)},
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


def _checkedtar_bundle(archive: Path, m: dict[str, Any]) -> Path:
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


def stream_members(archive: Path, m: dict[str, Any], sink=None) -> None:
    """Check every member against the manifest while streaming it; ``sink(rel, chunk)`` receives
    its bytes. A member's tar header (type, name, size) is compared with its manifest entry before
    any of its data is read, so a member the manifest does not list, or one of another size, is
    refused without being expanded; sha256 and rows are computed chunk by chunk."""
    bundle_path = _checkedtar_bundle(archive, m)
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
    stream_members(Path(archive), m)
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
            stream_members(archive, m, sink)
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
