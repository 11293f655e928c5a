"""`rspo train` (the real CLI) with the dense digit reward of tests/test_train.py, so a random tiny
model gets non-zero advantages. Run it with plain python (one process) or under torchrun.

With RSPO_TEST_MEMORY=<prefix>, each rank writes <prefix>.rank<r>.json: for the checkpoint
resume, each save and the final checkpoint, the resident memory before (MiB) and the peak during
(the kernel's high-water mark, reset before each phase); the final checkpoint is then written in
files of at most RSPO_TEST_FINAL_SHARD_BYTES.

With RSPO_TEST_FAIL_RANK=<r>, rank r raises in its first update of step 1 while a thread it started
is still running (as a reward pool or an engine thread would be), which alone keeps a Python
process alive after its main thread raised. With RSPO_TEST_SLOW_RANK=<s> as well, rank s computes
for 30 s (no collective) before that update: torchrun's SIGTERM reaches it before any collective
could break."""

import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import rspo.train.trainer as trainer  # noqa: E402
from rspo.tasks import Task, get_task  # noqa: E402


def digit_task(name: str, prompt_format: str = "steps") -> Task:
    base = get_task(name, prompt_format)

    def score_batch(completions, records, workers):
        return [(sum(ch.isdigit() for ch in c) / max(1, len(c)), "digits") for c in completions]

    return Task("countdown-digits", base.load, base.prompt, score_batch)


def _rss_mib() -> tuple[float, float]:
    status = Path("/proc/self/status").read_text()
    return tuple(int(re.search(rf"{k}:\s+(\d+)", status).group(1)) / 1024 for k in ("VmRSS", "VmHWM"))


def probe_memory(prefix: str) -> None:
    """Record the peak resident memory of each checkpoint phase of every rank."""
    import rspo.train.checkpoint as checkpoint

    checkpoint.FINAL_SHARD_BYTES = int(os.environ.get("RSPO_TEST_FINAL_SHARD_BYTES", checkpoint.FINAL_SHARD_BYTES))
    rows: list[dict] = []

    def wrap(name):
        real = getattr(trainer.Trainer, name)

        def measured(self, *args, **kwargs):
            Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark
            before, _ = _rss_mib()
            out = real(self, *args, **kwargs)
            rows.append({"phase": name, "before_mib": before, "peak_mib": _rss_mib()[1]})
            Path(f"{prefix}.rank{self.dist.rank}.json").write_text(json.dumps(rows))
            return out

        setattr(trainer.Trainer, name, measured)

    for name in ("load_checkpoint", "save_checkpoint", "save_final"):
        wrap(name)


def fail_on_rank(rank: int, slow_rank: int | None = None) -> None:
    import threading
    import time

    from rspo.train import update

    real = update.update_mini_batch

    def failing(policy, *args, step, **kwargs):
        if policy.dist.rank == rank and step == 1:
            threading.Thread(target=time.sleep, args=(600,)).start()
            raise ValueError("reward worker crashed (test)")
        if policy.dist.rank == slow_rank and step == 1:
            time.sleep(30)
        return real(policy, *args, step=step, **kwargs)

    update.update_mini_batch = failing


if __name__ == "__main__":
    from rspo.commands.train import main

    assert hasattr(trainer, "task_for"), "rspo.train.trainer no longer builds its task with task_for"
    trainer.task_for = lambda cfg_data, tokenizer: digit_task(cfg_data.task, cfg_data.prompt_format)
    if os.environ.get("RSPO_TEST_FAIL_RANK"):
        slow = os.environ.get("RSPO_TEST_SLOW_RANK")
        fail_on_rank(int(os.environ["RSPO_TEST_FAIL_RANK"]), None if slow is None else int(slow))
    if os.environ.get("RSPO_TEST_MEMORY"):
        probe_memory(os.environ["RSPO_TEST_MEMORY"])
    sys.exit(main(sys.argv[1:]))
