"""A real `mlflow server` on 127.0.0.1 for the tests (its own sqlite database and artifact folder),
which a test can stop and start again on the same database (a tracking server going down)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 180) -> MlflowServer:
        env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
        env.pop("MLFLOW_TRACKING_URI", None)
        log = open(self.root / "server.log", "a")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--backend-store-uri",
                f"sqlite:///{self.root / 'server.db'}",
                "--artifacts-destination",
                str(self.root / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() ends the uvicorn workers too
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.root / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                    if r.read().strip() == b"OK":
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server did not answer in {timeout} s")

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self.proc = None

    def __enter__(self) -> MlflowServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
