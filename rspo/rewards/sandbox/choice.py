"""Which isolation a process uses, chosen once by running a tiny program through each backend in
turn (``sandbox_setup``), and the entry point that runs a program's cases with it (``run_python``);
rspo.rewards.sandbox states the isolation."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Sequence

from rspo.rewards.sandbox.backends import BACKENDS, SYS_PATH, candidate_pythons, interpreter_paths, is_root
from rspo.rewards.sandbox.launch import run_spec
from rspo.rewards.sandbox.limits import DEFAULT_LIMITS, CaseResult, Limits, RunResult, SandboxSetup


def probe(backend: str, python: str, binds: tuple[str, ...]) -> str | None:
    """Run a tiny program through the real path; None if it works, else why not."""
    setup = SandboxSetup(backend, python, binds, ())
    try:
        res = run_spec(setup, "print(int(input()) + 1)", "stdin", ["41"], None, Limits(timeout=10.0), None)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    if res.failure or res.compile_error or len(res.cases) != 1:
        return res.failure or res.compile_error or "no result"
    c = res.cases[0]
    if c.status != "ok" or c.stdout.strip() != "42":
        return f"probe case {c.status}: {c.error or c.stdout[:200]}"
    return None


_SETUPS: dict[str, SandboxSetup] = {}
_SETUP_LOCK = threading.Lock()


def sandbox_setup(backend: str | None) -> SandboxSetup:
    want = backend or os.environ.get("RSPO_SANDBOX_BACKEND") or "auto"
    if want not in BACKENDS + ("auto",):
        raise ValueError(f"sandbox backend must be one of {BACKENDS} or 'auto', got {want!r}")
    with _SETUP_LOCK:
        if want in _SETUPS:
            return _SETUPS[want]
        order = list(BACKENDS) if want == "auto" else [want]
        notes = []
        for b in order:
            if b == "bwrap" and not shutil.which("bwrap", path=SYS_PATH):
                notes.append("bwrap: not installed (scripts/install_sandbox.sh)")
                continue
            if b == "unshare" and not (is_root() and shutil.which("unshare", path=SYS_PATH)):
                notes.append("unshare: needs root and util-linux unshare")
                continue
            for py in candidate_pythons():
                binds = interpreter_paths(py)
                if binds is None:
                    notes.append(f"{b}: {py} does not run")
                    continue
                why = probe(b, py, tuple(binds) if b == "bwrap" else ())
                if why is None:
                    s = SandboxSetup(b, py, tuple(binds) if b == "bwrap" else (), tuple(notes))
                    _SETUPS[want] = s
                    return s
                notes.append(f"{b} with {py}: {why.strip().splitlines()[-1][:300] if why.strip() else why}")
        raise RuntimeError("no working sandbox backend: " + "; ".join(notes))


def sandbox_backend(backend: str | None = None) -> str:
    """Isolation in use: "bwrap", "unshare" or "rlimits" (see the module docstring)."""
    return sandbox_setup(backend).backend


def sandbox_info(backend: str | None = None) -> dict:
    """Backend, interpreter, uid policy and why stronger backends were skipped."""
    s = sandbox_setup(backend)
    return {
        "backend": s.backend,
        "python": s.python,
        "python_binds": list(s.binds),
        "uid": "private uid per run" if is_root() else f"same user ({os.getuid()})",
        "skipped": list(s.notes),
    }


def run_python(
    code: str,
    kind: str,
    inputs: Sequence,
    *,
    fn_name: str | None = None,
    limits: Limits = DEFAULT_LIMITS,
    on_case: Callable[[CaseResult], bool] | None = None,
    backend: str | None = None,
) -> RunResult:
    """Run `code` on every input in the sandbox; one CaseResult per case, in order.

    kind "stdin": inputs are strings fed as standard input; CaseResult.stdout holds the output.
    kind "functional": inputs are lists of positional arguments for `fn_name` (a top-level
    function, else `Solution().fn_name`); CaseResult.value holds the JSON of the return value.
    on_case(result) is called as each case finishes; returning False stops the run (the
    sandbox is killed and RunResult.stopped is True).
    """
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    if kind not in ("stdin", "functional"):
        raise ValueError(f"kind must be 'stdin' or 'functional', got {kind!r}")
    if kind == "functional" and not (isinstance(fn_name, str) and fn_name.isidentifier()):
        raise ValueError(f"functional tests need fn_name, a Python identifier, got {fn_name!r}")
    inputs = list(inputs)
    for i, inp in enumerate(inputs):
        if kind == "stdin" and not isinstance(inp, str):
            raise ValueError(f"stdin case {i}: input must be a str, got {type(inp).__name__}")
        if kind == "functional" and not isinstance(inp, (list, tuple)):
            raise ValueError(f"functional case {i}: input must be a list of arguments, got {type(inp).__name__}")
    if not isinstance(limits, Limits):
        raise TypeError("limits must be a rspo.rewards.sandbox.Limits")
    return run_spec(sandbox_setup(backend), code, kind, inputs, fn_name, limits, on_case)
