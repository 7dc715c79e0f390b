"""Live topology from the Kubernetes API (`railtrace serve --topology k8s`).

Lists and watches Nodes, Pods, ResourceSlices and ResourceClaims with the official
`kubernetes` client, keeps the current set of objects as plain dicts in the API's JSON shape,
and on every change rebuilds the model with `TopologyBuilder` and swaps it into the
`TopologyHolder`, so verdicts follow pods as they come and go without a restart.

Why list+watch per kind rather than a periodic poll: a topology that is minutes stale pairs a
request with the previous tenant of a GPU. Why plain dicts: the builder reads the same JSON
shape from files (`kubectl get -o yaml`) and from the API, so there is one parser.

Failure handling follows the API's own contract: a watch that ends is resumed from the last
resourceVersion; `410 Gone` (history compacted) re-lists that kind and replaces its whole set,
which also drops objects deleted while nobody was watching; any other error backs off
exponentially and retries. The last good model stays in the holder meanwhile.

Needs read-only RBAC: get/list/watch on nodes, pods, resourceslices, resourceclaims
(`deploy/base/rbac.yaml`).
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from railtrace.topology.k8s_keys import RESOURCE_GROUP

log = logging.getLogger("railtrace.topology.k8s")

K8S_TOPOLOGY = "k8s"
"""The `--topology` value that selects the live cluster instead of files."""

SOURCE_NAME = "kubernetes API"
"""How objects from the live cluster are attributed in the model's `sources`."""

# Newest first: the DRA API went GA as v1 in Kubernetes 1.34; v1beta2 (1.33) and v1beta1
# (1.32) are what older clusters still serve.
RESOURCE_VERSIONS = ("v1", "v1beta2", "v1beta1")
# Completed pods hold no devices; leaving them out keeps the set small in busy clusters.
DEFAULT_POD_FIELD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"


class _Builder(Protocol):
    def add_k8s_object(self, obj: dict[str, Any], source: str = "") -> Any: ...
    def build(self) -> Any: ...


class _Holder(Protocol):
    def replace(self, topology: Any) -> Any: ...


class NotServedError(Exception):
    """None of the API versions of a kind is served by this cluster (e.g. no DRA API)."""


@dataclass
class KindStatus:
    """What the source knows about one kind; shown in logs and readiness, read by tests."""

    kind: str
    api_version: str | None = None
    synced: bool = False
    served: bool = True
    objects: int = 0
    lists: int = 0
    relists_after_gone: int = 0
    watch_restarts: int = 0
    errors: int = 0
    last_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class _Kind:
    """One watched kind: candidate API versions with the client function that lists them."""

    kind: str
    namespaced: bool
    candidates: list[tuple[str, Callable[..., Any]]]
    field_selector: str | None = None
    label_selector: str | None = None
    status: KindStatus = field(init=False)

    def __post_init__(self) -> None:
        self.status = KindStatus(self.kind)


def load_api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """An `ApiClient` from a kubeconfig file, else in-cluster service account, else ~/.kube/config."""
    try:
        from kubernetes import client, config
    except ModuleNotFoundError as exc:  # pragma: no cover - the extra is part of the test install
        raise RuntimeError(
            "--topology k8s needs the official Kubernetes client: pip install 'railtrace[kubernetes]'"
        ) from exc
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not os.environ.get("KUBECONFIG")
    try:
        if kubeconfig is None and in_cluster:
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        return config.new_client_from_config(config_file=kubeconfig, context=context)
    except (config.ConfigException, OSError) as exc:
        raise RuntimeError(
            f"--topology k8s: cannot reach a cluster ({exc}); run in a pod with a service account, "
            "or set RAILTRACE_KUBECONFIG or KUBECONFIG to a kubeconfig file"
        ) from exc


def _default_builder_factory() -> _Builder:
    from railtrace.topology import TopologyBuilder

    return TopologyBuilder()


def _flatten_v1beta1_devices(obj: dict[str, Any]) -> dict[str, Any]:
    """v1beta1 nests device attributes under `basic`; v1beta2 and v1 do not. Give one shape."""
    devices = (obj.get("spec") or {}).get("devices")
    for device in devices if isinstance(devices, list) else []:
        if not isinstance(device, dict):
            continue  # malformed: left for the builder to report
        basic = device.pop("basic", None)
        if isinstance(basic, dict):
            for key, value in basic.items():
                device.setdefault(key, value)
    return obj


class KubernetesTopologySource:
    """Keeps the holder's topology in step with the cluster.

    `start()` runs one list+watch thread per kind and one rebuild thread; `stop()` ends them.
    The first model is published once every kind has been listed, so the service never
    judges requests against a half-loaded cluster.
    """

    def __init__(
        self,
        holder: _Holder,
        api_client: Any,
        *,
        builder_factory: Callable[[], _Builder] = _default_builder_factory,
        static_inputs: Callable[[_Builder], None] | None = None,
        namespace: str | None = None,
        pod_label_selector: str | None = None,
        pod_field_selector: str | None = DEFAULT_POD_FIELD_SELECTOR,
        watch_timeout_s: int = 300,
        page_size: int = 500,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        settle_s: float = 0.2,
        rediscover_s: float = 300.0,
    ) -> None:
        from kubernetes import client

        self._holder = holder
        self._api_client = api_client
        self._builder_factory = builder_factory
        self._static_inputs = static_inputs
        self._watch_timeout_s = max(1, int(watch_timeout_s))
        self._page_size = page_size
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._settle_s = settle_s
        self._rediscover_s = rediscover_s

        core = client.CoreV1Api(api_client)
        dra = {
            "v1": client.ResourceV1Api(api_client),
            "v1beta2": client.ResourceV1beta2Api(api_client),
            "v1beta1": client.ResourceV1beta1Api(api_client),
        }

        def claims(api: Any) -> Callable[..., Any]:
            if namespace:
                return functools.partial(api.list_namespaced_resource_claim, namespace)
            return api.list_resource_claim_for_all_namespaces

        pods = (
            functools.partial(core.list_namespaced_pod, namespace)
            if namespace
            else core.list_pod_for_all_namespaces
        )
        self._kinds = [
            _Kind("Node", False, [("v1", core.list_node)]),
            _Kind("Pod", True, [("v1", pods)], pod_field_selector, pod_label_selector),
            _Kind(
                "ResourceSlice",
                False,
                [(f"{RESOURCE_GROUP}/{v}", dra[v].list_resource_slice) for v in RESOURCE_VERSIONS],
            ),
            _Kind(
                "ResourceClaim",
                True,
                [(f"{RESOURCE_GROUP}/{v}", claims(dra[v])) for v in RESOURCE_VERSIONS],
            ),
        ]
        self._lock = threading.Lock()
        self._objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {k.kind: {} for k in self._kinds}
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._published = threading.Condition()
        self._generation = 0
        self._threads: list[threading.Thread] = []
        self._watches: dict[str, Any] = {}

    # -- public ---------------------------------------------------------------------------

    def start(self) -> KubernetesTopologySource:
        """Start the watch threads and the rebuild thread; returns self."""
        if self._threads:
            return self
        self._stop.clear()
        for kind in self._kinds:
            thread = threading.Thread(
                target=self._run_kind, args=(kind,), name=f"railtrace-k8s-{kind.kind}", daemon=True
            )
            self._threads.append(thread)
        self._threads.append(
            threading.Thread(target=self._run_rebuild, name="railtrace-k8s-rebuild", daemon=True)
        )
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop watching; open watch streams are shut so no thread is left blocked on a socket."""
        self._stop.set()
        self._dirty.set()
        with self._lock:
            responses = list(self._watches.values())
        for response in responses:
            try:
                response.shutdown()  # unblocks the reader thread's recv
            except Exception:
                log.debug("watch stream already closed", exc_info=True)
        for thread in self._threads:
            thread.join(timeout)
        self._threads = []

    def __enter__(self) -> KubernetesTopologySource:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def synced(self) -> bool:
        """True once every kind has been listed (or found not served) at least once."""
        return all(k.status.synced for k in self._kinds)

    @property
    def generation(self) -> int:
        """How many models have been published to the holder."""
        with self._published:
            return self._generation

    def status(self) -> dict[str, dict[str, Any]]:
        """Per kind: served API version, object count, lists, 410 re-lists, errors."""
        with self._lock:
            return {k.kind: k.status.to_dict() for k in self._kinds}

    def objects(self) -> list[dict[str, Any]]:
        """The current object set (deep copies), in a stable order."""
        with self._lock:
            out = []
            for kind in self._kinds:
                for key in sorted(self._objects[kind.kind]):
                    out.append(copy.deepcopy(self._objects[kind.kind][key]))
            return out

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 30.0) -> bool:
        """Block until `predicate()` holds after a publish (or now); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._published:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._published.wait(min(remaining, 0.5))
            return True

    def rebuild(self) -> Any:
        """Build a model from the current object set (and static inputs) and publish it."""
        topology = self._build(self.objects())
        self._holder.replace(topology)
        with self._published:
            self._generation += 1
            self._published.notify_all()
        return topology

    # -- model ----------------------------------------------------------------------------

    def _build(self, objects: Iterable[dict[str, Any]]) -> Any:
        """The model of these objects; an object the builder chokes on is left out, not fatal.

        One malformed object from the cluster (a driver publishing an odd slice) must not
        freeze the model for every other node, so when the full build fails each object is
        tried alone and the ones that fail alone are skipped with a warning.
        """
        objects = list(objects)
        try:
            return self._build_from(objects, with_static=True)
        except Exception as exc:
            log.warning(
                "topology build failed (%s: %s); isolating the object that breaks it", type(exc).__name__, exc
            )
        good = []
        for obj in objects:
            try:
                self._build_from([obj], with_static=False)
            except Exception as exc:
                meta = obj.get("metadata") or {}
                log.warning(
                    "skipping %s %s/%s: %s: %s",
                    obj.get("kind"),
                    meta.get("namespace") or "",
                    meta.get("name"),
                    type(exc).__name__,
                    exc,
                )
                continue
            good.append(obj)
        return self._build_from(good, with_static=True)

    def _build_from(self, objects: list[dict[str, Any]], *, with_static: bool) -> Any:
        builder = self._builder_factory()
        if with_static and self._static_inputs is not None:
            self._static_inputs(builder)
        for obj in objects:
            builder.add_k8s_object(obj, source=SOURCE_NAME)
        return builder.build()

    def _run_rebuild(self) -> None:
        while not self._stop.is_set():
            self._dirty.wait()
            if self._stop.is_set():
                return
            if not self.synced:
                self._dirty.clear()
                continue  # the last kind to sync sets dirty again
            # Coalesce a burst (a node joining brings its slices, pods and claims at once).
            if self._settle_s > 0 and self._stop.wait(self._settle_s):
                return
            self._dirty.clear()
            try:
                self.rebuild()
            except Exception:
                log.exception("topology rebuild failed; keeping the previous model")

    # -- list + watch ---------------------------------------------------------------------

    def _run_kind(self, kind: _Kind) -> None:
        from kubernetes.client.exceptions import ApiException

        resource_version: str | None = None
        need_list = True
        backoff = self._backoff_s
        while not self._stop.is_set():
            try:
                if need_list:
                    resource_version = self._list(kind)
                    need_list = False
                resource_version = self._watch(kind, resource_version)
                backoff = self._backoff_s
            except NotServedError:
                self._set_not_served(kind)
                need_list = True
                self._stop.wait(self._rediscover_s)
            except ApiException as exc:
                if exc.status == 410:
                    log.info(
                        "%s: resourceVersion %s expired (410 Gone); re-listing", kind.kind, resource_version
                    )
                    with self._lock:
                        kind.status.relists_after_gone += 1
                    need_list = True
                    continue
                if exc.status == 404:
                    need_list = True  # the served version went away: discover again
                self._record_error(kind, f"HTTP {exc.status} {exc.reason}".strip())
                backoff = self._sleep_backoff(backoff)
            except Exception as exc:  # connection reset, truncated stream, bad JSON, ...
                if self._stop.is_set():
                    return
                self._record_error(kind, f"{type(exc).__name__}: {exc}")
                backoff = self._sleep_backoff(backoff)

    def _sleep_backoff(self, backoff: float) -> float:
        self._stop.wait(backoff * (0.5 + random.random() / 2))
        return min(backoff * 2, self._max_backoff_s)

    def _record_error(self, kind: _Kind, message: str) -> None:
        log.warning("%s: %s", kind.kind, message)
        with self._lock:
            kind.status.errors += 1
            kind.status.last_error = message

    def _set_not_served(self, kind: _Kind) -> None:
        log.warning(
            "%s is not served by this cluster (tried %s); using the other kinds only",
            kind.kind,
            ", ".join(v for v, _ in kind.candidates),
        )
        with self._lock:
            changed = bool(self._objects[kind.kind])
            self._objects[kind.kind] = {}
            kind.status.served = False
            kind.status.api_version = None
            kind.status.objects = 0
            first = not kind.status.synced
            kind.status.synced = True
        if changed or first:
            self._dirty.set()

    def _list(self, kind: _Kind) -> str:
        """List every page of the kind, replace its whole set, return the list's resourceVersion."""
        from kubernetes.client.exceptions import ApiException

        candidates = kind.candidates
        if kind.status.api_version:  # try the version that worked last time first
            candidates = sorted(candidates, key=lambda c: c[0] != kind.status.api_version)
        for api_version, func in candidates:
            try:
                items, resource_version = self._list_pages(kind, func, api_version)
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            with self._lock:
                self._objects[kind.kind] = {self._key(obj): obj for obj in items}
                kind.status.api_version = api_version
                kind.status.served = True
                kind.status.synced = True
                kind.status.lists += 1
                kind.status.objects = len(items)
            self._dirty.set()
            log.info(
                "%s: listed %d objects (%s, resourceVersion %s)",
                kind.kind,
                len(items),
                api_version,
                resource_version,
            )
            return resource_version
        raise NotServedError(kind.kind)

    def _list_pages(
        self, kind: _Kind, func: Callable[..., Any], api_version: str
    ) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        continue_token: str | None = None
        resource_version = ""
        while True:
            kwargs: dict[str, Any] = {"limit": self._page_size, "_preload_content": False}
            if continue_token:
                kwargs["_continue"] = continue_token
            if kind.field_selector:
                kwargs["field_selector"] = kind.field_selector
            if kind.label_selector:
                kwargs["label_selector"] = kind.label_selector
            response = func(**kwargs)
            try:
                body = json.loads(response.data)
            finally:
                response.release_conn()
            for raw in body.get("items") or []:
                items.append(self._normalise(kind, api_version, raw))
            meta = body.get("metadata") or {}
            resource_version = str(meta.get("resourceVersion") or resource_version)
            continue_token = meta.get("continue")
            if not continue_token:
                return items, resource_version

    def _watch(self, kind: _Kind, resource_version: str | None) -> str | None:
        """Apply watch events until the server ends the stream; return the last resourceVersion.

        The stream is read line by line here rather than through `kubernetes.watch.Watch`,
        whose raw mode cannot report an ERROR event (it looks for a key only its model mode
        sets) and whose model mode re-validates every object against the client's models.
        """
        from kubernetes.client.exceptions import ApiException
        from kubernetes.watch.watch import iter_resp_lines

        api_version = kind.status.api_version
        func = dict(kind.candidates)[api_version]
        kwargs: dict[str, Any] = {
            "watch": True,
            "timeout_seconds": self._watch_timeout_s,
            "allow_watch_bookmarks": True,
            "_preload_content": False,
            # A dead connection shows up as a read timeout instead of a hang.
            "_request_timeout": (10, self._watch_timeout_s + 30),
        }
        if resource_version:
            kwargs["resource_version"] = resource_version
        if kind.field_selector:
            kwargs["field_selector"] = kind.field_selector
        if kind.label_selector:
            kwargs["label_selector"] = kind.label_selector
        response = func(**kwargs)
        with self._lock:
            self._watches[kind.kind] = response
        try:
            if self._stop.is_set():
                return resource_version
            for line in iter_resp_lines(response):
                if self._stop.is_set():
                    break
                if not line.strip():
                    continue
                event = json.loads(line)
                if not isinstance(event, dict):
                    continue
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    raise ApiException(
                        status=int(status.get("code") or 500),
                        reason=f"{status.get('reason', '')}: {status.get('message', '')}",
                    )
                resource_version = self._apply(kind, api_version, event) or resource_version
        finally:
            with self._lock:
                self._watches.pop(kind.kind, None)
                kind.status.watch_restarts += 1
            response.release_conn()
        return resource_version

    def _apply(self, kind: _Kind, api_version: str | None, event: dict[str, Any]) -> str | None:
        event_type = event.get("type")
        raw = event.get("object")
        if not isinstance(raw, dict):
            return None
        resource_version = (raw.get("metadata") or {}).get("resourceVersion")
        if event_type == "BOOKMARK":
            return resource_version
        obj = self._normalise(kind, api_version or "", raw)
        key = self._key(obj)
        with self._lock:
            objects = self._objects[kind.kind]
            if event_type in ("ADDED", "MODIFIED"):
                objects[key] = obj
            elif event_type == "DELETED":
                objects.pop(key, None)
            else:
                return resource_version
            kind.status.objects = len(objects)
        self._dirty.set()
        return resource_version

    @staticmethod
    def _normalise(kind: _Kind, api_version: str, raw: dict[str, Any]) -> dict[str, Any]:
        # List items carry no kind/apiVersion; the builder dispatches on them.
        raw.setdefault("kind", kind.kind)
        # Field-manager bookkeeping is often the largest part of a Pod; the model never reads it.
        (raw.get("metadata") or {}).pop("managedFields", None)
        raw.setdefault("apiVersion", api_version)
        if kind.kind == "ResourceSlice" and raw.get("apiVersion", "").endswith("/v1beta1"):
            _flatten_v1beta1_devices(raw)
        return raw

    @staticmethod
    def _key(obj: dict[str, Any]) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return (meta.get("namespace") or "", meta.get("name") or meta.get("uid") or "")


def wants_live_topology(paths: Sequence[str]) -> bool:
    """True if `--topology k8s` was given."""
    return any(p == K8S_TOPOLOGY for p in paths)


def start_live_topology(
    holder: _Holder,
    paths: Sequence[str],
    *,
    kubeconfig: str | None = None,
    context: str | None = None,
    **options: Any,
) -> KubernetesTopologySource | None:
    """Start a source for the service if `k8s` is among the topology paths; None otherwise.

    The other paths (files, folders, `nvidia-smi topo -m` output, railtrace YAML) are read
    again into every rebuilt model, so what the cluster does not publish -- GPU NUMA from
    `nvidia-smi`, rails from a railtrace document -- is not lost when the cluster changes.
    """
    if not wants_live_topology(paths):
        return None
    static = [p for p in paths if p != K8S_TOPOLOGY]
    if static and "static_inputs" not in options:
        from railtrace.topology.loaders import load_into

        options["static_inputs"] = lambda builder: load_into(builder, static)
    api_client = load_api_client(kubeconfig or os.environ.get("RAILTRACE_KUBECONFIG"), context)
    return KubernetesTopologySource(holder, api_client, **options).start()


class _Capture:
    """A holder that just keeps what it is given (for one-shot snapshots)."""

    topology: Any = None

    def replace(self, topology: Any) -> None:
        self.topology = topology


def snapshot_topology(api_client: Any | None = None, **options: Any) -> Any:
    """List the cluster once, without watching, and build the model.

    For one-shot tools such as `railtrace topology show k8s` and `railtrace contract`; the
    service uses `start_live_topology` instead. Kinds the cluster does not serve are left out.
    """
    from kubernetes.client.exceptions import ApiException

    if api_client is None:
        api_client = load_api_client(options.pop("kubeconfig", None), options.pop("context", None))
    holder = _Capture()
    source = KubernetesTopologySource(holder, api_client, **options)
    for kind in source._kinds:
        try:
            source._list(kind)
        except NotServedError:
            source._set_not_served(kind)
        except ApiException as exc:
            raise RuntimeError(f"listing {kind.kind} failed: HTTP {exc.status} {exc.reason}") from exc
    return source.rebuild()
