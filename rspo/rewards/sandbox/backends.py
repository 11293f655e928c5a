"""The isolation of a sandboxed program: the backends (bubblewrap, unshare, rlimits), the leased
private uid, the interpreter and the probe that chooses them once per process (rspo.rewards.sandbox
states the argument whole)."""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

from rspo.rewards.sandbox.limits import Limits

BACKENDS = ("bwrap", "unshare", "rlimits")
SYS_PATH = "/usr/local/bin:/usr/bin:/bin"
_UID_COUNT = 4096


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def minimal_env(home: str) -> dict[str, str]:
    return {
        "PATH": SYS_PATH,
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


class UidLease:
    """A private uid for one sandbox run (root only), leased with flock across processes."""

    _next = 0
    _lock = threading.Lock()

    def __init__(self):
        base = int(os.environ.get("RSPO_SANDBOX_UID_BASE", "1900000000"))
        if not 1000 <= base <= 2**31 - _UID_COUNT - 1:
            raise ValueError(f"RSPO_SANDBOX_UID_BASE must be in [1000, 2^31 - {_UID_COUNT}), got {base}")
        locks = lock_dir()
        with UidLease._lock:
            start = UidLease._next
            UidLease._next = (UidLease._next + 1) % _UID_COUNT
        for k in range(_UID_COUNT):
            slot = (start + k) % _UID_COUNT
            path = os.path.join(locks, f"{base + slot}.lock")
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
def lock_dir() -> str:
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


def kill_uid(uid: int) -> None:
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


def user_thread_count() -> int:
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


def interpreter_paths(python: str) -> list[str] | None:
    """Directories an interpreter needs (prefixes, executable dir), or None if it fails."""
    probe = (
        "import json, os, sys; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, "
        "sys.base_exec_prefix, os.path.dirname(os.path.realpath(sys.executable)), "
        "os.path.dirname(os.path.abspath(sys.executable))]))"
    )
    try:
        out = subprocess.run(
            [python, "-I", "-c", probe], capture_output=True, timeout=30, env=minimal_env("/"), check=True
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


def bwrap_argv(python: str, binds: Sequence[str], limits: Limits) -> list[str]:
    argv = [
        shutil.which("bwrap", path=SYS_PATH) or "bwrap",
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
    for k, v in minimal_env("/tmp").items():
        argv += ["--setenv", k, v]
    argv += ["--", python]
    return argv


def unshare_argv(python: str, uid: int) -> list[str]:
    return [
        shutil.which("unshare", path=SYS_PATH) or "unshare",
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


def candidate_pythons() -> list[str]:
    cands = []
    env_py = os.environ.get("RSPO_SANDBOX_PYTHON")
    if env_py:
        cands.append(env_py)
    cands.append(sys.executable)
    sys_py = shutil.which("python3", path=SYS_PATH)
    if sys_py:
        cands.append(sys_py)
    seen, out = set(), []
    for c in cands:
        if c and c not in seen:
            seen.add(c)
            out.append(c)
    return out
