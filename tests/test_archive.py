"""rspo.archive: pack a preset's run files, check and unpack them (identical bytes), refuse every kind
of bad archive with a message naming the problem and without writing anything, and build the
report targets from an archive under Snakemake without planning any pretrain, train or evaluate job."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from test_report import write_fake_results
from test_workflow import job_counts, make_workspace, snakemake

from rspo.archive import ArchiveError, pack, read_manifest, unpack, verify
from rspo.commands.archive import main
from rspo.grid import load_train_config
from rspo.plan import Plan

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.yaml"
EARLIER = ROOT / "docs" / "results" / "small-3seed"  # the 3-seed study, before the 5-seed design


def write_results(res: Path, plan: Plan) -> None:
    """The fake run files of tests/test_report.py plus what a real run folder also holds."""
    write_fake_results(res, plan)
    for name in plan.runs:
        (res / "runs" / name / "config.json").write_text(json.dumps(load_train_config(SMOKE, name).to_dict()))
    for task in plan.tasks:
        if not plan.hub_model(task):
            d = res / "models" / plan.base_dir(task)
            d.mkdir(parents=True, exist_ok=True)
            (d / "pretrain.json").write_text(json.dumps({"task": task, "steps": 3, "wall_time_s": 1.0}))
            (d / "rspo_meta.json").write_text(json.dumps({"task": task, "pretrain": {"examples": 10}}))
    (res / "data" / "countdown").mkdir(parents=True, exist_ok=True)
    for split in ("train", "val", "val_target"):
        (res / "data" / "countdown" / f"{split}.jsonl").write_text('{"nums": [1, 2], "target": 3}\n' * 4)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("archive")
    plan = Plan.from_file(SMOKE)
    res = root / "results" / "smoke"
    write_results(res, plan)
    manifest = pack(plan, res, root / "archive")
    return plan, res, root / "archive", manifest


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_pack_then_unpack_gives_the_same_bytes(packed, tmp_path):
    plan, res, archive, m = packed
    assert m["format"] == "rspo-run-archive" and m["version"] == 1 and m["preset"] == "smoke"
    assert sorted(m["runs"]) == sorted(plan.runs)
    paths = {e["path"] for e in m["members"]}
    for name in plan.runs:
        assert {f"runs/{name}/{f}" for f in ("metrics.jsonl", "config.json", "run.json", "final.json")} <= paths
    assert "bench.json" in paths and "eval/base/countdown.json" in paths and "models/base/pretrain.json" in paths
    e = next(e for e in m["members"] if e["path"] == f"runs/{next(iter(plan.runs))}/metrics.jsonl")
    assert e["rows"] > 1 and len(e["sha256"]) == 64
    assert m["datasets"]  # the data files the runs used, for MLflow's dataset inputs
    into = tmp_path / "results" / "smoke"
    unpack(archive, plan.preset, into)
    got = files_under(into)
    for rel in paths:
        assert got[rel] == (res / rel).read_bytes(), rel
    assert json.loads((into / "archive.json").read_text())["preset_digest"] == m["preset_digest"]
    unpack(archive, plan.preset, into)  # again: the same files are there, nothing to do
    assert main(["verify", str(archive), "--preset", str(SMOKE)]) == 0


def test_pack_refuses_incomplete_results_and_names_what_is_missing(tmp_path):
    plan = Plan.from_file(SMOKE)
    res = tmp_path / "results" / "smoke"
    write_results(res, plan)
    (res / "runs" / "grpo-s0" / "metrics.jsonl").unlink()
    with pytest.raises(ArchiveError, match="missing runs/grpo-s0/metrics.jsonl"):
        pack(plan, res, tmp_path / "archive")
    assert not (tmp_path / "archive").exists()


def copy_archive(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


class _Zeros(io.RawIOBase):
    """n zero bytes, produced as read (a member that expands far beyond what its archive weighs)."""

    def __init__(self, n: int):
        self.n = n

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        k = min(len(b), self.n)
        b[:k] = bytes(k)
        self.n -= k
        return k


def rebuild_bundle(archive: Path, members: list[tuple[str, int, object]]) -> None:
    """runs.tar.xz made of (name, size in the tar header, file object); the manifest's bundle
    entry (size, sha256) updated so that only the member checks stand between it and the reader."""
    import hashlib

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", preset=0) as tar:
        for name, size, fileobj in members:
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, fileobj)
    (archive / "runs.tar.xz").write_bytes(buf.getvalue())
    m = json.loads((archive / "archive.json").read_text())
    m["bundle"].update(bytes=len(buf.getvalue()), sha256=hashlib.sha256(buf.getvalue()).hexdigest())
    (archive / "archive.json").write_text(json.dumps(m))


def bundle_files(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive / "runs.tar.xz", "r:xz") as tar:
        return {i.name: tar.extractfile(i).read() for i in tar.getmembers()}


def rewrite_bundle(archive: Path, edit) -> None:
    """Rebuild runs.tar.xz with edit(name, bytes) -> bytes applied, and its sha256 and size in the
    manifest (so that only a member's own checks can catch the change)."""
    edited = [(name, edit(name, data)) for name, data in bundle_files(archive).items()]
    rebuild_bundle(archive, [(name, len(data), io.BytesIO(data)) for name, data in edited])


def test_bad_archives_are_refused_with_the_reason_and_nothing_is_written(packed, tmp_path):
    plan, res, archive, m = packed
    into = tmp_path / "results" / "smoke"

    def refused(arch: Path, match: str, preset=None) -> None:
        with pytest.raises(ArchiveError, match=match):
            unpack(arch, preset or plan.preset, into)
        assert not into.exists() or not any(into.rglob("*.json*")), "a refused archive wrote files"

    bad = copy_archive(archive, tmp_path / "damaged")
    (bad / "runs.tar.xz").write_bytes((bad / "runs.tar.xz").read_bytes()[:-100] + b"x" * 100)
    refused(bad, "runs.tar.xz: sha256 does not match")

    bad = copy_archive(archive, tmp_path / "member")
    victim = "runs/grpo-s0/metrics.jsonl"
    rewrite_bundle(bad, lambda name, data: data.replace(b"0.", b"9.", 1) if name == victim else data)
    refused(bad, f"member {victim} is corrupt")

    bad = copy_archive(archive, tmp_path / "lost")
    rewrite_bundle(bad, lambda name, data: data)
    man = json.loads((bad / "archive.json").read_text())
    man["members"].append({"path": "runs/x/metrics.jsonl", "rows": 1, "bytes": 1, "sha256": "0" * 64})
    (bad / "archive.json").write_text(json.dumps(man))
    refused(bad, "member runs/x/metrics.jsonl is listed in the manifest but missing")

    bad = copy_archive(archive, tmp_path / "nobundle")
    (bad / "runs.tar.xz").unlink()
    refused(bad, "the bundle runs.tar.xz is missing")

    bad = copy_archive(archive, tmp_path / "version")
    man = json.loads((bad / "archive.json").read_text())
    (bad / "archive.json").write_text(json.dumps({**man, "version": 99}))
    refused(bad, "archive format version 99; this version of rspo reads version 1")

    refused(tmp_path / "nothing", "not a run archive")
    small = Plan.from_file(ROOT / "configs" / "small.yaml")
    refused(archive, "an archive of preset 'smoke', not of 'small'", small.preset)
    edited = json.loads(json.dumps(plan.preset))
    edited["rl"]["optim"]["lr"] = 0.5
    refused(archive, "packed from another version of preset 'smoke'", edited)

    into.mkdir(parents=True)  # a real run's results are there: never overwritten
    (into / "runs" / "grpo-s0").mkdir(parents=True)
    (into / "runs" / "grpo-s0" / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(ArchiveError, match="already holds other versions"):
        unpack(archive, plan.preset, into)
    assert sorted(p.name for p in into.rglob("*") if p.is_file()) == ["metrics.jsonl"]
    assert main(["unpack", str(tmp_path / "damaged"), "--preset", str(SMOKE), "--into", str(tmp_path / "x")]) == 2


def test_a_member_that_expands_beyond_its_declared_size_is_refused_unread_in_bounded_memory(packed, tmp_path):
    """The bomb: the first member declared as its real few KB, its tar header 512 MiB of zeros (the
    bundle stays ~100 KB). verify and unpack, in a child process, refuse it naming the member and
    both sizes, with the child's peak memory within 32 MiB of the same child's on the honest archive;
    the target folder is untouched."""
    plan, _, archive, m = packed
    bomb = copy_archive(archive, tmp_path / "bomb")
    files = bundle_files(archive)
    first = m["members"][0]["path"]
    size = 512 << 20
    rebuild_bundle(
        bomb, [(n, size, _Zeros(size)) if n == first else (n, len(d), io.BytesIO(d)) for n, d in files.items()]
    )
    assert (bomb / "runs.tar.xz").stat().st_size < 1 << 20
    into = tmp_path / "results" / "smoke"
    into.mkdir(parents=True)
    (into / "keep.txt").write_text("a user's file\n")
    child = (
        "import json, resource, sys\n"
        "from rspo.archive import ArchiveError, unpack, verify\n"
        "from rspo.plan import Plan\n"
        "preset = Plan.from_file(sys.argv[1]).preset\n"
        "out = {}\n"
        "for name, call in (('verify', lambda: verify(sys.argv[2], preset)), "
        "('unpack', lambda: unpack(sys.argv[2], preset, sys.argv[3]))):\n"
        "    try:\n"
        "        call(); out[name] = 'accepted'\n"
        "    except ArchiveError as e:\n"
        "        out[name] = str(e)\n"
        "out['peak_kib'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(json.dumps(out))\n"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))

    def child_run(arch: Path, target: Path) -> dict:
        proc = subprocess.run(
            [sys.executable, "-c", child, str(SMOKE), str(arch), str(target)], capture_output=True, text=True, env=env
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    good = child_run(archive, tmp_path / "good")  # the same process on the honest archive: the baseline
    assert good["verify"] == good["unpack"] == "accepted"
    out = child_run(bomb, into)
    for name in ("verify", "unpack"):
        assert (
            f"member {first} is {size} bytes in the bundle, the manifest says {m['members'][0]['bytes']}" in out[name]
        )
    # the imports dominate both peaks; reading the member would add its 512 MiB
    assert (out["peak_kib"] - good["peak_kib"]) * 1024 < 32 << 20, (out["peak_kib"], good["peak_kib"])
    assert [p.name for p in into.rglob("*")] == ["keep.txt"]


def test_members_of_another_size_or_unlisted_are_refused_and_nothing_is_written(packed, tmp_path):
    plan, _, archive, m = packed
    files = bundle_files(archive)
    into = tmp_path / "results" / "smoke"
    into.mkdir(parents=True)
    (into / "keep.txt").write_text("a user's file\n")
    victim = m["members"][1]

    def refused(arch: Path, match: str) -> None:
        with pytest.raises(ArchiveError, match=match):
            unpack(arch, plan.preset, into)
        with pytest.raises(ArchiveError, match=match):
            verify(arch, plan.preset)
        assert [p.name for p in into.rglob("*")] == ["keep.txt"]
        assert main(["verify", str(arch), "--preset", str(SMOKE)]) == 2

    for delta in (1, -1):  # the manifest says one byte more, one byte less than the bundle holds
        bad = copy_archive(archive, tmp_path / f"size{delta}")
        man = json.loads((bad / "archive.json").read_text())
        entry = next(e for e in man["members"] if e["path"] == victim["path"])
        entry["bytes"] += delta
        (bad / "archive.json").write_text(json.dumps(man))
        have = victim["bytes"]
        refused(bad, f"member {victim['path']} is {have} bytes in the bundle, the manifest says {have + delta}")

    extra = copy_archive(archive, tmp_path / "extra")
    payload = b'{"step": 1}\n'
    rebuild_bundle(
        extra,
        [(n, len(d), io.BytesIO(d)) for n, d in files.items()]
        + [("runs/x/metrics.jsonl", len(payload), io.BytesIO(payload))],
    )
    refused(extra, r"holds runs/x/metrics.jsonl \(12 bytes\), which the manifest does not list")

    big = copy_archive(archive, tmp_path / "bundle")
    with (big / "runs.tar.xz").open("ab") as f:
        f.write(b"\0" * 10)
    refused(big, f"runs.tar.xz: {m['bundle']['bytes'] + 10} bytes, the manifest says {m['bundle']['bytes']}")


@pytest.mark.slow
def test_snakemake_builds_the_report_targets_from_an_archive_without_training(packed, tmp_path):
    plan, _, archive, _ = packed
    ws = tmp_path / "ws"
    ws.mkdir()
    make_workspace(ws)
    # the user's own results of the preset: archive mode must leave them as they are
    own = ws / "results" / "smoke" / "runs" / "grpo-s0" / "metrics.jsonl"
    own.parent.mkdir(parents=True)
    own.write_text('{"step": 1, "own": true}\n')
    targets = ["fig4_plugin", "table_countdown", "table_claims"]
    r = snakemake(ws, "-n", *targets, "--config", "preset=smoke", f"archive={archive}")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert set(job_counts(r.stdout + r.stderr)) == {"unpack_archive", *targets, "total"}
    r = snakemake(ws, "--cores", "2", *targets, "--config", "preset=smoke", f"archive={archive}", timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    res = ws / "results" / "smoke-archive"
    assert (res / "figures" / "fig4_plugin.png").stat().st_size > 1000
    assert own.read_text() == '{"step": 1, "own": true}\n'
    assert sorted(p.name for p in (ws / "results" / "smoke").iterdir()) == ["runs"]
    assert "GRPO" in (res / "tables" / "table_countdown.md").read_text()
    # an archive that lacks runs a target needs: the error names them, before any job
    short = copy_archive(archive, tmp_path / "short")
    man = json.loads((short / "archive.json").read_text())
    man["runs"] = [r for r in man["runs"] if r != "grpo-s0"]
    (short / "archive.json").write_text(json.dumps(man))
    ws2 = tmp_path / "ws2"
    ws2.mkdir()
    make_workspace(ws2)
    r = snakemake(ws2, "-n", "fig4_plugin", "--config", "preset=smoke", f"archive={short}")
    assert r.returncode != 0 and "needs runs that the archive" in r.stdout + r.stderr
    assert "grpo-s0" in r.stdout + r.stderr
    # a damaged bundle: the unpack job refuses it, no report job runs
    damaged = copy_archive(archive, tmp_path / "damaged")
    (damaged / "runs.tar.xz").write_bytes((damaged / "runs.tar.xz").read_bytes()[:-64] + b"x" * 64)
    ws3 = tmp_path / "ws3"
    ws3.mkdir()
    make_workspace(ws3)
    r = snakemake(ws3, "--cores", "1", "fig4_plugin", "--config", "preset=smoke", f"archive={damaged}")
    assert r.returncode != 0
    log = (ws3 / "results" / "smoke-archive" / "logs" / "archive" / "unpack.log").read_text()
    assert "runs.tar.xz: sha256 does not match the manifest" in log
    assert not (ws3 / "results" / "smoke-archive" / "figures").exists()
    # the archive's own folder edited by hand: refused before any job
    (res / "runs" / "grpo-s0" / "metrics.jsonl").write_text('{"step": 1}\n')
    r = snakemake(ws, "-n", "fig4_plugin", "--config", "preset=smoke", f"archive={archive}")
    assert r.returncode != 0 and "holds other versions of the archive's files" in r.stdout + r.stderr


def test_read_manifest_checks_the_preset(packed):
    plan, _, archive, m = packed
    assert read_manifest(archive, plan.preset)["preset_digest"] == m["preset_digest"]


def test_an_archive_keeps_the_preset_it_was_packed_from_and_is_read_with_it(packed, tmp_path):
    """configs/<p>.yaml moves on (here: another seed); the archive packed with its preset file stays
    readable: read_manifest names its copy, a Snakemake dry run in archive mode plans from the copy
    (saying so) and mlflow-sync --shipped reads the unpacked runs with it; a copy of another preset
    is refused at packing."""
    import yaml

    from rspo.archive import own_preset, unpacked_preset

    plan, res, _, m = packed
    archive = tmp_path / "kept"
    pack(plan, res, archive, preset_file=SMOKE)
    assert own_preset(archive, "smoke").read_text() == SMOKE.read_text()
    moved = yaml.safe_load(SMOKE.read_text())
    moved["seeds"] = [*moved["seeds"], 7]
    with pytest.raises(ArchiveError, match=r"read it with the preset it was packed from, .*kept/smoke.yaml"):
        read_manifest(archive, moved)
    with pytest.raises(ArchiveError, match="not the preset these runs were planned from"):
        edited = tmp_path / "smoke.yaml"
        edited.write_text(yaml.safe_dump(moved))
        pack(plan, res, tmp_path / "other", preset_file=edited)
    ws = tmp_path / "ws"
    ws.mkdir()
    make_workspace(ws)
    (ws / "configs" / "smoke.yaml").write_text(yaml.safe_dump(moved))  # the preset in configs/ moved on
    r = snakemake(ws, "-n", "table_countdown", "--config", "preset=smoke", f"archive={archive}")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "was packed from an earlier version of configs/smoke.yaml" in r.stdout + r.stderr
    assert "--preset " + str(archive / "smoke.yaml") in r.stdout + r.stderr  # the report reads the copy
    into = tmp_path / "unpacked"
    unpack(archive, plan.preset, into)
    assert unpacked_preset(into, "smoke") == archive / "smoke.yaml"


# a user's own results of preset small, as the issue's `make bench` then `make figures` left them
USER_FILES = {
    "bench.json": '{"tokens_per_s": 123.4}\n',
    "models/base.work/metrics.jsonl": '{"step": 1, "loss": 2.5}\n',
    "models/base/pretrain.json": '{"steps": 10}\n',
}


@pytest.fixture(scope="module")
def figures_clone(tmp_path_factory):
    """A clone of the repository with nothing beside it after `make figures` (this venv's Python):
    -> (clone, make's output)."""
    clone = tmp_path_factory.mktemp("figures") / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    for rel, text in USER_FILES.items():  # what `make bench` and a pretraining leave in results/small
        (clone / "results" / "small" / rel).parent.mkdir(parents=True, exist_ok=True)
        (clone / "results" / "small" / rel).write_text(text)
    r = subprocess.run(
        ["make", "-o", ".venv/.installed", "figures", f"BIN={Path(sys.executable).parent}", "CORES=2"],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return clone, r.stdout + r.stderr


@pytest.mark.slow
def test_a_fresh_clone_rebuilds_every_committed_small_result_byte_for_byte(figures_clone):
    """`make figures` on a clone with nothing beside it but a user's own results/small: one unpack
    job and the report jobs, no pretrain / train / evaluate job, every committed table and figure
    of docs/results/small comes out with the same bytes in results/small-archive, and the user's
    files are as they were."""
    clone, out = figures_clone
    committed = ROOT / "docs" / "results" / "small"
    counts = job_counts(out)
    assert counts.get("unpack_archive") == 1
    assert not {"pretrain", "train", "evaluate_countdown", "countdown_data", "bench"} & set(counts), counts
    built = clone / "results" / "small-archive"  # beside the user's results/small, never in it
    files = sorted(p.relative_to(committed) for p in committed.glob("*/*") if p.parent.name in ("figures", "tables"))
    # the committed folder holds exactly what `make figures` builds: every table and figure, nothing stale
    assert files and files == sorted(
        p.relative_to(built) for p in built.glob("*/*") if p.parent.name in ("figures", "tables")
    )
    for rel in files:
        assert (built / rel).read_bytes() == (committed / rel).read_bytes(), f"{rel} differs from the committed file"
    # the user's own results/small: the same files with the same bytes, nothing added
    own = clone / "results" / "small"
    assert {str(p.relative_to(own)): p.read_text() for p in own.rglob("*") if p.is_file()} == USER_FILES


@pytest.mark.slow
def test_make_figure_redraws_one_shipped_figure_byte_for_byte_without_training(figures_clone):
    """`make figure FIG=fig4_plugin` (the README's way to redraw one) on a clone without runs of its
    own: that figure's job alone, forced, from the unpacked shipped runs; the same bytes as committed."""
    clone, _ = figures_clone
    r = subprocess.run(
        [
            "make",
            "-o",
            ".venv/.installed",
            "figure",
            "FIG=fig4_plugin",
            f"BIN={Path(sys.executable).parent}",
            "CORES=2",
        ],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "from the shipped runs" in out and job_counts(out) == {"fig4_plugin": 1, "total": 1}, out[-3000:]
    committed = ROOT / "docs" / "results" / "small" / "figures"
    for name in ("fig4_plugin.pdf", "fig4_plugin.png"):
        built = clone / "results" / "small-archive" / "figures" / name
        assert built.read_bytes() == (committed / name).read_bytes(), name


@pytest.mark.slow
def test_the_shipped_archive_opens_in_mlflow_with_every_run(figures_clone, tmp_path):
    """What `make mlflow-ui` does right after a clone: the archive's runs (after `make figures`)
    recorded by `mlflow-sync` into the local store; `mlflow ui` in headless Chromium then lists
    every RL run, evaluation, the pretraining and the report run; a second sync records nothing."""
    from test_mlflow_ui import chromium_or_skip

    clone, _ = figures_clone
    sync = [sys.executable, "-m", "rspo", "mlflow-sync", "--preset", "small", "--shipped"]
    r = subprocess.run(sync, cwd=clone, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    first = json.loads(r.stdout.strip().splitlines()[-1])
    res = clone / "results" / "small-archive"
    rl_runs = sorted(p.name for p in (res / "runs").iterdir() if p.is_dir())
    evals = sorted(p.name for p in (res / "eval").iterdir() if p.is_dir())
    manifest = json.loads((ROOT / "docs" / "results" / "small" / "archive.json").read_text())
    assert rl_runs == sorted(manifest["runs"]) and len(evals) == len(manifest["evals"]) == len(rl_runs) + 1  # + base
    assert first["runs created"] == len(rl_runs) + len(evals) + 1  # + the pretraining run
    # every RL run with its training and two validation sets (their configs name results/small/data,
    # where they trained; the archive records the files under data/): none had any before
    assert first["dataset inputs"] == 3 * len(rl_runs) + 2 * len(evals) + 2  # + the pretraining's two
    r = subprocess.run(sync, cwd=clone, capture_output=True, text=True, timeout=900)
    again = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0 and not set(again) - {"tracking_uri", "experiment"}, again  # nothing to record

    chromium_or_skip()
    dom = tmp_path / "page.html"
    r = subprocess.run(
        [
            sys.executable,
            "scripts/mlflow_ui_check.py",
            "--preset",
            "small",
            "--shipped",
            "--by-name",  # more than 100 runs, 100 loaded; many share their start second: sorted by name
            "--dom",
            str(dom),
            "--expect",
            *rl_runs,
            "report",
        ],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["missing"] == []
    total = len(rl_runs) + len(evals) + 2  # + pretraining and report
    # the runs table loads runs 100 at a time ("Load more"): it counts what it has loaded
    assert re.search(r"<strong>(\d+)</strong> matching runs", dom.read_text())[1] == str(min(total, 100))


def test_an_archive_of_a_run_selection_records_it(tmp_path):
    """An archive packed from a selection of grid families (--families, as docs/results/small-3seed ships
    plugin + mismatch_routing) records the selection; make figures rebuilds the same plan from it."""
    plan = Plan.from_file(SMOKE, families=["plugin"])
    assert "routing" not in plan.families and "stress_plugin" in plan.families
    res = tmp_path / "results" / "smoke"
    write_results(res, plan)
    m = pack(plan, res, tmp_path / "archive")
    assert m["families"] == ["plugin"] and not m["full"] and sorted(m["runs"]) == sorted(plan.runs)
    again = Plan(plan.preset, full=m["full"], families=m["families"])
    assert again.runs == plan.runs
    assert main(["pack", "--preset", str(SMOKE), "--families", "routnig", "--out", str(tmp_path / "x")]) == 2


def _pieces(tmp_path):
    """The earlier 3-seed study unpacked, then packed again as two pieces by seed (0-1 and 2), each with the
    base model's weights in its results (as a machine that trained it has them)."""
    from rspo.archive import pack as pack_archive
    from rspo.archive import unpack as unpack_archive
    from rspo.plan import Plan

    shipped = EARLIER
    manifest = json.loads((shipped / "archive.json").read_text())
    preset_file = shipped / "small.yaml"
    plan = Plan.from_file(preset_file, families=manifest["families"])
    results = tmp_path / "results"
    unpack_archive(shipped, plan.preset, results)
    (results / "models" / "base" / "model.safetensors").write_bytes(b"the base's weights")
    out = []
    for i, seeds in enumerate(([0, 1], [2])):
        if i == 1:  # a second piece measures the benchmark and the base model's evaluation again
            remeasure(results / "bench.json", "rs_throughput_ratio_per_step")
            remeasure(results / "eval" / "base" / "countdown.json", "wall_time_s")
        piece = Plan.from_file(preset_file, seeds, families=manifest["families"])
        trials = results / "trials.jsonl" if i == 0 else None  # the regime trials travel with one piece
        pack_archive(piece, results, tmp_path / f"piece{i}", trials, preset_file=preset_file)
        out.append(tmp_path / f"piece{i}")
    return shipped, manifest, plan, out


def remeasure(path, key):
    """The file as another measurement writes it: ``key``'s value changed."""
    data = json.loads(path.read_text())
    data[key] = [x * 1.01 for x in data[key]] if isinstance(data[key], list) else data[key] + 1.5
    path.write_text(json.dumps(data))


def test_a_study_packed_in_pieces_by_seed_merges_into_the_archive_of_the_whole(tmp_path):
    from rspo.archive import unpack, verify
    from rspo.archive_pieces import merge

    shipped, manifest, plan, (a, b) = _pieces(tmp_path)
    ma, mb = json.loads((a / "archive.json").read_text()), json.loads((b / "archive.json").read_text())
    assert ma["seeds"] == [0, 1] and mb["seeds"] == [2] and ma["preset_digest"] == mb["preset_digest"]
    assert ma["bases"]["base"] == mb["bases"]["base"]  # the piece records the base it started from
    merged = merge([a, b], tmp_path / "merged")
    assert merged["seeds"] == [0, 1, 2] and merged["runs"] == sorted(manifest["runs"])
    assert [p["seeds"] for p in merged["pieces"]] == [[0, 1], [2]]
    shipped_members = {e["path"]: e["sha256"] for e in manifest["members"]}
    # the same files, byte for byte: of the benchmark and the base's evaluation, which the second piece
    # measured again, the first piece's are kept and the second's are listed
    assert {e["path"]: e["sha256"] for e in merged["members"]} == shipped_members
    assert sorted(merged["shared"]) == ["bench.json", "eval/base/countdown.json"]
    again = {e["path"]: e["sha256"] for e in mb["members"]}
    for rel, record in merged["shared"].items():
        assert record == {"kept": str(a), "others": [{"piece": str(b), "sha256": again[rel]}]}
        assert again[rel] != shipped_members[rel]
    verify(tmp_path / "merged", plan.preset)  # a whole archive of the preset: bundle and members check
    unpack(tmp_path / "merged", plan.preset, tmp_path / "again")
    assert (tmp_path / "merged" / "small.yaml").read_bytes() == (shipped / "small.yaml").read_bytes()


def test_merging_refuses_pieces_of_other_studies_other_bases_and_a_run_twice(tmp_path):
    import shutil

    from rspo.archive import ArchiveError
    from rspo.archive_pieces import merge

    _, _, _, (a, b) = _pieces(tmp_path)
    with pytest.raises(ArchiveError, match=r"run \S+ is in two pieces"):
        merge([a, a], tmp_path / "twice")

    def altered(src, name, change):
        dst = tmp_path / name
        shutil.copytree(src, dst)
        m = json.loads((dst / "archive.json").read_text())
        change(m)
        (dst / "archive.json").write_text(json.dumps(m))
        return dst

    other = altered(b, "other_preset", lambda m: m.update(preset_digest="0" * 16))
    with pytest.raises(ArchiveError, match="pieces of different studies: preset_digest"):
        merge([a, other], tmp_path / "x")
    rebased = altered(b, "other_base", lambda m: m["bases"].update(base="f" * 64))
    with pytest.raises(ArchiveError, match="started from different base models"):
        merge([a, rebased], tmp_path / "y")
    # any other file two pieces hold in two versions (here the base model's pretraining record) is refused
    from rspo.archive import pack as pack_archive
    from rspo.archive import unpack as unpack_archive
    from rspo.plan import Plan

    shipped = EARLIER
    families = json.loads((shipped / "archive.json").read_text())["families"]
    results = tmp_path / "results-c"
    unpack_archive(b, Plan.from_file(shipped / "small.yaml", [2], families=families).preset, results)
    record = results / "models" / "base" / "pretrain.json"
    record.write_text(record.read_text().replace('"task"', '"task" ', 1))
    (results / "models" / "base" / "model.safetensors").write_bytes(b"the base's weights")
    piece = Plan.from_file(shipped / "small.yaml", [2], families=families)
    pack_archive(piece, results, tmp_path / "piece-c", preset_file=shipped / "small.yaml")
    with pytest.raises(ArchiveError, match=r"different versions of models/base/pretrain.json"):
        merge([a, tmp_path / "piece-c"], tmp_path / "z")
    with pytest.raises(ArchiveError, match="two pieces or more"):
        merge([a], tmp_path / "one")


def test_a_study_that_grew_by_a_family_merges_with_its_new_piece_last(tmp_path):
    """A family added to a study after its pieces were packed (the stop-gradient arm beside the plug-in
    runs): its piece, packed with --families under a preset that differs only in default_families and
    holding the paired arm's runs with the same bytes, merges last into the archive of the grown preset.
    Refused: the new piece not last, a preset that differs in more, a shared run with other bytes."""
    import shutil

    from rspo.archive import unpack, verify
    from rspo.archive_pieces import merge

    shipped, manifest, plan, (a, b) = _pieces(tmp_path)

    def grown_preset(name, **edit):
        data = yaml.safe_load((shipped / "small.yaml").read_text())
        data.update(default_families=["plugin", "mismatch_routing", "stop_gradient"], **edit)
        path = tmp_path / name / "small.yaml"
        path.parent.mkdir()
        path.write_text(yaml.safe_dump(data))
        return path

    grown = grown_preset("grown")
    results = tmp_path / "results"  # the study unpacked (by _pieces): the stop-gradient arm trained beside it
    sg = Plan.from_file(grown, families=["stop_gradient"])
    new_runs = [r for r in sg.runs if r not in manifest["runs"]]
    assert new_runs and all("nosg" in r for r in new_runs)
    for run in new_runs:
        shutil.copytree(results / "runs" / run.replace("-nosg", ""), results / "runs" / run)
        shutil.copytree(results / "eval" / run.replace("-nosg", ""), results / "eval" / run)
    pack(sg, results, tmp_path / "piece-sg", preset_file=grown)
    merged = merge([a, b, tmp_path / "piece-sg"], tmp_path / "merged")
    whole = Plan.from_file(grown)
    assert merged["runs"] == sorted(whole.runs) == sorted(manifest["runs"] + new_runs)
    assert merged["families"] is None and [p["from"] for p in merged["pieces"]][-1] == str(tmp_path / "piece-sg")
    assert (tmp_path / "merged" / "small.yaml").read_bytes() == grown.read_bytes()
    verify(tmp_path / "merged", whole.preset)
    unpack(tmp_path / "merged", whole.preset, tmp_path / "again")
    with pytest.raises(ArchiveError, match=r"ran families \['stop_gradient'\] that the last piece's preset"):
        merge([tmp_path / "piece-sg", a, b], tmp_path / "x")
    later = grown_preset("later", regime_trials=["configs/sweeps/small-round5.yaml"])  # the search grew too
    pack(Plan.from_file(later, families=["stop_gradient"]), results, tmp_path / "piece-l", preset_file=later)
    assert merge([a, b, tmp_path / "piece-l"], tmp_path / "merged-l")["runs"] == merged["runs"]
    other = grown_preset("other", seeds=[0, 1, 2, 3])
    pack(Plan.from_file(other, [0, 1, 2], families=["stop_gradient"]), results, tmp_path / "piece-o", preset_file=other)
    with pytest.raises(ArchiveError, match="their presets differ in seeds .pieces may differ only in default_"):
        merge([a, b, tmp_path / "piece-o"], tmp_path / "y")
    run = next(r for r in sg.runs if "nosg" not in r)
    log = results / "runs" / run / "metrics.jsonl"
    log.write_text(log.read_text() + "\n")
    pack(sg, results, tmp_path / "piece-d", preset_file=grown)
    with pytest.raises(ArchiveError, match=f"run {run} is in two pieces"):
        merge([a, b, tmp_path / "piece-d"], tmp_path / "z")


def test_the_shipped_study_is_the_merge_of_its_committed_pieces(tmp_path, monkeypatch):
    """docs/results/small is what `rspo archive merge` builds from the pieces committed under
    docs/results/small-pieces (each run by `make piece`), and those pieces are the preset's whole
    design: every run of configs/small.yaml's default target, with the preset's seeds."""
    from rspo.archive_pieces import merge

    shipped = ROOT / "docs" / "results" / "small"
    manifest = json.loads((shipped / "archive.json").read_text())
    monkeypatch.chdir(ROOT)  # the pieces are recorded by their repository paths
    again = merge([p["from"] for p in manifest["pieces"]], tmp_path / "merged")
    assert len(manifest["pieces"]) >= 2
    for key in ("preset_digest", "seeds", "runs", "evals", "members", "bundle", "bases", "shared", "pieces"):
        assert again.get(key) == manifest.get(key), key
    plan = Plan.from_file(ROOT / "configs" / "small.yaml")
    assert manifest["runs"] == sorted(plan.runs) and manifest["seeds"] == plan.seeds
    verify(shipped, plan.preset)
