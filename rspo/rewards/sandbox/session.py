"""Call sessions: a program loaded once in one sandboxed child that answers framed calls (HumanEval,
MBPP and their plus sets; rspo.rewards.verdict decides, rspo.rewards.sandbox states the isolation)."""

from __future__ import annotations

import json
import os
import selectors
import tempfile
import time
from collections.abc import Sequence

from rspo.rewards.sandbox.backends import UidLease, is_root
from rspo.rewards.sandbox.choice import sandbox_setup
from rspo.rewards.sandbox.launch import launch, teardown
from rspo.rewards.sandbox.limits import DEFAULT_LIMITS, Limits, SandboxSetup


class SessionError(Exception):
    """The solution's process cannot be trusted to answer any more (crash, exit, timeout,
    garbage on the reply pipe, a value that is not plain data, a compile or load error)."""


class CandidateRaised(Exception):
    """The solution's function raised `name` (an Exception subclass) with message `msg`."""

    def __init__(self, name: str, msg: str):
        super().__init__(f"{name}: {msg}")
        self.name = name
        self.msg = msg


_FRAME_BYTES = 64 << 20


class CallSession:
    """Call a sandboxed program's functions from trusted code, one call at a time.

    The program is loaded once in one sandboxed process (harness.py, kind "session"): fresh
    globals, `__name__ == "__rspo_solution__"`, stdin/stdout/stderr on /dev/null. `call(fn,
    args)` sends the arguments (plain data, see harness.encode_value) and returns the reply
    decoded into exact built-in types, or raises CandidateRaised (the function raised an
    Exception) or SessionError (anything else; the session is then dead and every later call
    raises SessionError too). Only a well-formed reply carrying the id of the request just
    sent is accepted; anything else on the pipe (a forged frame, a stray print to fd 4, a
    second reply) breaks the session. The session's total wall-clock time is
    `limits.timeout` from the moment the sandbox is ready (RLIMIT_CPU of the solution's
    process likewise); `call(..., timeout=t)` bounds one call further.

    Nothing but the program and the arguments of each call enters the sandbox: the caller
    keeps the tests, the expected values and the verdict.
    """

    def __init__(
        self,
        code: str,
        *,
        limits: Limits = DEFAULT_LIMITS,
        backend: str | None = None,
        setup: SandboxSetup | None = None,
        frame_bytes: int = _FRAME_BYTES,
    ):
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        self.code = code
        self.limits = limits
        self.frame_bytes = frame_bytes
        self._setup_obj = setup if setup is not None else sandbox_setup(backend)
        self.backend = self._setup_obj.backend
        self._proc = None
        self._lease = None
        self._workdir = None
        self._buf = bytearray()
        self._deadline = None
        self._next_id = 0
        self.broken: str | None = None
        self.calls = 0

    # -- lifecycle
    def __enter__(self) -> CallSession:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        """Launch the sandbox and load the program; SessionError if that fails."""
        from rspo.rewards.harness import pack_frame  # noqa: F401  (same framing both sides)

        limits = self.limits
        spec = {
            "code": self.code,
            "kind": "session",
            "fn_name": None,
            "inputs": [],
            **limits.harness_fields(),
            "frame_bytes": self.frame_bytes,
        }
        self._lease = UidLease() if is_root() else None
        try:
            self._err = tempfile.TemporaryFile()
            self._proc, self._workdir = launch(self._setup_obj, spec, limits, self._lease, stderr=self._err)
            payload = json.dumps(spec).encode("ascii")
            os.set_blocking(self._proc.stdin.fileno(), False)
            os.set_blocking(self._proc.stdout.fileno(), False)
            self._deadline = time.monotonic() + limits.startup_s
            self._write(len(payload).to_bytes(8, "big") + payload)
            first = self._read_frame()
            if first.get("t") == "compile_error":
                self._break(f"syntax error: {first.get('error')}")
            if first.get("t") != "ready":
                self._break("sandbox protocol error (no ready record)")
            self._deadline = time.monotonic() + limits.timeout
            second = self._read_frame()
            if second.get("t") == "load_error":
                self._break(f"error while loading the program: {second.get('error')}")
            if second.get("t") != "loaded":
                self._break(self._ended(second) or "sandbox protocol error (program not loaded)")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        proc, self._proc = self._proc, None
        lease, self._lease = self._lease, None
        workdir, self._workdir = self._workdir, None
        teardown(proc, lease, workdir)
        err = getattr(self, "_err", None)
        if err is not None:
            err.close()
            self._err = None

    # -- calls
    def call(self, fn: str, args: Sequence = (), timeout: float | None = None, kwargs: dict | None = None):
        """fn(*args, **kwargs) in the sandbox; the decoded return value (exact built-in types)."""
        from rspo.rewards.harness import CodecError, decode_value, encode_value, pack_frame

        if self.broken is not None:
            raise SessionError(self.broken)
        if self._proc is None:
            raise SessionError("session not started")
        self._next_id += 1
        rid = self._next_id
        self.calls += 1
        try:
            tree = encode_value(tuple(args))
            ktree = encode_value(dict(kwargs)) if kwargs else None
        except CodecError as exc:  # the caller's own arguments: not the solution's fault
            raise ValueError(f"arguments of {fn} are not plain data: {exc}") from exc
        old = self._deadline
        if timeout is not None:
            self._deadline = min(old, time.monotonic() + timeout)
        try:
            req = {"id": rid, "fn": fn, "args": tree}
            if ktree is not None:
                req["kwargs"] = ktree
            self._write(pack_frame(req))
            rep = self._read_frame()
        finally:
            self._deadline = old
        if rep.get("id") != rid or type(rep.get("id")) is not int:
            self._break(self._ended(rep) or "reply to another request on the reply pipe")
        keys = set(rep)
        if keys == {"id", "ok"}:
            try:
                return decode_value(rep["ok"])
            except (CodecError, RecursionError) as exc:
                self._break(f"malformed return value: {exc}")
        if keys == {"id", "exc", "msg"} and type(rep["exc"]) is str and type(rep["msg"]) is str:
            raise CandidateRaised(rep["exc"][:100], rep["msg"][:300])
        if keys == {"id", "bad"} and type(rep["bad"]) is str:
            self._break(f"return value of {fn} is not plain data ({rep['bad'][:200]})")
        self._break("malformed reply on the reply pipe")

    # -- plumbing
    def _break(self, why: str):
        if self.broken is None:
            self.broken = why
        self.close()
        raise SessionError(self.broken)

    @staticmethod
    def _ended(rec: dict) -> str | None:
        if rec.get("t") == "exit":
            how = str(rec.get("how", "?"))[:200]
            return "timeout" if how == "timeout" else f"the program's process ended ({how})"
        return None

    def _left(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            self._break("timeout")
        return left

    def _write(self, data: bytes) -> None:
        fd = self._proc.stdin.fileno()
        view = memoryview(data)
        while view:
            try:
                n = os.write(fd, view[: 1 << 20])
                view = view[n:]
                continue
            except BlockingIOError:
                pass
            except OSError:
                self._break(self._drain_end() or "the program's process ended (broken pipe)")
            sel = selectors.DefaultSelector()
            try:
                sel.register(fd, selectors.EVENT_WRITE)
                sel.select(timeout=min(self._left(), 1.0))
            finally:
                sel.close()

    def _drain_end(self) -> str | None:
        try:
            while True:
                rec = self._read_frame(quiet=True)
                why = self._ended(rec) if isinstance(rec, dict) else None
                if why:
                    return why
        except SessionError:
            return None

    def _read_frame(self, quiet: bool = False) -> dict:
        fd = self._proc.stdout.fileno()
        while True:
            if len(self._buf) >= 4:
                n = int.from_bytes(self._buf[:4], "big")
                if n > self.frame_bytes:
                    self._break("sandbox protocol error (frame too long)")
                if len(self._buf) >= 4 + n:
                    body = bytes(self._buf[4 : 4 + n])
                    del self._buf[: 4 + n]
                    try:
                        rec = json.loads(body.decode("utf-8"))
                    except (ValueError, RecursionError):
                        self._break("garbage on the reply pipe")
                    if not isinstance(rec, dict):
                        self._break("garbage on the reply pipe")
                    return rec
            left = 0.2 if quiet else self._left()
            sel = selectors.DefaultSelector()
            try:
                sel.register(fd, selectors.EVENT_READ)
                ready = sel.select(timeout=min(left, 1.0))
            finally:
                sel.close()
            if not ready:
                if quiet:
                    raise SessionError("no more records")
                continue
            try:
                chunk = os.read(fd, 1 << 20)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                self._break("the program's process ended (no reply)")
            self._buf += chunk
