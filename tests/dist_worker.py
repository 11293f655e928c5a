"""`rspo train` (the real CLI) with the dense digit reward of tests/test_train.py, so a random tiny
model gets non-zero advantages. Run it with plain python (one process) or under torchrun."""

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


if __name__ == "__main__":
    from rspo.train.cli import main

    trainer.get_task = digit_task
    sys.exit(main(sys.argv[1:]))
