"""Hostile programs must be contained by every sandbox backend available here.

Each test runs on "bwrap", "unshare" and "rlimits" when that backend works on this
machine (unshare needs root; "rlimits" is only tested as root, where programs still run
under a private uid: as a normal user it is no sandbox at all, see rspo/rewards/sandbox/__init__.py). Each
hostile program is followed by a check that the evaluator still scores a good program.
"""

from __future__ import annotations

import functools
import os
import socket
import time

import pytest

from rspo.rewards import sandbox
from rspo.rewards.code import score
from rspo.rewards.sandbox import BACKENDS, Limits, run_python

# A uid range of our own, so that sandboxes of other evaluators running on this machine
# at the same time are not mistaken for leftovers of ours.
UID_BASE = 1_000_000_000 + (os.getpid() % 200_000) * 4096


@pytest.fixture(autouse=True)
def _private_uid_range(monkeypatch):
    monkeypatch.setenv("RSPO_SANDBOX_UID_BASE", str(UID_BASE))


GOOD = ("print(int(input()) + 1)", {"kind": "stdin", "cases": [{"input": "1", "output": "2"}]})


@functools.cache
def _available(backend: str) -> str | None:
    if backend == "rlimits" and os.geteuid() != 0:
        return "rlimits as a normal user is not a sandbox (programs run as that user)"
    try:
        sandbox.sandbox_backend(backend)
    except RuntimeError as exc:
        return str(exc)
    return None


@pytest.fixture(params=BACKENDS)
def backend(request):
    why = _available(request.param)
    if why:
        pytest.skip(f"{request.param} unavailable: {why[:200]}")
    return request.param


def run(program: str, expected: str = "contained", backend: str | None = None, timeout: float = 1.0):
    tests = {"kind": "stdin", "cases": [{"input": "", "output": expected}], "timeout": timeout, "memory_mb": 256}
    return score(program, tests, backend=backend)


def _live_sandbox_pids() -> list[int]:
    """Live processes owned by a sandbox uid (root only: otherwise there is no such uid)."""
    base = UID_BASE
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            uid = int(fields["Uid"].split()[0])
            if base <= uid < base + 4096 and fields["State"].split()[0] not in ("Z", "X"):
                pids.append(int(name))
        except (OSError, KeyError, ValueError):
            continue
    return pids


def assert_clean_and_working(backend: str) -> None:
    if os.geteuid() == 0:
        deadline = time.monotonic() + 2.0
        while _live_sandbox_pids() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _live_sandbox_pids() == []
    assert score(*GOOD, backend=backend) == (1.0, "ok")


def test_cannot_delete_or_modify_files_outside(backend, tmp_path):
    canary = tmp_path / "canary.txt"
    canary.write_text("alive")
    programs = [
        f"import os\nos.remove({str(canary)!r})\nprint('deleted')",
        f"import shutil\nshutil.rmtree({str(tmp_path)!r})\nprint('deleted')",
        f"open({str(canary)!r}, 'w').write('pwned')\nprint('deleted')",
    ]
    for prog in programs:
        reward, reason = run(prog, expected="deleted", backend=backend)
        assert reward == 0.0 and reason.startswith("runtime error on case 1: ")
        assert canary.read_text() == "alive"
    # Through a shell: rm's failure is silent (or the path does not exist in the sandbox).
    run("import os\nos.system('rm -rf ' + " + repr(str(tmp_path)) + ")", expected="x", backend=backend)
    assert canary.read_text() == "alive"
    assert_clean_and_working(backend)


def test_parent_environment_is_not_visible(backend, monkeypatch):
    secret = "s3cr3t-" + os.urandom(6).hex()
    monkeypatch.setenv("RSPO_TEST_SECRET", secret)
    reward, reason = run(
        "import os\nprint(os.environ.get('RSPO_TEST_SECRET', 'absent'))", expected=secret, backend=backend
    )
    assert (reward, reason) == (0.0, f"wrong answer on case 1: expected {secret}, got absent")
    res = run_python(
        "import os\nprint(dict(os.environ))\n"
        "for p in ('/proc/self/environ', '/proc/1/environ', '/proc/%d/environ' % os.getppid()):\n"
        "    try:\n        print(open(p, 'rb').read())\n    except OSError as e:\n        print(e)\n",
        "stdin",
        [""],
        limits=Limits(timeout=2.0, memory_mb=256),
        backend=backend,
    )
    assert res.cases[0].status == "ok"
    assert secret not in res.cases[0].stdout and "RSPO_TEST_SECRET" not in res.cases[0].stdout
    assert_clean_and_working(backend)


def test_no_network(backend):
    if backend == "rlimits":
        pytest.skip("the rlimits backend does not isolate the network (documented in rspo/rewards/sandbox/__init__.py)")
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.setblocking(False)
    port = srv.getsockname()[1]
    try:
        prog = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')"
        reward, reason = run(prog, expected="connected", backend=backend)
        assert reward == 0.0 and reason.startswith("runtime error on case 1: ")
        with pytest.raises(BlockingIOError):
            srv.accept()  # nobody connected
        prog = "import socket\nprint(socket.getaddrinfo('pypi.org', 443)[0][4])"
        assert run(prog, expected="x", backend=backend)[0] == 0.0
    finally:
        srv.close()
    assert_clean_and_working(backend)


def test_fork_bomb_is_bounded(backend):
    prog = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    reward, reason = run(prog, backend=backend, timeout=1.0)
    assert (reward, reason) == (0.0, "timeout on case 1")
    reward, reason = run("import os\nwhile True:\n    os.fork()", backend=backend)
    assert reward == 0.0 and reason.startswith("runtime error on case 1: BlockingIOError")
    assert_clean_and_working(backend)


def test_huge_allocation(backend):
    assert run("x = bytearray(50 * 2**30)\nprint('contained')", backend=backend) == (
        0.0,
        "memory limit exceeded on case 1",
    )
    assert run("x = [0] * (50 * 2**30 // 8)", backend=backend) == (0.0, "memory limit exceeded on case 1")
    assert_clean_and_working(backend)


def test_infinite_loop_times_out_and_leaves_nothing(backend):
    assert run("while True:\n    pass", backend=backend, timeout=0.5) == (0.0, "timeout on case 1")
    prog = "import os, time\nif os.fork() == 0:\n    os.setsid()\nwhile True:\n    time.sleep(1)"
    assert run(prog, backend=backend, timeout=0.5) == (0.0, "timeout on case 1")
    assert_clean_and_working(backend)


def test_detached_process_is_killed_after_a_passing_run(backend):
    prog = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(100)\nelse:\n    print('contained')"
    assert run(prog, backend=backend) == (1.0, "ok")
    assert_clean_and_working(backend)


def test_printing_1gb_hits_the_output_cap(backend):
    prog = "import sys\ns = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(s)\nprint('contained')"
    assert run(prog, backend=backend, timeout=5.0) == (0.0, "output limit exceeded on case 1")
    prog = "import os\nwhile True:\n    os.write(1, b'x' * (1 << 20))"
    assert run(prog, backend=backend, timeout=5.0) == (0.0, "output limit exceeded on case 1")
    prog = "with open('big.bin', 'wb') as f:\n    for _ in range(1024):\n        f.write(b'x' * (1 << 20))"
    assert run(prog, backend=backend, timeout=5.0)[0] == 0.0
    assert_clean_and_working(backend)


@pytest.mark.parametrize(
    "attack",
    [
        "os.kill(os.getppid(), 9)",
        "os.killpg(os.getpgid(os.getppid()), 9)",
        "os.killpg(os.getpgid(0), 9)",
        "os.kill(-1, 9)",
        "os.kill(TEST_PID, 9)",
        "os.killpg(os.getpgid(TEST_PID), 9)",
    ],
)
def test_killing_the_parent_or_the_evaluator(backend, attack):
    prog = (
        f"import os, time\nTEST_PID = {os.getpid():d}\ntry:\n    {attack}\nexcept OSError as e:\n    print(e)\n"
        "time.sleep(0.2)\nwhile True:\n    pass"
    )
    reward, reason = run(prog, backend=backend, timeout=0.5)
    assert reward == 0.0
    assert reason.startswith(("timeout on case 1", "runtime error on case 1: "))
    assert_clean_and_working(backend)  # we are alive, and so is the evaluator


def test_stopping_the_harness_costs_a_timeout_not_a_hang():
    # SIGSTOP on the harness: no more records arrive; the caller's own deadline
    # (timeout + 2 s after the last record) kills the sandbox.
    prog = "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\nwhile True:\n    pass"
    reward, reason = run(prog, timeout=0.5)
    assert reward == 0.0 and reason.startswith("timeout on case 1")
    assert_clean_and_working(sandbox.sandbox_backend())
