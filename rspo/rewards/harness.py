"""The program that runs INSIDE the sandbox (see rspo/rewards/sandbox/__init__.py for the isolation).

rspo.rewards.sandbox starts it as `python -I -B -c <the text of this file>` under the chosen
backend (the file itself need not be visible inside the sandbox), so it must stay
self-contained: standard library only, any Python >= 3.8. It is also importable
(`from rspo.rewards.harness import encode_value, decode_value, ...`): the trusted side uses
the same codec and framing functions, and tests exercise them directly.

Protocol: the caller writes an 8-byte big-endian length and a JSON spec on stdin.

- kind "stdin" / "functional" (training rewards, LiveCodeBench): one forked child per case
  (see rspo/rewards/sandbox/__init__.py); one JSON line per case on stdout. The verdict is NOT decided here: the
  caller compares the case's stdout / return value with the expected output, which never
  enters the sandbox.
- kind "session" (benchmarks whose checks are code: HumanEval, MBPP, HumanEval+/MBPP+): the
  program is loaded once in ONE forked child (fresh globals, `__name__ ==
  "__rspo_solution__"`, fds 0-2 on /dev/null); the child then answers calls. Requests
  (`{"id", "fn", "args"}`) come from the caller on fd 3 (our stdin), replies (`{"id", "ok":
  value}`, `{"id", "exc": name, "msg"}` or `{"id", "bad": why}`) go to the caller on fd 4
  (our stdout), all framed (4-byte length + JSON) and every value in the plain-data codec
  below. The harness itself only frames "ready", "compile_error" and, when the child ends or
  its time is up, "exit". The child holds fds 3 and 4 and may write anything on them: the
  caller treats every frame as untrusted (it accepts only a well-formed reply to the request
  it has just sent, decodes values into exact built-in types, and decides the verdict
  itself). No test, expected value or pass token is ever sent here.

Why one file: it is passed whole as ``python -c <text>`` into a sandbox that sees no
other file, so everything the sandboxed side runs must be in this text.
"""

import builtins
import fcntl
import json
import os
import resource
import signal
import sys
import time

PRELUDE = """from string import *
from re import *
from datetime import *
from collections import *
from heapq import *
from bisect import *
from copy import *
from math import *
from random import *
from statistics import *
from itertools import *
from functools import *
from operator import *
from io import *
from sys import *
from json import *
from builtins import *
from typing import *
import string
import re
import datetime
import collections
import heapq
import bisect
import copy
import math
import random
import statistics
import itertools
import functools
import operator
import io
import sys
import json
sys.setrecursionlimit(50000)
"""
SKIP_PREIMPORT = {"antigravity", "this", "__hello__", "__phello__", "idlelib", "tkinter", "turtle", "turtledemo"}


def write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_fd(fd, limit):
    os.lseek(fd, 0, 0)
    chunks, total = [], 0
    while total < limit:
        b = os.read(fd, min(1 << 20, limit - total))
        if not b:
            break
        chunks.append(b)
        total += len(b)
    return b"".join(chunks)


def setlim(res, soft, hard=None):
    try:
        cur_soft, cur_hard = resource.getrlimit(res)
        if hard is None:
            hard = soft
        if cur_hard != resource.RLIM_INFINITY:
            hard = min(hard, cur_hard)
            soft = min(soft, hard)
        resource.setrlimit(res, (soft, hard))
    except (ValueError, OSError):
        pass


def prctl(option, arg):
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)
    except Exception:
        pass


def memfd(name):
    try:
        return os.memfd_create(name)
    except (AttributeError, OSError):
        import tempfile

        fd, path = tempfile.mkstemp(prefix=name)
        os.unlink(path)
        return fd


def signame(sig):
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig:d}"


def json_default(o):
    if getattr(o, "shape", None) == () and hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"return value of type {type(o).__name__} is not JSON serializable")


def child(kind, code, base, case_input, fn_name, out_fd, err_fd, res_fd, spec):
    # Never returns. Runs the program on one case with fresh globals.
    def result(obj):
        try:
            write_all(3, ("\n" + json.dumps(obj) + "\n").encode())
        except Exception:
            pass

    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    try:
        in_fd = memfd("in")
        if kind == "stdin":
            write_all(in_fd, case_input.encode("utf-8", "surrogateescape"))
        os.lseek(in_fd, 0, 0)
        # Move the sources above the targets 0..3 first, so no dup2 clobbers another.
        in_fd, out_fd, err_fd, res_fd = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (in_fd, out_fd, err_fd, res_fd)]
        os.dup2(in_fd, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.dup2(res_fd, 3)
        os.closerange(4, max(spec["nofile"], 256) + 16)
        cap = spec["output_bytes"]
        setlim(resource.RLIMIT_FSIZE, cap)
        cpu = spec["cpu_s"]
        setlim(resource.RLIMIT_CPU, cpu, cpu + 1)
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    except BaseException as e:
        result({"error": f"harness setup failed: {e!r}"})
        os._exit(70)
    g = dict(base)
    g["__name__"] = "__main__"
    g["__builtins__"] = builtins
    g["__file__"] = "solution.py"
    try:
        exec(code, g)
        if kind == "functional":
            fn = g.get(fn_name)
            if not callable(fn) or isinstance(fn, type):
                sol = g.get("Solution")
                if isinstance(sol, type) and hasattr(sol, fn_name):
                    fn = getattr(sol(), fn_name)
                else:
                    raise NameError(f"function {fn_name!r} not found (neither top-level nor Solution().{fn_name})")  # noqa: E501
            value = fn(*case_input)
            text = json.dumps(value, default=json_default)
            sys.stdout.flush()
            result({"ok": True, "value": text})
        else:
            sys.stdout.flush()
            result({"ok": True})
        os._exit(0)
    except SystemExit as e:
        code_ = e.code
        try:
            sys.stdout.flush()
        except BaseException:
            pass
        if code_ is None or code_ is False or code_ == 0:
            if kind == "functional":
                result({"error": "SystemExit: the program exited before returning"})
                os._exit(1)
            result({"ok": True})
            os._exit(0)
        result({"error": f"SystemExit: {code_}"})
        os._exit(1)
    except MemoryError:
        result({"error": "MemoryError", "memory": True})
        os._exit(1)
    except BaseException as e:
        try:
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
        except BaseException:
            pass
        msg = f"{type(e).__name__}: {e}"
        result({"error": msg[:1000]})
        os._exit(1)


def wait_child(pid, timeout):
    # Returns (killed_by_timeout, wait_status).
    deadline = time.monotonic() + timeout
    pidfd = None
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        if pidfd is not None:
            import select

            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if poller.poll(int(left * 1000) + 1):
                    _, st = os.waitpid(pid, 0)
                    return False, st
        else:
            delay = 0.0005
            while time.monotonic() < deadline:
                p, st = os.waitpid(pid, os.WNOHANG)
                if p == pid:
                    return False, st
                time.sleep(delay)
                delay = min(delay * 2, 0.01)
        p, st = os.waitpid(pid, os.WNOHANG)
        if p == pid:
            return False, st
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _, st = os.waitpid(pid, 0)
        return True, st
    finally:
        if pidfd is not None:
            os.close(pidfd)


# ----------------------------------------------------------------------------- call sessions
# Frames on the session's pipes: 4-byte big-endian length, then that many bytes of UTF-8 JSON.
# Values inside frames use the plain-data codec below (tagged JSON trees).
MAX_DEPTH = 64
MAX_NODES = 5000000
_SMALL_INT = 1 << 62


class CodecError(ValueError):
    """A value that is not plain data, or a malformed encoded tree."""


def encode_value(v):
    """Plain data -> a JSON-able tagged tree (None, bool, int, float, str, bytes, list, tuple,
    dict, set, frozenset, nested at most MAX_DEPTH deep, at most MAX_NODES values).

    Subclasses of int/float/str/bytes/list/tuple/dict/set/frozenset and NumPy scalars are
    converted to the base type (this runs on the solution's side and only decides what an
    honest solution may return; the trusted side decodes into exact built-in types)."""
    count = [0]

    def enc(x, depth):
        count[0] += 1
        if count[0] > MAX_NODES:
            raise CodecError(f"value too large (more than {MAX_NODES} items)")
        if depth > MAX_DEPTH:
            raise CodecError(f"value nested deeper than {MAX_DEPTH}")
        t = type(x)
        if x is None or t is bool:
            return x
        if t.__module__ == "numpy" and getattr(x, "shape", None) == () and hasattr(x, "item"):
            x = x.item()
            t = type(x)
            if x is None or t is bool:
                return x
        if isinstance(x, bool):
            return bool(x)
        if isinstance(x, int):
            x = int.__index__(x) if t is not int else x
            return x if -_SMALL_INT < x < _SMALL_INT else ["i", format(x, "x")]
        if isinstance(x, float):
            x = float.__float__(x) if t is not float else x
            if x != x:
                return ["f", "nan"]
            if x in (float("inf"), float("-inf")):
                return ["f", "inf" if x > 0 else "-inf"]
            return ["f", float.hex(x)]
        if isinstance(x, str):
            return ["u", str.__str__(x)] if t is not str else ["u", x]
        if isinstance(x, (bytes, bytearray)):
            return ["b", bytes(x).hex()]
        if isinstance(x, (list, tuple, set, frozenset, dict)):
            if isinstance(x, list):
                tag, items = "l", list.__iter__(x)
            elif isinstance(x, tuple):
                tag, items = "t", tuple.__iter__(x)
            elif isinstance(x, frozenset):
                tag, items = "z", frozenset.__iter__(x)
            elif isinstance(x, set):
                tag, items = "s", set.__iter__(x)
            else:
                return ["d", [[enc(k, depth + 1), enc(dict.__getitem__(x, k), depth + 1)] for k in dict.__iter__(x)]]
            return [tag, [enc(i, depth + 1) for i in items]]
        raise CodecError(f"not plain data: {t.__name__}")

    return enc(v, 0)


def decode_value(tree):
    """A tagged tree -> plain data of exact built-in types; CodecError if malformed."""
    count = [0]

    def dec(x, depth):
        count[0] += 1
        if count[0] > MAX_NODES:
            raise CodecError("value too large")
        if depth > MAX_DEPTH:
            raise CodecError("value nested too deep")
        t = type(x)
        if x is None or t is bool:
            return x
        if t is int:
            if not -_SMALL_INT < x < _SMALL_INT:
                raise CodecError("bad int")
            return x
        if t is not list or len(x) != 2 or type(x[0]) is not str:
            raise CodecError(f"malformed value ({t.__name__})")
        tag, body = x
        if tag == "u":
            if type(body) is not str:
                raise CodecError("bad str")
            return body
        if tag == "f":
            if type(body) is not str:
                raise CodecError("bad float")
            if body == "nan":
                return float("nan")
            if body in ("inf", "-inf"):
                return float(body)
            try:
                return float.fromhex(body)
            except (ValueError, OverflowError):
                raise CodecError("bad float") from None
        if tag == "i":
            if type(body) is not str or len(body) > 1000000:
                raise CodecError("bad int")
            try:
                return int(body, 16)
            except ValueError:
                raise CodecError("bad int") from None
        if tag == "b":
            if type(body) is not str:
                raise CodecError("bad bytes")
            try:
                return bytes.fromhex(body)
            except ValueError:
                raise CodecError("bad bytes") from None
        if type(body) is not list:
            raise CodecError("malformed container")
        try:
            if tag == "l":
                return [dec(i, depth + 1) for i in body]
            if tag == "t":
                return tuple(dec(i, depth + 1) for i in body)
            if tag == "s":
                return set(dec(i, depth + 1) for i in body)
            if tag == "z":
                return frozenset(dec(i, depth + 1) for i in body)
            if tag == "d":
                out = {}
                for kv in body:
                    if type(kv) is not list or len(kv) != 2:
                        raise CodecError("malformed dict item")
                    out[dec(kv[0], depth + 1)] = dec(kv[1], depth + 1)
                return out
        except TypeError:  # unhashable key or set element
            raise CodecError("unhashable key or set element") from None
        raise CodecError(f"unknown tag {tag[:20]!r}")

    return dec(tree, 0)


def pack_frame(obj):
    data = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")
    return len(data).to_bytes(4, "big") + data


def read_exact(fd, n):
    chunks, got = [], 0
    while got < n:
        b = os.read(fd, min(1 << 20, n - got))
        if not b:
            return None
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def read_frame(fd, limit):
    head = read_exact(fd, 4)
    if head is None:
        return None
    n = int.from_bytes(head, "big")
    if n > limit:
        raise CodecError("frame too long")
    body = read_exact(fd, n)
    if body is None:
        return None
    return json.loads(body.decode("utf-8"))


def session_child(code, req_fd, rep_fd, spec):
    # Never returns. Loads the program once, then answers calls until its input ends.
    def send(obj):
        try:
            write_all(4, pack_frame(obj))
        except Exception:
            os._exit(1)

    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    try:
        req_fd, rep_fd = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (req_fd, rep_fd)]
        devnull = os.open(os.devnull, os.O_RDWR)
        for target in (0, 1, 2):
            os.dup2(devnull, target)
        os.dup2(req_fd, 3)
        os.dup2(rep_fd, 4)
        os.closerange(5, max(spec["nofile"], 256) + 16)
        setlim(resource.RLIMIT_FSIZE, spec["output_bytes"])
        cpu = spec["cpu_s"]
        setlim(resource.RLIMIT_CPU, cpu, cpu + 1)
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    except BaseException:
        os._exit(70)
    g = {"__name__": "__rspo_solution__", "__builtins__": builtins, "__file__": "solution.py"}
    try:
        exec(code, g)
    except BaseException as e:
        send({"t": "load_error", "error": (f"{type(e).__name__}: {e}")[:1000]})
        os._exit(1)
    send({"t": "loaded"})
    limit = spec["frame_bytes"]
    while True:
        try:
            req = read_frame(3, limit)
        except BaseException:
            os._exit(1)
        if req is None:
            os._exit(0)
        rid = req.get("id")
        try:
            args = decode_value(req["args"])
            kwargs = decode_value(req["kwargs"]) if "kwargs" in req else {}
            fn = g.get(req["fn"])
            if not callable(fn):
                raise NameError("name {!r} is not defined by the program".format(req["fn"]))
            value = fn(*args, **kwargs)
        except SystemExit:
            os._exit(1)
        except BaseException as e:
            if not isinstance(e, Exception):
                os._exit(1)
            send({"id": rid, "exc": type(e).__name__, "msg": str(e)[:300]})
            continue
        try:
            tree = encode_value(value)
        except BaseException as e:
            send({"id": rid, "bad": str(e)[:300]})
            continue
        send({"id": rid, "ok": tree})


def run_session(code, spec, rec_fd):
    # The harness's side of a session: one child serves every call; the harness only reports
    # how it ended. Requests go straight from the caller (our stdin) to the child and replies
    # straight back (our stdout).
    def emit(obj):
        write_all(rec_fd, pack_frame(obj))

    emit({"t": "ready"})
    pid = os.fork()
    if pid == 0:
        session_child(code, 0, rec_fd, spec)
        os._exit(70)
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass
    os.close(0)
    timed_out, st = wait_child(pid, spec["timeout"])
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    if timed_out:
        how = "timeout"
    elif os.WIFSIGNALED(st):
        how = f"killed by {signame(os.WTERMSIG(st))}"
    else:
        how = f"exit code {os.WEXITSTATUS(st):d}"
    emit({"t": "exit", "how": how})


def main():
    head = read_exact(0, 8)
    if head is None:
        return
    payload = read_exact(0, int.from_bytes(head, "big"))
    if payload is None:
        return
    spec = json.loads(payload.decode("utf-8", "surrogateescape"))
    del payload
    session = spec["kind"] == "session"
    rec_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.close(devnull)

    def emit(obj):
        if session:
            write_all(rec_fd, pack_frame(obj))
        else:
            write_all(rec_fd, (json.dumps(obj) + "\n").encode())

    prctl(38, 1)  # PR_SET_NO_NEW_PRIVS
    prctl(4, 0)  # PR_SET_DUMPABLE = 0
    mem = spec["memory_bytes"]
    setlim(resource.RLIMIT_CORE, 0)
    setlim(resource.RLIMIT_NOFILE, spec["nofile"])
    setlim(resource.RLIMIT_NPROC, spec["nproc"])
    stack_soft, stack_hard = resource.getrlimit(resource.RLIMIT_STACK)
    want = min(256 << 20, mem // 2)
    if stack_hard == resource.RLIM_INFINITY or stack_hard >= want:
        setlim(resource.RLIMIT_STACK, want, stack_hard)
    setlim(resource.RLIMIT_AS, mem)
    kind = spec["kind"]
    source = spec["code"]
    try:
        code = compile(source, "solution.py", "exec", dont_inherit=True)
    except SyntaxError as e:
        emit({"t": "compile_error", "error": f"{type(e).__name__}: {e.msg} (line {e.lineno})"})
        emit({"t": "done"})
        return
    except (ValueError, TypeError, MemoryError, RecursionError) as e:
        emit({"t": "compile_error", "error": f"{type(e).__name__}: {e}"})
        emit({"t": "done"})
        return
    base = {}
    if not session:
        exec(compile(PRELUDE, "<prelude>", "exec"), base)
    # Pre-import what the program imports (installed modules only; the program itself is
    # not run here) so that forked cases do not pay for heavy imports again.
    try:
        import ast
        import importlib

        names = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
        for name in sorted(names):
            if name.split(".")[0] in SKIP_PREIMPORT:
                continue
            try:
                importlib.import_module(name)
            except BaseException:
                pass
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    if session:
        run_session(code, spec, rec_fd)
        return
    fn_name = spec.get("fn_name")
    timeout = spec["timeout"]
    emit({"t": "ready"})
    for i, case_input in enumerate(spec["inputs"]):
        out_fd, err_fd, res_fd = memfd("out"), memfd("err"), memfd("res")
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            child(kind, code, base, case_input, fn_name, out_fd, err_fd, res_fd, spec)
            os._exit(70)
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass
        timed_out, st = wait_child(pid, timeout)
        elapsed = time.monotonic() - t0
        try:
            os.killpg(pid, signal.SIGKILL)  # leftovers of the case in its group
        except OSError:
            pass
        out = read_fd(out_fd, spec["output_bytes"])
        err = read_fd(err_fd, 1 << 16)[-4000:].decode("utf-8", "replace")
        res_lines = [ln for ln in read_fd(res_fd, spec["output_bytes"] + (1 << 20)).split(b"\n") if ln.strip()]
        for fd in (out_fd, err_fd, res_fd):
            os.close(fd)
        res = None
        if res_lines:
            try:
                res = json.loads(res_lines[-1].decode("utf-8", "replace"))
                if not isinstance(res, dict):
                    res = None
            except ValueError:
                res = None
        rec = {"t": "case", "i": i, "time": round(elapsed, 4)}
        if timed_out:
            rec.update(status="timeout", error="wall-clock timeout")
        elif os.WIFSIGNALED(st):
            sig = os.WTERMSIG(st)
            if sig == signal.SIGXCPU:
                rec.update(status="timeout", error="CPU time limit (SIGXCPU)")
            elif sig == signal.SIGXFSZ:
                rec.update(status="output", error="output limit exceeded (SIGXFSZ)")
            else:
                rec.update(status="signal", error=f"killed by {signame(sig)}")
        elif os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0:
            if kind == "functional":
                if res is not None and res.get("ok") and isinstance(res.get("value"), str):
                    rec.update(status="ok", value=res["value"])
                else:
                    rec.update(status="error", error="no return value (the program exited before returning)")
            else:
                rec.update(status="ok", stdout=out.decode("utf-8", "replace"))
        else:
            code_ = os.WEXITSTATUS(st) if os.WIFEXITED(st) else -1
            if res is not None and res.get("memory"):
                rec.update(status="memory", error="MemoryError")
            elif res is not None and res.get("error"):
                rec.update(status="error", error=str(res["error"]))
            else:
                last = err.strip().splitlines()[-1] if err.strip() else ""
                rec.update(status="error", error=f"exit code {code_:d}" + (": " + last if last else ""))
            if "MemoryError" in rec.get("error", "") and rec["status"] == "error":
                rec["status"] = "memory"
        emit(rec)
    emit({"t": "done"})


if __name__ == "__main__":
    main()
