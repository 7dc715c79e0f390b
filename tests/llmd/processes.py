"""llm-d's binaries for tests, built by scripts/build-llmd, and the processes a test starts."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-llmd"

_built: dict[str, Path] = {}


def go_available() -> bool:
    return shutil.which("go") is not None


def llmd_binary(name: str) -> Path:
    """Path of one of scripts/build-llmd's binaries, building it on first use (cold: minutes)."""
    if name not in _built:
        done = subprocess.run(
            [str(BUILD_SCRIPT), name], capture_output=True, text=True, timeout=3600, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"scripts/build-llmd {name} failed ({done.returncode}):\n{done.stderr[-4000:]}"
            )
        lines = done.stdout.strip().splitlines()
        assert lines, "scripts/build-llmd printed no path"
        path = Path(lines[-1])
        assert path.is_file() and os.access(path, os.X_OK), path
        _built[name] = path
    return _built[name]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """One child process, its output in a file, stopped by its PID (SIGTERM, then SIGKILL)."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=REPO
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def wait_port(self, port: int, timeout: float = 60) -> None:
        """Until something accepts on 127.0.0.1:`port`; fails with the log if the process exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited {self.proc.returncode}:\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"{self.name} did not listen on {port} within {timeout} s:\n{self.log()}")

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM (each process flushes its spans on it), then SIGKILL; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout)
        self._log.close()
        return int(self.proc.returncode)


def railtrace_serve(db_url: str, log_dir: Path) -> tuple[Proc, str, int]:
    """`railtrace serve` in its own process on `db_url`: the process, its HTTP base, its gRPC port."""
    port, grpc_port = free_port(), free_port()
    proc = Proc(
        "railtrace-serve",
        [
            sys.executable,
            "-m",
            "railtrace.cli",
            "serve",
            "--db",
            db_url,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--grpc-port",
            str(grpc_port),
            "--quiet-period",
            "0.5",
        ],
        log_dir,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if proc.proc.poll() is not None:
            raise AssertionError(f"railtrace serve exited {proc.proc.returncode}:\n{proc.log()}")
        try:
            if httpx.get(base + "/readyz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"railtrace serve not ready:\n{proc.log()}")
        time.sleep(0.1)
    return proc, base, grpc_port
