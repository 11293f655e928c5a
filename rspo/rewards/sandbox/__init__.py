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

The package, by concern: ``limits`` (what a sandboxed program may use, what comes back, the chosen
isolation), ``backends`` (the isolation: bubblewrap's and unshare's argv, a leased private uid, the
minimal environment, the interpreter's directories), ``launch`` (one sandboxed process: its spec,
launch, watch and teardown; the cases of one program), ``choice`` (the probe that chooses the
backend once per process, and ``run_python``), ``session`` (the call sessions that reuse the same
launch). The isolation is reviewed
as one argument: this docstring states it whole, and no module outside this package imports its
submodules (tests/test_layers.py), so the launch's internals (uid leases, teardown, the backend's
argv) cannot be called around the checks.
"""

from __future__ import annotations

from rspo.rewards.sandbox.backends import BACKENDS
from rspo.rewards.sandbox.choice import run_python, sandbox_backend, sandbox_info, sandbox_setup
from rspo.rewards.sandbox.launch import harness_source
from rspo.rewards.sandbox.limits import CaseResult, Limits, RunResult, SandboxSetup
from rspo.rewards.sandbox.session import CallSession, CandidateRaised, SessionError

__all__ = [
    "Limits",
    "CaseResult",
    "RunResult",
    "run_python",
    "sandbox_backend",
    "sandbox_info",
    "sandbox_setup",
    "SandboxSetup",
    "BACKENDS",
    "CallSession",
    "CandidateRaised",
    "SessionError",
    "harness_source",
]
