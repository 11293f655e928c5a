"""What a sandboxed program may use (``Limits``), what comes back (``CaseResult``, ``RunResult``) and
the chosen isolation (``SandboxSetup``); rspo.rewards.sandbox states the isolation."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


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

    def harness_fields(self) -> dict[str, float | int]:
        """The limits as the harness's spec carries them (it sets the rlimits from these)."""
        return {
            "timeout": float(self.timeout),
            "cpu_s": int(math.ceil(self.timeout)) + 1,
            "memory_bytes": self.memory_mb << 20,
            "output_bytes": self.output_bytes,
            "nofile": self.nofile,
            "nproc": self.nproc,
        }


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


@dataclass(frozen=True)
class SandboxSetup:
    backend: str
    python: str
    binds: tuple[str, ...]
    notes: tuple[str, ...]


DEFAULT_LIMITS = Limits()
