"""Run untrusted Python programs against test inputs, isolated from the evaluator.

One sandboxed process per PROGRAM (not per case): a small trusted harness (rspo/rewards/harness.py,
run with `python -I -B -c`) reads the program and every case input from its stdin,
compiles the program once, pre-imports the modules it imports, then FORKS ONE CHILD PER
CASE. Each child gets fresh globals (LiveCodeBench's import prelude, `__name__ ==
"__main__"`), its case input as fd 0 (a memfd, so `input()`, `sys.stdin.buffer.read()` and
`open(0)` all work), its own stdout/stderr memfds, a new process group, RLIMIT_CPU and
RLIMIT_FSIZE; the harness kills the group at the case's wall-clock timeout. Cases are thus
independent (no state leaks between them) while the interpreter starts only once per
program. The harness streams one JSON record per case back on a pipe the children cannot
reach; the EXPECTED outputs never enter the sandbox (they are compared by the caller), so a
program cannot read them from memory. The caller may stop early (first failure) and the
whole sandbox is then killed.

Call sessions (`CallSession`, harness kind "session"): for benchmarks whose checks are code
(HumanEval, MBPP, HumanEval+/MBPP+), the program is loaded once in ONE forked child that then
answers calls: framed requests (function name + arguments in a plain-data codec) on fd 3,
framed replies on fd 4, fds 0-2 on /dev/null. The checks and the verdict stay with the caller
(rspo/rewards/verdict.py); only well-formed replies to the pending request are accepted and
values are decoded into exact built-in types, so the solution cannot forge a pass by writing
on any fd, exiting, or returning objects that lie about equality. The whole session has one
wall-clock budget (`Limits.timeout`) and RLIMIT_CPU of ceil(timeout)+1 s.

Isolation, chosen once per process by `sandbox_backend()` (override with the environment
variable RSPO_SANDBOX_BACKEND=bwrap|unshare|rlimits or the `backend=` argument):

1. "bwrap" (bubblewrap found and working; install with scripts/install_sandbox.sh):
   `bwrap --unshare-all --unshare-user --disable-userns --die-with-parent --new-session`,
   read-only binds of /usr (and /bin, /lib*, /sbin as on the host), of a few files of /etc
   (ld.so cache, localtime) and of the interpreter's prefix when it is outside /usr; fresh
   /proc and /dev; the only writable place is a tmpfs at /tmp (size `disk_mb`), also the
   working directory; `--clearenv` plus a minimal environment.
   Protected: network (own empty net namespace: no route to the host's 127.0.0.1 either),
   host files (nothing else is mounted; nothing is writable but the tmpfs), other
   processes (own PID namespace: no signal can reach the evaluator, and the whole tree
   dies with bwrap), IPC, hostname, environment variables, nested user namespaces.
2. "unshare" (no usable bwrap, running as root, util-linux `unshare` present):
   `unshare --net --ipc --uts --pid --fork --kill-child --mount-proc --setuid U --setgid U`
   with a fresh host temporary directory (mode 700, owned by U) as working directory.
   Protected: network, other processes (PID namespace), IPC, environment. NOT protected:
   the host file system is visible with the permissions of an unprivileged stranger:
   world-readable files can be read (including, for a reward, any world-readable copy of
   the benchmark's expected outputs: keep test data in directories without o+rx) and
   world-writable directories (/tmp, /dev/shm, /var/tmp) can be written (sticky bits
   still protect other users' files there).
3. "rlimits" (neither of the above): a plain subprocess in a new session with a minimal
   environment and a fresh temporary working directory. As root it still runs under a
   private uid U (so files of root/other users with usual permissions are protected and
   signals cannot reach the evaluator, and a process that leaves the group is still
   killed by uid), but the NETWORK IS OPEN, IPC is shared and the host file system is
   visible as in 2. As a non-root user, the program runs AS THAT USER: it can read and
   delete the user's files, signal the user's processes (including the evaluator) and use
   the network. Only use this for trusted code.

The unit tests check every available mode (tests/test_sandbox_security.py) against
deleting a file outside, reading the parent's environment, connecting to the host's
127.0.0.1 (bwrap and unshare only), a fork bomb, a 50 GB allocation, an endless loop, a
detached (setsid) process, printing 1 GB, and killing the harness, its group, every
process (kill -1) or the evaluator.

In every mode: the environment is minimal (PATH, HOME, LANG/LC_ALL=C.UTF-8, TMPDIR and
*_NUM_THREADS=1; nothing of the parent's, so its secrets do not leak); rlimits in the
harness (inherited by every case): RLIMIT_AS = `memory_mb`, RLIMIT_NPROC = `nproc`,
RLIMIT_NOFILE = `nofile`, RLIMIT_CORE = 0, RLIMIT_STACK raised to min(256 MiB,
memory_mb/2) (deep recursion; never above the hard limit), and per case RLIMIT_CPU =
ceil(timeout)+1 and RLIMIT_FSIZE = `output_bytes` (caps the captured stdout: a program
printing more is killed by SIGXFSZ at once, and so is a write of a larger file);
PR_SET_NO_NEW_PRIVS (setuid binaries cannot raise privileges) and PR_SET_DUMPABLE=0 (a
case cannot ptrace or open /proc/<harness>/fd of its harness); `start_new_session=True`
and `os.killpg` of the sandbox's group on timeout or early stop. Besides the harness's
per-case timeout, the caller kills the sandbox if the harness is not ready (program
compiled, imports done) within `startup_s` s, or if a case's record does not arrive
within `timeout + 2` s: a stopped or wedged harness costs a "timeout" on the current
case, never a hang.
Private uids: when started as root, each concurrent sandbox runs as its own uid U taken
from RSPO_SANDBOX_UID_BASE (default 1_900_000_000) + 0..4095, leased with flock under
/run/lock/rspo-sandbox (or the temp dir), so RLIMIT_NPROC (counted per uid, or per user
namespace with bwrap) bounds each sandbox separately and, after the run, every process
still owned by U is killed (this catches processes that left the process group with
setsid; in modes 1 and 2 the PID namespace already takes them down). Without root, bwrap
maps the user to itself inside a new user namespace, where RLIMIT_NPROC counts only the
sandbox's processes (Linux >= 5.14 ucounts); in mode 3 without root, RLIMIT_NPROC is set to
the user's current thread count plus `nproc`.
Not bounded in any mode: the TOTAL memory of a sandbox's processes (RLIMIT_AS is per
process, so at most `nproc` x `memory_mb`; no cgroup is used), CPU time shared with the
evaluator, and disk in modes 2 and 3 beyond RLIMIT_FSIZE per file.

Interpreter: the first of $RSPO_SANDBOX_PYTHON, sys.executable and the system python3
that the sandbox user can run under the chosen backend (probed once). When the evaluator
runs as root from a virtualenv under /root (not readable by the sandbox uid), this is the
system /usr/bin/python3, which has only the standard library (and Debian's
dist-packages); `sandbox_info()` reports the choice.

Departures from LiveCodeBench's runner (lcb_runner/evaluation/testing_util.py): LCB runs
all cases in one process, calling the program wrapped as a function with sys.stdin and
builtins.open mocked, and uses signal.alarm per case; here each case is a real process
(fork) with real file descriptors. LCB has no memory cap; the default here is 1 GiB of
address space. LCB's prelude of star-imports and sys.setrecursionlimit(50000) is kept.

Why one file: the isolation is reviewed as one argument, which backend (bubblewrap, unshare, a
leased uid), which limits, how a sandboxed process is launched, watched and torn down, and the
call sessions that reuse that same launch; split, the launch's internals (uid leases, teardown,
the backend's argv) would become public names other modules could call around the checks.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "Limits",
    "CaseResult",
    "RunResult",
    "run_python",
    "sandbox_backend",
    "sandbox_info",
    "BACKENDS",
    "CallSession",
    "CandidateRaised",
    "SessionError",
    "harness_source",
]

BACKENDS = ("bwrap", "unshare", "rlimits")
_SYS_PATH = "/usr/local/bin:/usr/bin:/bin"
_UID_COUNT = 4096
_STDERR_KEEP = 8192


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed program."""

    timeout: float = 6.0
    """Wall-clock seconds per case (LiveCodeBench uses 6); RLIMIT_CPU is ceil(timeout)+1."""
    memory_mb: int = 1024
    """RLIMIT_AS (virtual address space) of each process, MiB."""
    output_bytes: int = 16 << 20
    """RLIMIT_FSIZE per case: largest stdout (and any file) a case may write."""
    nproc: int = 16
    """RLIMIT_NPROC: processes + threads of the sandbox (fork bombs stop here)."""
    nofile: int = 256
    """RLIMIT_NOFILE: open file descriptors per process."""
    disk_mb: int = 64
    """Size of the writable tmpfs at /tmp (bwrap only)."""
    startup_s: float = 15.0
    """Seconds allowed for the sandbox and harness to start (interpreter, pre-imports)."""

    def __post_init__(self):
        for name in ("timeout", "startup_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"Limits.{name} must be a positive number, got {v!r}")
        for name in ("memory_mb", "output_bytes", "nproc", "nofile", "disk_mb"):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
                raise ValueError(f"Limits.{name} must be a positive int, got {v!r}")
        if self.nproc < 4:
            raise ValueError(f"Limits.nproc must be >= 4 (harness + case + helpers), got {self.nproc}")
        if self.nofile < 16:
            raise ValueError(f"Limits.nofile must be >= 16, got {self.nofile}")


@dataclass(frozen=True)
class CaseResult:
    """Outcome of one case inside the sandbox (the caller compares outputs).

    status: "ok" (exited normally), "error" (exception or non-zero exit), "timeout",
    "memory" (MemoryError), "output" (output limit exceeded), "signal" (killed by a signal).
    """

    index: int
    status: str
    stdout: str = ""
    value: str | None = None  # functional: JSON text of the return value
    error: str = ""
    time_s: float = 0.0


@dataclass(frozen=True)
class RunResult:
    """All that came back from one sandboxed program."""

    backend: str
    cases: list[CaseResult] = field(default_factory=list)
    compile_error: str | None = None  # "SyntaxError: ... (line 3)"
    failure: str | None = None  # the sandbox itself failed (harness killed, global timeout)
    stopped: bool = False  # the caller's on_case asked to stop


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


# ----------------------------------------------------------------------------- backends
def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _minimal_env(home: str) -> dict[str, str]:
    return {
        "PATH": _SYS_PATH,
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


class _UidLease:
    """A private uid for one sandbox run (root only), leased with flock across processes."""

    _next = 0
    _lock = threading.Lock()

    def __init__(self):
        base = int(os.environ.get("RSPO_SANDBOX_UID_BASE", "1900000000"))
        if not 1000 <= base <= 2**31 - _UID_COUNT - 1:
            raise ValueError(f"RSPO_SANDBOX_UID_BASE must be in [1000, 2^31 - {_UID_COUNT}), got {base}")
        lock_dir = _lock_dir()
        with _UidLease._lock:
            start = _UidLease._next
            _UidLease._next = (_UidLease._next + 1) % _UID_COUNT
        for k in range(_UID_COUNT):
            slot = (start + k) % _UID_COUNT
            path = os.path.join(lock_dir, f"{base + slot}.lock")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    continue
                raise
            self.uid = base + slot
            self._fd = fd
            return
        raise RuntimeError(f"no free sandbox uid in [{base}, {base + _UID_COUNT})")

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # drops the flock
            self._fd = None


@functools.lru_cache(maxsize=1)
def _lock_dir() -> str:
    for parent in ("/run/lock", tempfile.gettempdir()):
        path = os.path.join(parent, "rspo-sandbox")
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            st = os.stat(path)
            if st.st_uid == os.geteuid() and os.access(path, os.W_OK):
                return path
        except OSError:
            continue
    raise RuntimeError("cannot create a lock directory for sandbox uids")


def _kill_uid(uid: int) -> None:
    """SIGKILL every live process whose real uid is `uid` (root only), until none is left.

    Zombies are skipped: they run nothing and are reaped by their (new) parent.
    """
    for _ in range(50):
        found = False
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/status", "rb") as f:
                    state = b""
                    for line in f:
                        if line.startswith(b"State:"):
                            state = line.split()[1]
                        elif line.startswith(b"Uid:"):
                            if int(line.split()[1]) == uid and state not in (b"Z", b"X"):
                                found = True
                                os.kill(int(name), signal.SIGKILL)
                            break
            except (OSError, ValueError, IndexError):
                continue
        if not found:
            return
        time.sleep(0.002)


def _user_thread_count() -> int:
    uid, n = os.getuid(), 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                real_uid, threads = None, 1
                for line in f:
                    if line.startswith(b"Uid:"):
                        real_uid = int(line.split()[1])
                    elif line.startswith(b"Threads:"):
                        threads = int(line.split()[1])
            if real_uid == uid:
                n += threads
        except (OSError, ValueError, IndexError):
            continue
    return n


def _interpreter_paths(python: str) -> list[str] | None:
    """Directories an interpreter needs (prefixes, executable dir), or None if it fails."""
    probe = (
        "import json, os, sys; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, "
        "sys.base_exec_prefix, os.path.dirname(os.path.realpath(sys.executable)), "
        "os.path.dirname(os.path.abspath(sys.executable))]))"
    )
    try:
        out = subprocess.run(
            [python, "-I", "-c", probe], capture_output=True, timeout=30, env=_minimal_env("/"), check=True
        ).stdout
        dirs = json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    keep = []
    for d in sorted({os.path.realpath(p) for p in dirs} | {p for p in dirs}):
        if d.startswith("/usr/") or d == "/usr" or not os.path.isdir(d):
            continue
        if d in ("/", "/root", "/home", "/bin", "/lib", "/lib64", "/sbin"):
            continue
        keep.append(d)
    # Keep only outermost directories.
    out_dirs = [d for d in keep if not any(d != o and d.startswith(o + "/") for o in keep)]
    return out_dirs


def _bwrap_argv(python: str, binds: Sequence[str], limits: Limits) -> list[str]:
    argv = [
        shutil.which("bwrap", path=_SYS_PATH) or "bwrap",
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    for f in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives"):
        argv += ["--ro-bind-try", f, f]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    # The tmpfs first: a later bind below /tmp (an interpreter in /tmp/venv) stays visible.
    argv += ["--size", str(limits.disk_mb << 20), "--tmpfs", "/tmp"]
    for d in binds:
        argv += ["--ro-bind", d, d]
    argv += ["--chdir", "/tmp", "--clearenv"]
    for k, v in _minimal_env("/tmp").items():
        argv += ["--setenv", k, v]
    argv += ["--", python]
    return argv


def _unshare_argv(python: str, uid: int) -> list[str]:
    return [
        shutil.which("unshare", path=_SYS_PATH) or "unshare",
        "--net",
        "--ipc",
        "--uts",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc",
        "--setuid",
        str(uid),
        "--setgid",
        str(uid),
        "--",
        python,
    ]


@dataclass(frozen=True)
class SandboxSetup:
    backend: str
    python: str
    binds: tuple[str, ...]
    notes: tuple[str, ...]


def _candidate_pythons() -> list[str]:
    cands = []
    env_py = os.environ.get("RSPO_SANDBOX_PYTHON")
    if env_py:
        cands.append(env_py)
    cands.append(sys.executable)
    sys_py = shutil.which("python3", path=_SYS_PATH)
    if sys_py:
        cands.append(sys_py)
    seen, out = set(), []
    for c in cands:
        if c and c not in seen:
            seen.add(c)
            out.append(c)
    return out


def _probe(backend: str, python: str, binds: tuple[str, ...]) -> str | None:
    """Run a tiny program through the real path; None if it works, else why not."""
    setup = SandboxSetup(backend, python, binds, ())
    try:
        res = _run(setup, "print(int(input()) + 1)", "stdin", ["41"], None, Limits(timeout=10.0), None)
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
            if b == "bwrap" and not shutil.which("bwrap", path=_SYS_PATH):
                notes.append("bwrap: not installed (scripts/install_sandbox.sh)")
                continue
            if b == "unshare" and not (_is_root() and shutil.which("unshare", path=_SYS_PATH)):
                notes.append("unshare: needs root and util-linux unshare")
                continue
            for py in _candidate_pythons():
                binds = _interpreter_paths(py)
                if binds is None:
                    notes.append(f"{b}: {py} does not run")
                    continue
                why = _probe(b, py, tuple(binds) if b == "bwrap" else ())
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
        "uid": "private uid per run" if _is_root() else f"same user ({os.getuid()})",
        "skipped": list(s.notes),
    }


# ----------------------------------------------------------------------------- running
def run_python(
    code: str,
    kind: str,
    inputs: Sequence,
    *,
    fn_name: str | None = None,
    limits: Limits = Limits(),
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
    return _run(sandbox_setup(backend), code, kind, inputs, fn_name, limits, on_case)


def _rmtree(path: str) -> None:
    def onerror(func, p, exc_info):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=onerror)


def _run(setup: SandboxSetup, code, kind, inputs, fn_name, limits: Limits, on_case) -> RunResult:
    spec = {
        "code": code,
        "kind": kind,
        "fn_name": fn_name,
        "inputs": [list(x) if isinstance(x, tuple) else x for x in inputs],
        "timeout": float(limits.timeout),
        "cpu_s": int(math.ceil(limits.timeout)) + 1,
        "memory_bytes": limits.memory_mb << 20,
        "output_bytes": limits.output_bytes,
        "nofile": limits.nofile,
        "nproc": limits.nproc,
    }
    lease = _UidLease() if _is_root() else None
    workdir = None
    proc = None
    cases: list[CaseResult] = []
    compile_error = failure = None
    stopped = False
    try:
        proc, workdir = _launch(setup, spec, limits, lease, stderr=subprocess.PIPE)
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
        _teardown(proc, lease, workdir)


def _launch(setup: SandboxSetup, spec: dict, limits: Limits, lease, stderr) -> tuple[subprocess.Popen, str | None]:
    """Start the harness under the backend; (process, host working directory or None)."""
    root = lease is not None
    workdir = None
    harness = ["-I", "-B", "-c", harness_source()]
    popen_kw: dict = {}
    if setup.backend == "bwrap":
        argv = _bwrap_argv(setup.python, setup.binds, limits) + harness
        cwd, env = "/", _minimal_env("/tmp")
        if root:
            popen_kw = dict(user=lease.uid, group=lease.uid, extra_groups=[])
    else:
        workdir = tempfile.mkdtemp(prefix="rspo-sbx-")
        if root:
            os.chown(workdir, lease.uid, lease.uid)
        os.chmod(workdir, 0o700)
        cwd, env = workdir, _minimal_env(workdir)
        if setup.backend == "unshare":
            argv = _unshare_argv(setup.python, lease.uid) + harness
        else:
            argv = [setup.python] + harness
            if root:
                popen_kw = dict(user=lease.uid, group=lease.uid, extra_groups=[])
            else:
                spec["nproc"] = _user_thread_count() + limits.nproc
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


def _teardown(proc, lease, workdir) -> None:
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
        _kill_uid(lease.uid)
        lease.release()
    if workdir is not None:
        _rmtree(workdir)


# ----------------------------------------------------------------------------- call sessions
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
        limits: Limits = Limits(),
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
            "timeout": float(limits.timeout),
            "cpu_s": int(math.ceil(limits.timeout)) + 1,
            "memory_bytes": limits.memory_mb << 20,
            "output_bytes": limits.output_bytes,
            "nofile": limits.nofile,
            "nproc": limits.nproc,
            "frame_bytes": self.frame_bytes,
        }
        self._lease = _UidLease() if _is_root() else None
        try:
            self._err = tempfile.TemporaryFile()
            self._proc, self._workdir = _launch(self._setup_obj, spec, limits, self._lease, stderr=self._err)
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
        _teardown(proc, lease, workdir)
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
