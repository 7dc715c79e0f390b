"""Database outages without touching the database server: a TCP proxy that can be cut, and a
small file system that can be filled.

`TcpProxy` stands between `railtrace serve` and PostgreSQL on 127.0.0.1: `cut()` closes its
listening socket and every connection through it (the service sees refused connections and
broken ones, as when the server or its network goes away), `restore()` listens again on the
same port. The shared PostgreSQL server itself is never stopped.

`SmallDisk` mounts a tmpfs of a few MiB (needs root) that the SQLite database lives on;
`fill()` writes a file until the disk is full, `free()` removes it. Where nothing can be
mounted, `FileSizeLimit` lowers the service process's RLIMIT_FSIZE instead, and restores it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from sqlalchemy.engine import make_url

from tests.reliability.crash_harness import Ledger, Senders, Server, sqlite_integrity, stored


class TcpProxy:
    """Forwards 127.0.0.1:<port> to `upstream` until cut."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._flowing = threading.Event()  # cleared by `freeze`
        self._flowing.set()
        self.port = 0
        self._listen()

    def _listen(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        self.port = sock.getsockname()[1]
        self._listener = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            if listener is not self._listener:
                client.close()
                return
            self._flowing.wait()  # frozen: the client's handshake is answered by the kernel, then silence
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._conns.update((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                self._flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            with self._lock:
                self._conns.difference_update((src, dst))

    def cut(self) -> None:
        """Refuse new connections and break every open one."""
        if self._listener is not None:
            # shutdown first: close alone does not wake a thread blocked in accept(), which
            # would then take one more connection.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            conns = list(self._conns)
            self._conns.clear()
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def restore(self) -> None:
        if self._listener is None:
            self._listen()

    def freeze(self) -> None:
        """Stop forwarding without closing anything, as when packets are dropped: calls on open
        connections and new connection attempts get no answer (and no error)."""
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self.cut()

    def url(self, db_url: str) -> str:
        """`db_url` (on 127.0.0.1) reached through this proxy."""
        return make_url(db_url).set(host="127.0.0.1", port=self.port).render_as_string(hide_password=False)


class SmallDisk:
    """A tmpfs of `size_mb` MiB at `path` (root only)."""

    def __init__(self, path: Path, size_mb: int) -> None:
        self.path = path
        self.size_mb = size_mb
        self.filler = path / "filler"

    def mount(self) -> SmallDisk:
        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs", str(self.path)],
            check=True,
            capture_output=True,
        )
        return self

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=False, capture_output=True)

    def fill(self) -> int:
        """Write until the file system refuses; returns the bytes written."""
        written = 0
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            for size in (1 << 20, 4096, 1):  # big steps, then the last partial pages
                while True:
                    try:
                        written += os.write(fd, b"\0" * size)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
        finally:
            os.close(fd)
        return written

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.filler)


@dataclass
class Probes:
    """/readyz and /healthz answers seen while polling, with the time of each."""

    readyz: list[tuple[float, int]] = field(default_factory=list)
    healthz: list[tuple[float, int]] = field(default_factory=list)

    def poll(self, url: str, stop: threading.Event, every: float = 0.2) -> None:
        with httpx.Client(base_url=url, timeout=5) as client:
            while not stop.is_set():
                for path, seen in (("/readyz", self.readyz), ("/healthz", self.healthz)):
                    try:
                        seen.append((time.monotonic(), client.get(path).status_code))
                    except httpx.HTTPError:
                        seen.append((time.monotonic(), 0))
                stop.wait(every)


@contextlib.contextmanager
def polling(url: str) -> Iterator[Probes]:
    probes = Probes()
    stop = threading.Event()
    thread = threading.Thread(target=probes.poll, args=(url, stop), daemon=True)
    thread.start()
    try:
        yield probes
    finally:
        stop.set()
        thread.join(10)


def wait_for(url: str, path: str, status: int, timeout: float) -> float:
    """Seconds until `url + path` answers `status`; raises after `timeout`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            if httpx.get(url + path, timeout=5).status_code == status:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{path} did not answer {status} within {timeout}s")


def _run_outage(
    server_url: str,
    start_outage: Callable[[], object],
    end_outage: Callable[[], object],
    seconds: float,
    ledger: Ledger,
    senders: Senders,
) -> dict[str, object]:
    """Export without pause, cause an outage of `seconds`, end it and measure the recovery."""
    with senders, polling(server_url) as probes:
        time.sleep(2)
        acked_before = len(ledger.acked)
        start_outage()
        began = time.monotonic()
        refused_after = wait_for(server_url, "/readyz", 503, 30)
        time.sleep(max(0.0, seconds - (time.monotonic() - began)))
        end_outage()
        ended = time.monotonic()
        ready_after = wait_for(server_url, "/readyz", 200, 60)
        ok_at_recovery = ledger.ok_exports
        time.sleep(3)
        ok_after = ledger.ok_exports - ok_at_recovery
    during = [code for t, code in probes.healthz if began <= t < ended]
    return {
        "outage_s": round(ended - began, 1),
        "readyz_503_after_s": round(refused_after, 2),
        "readyz_200_after_end_s": round(ready_after, 2),
        "exports_ok_in_3s_after_recovery": ok_after,
        "acked_spans_before_outage": acked_before,
        "acked_spans": len(ledger.acked),
        "failed_exports": ledger.failed_exports,
        "healthz_during": sorted(set(during)),
        "healthz_first_503_s": next(
            (round(t - began, 1) for t, c in probes.healthz if t >= began and c == 503), None
        ),
        "healthz_after": sorted({c for t, c in probes.healthz if t >= ended + ready_after}),
    }


def pg_outage(
    direct_url: str, workdir: Path, seconds: float, restart_after_s: float, frozen: bool = False
) -> dict[str, object]:
    """`railtrace serve` on PostgreSQL through a `TcpProxy` cut (`frozen`: silent) for `seconds`."""
    port = make_url(direct_url).port or 5432
    proxy = TcpProxy(("127.0.0.1", port))
    env = {"RAILTRACE_WRITE_RETRY_MAX_S": "1", "RAILTRACE_WRITE_FAILURE_RESTART_S": str(restart_after_s)}
    server = Server(proxy.url(direct_url), workdir, env=env)
    try:
        server.wait_ready()
        ledger = Ledger()
        start, end = (proxy.freeze, proxy.thaw) if frozen else (proxy.cut, proxy.restore)
        figures = _run_outage(server.url, start, end, seconds, ledger, Senders(server, ledger))
        figures["lost_spans"] = len(ledger.acked - stored(direct_url))
        figures["sigterm_exit"] = server.terminate()
        return figures
    finally:
        if server.proc.poll() is None:
            server.kill()
        proxy.close()


class FileSizeLimit:
    """Where no file system can be mounted (not root): the service process's file size limit
    (RLIMIT_FSIZE, set from outside with prlimit) lowered to `limit` bytes, so every write past
    that offset in any file fails with EFBIG as a full disk fails with ENOSPC (Python ignores
    the SIGXFSZ that comes with it); `free` puts the limit back."""

    def __init__(self, pid: int, limit: int = 4096) -> None:
        self.pid = pid
        self.limit = limit
        self._saved: tuple[int, int] | None = None

    def fill(self) -> int:
        self._saved = resource.prlimit(self.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(self.pid, resource.RLIMIT_FSIZE, (self.limit, self._saved[1]))
        return 0

    def free(self) -> None:
        if self._saved is not None:
            resource.prlimit(self.pid, resource.RLIMIT_FSIZE, self._saved)


def can_mount_tmpfs(path: Path) -> str | None:
    """None if a small tmpfs can be mounted here, else why not."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        return f"cannot mount a tmpfs: {done.stderr.decode().strip()}"
    subprocess.run(["umount", str(path)], check=False, capture_output=True)
    return None


def sqlite_disk_full(workdir: Path, seconds: float, size_mb: int = 256) -> dict[str, object]:
    """`railtrace serve` on SQLite on a `SmallDisk` filled for `seconds`, then freed; without
    the right to mount one, the process's file size limit lowered and restored instead.

    The freed disk must hold what the exporters resend once it has room: on a quiet machine
    their retries after a 5 s outage took the whole of a 64 MiB disk's WAL again, so the disk
    stayed full for a reason of its own (too small for the traffic), not the one under test."""
    disk: SmallDisk | None = None
    if can_mount_tmpfs(workdir / "probe") is None:
        disk = SmallDisk(workdir / "disk", size_mb).mount()
        url = f"sqlite:///{disk.path / 'railtrace.db'}"
    else:
        url = f"sqlite:///{workdir / 'railtrace.db'}"
    server = Server(url, workdir, env={"RAILTRACE_WRITE_RETRY_MAX_S": "1"})
    try:
        server.wait_ready()
        ledger = Ledger()
        filled: list[int] = []
        senders = Senders(server, ledger)
        full: SmallDisk | FileSizeLimit = disk if disk is not None else FileSizeLimit(server.proc.pid)
        fill = lambda: filled.append(full.fill())  # noqa: E731
        figures = _run_outage(server.url, fill, full.free, seconds, ledger, senders)
        figures["how"] = "tmpfs filled" if disk is not None else "RLIMIT_FSIZE lowered"
        figures["filler_mb"] = round(filled[0] / 2**20, 1)
        figures["sigterm_exit"] = server.terminate()
        figures["lost_spans"] = len(ledger.acked - stored(url))
        figures["integrity"] = sqlite_integrity(url)
        return figures
    finally:
        if server.proc.poll() is None:
            server.kill()
        if disk is not None:
            disk.unmount()
