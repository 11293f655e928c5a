"""One sandboxed process: its spec, launch, watch and teardown, and the cases of one program
(``run_python``; rspo.rewards.sandbox states the isolation)."""

from __future__ import annotations

import functools
import json
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time

from rspo.rewards.sandbox.backends import (
    UidLease,
    bwrap_argv,
    is_root,
    kill_uid,
    minimal_env,
    unshare_argv,
    user_thread_count,
)
from rspo.rewards.sandbox.limits import CaseResult, Limits, RunResult, SandboxSetup

_STDERR_KEEP = 8192


# ----------------------------------------------------------------------------- harness
# The program run INSIDE the sandbox is rspo/rewards/harness.py, passed as `python -I -B -c
# <its text>` (the file need not be visible inside the sandbox). It writes records on a
# private dup of fd 1; fd 1 itself is /dev/null.
@functools.lru_cache(maxsize=1)
def harness_source() -> str:
    """Text of rspo/rewards/harness.py, the program the sandbox runs."""
    from rspo.rewards import harness

    with open(harness.__file__, encoding="utf-8") as f:
        return f.read()


def _rmtree(path: str) -> None:
    def onerror(func, p, exc_info):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=onerror)


def run_spec(setup: SandboxSetup, code, kind, inputs, fn_name, limits: Limits, on_case) -> RunResult:
    spec = {
        "code": code,
        "kind": kind,
        "fn_name": fn_name,
        "inputs": [list(x) if isinstance(x, tuple) else x for x in inputs],
        **limits.harness_fields(),
    }
    lease = UidLease() if is_root() else None
    workdir = None
    proc = None
    cases: list[CaseResult] = []
    compile_error = failure = None
    stopped = False
    try:
        proc, workdir = launch(setup, spec, limits, lease, stderr=subprocess.PIPE)
        payload = json.dumps(spec).encode("ascii")
        payload = len(payload).to_bytes(8, "big") + payload
        line_cap = 6 * limits.output_bytes + (1 << 20)
        sel = selectors.DefaultSelector()
        os.set_blocking(proc.stdin.fileno(), False)
        os.set_blocking(proc.stdout.fileno(), False)
        os.set_blocking(proc.stderr.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE, "in")
        sel.register(proc.stdout, selectors.EVENT_READ, "out")
        sel.register(proc.stderr, selectors.EVENT_READ, "err")
        view = memoryview(payload)
        buf = bytearray()
        err_tail = bytearray()
        done = False
        deadline = time.monotonic() + limits.startup_s
        n_expected = len(inputs)
        while not done:
            left = deadline - time.monotonic()
            if left <= 0:
                i = len(cases)
                if i < n_expected:
                    cr = CaseResult(i, "timeout", error="sandbox deadline (harness unresponsive)")
                    cases.append(cr)
                    if on_case is not None:
                        on_case(cr)
                failure = "timeout"
                break
            events = sel.select(timeout=min(left, 1.0))
            if not sel.get_map():
                break
            for key, _ in events:
                if key.data == "in":
                    try:
                        n = os.write(key.fd, view[:65536])
                        view = view[n:]
                    except BlockingIOError:
                        continue
                    except (BrokenPipeError, OSError):
                        view = view[:0]
                    if not view:
                        sel.unregister(proc.stdin)
                        proc.stdin.close()
                elif key.data == "err":
                    try:
                        chunk = os.read(key.fd, 65536)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        sel.unregister(proc.stderr)
                        continue
                    err_tail += chunk
                    del err_tail[:-_STDERR_KEEP]
                else:
                    try:
                        chunk = os.read(key.fd, 1 << 20)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        sel.unregister(proc.stdout)
                        done = True
                        continue
                    buf += chunk
                    while True:
                        nl = buf.find(b"\n")
                        if nl < 0:
                            break
                        line = bytes(buf[:nl])
                        del buf[: nl + 1]
                        try:
                            rec = json.loads(line)
                        except ValueError:
                            failure = "sandbox protocol error"
                            done = True
                            break
                        t = rec.get("t")
                        if t == "ready":
                            deadline = time.monotonic() + limits.timeout + 2.0
                        elif t == "compile_error":
                            compile_error = str(rec.get("error"))
                        elif t == "done":
                            done = True
                            break
                        elif t == "case":
                            cr = CaseResult(
                                index=int(rec["i"]),
                                status=str(rec["status"]),
                                stdout=rec.get("stdout", ""),
                                value=rec.get("value"),
                                error=str(rec.get("error", "")),
                                time_s=float(rec.get("time", 0.0)),
                            )
                            cases.append(cr)
                            deadline = time.monotonic() + limits.timeout + 2.0
                            if on_case is not None and on_case(cr) is False:
                                stopped = done = True
                                break
                    if len(buf) > line_cap:
                        failure = "sandbox protocol error (record too long)"
                        done = True
                if done:
                    break
        sel.close()
        if not stopped and failure is None and compile_error is None and len(cases) < n_expected:
            # The harness died (a case killed it, or the sandbox failed to start).
            rc = proc.poll()
            if rc is None:
                try:
                    rc = proc.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    rc = None
            why = err_tail.decode("utf-8", "replace").strip().splitlines()
            how = f"exit code {rc}"
            if rc is not None and rc < 0:
                try:
                    how = f"killed by {signal.Signals(-rc).name}"
                except ValueError:
                    how = f"killed by signal {-rc}"
            failure = f"sandbox process ended early ({how})" + (f": {why[-1][:300]}" if why else "")
        return RunResult(setup.backend, cases, compile_error, failure, stopped)
    finally:
        teardown(proc, lease, workdir)


def launch(setup: SandboxSetup, spec: dict, limits: Limits, lease, stderr) -> tuple[subprocess.Popen, str | None]:
    """Start the harness under the backend; (process, host working directory or None)."""
    root = lease is not None
    workdir = None
    harness = ["-I", "-B", "-c", harness_source()]
    popen_kw: dict = {}
    if setup.backend == "bwrap":
        argv = bwrap_argv(setup.python, setup.binds, limits) + harness
        cwd, env = "/", minimal_env("/tmp")
        if root:
            popen_kw = dict(user=lease.uid, group=lease.uid, extra_groups=[])
    else:
        workdir = tempfile.mkdtemp(prefix="rspo-sbx-")
        if root:
            os.chown(workdir, lease.uid, lease.uid)
        os.chmod(workdir, 0o700)
        cwd, env = workdir, minimal_env(workdir)
        if setup.backend == "unshare":
            argv = unshare_argv(setup.python, lease.uid) + harness
        else:
            argv = [setup.python] + harness
            if root:
                popen_kw = dict(user=lease.uid, group=lease.uid, extra_groups=[])
            else:
                spec["nproc"] = user_thread_count() + limits.nproc
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=cwd,
            env=env,
            start_new_session=True,
            close_fds=True,
            **popen_kw,
        )
    except BaseException:
        if workdir is not None:
            _rmtree(workdir)
        raise
    return proc, workdir


def teardown(proc, lease, workdir) -> None:
    """Kill the sandbox's group, every process of its private uid, remove its directory."""
    if proc is not None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    if lease is not None:
        kill_uid(lease.uid)
        lease.release()
    if workdir is not None:
        _rmtree(workdir)


# ----------------------------------------------------------------------------- call sessions
