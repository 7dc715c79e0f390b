"""Route UCX's info log to a file the shim owns and read transport evidence from it.

UCX reads `UCX_LOG_LEVEL`, `UCX_PROTO_INFO` and `UCX_LOG_FILE` once, when its library is
initialised by the first NIXL agent of the process; `configure()` must run before that.
`%p` in the path is expanded by UCX (and here) to the process id, so worker processes that
inherit the environment each get their own file.
"""

from __future__ import annotations

import ctypes
import os
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
        self._cache: dict[tuple[str | None, str | None], Evidence] = {}

    def configure(self, environ: MutableMapping[str, str] | None = None) -> bool:
        """Set the UCX variables unless the operator opted out; returns whether evidence is possible."""
        env = os.environ if environ is None else environ
        if env.get(ENV_UCX_CAPTURE, "1").strip().lower() in ("0", "false", "no", "off"):
            return False
        level = env.get("UCX_LOG_LEVEL", "").strip().lower()
        if level not in _VERBOSE_ENOUGH:
            env["UCX_LOG_LEVEL"] = "info"
        env.setdefault("UCX_PROTO_INFO", "y")
        if env.get("UCX_LOG_FILE"):
            self.path_template = env["UCX_LOG_FILE"]  # the operator's file: read it, don't move it
        else:
            if not self.path_template:
                self.path_template = env.get(ENV_UCX_LOG) or os.path.join(
                    tempfile.gettempdir(), "railtrace-ucx.%p.log"
                )
            env["UCX_LOG_FILE"] = self.path_template
        self.configured = True
        return True

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
            text = self._partial + chunk
            lines = text.split("\n")
            self._partial = lines.pop()
            for line in lines:
                self._parser.feed(line)
            self._cache.clear()
            return True

    def evidence(self, context: str | None, operation: str | None, poll: bool = True) -> Evidence | None:
        """Evidence for the endpoint of `context` (NIXL agent name) doing `operation`; None if none.
        `poll=False` uses what was read so far (callers that polled once for a batch)."""
        try:
            if poll:
                self.poll()
            key = (context, operation)
            with self._lock:
                cached = self._cache.get(key)
                if cached is not None:
                    return cached
                ev = self._parser.result.select(context, operation)
                if ev is not None:
                    self._cache[key] = ev
                return ev
        except Exception:
            logger.debug("railtrace: UCX evidence lookup failed", exc_info=True)
            return None
