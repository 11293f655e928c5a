"""A process pool whose items each have a deadline; a hung or crashed worker is replaced.

Why not `concurrent.futures.ProcessPoolExecutor` or `multiprocessing.Pool`: neither can
stop ONE running item. A sympy call that never returns keeps a `Pool` worker forever, and
killing a `ProcessPoolExecutor` worker breaks the whole executor (`BrokenProcessPool`).
`TimeoutPool` owns its workers directly:

- Workers are fresh interpreters (`subprocess.Popen([sys.executable, "-c", ...])` with the
  parent's sys.path, talking pickles over a socketpair): no fork of a parent that may hold
  torch/tokenizer threads, and unlike multiprocessing's "spawn" no re-import of the
  caller's `__main__` (a plain script without an `if __name__ == "__main__":` guard
  works). They are long-lived and run `module:function` (resolved once per worker).
- Soft deadline: the worker arms `setitimer(ITIMER_REAL, timeout)`; the SIGALRM handler
  raises `SoftTimeout` (a BaseException, so `except Exception` blocks in the called code
  do not swallow it). The worker survives and the item's outcome is "timeout".
- Hard deadline: if no answer arrives `grace` seconds after the soft one (C code that
  never returns to the interpreter, a handler swallowed by a bare `except:`, a stopped
  process), the dispatcher SIGKILLs the worker, records "timeout" and starts a
  replacement. A worker that dies (segfault, os._exit, OOM kill) gives "crash".
- A worker is retired (and replaced) after `max_tasks_per_child` items, bounding
  leaks (sympy caches grow).
- One dispatcher thread serves every caller, so `submit`/`map` are thread-safe and
  concurrent callers share the workers. Items are dispatched in submission order.
- If three workers in a row die before finishing any item (the target cannot be
  imported, for instance), the pool is marked broken and pending items fail with
  RuntimeError instead of respawning forever.

The called function runs in the MAIN thread of its worker process, so libraries that
rely on `signal.alarm` (math-verify) work there, but they must not set their own
SIGALRM timers while the soft deadline is armed (one process has one real-time timer):
the math reward passes `timeout_seconds=None` to math-verify inside workers.
"""

from __future__ import annotations

import atexit
import collections
import importlib
import json
import multiprocessing.connection
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

__all__ = ["Outcome", "SoftTimeout", "TimeoutPool", "resolve_target"]


class SoftTimeout(BaseException):
    """Raised inside a worker by its SIGALRM handler when an item exceeds its deadline."""


@dataclass(frozen=True)
class Outcome:
    """Result of one item.

    status: "ok" (value holds the return value), "error" (the function raised; detail holds
    "ExcType: message"), "timeout" (soft or hard deadline passed), "crash" (the worker
    process died; detail holds its exit code or signal).
    """

    status: str
    value: Any = None
    detail: str = ""


def resolve_target(target: str) -> Callable[..., Any]:
    """Import "package.module:function" and return the function."""
    if not isinstance(target, str) or target.count(":") != 1:
        raise ValueError(f"target must look like 'package.module:function', got {target!r}")
    module_name, attr = target.split(":")
    fn = importlib.import_module(module_name)
    for part in attr.split("."):
        fn = getattr(fn, part)
    if not callable(fn):
        raise ValueError(f"target {target!r} is not callable")
    return fn


_READY = "__ready__"


def _on_alarm(signum, frame):  # pragma: no cover - runs in worker processes
    raise SoftTimeout()


_BOOT = (
    "import json, sys; sys.path[:0] = json.loads(sys.argv[3]); "
    "from rspo.rewards.pool import _worker_entry; _worker_entry(int(sys.argv[1]), sys.argv[2])"
)


def _worker_entry(fd: int, target: str) -> None:  # pragma: no cover - runs in worker processes
    _worker_main(multiprocessing.connection.Connection(fd), target)


def _worker_main(conn, target: str) -> None:  # pragma: no cover - runs in worker processes
    """Worker loop: receive (task_id, args, timeout), answer (task_id, status, value, detail)."""
    # The dispatcher kills us on hard timeouts; ignore Ctrl-C so a terminal interrupt of the
    # parent does not print a traceback per worker (the parent's exit closes our pipe).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fn = resolve_target(target)
    signal.signal(signal.SIGALRM, _on_alarm)
    conn.send(_READY)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        task_id, args, timeout = msg
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, max(float(timeout), 1e-3))
                value = fn(*args)
                signal.setitimer(signal.ITIMER_REAL, 0)
                reply = (task_id, "ok", value, "")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except SoftTimeout:
            reply = (task_id, "timeout", None, "soft deadline")
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            reply = (task_id, "error", None, f"{type(exc).__name__}: {exc}"[:2000])
        try:
            conn.send(reply)
        except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable return value
            try:
                conn.send((task_id, "error", None, f"cannot send result: {exc}"[:2000]))
            except Exception:  # noqa: BLE001
                return


@dataclass
class _Task:
    task_id: int
    args: tuple
    timeout: float
    future: Future


class _Worker:
    def __init__(self, target: str):
        ours, theirs = socket.socketpair()
        try:
            fd = theirs.fileno()
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(fd), target, json.dumps(sys.path)],
                pass_fds=[fd],
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()  # keep only our end, so the worker's death reads as EOF
        self.conn = multiprocessing.connection.Connection(ours.detach())
        self.ready = False  # set when the worker has imported its target
        self.task: _Task | None = None
        self.deadline = 0.0  # hard deadline (monotonic) of the current task
        self.done = 0  # items finished by this worker

    def join(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        try:
            self.proc.kill()
        except Exception:  # noqa: BLE001 - already gone
            pass
        self.join(5)
        self.conn.close()

    def exit_reason(self) -> str:
        self.join(5)
        code = self.proc.returncode
        if code is None:
            return "worker did not exit"
        if code < 0:
            try:
                return f"worker killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"worker killed by signal {-code}"
        return f"worker exited with code {code}"


class TimeoutPool:
    """`workers` spawned processes running `target` ("module:function") with per-item deadlines.

    >>> pool = TimeoutPool("math:sqrt", workers=2)
    >>> [o.value for o in pool.map([(4.0,), (9.0,)], timeout=5)]
    [2.0, 3.0]
    >>> pool.close()
    """

    def __init__(
        self,
        target: str,
        workers: int,
        *,
        grace: float = 2.0,
        max_tasks_per_child: int = 2000,
    ):
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be a positive int, got {workers!r}")
        if grace <= 0:
            raise ValueError(f"grace must be > 0, got {grace!r}")
        if max_tasks_per_child < 1:
            raise ValueError(f"max_tasks_per_child must be >= 1, got {max_tasks_per_child!r}")
        if not isinstance(target, str) or target.count(":") != 1:
            raise ValueError(f"target must look like 'package.module:function', got {target!r}")
        self.target = target
        self.n_workers = workers
        self.grace = float(grace)
        self.max_tasks_per_child = max_tasks_per_child
        self._lock = threading.Lock()
        self._queue: collections.deque[_Task] = collections.deque()
        self._next_id = 0
        self._closed = False
        self._broken: str | None = None
        self._startup_failures = 0
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._wake_lock = threading.Lock()
        self._fds_open = True
        self._workers: list[_Worker] = []
        self._thread = threading.Thread(target=self._run, name="TimeoutPool-dispatcher", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # ---------------------------------------------------------------- public API
    def submit(self, args: Sequence[Any], timeout: float) -> Future:
        """Queue one call `target(*args)`; the Future resolves to an Outcome."""
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        fut: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("TimeoutPool is closed")
            if self._broken:
                raise RuntimeError(self._broken)
            self._queue.append(_Task(self._next_id, tuple(args), float(timeout), fut))
            self._next_id += 1
        self._wake()
        return fut

    def map(self, arg_list: Sequence[Sequence[Any]], timeout: float) -> list[Outcome]:
        """Run every item; returns one Outcome per item, in order."""
        futures = [self.submit(args, timeout) for args in arg_list]
        return [f.result() for f in futures]

    def close(self) -> None:
        """Stop the dispatcher and the workers; pending items fail with RuntimeError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake()
        self._thread.join(30)
        try:
            atexit.unregister(self.close)
        except Exception:  # noqa: BLE001
            pass

    @property
    def alive(self) -> bool:
        return not self._closed and self._broken is None and self._thread.is_alive()

    # ---------------------------------------------------------------- dispatcher
    def _wake(self) -> None:
        with self._wake_lock:
            if not self._fds_open:
                return
            try:
                os.write(self._wake_w, b"x")
            except (BlockingIOError, OSError):
                pass  # the pipe is full, so the dispatcher is awake anyway

    def _spawn(self) -> _Worker:
        return _Worker(self.target)

    def _finish(self, w: _Worker, outcome: Outcome) -> None:
        task, w.task = w.task, None
        if task is not None and not task.future.done():
            task.future.set_result(outcome)

    def _replace(self, w: _Worker) -> None:
        w.kill()
        if not w.ready:
            self._startup_failures += 1
        self._workers.remove(w)
        if self._startup_failures >= 3:
            self._broken = (
                f"TimeoutPool({self.target!r}) is broken: 3 workers in a row died before "
                f"importing their target ({w.exit_reason()})"
            )
            return
        if not self._closed:
            self._workers.append(self._spawn())

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - never leave callers waiting
            self._broken = f"TimeoutPool dispatcher died: {exc!r}\n{traceback.format_exc()}"
        finally:
            self._shutdown()

    def _loop(self) -> None:
        while True:
            with self._lock:
                if self._closed or self._broken:
                    return
            while len(self._workers) < self.n_workers:
                self._workers.append(self._spawn())
            # Retire idle workers that reached their task budget.
            for w in list(self._workers):
                if w.task is None and w.done >= self.max_tasks_per_child:
                    try:
                        w.conn.send(None)
                    except Exception:  # noqa: BLE001
                        pass
                    w.join(5)
                    self._workers.remove(w)
                    w.kill()
                    self._workers.append(self._spawn())
            # Hand queued items to idle workers.
            for w in self._workers:
                if w.task is not None or not w.ready:
                    continue
                with self._lock:
                    task = self._queue.popleft() if self._queue else None
                if task is None:
                    break
                if not task.future.set_running_or_notify_cancel():
                    continue
                w.task = task
                w.deadline = time.monotonic() + task.timeout + self.grace
                try:
                    w.conn.send((task.task_id, task.args, task.timeout))
                except (OSError, EOFError, BrokenPipeError):
                    self._finish(w, Outcome("crash", None, w.exit_reason()))
                    self._replace(w)
                    break  # the worker list changed; restart the pass
                except Exception as exc:  # noqa: BLE001 - e.g. unpicklable arguments
                    w.task = None
                    task.future.set_exception(exc)
            listening = [w for w in self._workers if w.task is not None or not w.ready]
            now = time.monotonic()
            wait_s = min((w.deadline - now for w in listening if w.task is not None), default=None)
            if wait_s is not None:
                wait_s = max(wait_s, 0.0)
            handles = [self._wake_r] + [w.conn for w in listening]
            ready = multiprocessing.connection.wait(handles, timeout=wait_s)
            if self._wake_r in ready:
                try:
                    os.read(self._wake_r, 65536)
                except BlockingIOError:
                    pass
            for w in listening:
                if w.conn not in ready:
                    continue
                try:
                    msg = w.conn.recv()
                except (EOFError, OSError):
                    self._finish(w, Outcome("crash", None, w.exit_reason()))
                    self._replace(w)
                    continue
                except Exception as exc:  # noqa: BLE001 - unpickling failed
                    self._finish(w, Outcome("error", None, f"cannot read result: {exc}"))
                    continue
                if msg == _READY:
                    w.ready = True
                    self._startup_failures = 0
                    continue
                task_id, status, value, detail = msg
                w.done += 1
                if w.task is not None and w.task.task_id == task_id:
                    self._finish(w, Outcome(status, value, detail))
            now = time.monotonic()
            for w in list(self._workers):
                if w.task is not None and now >= w.deadline:
                    self._finish(w, Outcome("timeout", None, "hard deadline: worker killed"))
                    self._replace(w)

    def _shutdown(self) -> None:
        reason = self._broken or "TimeoutPool is closed"
        for w in self._workers:
            if w.task is not None and not w.task.future.done():
                w.task.future.set_exception(RuntimeError(reason))
                w.task = None
            try:
                w.conn.send(None)
            except Exception:  # noqa: BLE001
                pass
        deadline = time.monotonic() + 2.0
        for w in self._workers:
            w.join(max(deadline - time.monotonic(), 0.0))
            w.kill()
        self._workers = []
        with self._lock:
            queued, self._queue = list(self._queue), collections.deque()
            self._closed = True
        for task in queued:
            if not task.future.done():
                task.future.set_exception(RuntimeError(reason))
        with self._wake_lock:
            self._fds_open = False
            for fd in (self._wake_r, self._wake_w):
                try:
                    os.close(fd)
                except OSError:
                    pass
