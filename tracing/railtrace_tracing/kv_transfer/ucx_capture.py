"""Route UCX's info log to a file the shim owns and read transport evidence from it.

UCX reads `UCX_LOG_LEVEL`, `UCX_PROTO_INFO` and `UCX_LOG_FILE` once, when its library is
initialised by the first NIXL agent of the process; `configure()` must run before that.
`%p` in the path is expanded by UCX (and here) to the process id, so worker processes that
inherit the environment each get their own file.
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
import threading
from collections.abc import MutableMapping

from railtrace_tracing._common import logger
from railtrace_tracing.semconv import ENV_UCX_CAPTURE, ENV_UCX_LOG
from railtrace_tracing.ucx.parser import Evidence, UcxLogParser

_VERBOSE_ENOUGH = {"info", "debug", "trace", "req", "data", "async", "func", "poll", "diag"}


try:  # UCX writes its log through a buffered stdio FILE*; fflush(NULL) pushes it to the file.
    _fflush = ctypes.CDLL(None).fflush
    _fflush.argtypes = [ctypes.c_void_p]
except (OSError, AttributeError):  # pragma: no cover - non-glibc platforms
    _fflush = None


def flush_stdio() -> None:
    """Flush every stdio stream of this process (UCX's log file among them)."""
    if _fflush is not None:
        _fflush(None)


def _expand(path: str) -> str:
    return path.replace("%p", str(os.getpid())).replace("%h", os.uname().nodename)


class UcxLogCapture:
    """Owns the UCX log file of this process and parses it incrementally."""

    def __init__(self, path: str | None = None) -> None:
        self.path_template = path or ""
        self._parser = UcxLogParser()
        self._offset = 0
        self._partial = ""
        self._lock = threading.Lock()
        self.configured = False
        self.forward_warnings = False
        self._cache: dict[tuple[str | None, str | None, str | None], Evidence] = {}
        self._peers: dict[tuple[str, str], list[tuple[int, int]]] = {}

    def configure(self, environ: MutableMapping[str, str] | None = None) -> bool:
        """Set the UCX variables the operator left unset; returns whether evidence is possible.

        Called just before the first NIXL agent starts UCX. A variable the operator (or vLLM) set
        is never changed: an explicit `UCX_LOG_LEVEL` below `info` or `UCX_PROTO_INFO=n` turns the
        capture off (spans then say `unknown`). When the shim owns the log file it copies UCX's
        warnings and errors to stderr, so they still reach `kubectl logs`.
        """
        env = os.environ if environ is None else environ
        if env.get(ENV_UCX_CAPTURE, "1").strip().lower() in ("0", "false", "no", "off"):
            return False
        level = env.get("UCX_LOG_LEVEL", "").strip().lower()
        proto = env.get("UCX_PROTO_INFO", "").strip().lower()
        if (level and level not in _VERBOSE_ENOUGH) or proto in ("n", "no", "0", "off", "false"):
            logger.info("railtrace: UCX_LOG_LEVEL/UCX_PROTO_INFO set by the operator; no UCX evidence")
            return False
        if not level:
            env["UCX_LOG_LEVEL"] = "info"
        if not proto:
            env["UCX_PROTO_INFO"] = "y"
        if env.get("UCX_LOG_FILE"):
            self.path_template = env["UCX_LOG_FILE"]  # the operator's file: read it, don't move it
        else:
            if not self.path_template:
                self.path_template = env.get(ENV_UCX_LOG) or os.path.join(
                    tempfile.gettempdir(), "railtrace-ucx.%p.log"
                )
            env["UCX_LOG_FILE"] = self.path_template
            self.forward_warnings = True
        self.configured = True
        return True

    def mark(self) -> int:
        """The log's current end (after flushing UCX's buffer): brackets what one call printed."""
        flush_stdio()
        try:
            return os.stat(self.path).st_size
        except OSError:
            return 0

    def note_peer(self, agent: str, peer: str, start: int, end: int) -> None:
        """UCX wrote the endpoint configuration(s) of `agent` → `peer` between these offsets."""
        if peer:
            with self._lock:
                self._peers.setdefault((agent, peer), []).append((start, end))
                self._cache.clear()

    @property
    def path(self) -> str:
        return _expand(self.path_template) if self.path_template else ""

    def poll(self) -> bool:
        """Feed lines written since the last poll to the parser; True when there were new lines."""
        path = self.path
        if not path:
            return False
        with self._lock:
            flush_stdio()
            try:
                if os.stat(path).st_size == self._offset:
                    return False  # nothing new: skip the open/read
                with open(path, encoding="utf-8", errors="replace") as fh:
                    fh.seek(self._offset)
                    chunk = fh.read()
                    self._offset = fh.tell()
            except OSError:
                return False
            if not chunk:
                return False
            pos = self._offset - len(chunk.encode("utf-8", "replace")) - len(self._partial.encode())
            text = self._partial + chunk
            lines = text.split("\n")
            self._partial = lines.pop()
            parser = self._parser
            forward = self.forward_warnings
            for line in lines:
                parser.offset = pos
                parser.feed(line)
                pos += len(line.encode("utf-8", "replace")) + 1
                if forward and (" UCX  WARN" in line or " UCX  ERROR" in line or " UCX  FATAL" in line):
                    sys.stderr.write(line + "\n")
            self._cache.clear()
            return True

    def evidence(
        self, context: str | None, operation: str | None, poll: bool = True, peer: str | None = None
    ) -> Evidence | None:
        """Evidence for the endpoint of `context` (NIXL agent name) to `peer` doing `operation`; None
        if none. Without a known endpoint to `peer` the process's configuration is used and the
        evidence says so (`peer` empty). `poll=False` uses what was read so far."""
        try:
            if poll:
                self.poll()
            key = (context, operation, peer)
            with self._lock:
                cached = self._cache.get(key)
                if cached is not None:
                    return cached
                windows = self._peers.get((context or "", peer)) if peer else None
                # Peers connected at the same time (vLLM handshakes on several threads) share a
                # window: an endpoint first printed where another peer's window also lies is
                # nobody's for certain.
                others = (
                    [
                        w
                        for (ctx, p), ws in self._peers.items()
                        if ctx == (context or "") and p != peer
                        for w in ws
                    ]
                    if windows
                    else None
                )
                ev = self._parser.result.select(
                    context, operation, windows=windows, peer=peer, exclude=others
                )
                if ev is not None:
                    self._cache[key] = ev
                return ev
        except Exception:
            logger.debug("railtrace: UCX evidence lookup failed", exc_info=True)
            return None
