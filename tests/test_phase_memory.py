"""rspo.phase_memory: each phase's memory kept over a step (its largest value), reported as
memory/<phase>/<what>_gib and started afresh each step; the first step's table beside the plan and the
warning that names a phase measured over its plan by more than 5%; the CPU kind measures the process's
resident memory (the trainer's own phases: tests/test_standin.py)."""

import pytest

from rspo.phase_memory import PHASES, HostMemory, PhaseMemory, host_allocation, host_context


class Fixed(PhaseMemory):
    def __init__(self, values):
        super().__init__()
        self.values = iter(values)

    def _exit(self, name):
        return {"peak_gib": next(self.values)}


def test_a_phase_keeps_its_largest_value_of_the_step_and_the_next_step_starts_afresh():
    mem = Fixed([3.0, 5.0, 4.0, 1.0])
    for name in ("update", "update", "optimizer_step"):
        with mem.phase(name):
            pass
    assert mem.step_metrics() == {"memory/update/peak_gib": 5.0, "memory/optimizer_step/peak_gib": 4.0}
    assert mem.first == {"update": {"peak_gib": 5.0}, "optimizer_step": {"peak_gib": 4.0}}
    with mem.phase("sync"):
        pass
    assert mem.step_metrics() == {"memory/sync/peak_gib": 1.0} and "sync" not in mem.first  # the first stays
    assert set(mem.last_seconds) == {"sync"}
    with pytest.raises(ValueError, match="unknown phase 'warmup'"):
        with mem.phase("warmup"):
            pass


def test_the_first_steps_table_sits_beside_the_plan_and_names_what_exceeds_it():
    mem = PhaseMemory()
    values = {"update": {"peak_gib": 70.0}, "sync": {"peak_gib": 60.0}, "rollout": {"peak_gib": 50.0}}
    planned = {"update": 69.0, "sync": 55.0, "rollout": 60.0}
    table = mem.table(values, planned)
    lines = table.splitlines()
    assert [ln.split()[0] for ln in lines[1:]] == ["rollout", "update", "sync"]  # the step's order
    assert "planned_gib" in lines[0] and "1.091" in table
    assert mem.over_plan(values, planned) == ["phase sync: measured 60.00 GiB, planned 55.00 GiB (+9%)"]
    assert PHASES.index("resume") < PHASES.index("engine_start") < PHASES.index("rollout")
    assert PHASES.index("optimizer_step") < PHASES.index("sync") < PHASES.index("kv_wake")


def test_on_a_cpu_the_resident_memory_is_measured():
    mem = HostMemory()
    with mem.phase("rollout"):
        block = bytearray(64 * 2**20)  # noqa: F841 (64 MiB resident at the phase's end)
    assert mem.current["rollout"]["rss_gib"] > 64 / 1024


def test_host_work_runs_in_the_given_context():
    seen = []

    class Marker:
        def __enter__(self):
            seen.append("in")

        def __exit__(self, *a):
            seen.append("out")

    with host_allocation():
        pass
    assert seen == []
    with host_context(Marker), host_allocation():
        pass
    assert seen == ["in", "out"]


def test_a_sleeping_engines_reservation_is_not_read_as_memory_in_use(monkeypatch):
    """torch.cuda's statistics stubbed as on a GPU beside a vLLM engine at level-2 sleep: 20 GiB of
    the engine's tensors still reserved in torch's counters, their pages unmapped. The driver sees
    30 GiB at the phase's end (10 GiB of training tensors and reservations, 8 of context, NCCL and
    the like, ... and nothing of the engine's 20), and the update reserved 5 GiB more for a moment.
    The phase peaked at 35 GiB; the earlier reading, peak reserved + (driver - reserved), said 45."""
    import torch

    from rspo.phase_memory import GIB, CudaMemory

    stats = {"free": 50 * GIB, "total": 80 * GIB, "reserved": 40 * GIB, "peak_reserved": 45 * GIB}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (stats["free"], stats["total"]))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: stats["reserved"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: stats["peak_reserved"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 38 * GIB)
    mem = CudaMemory(torch.device("cuda", 0))
    with mem.phase("update"):
        pass
    row = mem.step_metrics()
    assert row["memory/update/driver_used_gib"] == 30.0 and row["memory/update/peak_gib"] == 35.0
    # an awake engine (its pages mapped: the driver sees them): the reading is the earlier one
    stats.update(free=30 * GIB)
    with mem.phase("rollout"):
        pass
    assert mem.step_metrics()["memory/rollout/peak_gib"] == 45 + (50 - 40)


def test_bytes_torch_releases_inside_a_phase_are_not_counted_with_what_is_mapped_after(monkeypatch):
    """A KV wake as vLLM 0.32 runs it, scripted: at the phase's start torch reserves 12 GiB (the sync's
    gathered layers among them) and the driver sees 20; vLLM's wake empties torch's cache (reserved
    12 -> 4, driver 20 -> 12) and then maps its KV cache outside torch's counters (driver 12 -> 36).
    The device never held more than 36 GiB; the earlier reading, driver at the end + (peak reserved -
    reserved at the end), said 44. Preflight's "measured" reads the same value."""
    import torch

    from rspo.gpu_memory.preflight import _measured
    from rspo.phase_memory import GIB, CudaMemory

    total = 80 * GIB
    stats = {"used": 20 * GIB, "reserved": 12 * GIB, "peak_reserved": 12 * GIB}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(
        torch.cuda, "reset_peak_memory_stats", lambda device=None: stats.update(peak_reserved=stats["reserved"])
    )
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (total - stats["used"], total))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: stats["reserved"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: stats["peak_reserved"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 10 * GIB)
    mem = CudaMemory(torch.device("cuda", 0))
    with mem.phase("kv_wake"):
        stats.update(reserved=4 * GIB, used=12 * GIB)  # torch's cache emptied
        stats.update(used=36 * GIB)  # the KV cache mapped
    truth = 36.0
    assert abs(mem.current["kv_wake"]["peak_gib"] - truth) <= 0.01 * truth
    mem.step_metrics()
    assert abs(_measured(mem)["kv_wake"] - truth) <= 0.01 * truth
    # a transient inside the phase after the release still counts: 4 -> 13 -> 4 GiB reserved, the
    # driver at 12 + 9 = 21 for a moment, 12 at the end
    stats.update(used=12 * GIB, reserved=4 * GIB)
    with mem.phase("update"):
        stats.update(peak_reserved=13 * GIB)
    assert mem.current["update"]["peak_gib"] == 21.0
    # and one above the start's reservation, freed by the end, with nothing released: as before
    stats.update(used=20 * GIB, reserved=12 * GIB)
    with mem.phase("sync"):
        stats.update(peak_reserved=15 * GIB)
    assert mem.current["sync"]["peak_gib"] == 23.0
