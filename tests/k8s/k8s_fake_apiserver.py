"""A stand-in for the Kubernetes API server: list and watch over plain HTTP on 127.0.0.1.

No cluster can run on the test machine, so this serves the same wire format the real API
server does for the four kinds railtrace watches -- `List` bodies with `metadata.resourceVersion`
and `continue` paging, and chunked watch streams of `{"type", "object"}` lines -- from an event
log the test drives. It also reproduces the failures a watcher must survive: history compacted
away (a `410 Gone` ERROR event, as the real server sends it), HTTP errors, ERROR events with
other codes, streams cut mid-line, and DRA served only at an older version.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

# kind -> (group or "", plural, namespaced)
KINDS: dict[str, tuple[str, str, bool]] = {
    "Node": ("", "nodes", False),
    "Pod": ("", "pods", True),
    "ResourceSlice": ("resource.k8s.io", "resourceslices", False),
    "ResourceClaim": ("resource.k8s.io", "resourceclaims", True),
}


@dataclass
class Fault:
    """One injected failure, consumed by the next watch request of its kind."""

    kind: str
    what: str  # "http500" | "error500" | "cut" | "gone"


@dataclass
class _Event:
    rv: int
    type: str
    kind: str
    obj: dict[str, Any]


@dataclass
class FakeApiServer:
    """Event-log backed list/watch server; `dra_versions` are the resource.k8s.io versions served.
    `token=None` serves without authentication, as `kubectl proxy` does: client-go (clientcmd)
    sends a kubeconfig's token only over TLS, and this server speaks plain HTTP."""

    dra_versions: tuple[str, ...] = ("v1",)
    token: str | None = "railtrace-test-token"
    _rv: int = 100
    _state: dict[str, dict[tuple[str, str], dict[str, Any]]] = field(default_factory=dict)
    _log: list[_Event] = field(default_factory=list)
    _compacted_rv: int = 0
    _faults: deque[Fault] = field(default_factory=deque)
    requests: list[tuple[str, dict[str, list[str]]]] = field(default_factory=list)
    unauthorized: int = 0

    def __post_init__(self) -> None:
        self._cond = threading.Condition()
        self._state = {kind: {} for kind in KINDS}
        self._closing = False
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- driving the cluster ------------------------------------------------------------

    def put(self, obj: dict[str, Any]) -> None:
        """Create or update an object (ADDED or MODIFIED on open watches)."""
        obj = copy.deepcopy(obj)
        kind = obj["kind"]
        with self._cond:
            self._rv += 1
            obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
            key = self._key(obj)
            event_type = "MODIFIED" if key in self._state[kind] else "ADDED"
            self._state[kind][key] = obj
            self._log.append(_Event(self._rv, event_type, kind, obj))
            self._cond.notify_all()

    def delete(self, kind: str, name: str, namespace: str = "") -> None:
        """Delete an object (DELETED on open watches)."""
        with self._cond:
            obj = self._state[kind].pop((namespace, name))
            self._rv += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self._rv)
            self._log.append(_Event(self._rv, "DELETED", kind, obj))
            self._cond.notify_all()

    def compact(self) -> None:
        """Forget history, as etcd compaction does: watches from older versions get 410 Gone."""
        with self._cond:
            self._compacted_rv = self._rv
            self._log.clear()
            self._cond.notify_all()

    def delete_unseen(self, kind: str, name: str, namespace: str = "") -> None:
        """Delete an object while its history is compacted away: no watcher sees a DELETED event.

        This is what a watcher that was disconnected across the deletion faces; only a re-list
        after `410 Gone` can notice the object is gone.
        """
        with self._cond:
            del self._state[kind][(namespace, name)]
            self._rv += 1
            self._compacted_rv = self._rv
            self._log.clear()
            self._cond.notify_all()

    def inject(self, kind: str, what: str) -> None:
        """Make the next watch request for `kind` fail in the given way."""
        with self._cond:
            self._faults.append(Fault(kind, what))

    def count(self, kind: str, *, watch: bool) -> int:
        """How many list (watch=False) or watch (watch=True) requests were made for `kind`."""
        plural = KINDS[kind][1]
        return sum(
            1
            for path, query in list(self.requests)
            if path.endswith("/" + plural) and (query.get("watch", ["false"])[0] in ("true", "1")) == watch
        )

    def watch_versions(self, kind: str) -> list[int]:
        """The resourceVersion each watch request for `kind` started from, in order."""
        plural = KINDS[kind][1]
        return [
            int(query.get("resourceVersion", ["0"])[0] or 0)
            for path, query in list(self.requests)
            if path.endswith("/" + plural) and query.get("watch", ["false"])[0] in ("true", "1")
        ]

    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._rv

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> FakeApiServer:
        server = self

        class Handler(_Handler):
            api = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="fake-apiserver", daemon=True)
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(10)

    def kubeconfig(self) -> dict[str, Any]:
        """A kubeconfig pointing at this server with a bearer token, as a cluster admin would hand out."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "railtrace", "user": {"token": self.token} if self.token is not None else {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "railtrace"}}],
            "current-context": "fake",
        }

    # -- serving --------------------------------------------------------------------------

    @staticmethod
    def _key(obj: dict[str, Any]) -> tuple[str, str]:
        meta = obj["metadata"]
        return (meta.get("namespace") or "", meta["name"])

    def route(self, path: str) -> tuple[str, str, str | None] | None:
        """(kind, apiVersion, namespace) for a collection path, or None for 404."""
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group_version, rest = "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis" and parts[1] == "resource.k8s.io":
            if parts[2] not in self.dra_versions:
                return None
            group_version, rest = f"resource.k8s.io/{parts[2]}", parts[3:]
        else:
            return None
        namespace = None
        if len(rest) == 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if len(rest) != 1:
            return None
        for kind, (group, plural, namespaced) in KINDS.items():
            if plural == rest[0] and (group or "") == group_version.rpartition("/")[0]:
                if namespace is not None and not namespaced:
                    return None
                return kind, group_version, namespace
        return None

    def render(self, obj: dict[str, Any], api_version: str) -> dict[str, Any]:
        """The object as served at `api_version` (v1beta1 slices nest attributes under `basic`)."""
        out = copy.deepcopy(obj)
        if out["kind"] in ("ResourceSlice", "ResourceClaim"):
            out["apiVersion"] = api_version
        if out["kind"] == "ResourceSlice" and api_version.endswith("/v1beta1"):
            for device in out.get("spec", {}).get("devices", []):
                basic = {k: device.pop(k) for k in ("attributes", "capacity") if k in device}
                device["basic"] = basic
        return out

    def list_body(self, kind: str, api_version: str, namespace: str | None, query: dict[str, list[str]]):
        with self._cond:
            items = [
                o for key, o in sorted(self._state[kind].items()) if namespace is None or key[0] == namespace
            ]
            rv = self._rv
        start = int(query.get("continue", ["0"])[0] or 0)
        limit = int(query.get("limit", ["0"])[0] or 0) or len(items) or 1
        page = items[start : start + limit]
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if start + limit < len(items):
            meta["continue"] = str(start + limit)
        rendered = []
        for o in page:
            r = self.render(o, api_version)
            r.pop("kind", None)  # list items carry no kind/apiVersion on the wire
            r.pop("apiVersion", None)
            rendered.append(r)
        return {"kind": f"{kind}List", "apiVersion": api_version, "metadata": meta, "items": rendered}

    def take_fault(self, kind: str) -> Fault | None:
        with self._cond:
            for fault in list(self._faults):
                if fault.kind == kind:
                    self._faults.remove(fault)
                    return fault
        return None


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class _Handler(BaseHTTPRequestHandler):
    api: FakeApiServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        return

    def handle(self) -> None:
        # The client may shut a kept-alive or watch connection at any time; that is its right.
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            super().handle()

    def _json(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _bookmark(self, kind: str, api_version: str) -> dict[str, Any]:
        return {"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": str(self.api._rv)}}

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        api = self.api
        if api.token is not None and self.headers.get("Authorization") != f"Bearer {api.token}":
            api.unauthorized += 1
            self._json(401, _status(401, "Unauthorized", "Unauthorized"))
            return
        api.requests.append((url.path, query))
        routed = api.route(url.path)
        if routed is None:
            self._json(404, _status(404, "NotFound", "the server could not find the requested resource"))
            return
        kind, api_version, namespace = routed
        if query.get("watch", ["false"])[0] not in ("true", "1"):
            self._json(200, api.list_body(kind, api_version, namespace, query))
            return
        self._watch(kind, api_version, namespace, query)

    def _watch(self, kind: str, api_version: str, namespace: str | None, query: dict[str, list[str]]) -> None:
        api = self.api
        fault = api.take_fault(kind)
        if fault is not None and fault.what == "http500":
            self._json(500, _status(500, "InternalError", "etcd leader changed"))
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        from_rv = int(query.get("resourceVersion", ["0"])[0] or 0)
        timeout = float(query.get("timeoutSeconds", ["30"])[0])
        deadline = time.monotonic() + timeout
        try:
            if fault is not None and fault.what == "error500":
                boom = {"type": "ERROR", "object": _status(500, "InternalError", "boom")}
                self._chunk(json.dumps(boom).encode() + b"\n")
                self._chunk(b"")
                return
            if fault is not None and fault.what == "cut":
                # Half an event, then the connection drops without the closing chunk.
                self._chunk(b'{"type":"ADDED","object":{"kind":')
                self.close_connection = True
                return
            if (fault is not None and fault.what == "gone") or (from_rv and from_rv < api._compacted_rv):
                gone = _status(410, "Expired", f"too old resource version: {from_rv} ({api._compacted_rv})")
                self._chunk(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
                self._chunk(b"")
                return
            sent_rv = from_rv
            bookmarks = query.get("allowWatchBookmarks", ["false"])[0] in ("true", "1")
            if query.get("sendInitialEvents", ["false"])[0] in ("true", "1"):
                # A streaming list (client-go's WatchListClient, on by default from Kubernetes
                # 1.34): every current object as ADDED, then a bookmark that ends the initial list.
                with api._cond:
                    sent_rv = api._rv
                    initial = [
                        {"type": "ADDED", "object": api.render(o, api_version)}
                        for key, o in sorted(api._state[kind].items())
                        if namespace is None or key[0] == namespace
                    ]
                end = self._bookmark(kind, api_version)
                end["metadata"]["annotations"] = {"k8s.io/initial-events-end": "true"}
                for event in [*initial, {"type": "BOOKMARK", "object": end}]:
                    self._chunk(json.dumps(event).encode() + b"\n")
            ended = False
            while True:
                with api._cond:
                    if api._closing:
                        break
                    if sent_rv and sent_rv < api._compacted_rv:
                        gone = _status(410, "Expired", f"too old resource version: {sent_rv}")
                        pending = [{"type": "ERROR", "object": gone}]
                        sent_rv = api._rv
                    else:
                        events = [
                            e
                            for e in api._log
                            if e.rv > sent_rv
                            and e.kind == kind
                            and (namespace is None or e.obj["metadata"].get("namespace") == namespace)
                        ]
                        pending = [{"type": e.type, "object": api.render(e.obj, api_version)} for e in events]
                        if events:
                            sent_rv = events[-1].rv
                        elif not sent_rv:
                            sent_rv = api._rv
                    if not pending:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            if bookmarks:
                                # Nothing of this kind is newer than the current version: say so,
                                # as the real server does, so the client resumes from there.
                                pending = [{"type": "BOOKMARK", "object": self._bookmark(kind, api_version)}]
                                ended = True
                            else:
                                break
                        else:
                            api._cond.wait(min(remaining, 0.5))
                            continue
                for event in pending:
                    self._chunk(json.dumps(event).encode() + b"\n")
                if ended or (pending and pending[-1]["type"] == "ERROR"):
                    break
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
