"""How the library runs one of its own commands in a fresh process (a sweep's data, pretraining and
training, the data-parallel benchmark): the argument vector of ``python -m rspo <command> ...`` built
in one place, so a flag is spelt once (``base_model=...`` -> ``--base-model ...``)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

__all__ = ["rspo_argv"]


def rspo_argv(
    command: str, *words: str, sets: Iterable[str] = (), launcher: Iterable[str] = (), **flags: Any
) -> list[str]:
    """``[python, *launcher, -m, rspo, command, *words, --flag value ..., --set s ...]``: a flag whose
    value is True is written bare, one that is None or False is left out; ``launcher``: the arguments
    of a module run first (``-m torch.distributed.run --nproc-per-node 2``)."""
    argv = [sys.executable, *launcher, "-m", "rspo", command, *words]
    for name, value in flags.items():
        if value is None or value is False:
            continue
        argv.append("--" + name.replace("_", "-"))
        if value is not True:
            argv.append(str(value))
    for s in sets:
        argv += ["--set", s]
    return argv
