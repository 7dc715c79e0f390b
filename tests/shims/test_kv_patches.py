"""The NIXL patches' bookkeeping, on a stand-in agent class (no NIXL needed): every path from post
to span — completion inside the post, polling, error, release before done, prepped lists,
NIXL telemetry, inline emission — and that uninstrument() puts the class back as it was.

Every test runs four times: with handles of a slotted class, as NIXL 1.x's `nixl_xfer_handle` (the
shim keeps each record on the handle, in a subclass it puts in NIXL's module), and with opaque
objects, as NIXL releases whose handles are plain values (records keyed by id); each with the C
hot path (`_hotpath.c`, the default where it is built: the test environment builds it) and with
the Python patches (`RAILTRACE_KV_HOT_PATH=python`). With opaque handles the C patches hand
every call to the Python ones, which these tests also cover."""

from __future__ import annotations

import contextlib
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from railtrace_tracing import semconv as sc
from railtrace_tracing.kv_transfer import instrumentor as mod
from railtrace_tracing.kv_transfer import kv_transfer_scope

MODULE = "railtrace_fake_nixl._api"


class Telemetry:
    totalBytes = 4096
    descCount = 2
    postDuration = 10.0
    xferDuration = 250.0


class FakeAgent:
    """nixl_agent's method names and argument shapes; `script` gives the states to return."""

    def __init__(self, name: str, nixl_conf: Any = None) -> None:
        self.name = name
        self.script: list[str] = ["DONE"]
        self._last = "PROC"
        self.telemetry_reads: list[int] = []  # the thread of each get_xfer_telemetry call

    def add_remote_agent(self, metadata: bytes) -> bytes:
        return metadata

    def prep_xfer_dlist(self, agent_name: str, xfer_list: Any, mem_type: str = "DRAM") -> object:
        return object()

    def initialize_xfer(
        self, operation: str, local_descs: Any, remote_descs: Any, remote_agent: str, notif=b""
    ):
        return self._new_handle()

    def make_prepped_xfer(self, operation: str, local_xfer_side: Any, local_indices: Any, *rest: Any):
        return self._new_handle()

    def _new_handle(self) -> Any:
        # As NIXL's _api does: the handle class is looked up in the module when a handle is made.
        handle_cls = getattr(sys.modules.get(MODULE), "nixl_xfer_handle", None)
        return object() if handle_cls is None else handle_cls(self, 0)

    def transfer(self, handle: Any, notif_msg: bytes = b"") -> str:
        return self._next()

    def check_xfer_state(self, handle: Any) -> str:
        return self._next()

    def _next(self) -> str:
        # NIXL keeps a handle's state: once the script is used up, a poll gets the last one again.
        state = self.script.pop(0) if self.script else self._last
        self._last = state
        if state.startswith("raise:"):  # NIXL raises nixlBackendError & co. on a failed post/poll
            raise type(state[6:], (RuntimeError,), {})("backend failure")
        return state

    def release_xfer_handle(self, handle: Any) -> None:
        return None

    def get_xfer_telemetry(self, handle: Any) -> Telemetry:
        self.telemetry_reads.append(threading.get_ident())
        return Telemetry()


class SlottedHandle:
    """NIXL 1.x's `nixl_xfer_handle` shape: slots, no instance dict."""

    __slots__ = ("_agent", "_handle", "_released")

    def __init__(self, agent: Any, value: int) -> None:
        self._handle = int(value)
        self._agent = agent
        self._released = False


def install_fake_nixl(
    monkeypatch: pytest.MonkeyPatch, slotted: bool
) -> tuple[Any, Any, InMemorySpanExporter, TracerProvider]:
    """A NIXL-shaped module in `sys.modules` (handles of a slotted class, or opaque objects), the
    instrumentor watching only it and reset, with no UCX log (transport unknown); not instrumented.
    Returns (instrumentor, agent class, span exporter, tracer provider)."""
    api = types.ModuleType(MODULE)
    cls = type("nixl_agent", (FakeAgent,), {})
    api.nixl_agent = cls  # type: ignore[attr-defined]
    if slotted:
        api.nixl_xfer_handle = type("nixl_xfer_handle", (SlottedHandle,), {"__slots__": ()})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "railtrace_fake_nixl", types.ModuleType("railtrace_fake_nixl"))
    monkeypatch.setitem(sys.modules, MODULE, api)
    monkeypatch.setattr(mod, "NIXL_MODULES", (MODULE,))
    mem = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(mem))
    inst = mod.NixlKVTransferInstrumentor()
    inst.uninstrument()
    monkeypatch.setattr(inst, "capture", mod.UcxLogCapture())
    return inst, cls, mem, tp


@pytest.fixture(
    params=[
        ("slotted-handles", "c"),
        ("slotted-handles", "python"),
        ("opaque-handles", "c"),
        ("opaque-handles", "python"),
    ],
    ids="-".join,
)
def traced(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Any, InMemorySpanExporter, Any]]:
    handles, hot_path = request.param
    monkeypatch.setenv(sc.ENV_KV_HOT_PATH, hot_path)  # "c" fails loudly if it is not built
    inst, cls, mem, tp = install_fake_nixl(monkeypatch, slotted=handles == "slotted-handles")
    yield inst, mem, (cls, tp)
    inst.uninstrument()


def _start(traced: Any, **kwargs: Any) -> tuple[Any, Any]:
    inst, _mem, (cls, tp) = traced
    inst.instrument(tracer_provider=tp, capture_ucx_log=False, vllm_hook=False, **kwargs)
    return inst, cls


def finished_kv_spans(inst: Any, mem: InMemorySpanExporter) -> list[Any]:
    assert inst.force_flush()
    return [s for s in mem.get_finished_spans() if s.name == sc.SPAN_KV_TRANSFER]


def test_done_in_post_and_after_polling(traced: Any) -> None:
    inst, cls = _start(traced)
    agent = cls("dec-0")
    descs = [(0, 1 << 20, 0), (1 << 20, 1 << 20, 0)]
    with kv_transfer_scope("req-1", remote_engine_id="pre-7", remote_host="10.0.0.7"):
        h = agent.initialize_xfer("READ", descs, descs, "peer-agent")
        assert agent.transfer(h) == "DONE"
        agent.script = ["PROC", "PROC", "DONE"]
        assert agent.transfer(h) == "PROC"
        while agent.check_xfer_state(h) != "DONE":
            pass
        agent.release_xfer_handle(h)
    spans = finished_kv_spans(inst, traced[1])
    assert len(spans) == 2
    for span in spans:
        a = span.attributes
        assert a[sc.KV_OPERATION] == "read" and a[sc.KV_BYTES] == 2 << 20 and a[sc.KV_DESCRIPTORS] == 2
        assert a[sc.KV_REQUEST_ID] == "req-1" and a[sc.KV_REMOTE_ENGINE_ID] == "pre-7"
        assert a[sc.KV_REMOTE_HOST] == "10.0.0.7" and a[sc.KV_TRANSPORT] == "unknown"
        assert span.start_time <= span.end_time and span.status.status_code != StatusCode.ERROR


def test_error_release_before_done_and_unknown_handle(traced: Any) -> None:
    inst, cls = _start(traced)
    agent = cls("dec-0")
    h = agent.initialize_xfer("WRITE", [(0, 10, 0)], [(0, 10, 0)], "peer")
    agent.script = ["PROC", "ERR"]
    agent.transfer(h)
    agent.check_xfer_state(h)
    h2 = agent.initialize_xfer("READ", [(0, 10, 0)], [(0, 10, 0)], "peer")
    agent.script = ["PROC"]
    agent.transfer(h2)
    agent.release_xfer_handle(h2)
    agent.script = ["DONE"]
    agent.transfer(object())  # a handle the shim never saw prepared
    by_error = {s.attributes.get(sc.ERROR_TYPE): s for s in finished_kv_spans(inst, traced[1])}
    assert set(by_error) == {"nixl_xfer_err", "released_before_done", None}
    assert by_error["nixl_xfer_err"].status.status_code == StatusCode.ERROR
    assert by_error["nixl_xfer_err"].attributes[sc.KV_REMOTE_ENGINE_ID] == "peer"
    assert by_error[None].attributes[sc.KV_OPERATION] == "unknown"


def test_prepped_lists_telemetry_and_inline(traced: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", "y")
    _inst, cls = _start(traced, background_emit=False)
    agent = cls("dec-0")
    side = agent.prep_xfer_dlist("", [(0, 100, 0), (0, 200, 0), (0, 300, 0)])
    h = agent.make_prepped_xfer("READ", side, [0, 2], None, None)
    agent.transfer(h)
    [span] = [s for s in traced[1].get_finished_spans() if s.name == sc.SPAN_KV_TRANSFER]  # emitted inline
    a = span.attributes
    assert a[sc.KV_BYTES] == 4096 and a[sc.KV_DESCRIPTORS] == 2  # NIXL's own numbers win
    assert a[sc.KV_POST_DURATION_S] == pytest.approx(10e-6)
    monkeypatch.delenv("NIXL_TELEMETRY_ENABLE")
    agent2 = cls("dec-1")
    h = agent2.make_prepped_xfer("READ", side, [0, 2], None, None)
    agent2.transfer(h)
    last = [s for s in traced[1].get_finished_spans() if s.name == sc.SPAN_KV_TRANSFER][-1]
    assert last.attributes[sc.KV_BYTES] == 400 and last.attributes[sc.KV_DESCRIPTORS] == 2


def test_uninstrument_restores_the_class(traced: Any) -> None:
    inst, _mem, (cls, _tp) = traced
    before = {name: cls.__dict__.get(name) for name in mod._METHODS}
    _start(traced)
    assert all(cls.__dict__.get(n) is not before[n] for n in mod._METHODS)
    assert cls.transfer.__name__ == "transfer"
    inst.uninstrument()
    assert {name: cls.__dict__.get(name) for name in mod._METHODS} == before
    agent = cls("x")
    agent.transfer(agent.initialize_xfer("READ", [], [], "p"))
    assert finished_kv_spans(inst, traced[1]) == []


def test_a_forked_child_starts_its_own_emitter(traced: Any) -> None:
    import os

    inst, cls = _start(traced)
    agent = cls("dec-0")
    agent.transfer(agent.initialize_xfer("READ", [(0, 8, 0)], [(0, 8, 0)], "p"))
    assert inst.force_flush() and inst._worker is not None
    pid = os.fork()
    if pid == 0:  # child: a transfer must be emitted by a new emitter thread
        try:
            agent.script = ["DONE"]
            agent.transfer(agent.initialize_xfer("READ", [(0, 8, 0)], [(0, 8, 0)], "p"))
            ok = inst._worker is not None and inst._worker.is_alive() and inst.force_flush()
            os._exit(0 if ok else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_exceptions_from_post_and_poll_end_the_span_with_error(traced: Any) -> None:
    inst, cls = _start(traced)
    agent = cls("dec-0")
    with kv_transfer_scope("req-x"):
        h = agent.initialize_xfer("READ", [(0, 10, 0)], [(0, 10, 0)], "peer")
        agent.script = ["raise:nixlBackendError"]
        with pytest.raises(RuntimeError, match="backend failure"):
            agent.transfer(h)
        h2 = agent.initialize_xfer("WRITE", [(0, 10, 0)], [(0, 10, 0)], "peer")
        agent.script = ["PROC", "raise:nixlRemoteDisconnectError"]
        assert agent.transfer(h2) == "PROC"
        with pytest.raises(RuntimeError):
            agent.check_xfer_state(h2)
    spans = {s.attributes[sc.KV_OPERATION]: s for s in finished_kv_spans(inst, traced[1])}
    assert spans["read"].attributes[sc.ERROR_TYPE] == "nixlBackendError"
    assert spans["write"].attributes[sc.ERROR_TYPE] == "nixlRemoteDisconnectError"
    for span in spans.values():
        assert span.status.status_code == StatusCode.ERROR and span.attributes[sc.KV_REQUEST_ID] == "req-x"


def test_prepped_bytes_are_not_summed_on_the_posting_thread(traced: Any, monkeypatch) -> None:
    """131k-block transfers: make_prepped_xfer does O(1) work; the emitter sums with numpy."""
    import numpy as np

    inst, cls = _start(traced)
    agent = cls("dec-0")
    side = agent.prep_xfer_dlist("", [(i * 64, 64, 0) for i in range(1 << 17)])
    remote = agent.prep_xfer_dlist("prefill-agent", [(i * 64, 64, 0) for i in range(1 << 17)])
    calls: list[Any] = []
    monkeypatch.setattr(mod, "_prepped_bytes", lambda *a: calls.append(a) or 64 * len(a[1]))
    idx = np.arange(1 << 17)
    h = agent.make_prepped_xfer("READ", side, idx, remote, idx)
    assert calls == []  # nothing summed while posting
    agent.transfer(h)
    [span] = finished_kv_spans(inst, traced[1])
    assert span.attributes[sc.KV_BYTES] == 64 << 17 and span.attributes[sc.KV_DESCRIPTORS] == 1 << 17
    assert span.attributes[sc.KV_REMOTE_AGENT] == "prefill-agent"
    assert mod._prepped_bytes.__name__ == "<lambda>"


def test_telemetry_read_once_on_the_posting_thread_before_release(
    traced: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM (0.12 on) reads NIXL's telemetry itself after DONE: the shim keeps that object. A caller
    that does not gets it read by the shim at release, on its own thread, once."""
    monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", "y")
    inst, cls = _start(traced, evidence_grace_s=0.2)  # background emitter (the default)
    agent = cls("dec-0")
    reads = agent.telemetry_reads
    for script, caller_reads in ((["PROC", "DONE"], True), (["DONE", "DONE"], True), (["DONE"], False)):
        agent.script = list(script)
        h = agent.initialize_xfer("READ", [(0, 10, 0)], [(0, 10, 0)], "peer")
        if agent.transfer(h) == "PROC" or caller_reads:  # vLLM polls whatever the post returned
            assert agent.check_xfer_state(h) == "DONE"
        if caller_reads:
            agent.get_xfer_telemetry(h)
        agent.release_xfer_handle(h)
    assert reads == [threading.get_ident()] * 3  # one read per transfer, none on the emitter
    spans = finished_kv_spans(inst, traced[1])
    assert len(spans) == 3
    for span in spans:
        assert span.attributes[sc.KV_BYTES] == 4096 and span.attributes[sc.KV_XFER_DURATION_S] == 250e-6
    agent.script = ["DONE"]  # ended, then neither read nor released: emitted after the grace
    agent.transfer(agent.initialize_xfer("READ", [(0, 10, 0)], [(0, 10, 0)], "peer"))
    [late] = finished_kv_spans(inst, traced[1])[3:]
    assert late.attributes[sc.KV_BYTES] == 10 and sc.KV_XFER_DURATION_S not in late.attributes
    assert len(reads) == 3


def test_nothing_after_the_post_but_two_stores(traced: Any) -> None:
    """A transfer that ends inside the post (cma) is noted by two stores into its record, made
    before the post; the span is built later, by the emitter."""
    inst, cls = _start(traced)
    agent = cls("dec-0")
    h = agent.initialize_xfer("READ", [(0, 10, 0)], [(0, 10, 0)], "peer")
    seen: list[Any] = []
    agent.script = ["DONE"]
    real_next = agent._next

    def post_sees_the_record() -> str:  # inside the post: the record exists, not ended
        seen.append(list(inst._record_of(h)))
        return real_next()

    agent._next = post_sees_the_record  # type: ignore[method-assign]
    assert agent.transfer(h) == "DONE"
    before, after = seen[0], inst._record_of(h)
    assert before[5] is None and before[6] is None and before[0] > 0
    assert after[5] == "DONE" and after[6] >= after[0] and after[:5] == before[:5]
    agent.release_xfer_handle(h)
    [span] = finished_kv_spans(inst, traced[1])
    assert span.start_time == after[0] and span.end_time == after[6]


def test_the_emitter_emits_on_its_own_without_force_flush(traced: Any) -> None:
    """Spans reach the exporter from the background emitter alone (busy and after idling)."""
    import time

    _inst, cls = _start(traced)
    agent = cls("dec-0")
    for round_ in range(2):  # the second round starts from the emitter's idle pace
        agent.script = ["DONE"]
        agent.transfer(agent.initialize_xfer("READ", [(0, 8, 0)], [(0, 8, 0)], "p"))
        deadline = time.monotonic() + 5
        while len(traced[1].get_finished_spans()) <= round_ and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(traced[1].get_finished_spans()) == round_ + 1
        time.sleep(0.2)


def test_a_failure_seen_by_the_poll_survives_the_release(traced: Any) -> None:
    """vLLM ≥ 0.12 releases a failed handle (`_handle_failed_transfer`): the span keeps the poll's
    ERR or exception, not a release-before-done."""
    inst, cls = _start(traced)
    agent = cls("dec-0")
    for script in (["PROC", "ERR"], ["PROC", "raise:nixlRemoteDisconnectError"]):
        h = agent.initialize_xfer("READ", [(0, 10, 0)], [(0, 10, 0)], "peer")
        agent.script = list(script)
        agent.transfer(h)
        with contextlib.suppress(RuntimeError):
            agent.check_xfer_state(h)
        agent.script = ["DONE"]  # whatever NIXL would say now, the failure was already noted
        agent.release_xfer_handle(h)
    errors = sorted(s.attributes[sc.ERROR_TYPE] for s in finished_kv_spans(inst, traced[1]))
    assert errors == ["nixlRemoteDisconnectError", "nixl_xfer_err"]


def test_where_records_live_and_nixls_handle_class_comes_back(traced: Any) -> None:
    """With NIXL's slotted handle class the record rides on the handle (no dict lookup after a
    large copy), a handle made before instrument() still gets its span by id, a released handle
    drops its record (no handle ↔ record cycle), and uninstrument() restores NIXL's class. With
    opaque handles the module is left as it is and records are keyed by id until released."""
    inst, _mem, (cls, _tp) = traced
    api = sys.modules[MODULE]
    base = getattr(api, "nixl_xfer_handle", None)
    early_agent = cls("dec-early")  # made before instrument(): no telemetry flag on it
    early = early_agent.initialize_xfer("READ", [(0, 10, 0)], [(0, 10, 0)], "peer")
    inst, cls = _start(traced)
    agent = cls("dec-0")
    h = agent.initialize_xfer("READ", [(0, 10, 0)], [(0, 10, 0)], "peer")
    if base is None:
        assert not hasattr(api, "nixl_xfer_handle") and inst._handles[id(h)] is inst._record_of(h)
    else:
        assert api.nixl_xfer_handle is not base and issubclass(api.nixl_xfer_handle, base)
        assert type(h) is api.nixl_xfer_handle and inst._record_of(h) is h._railtrace_record
        assert id(h) not in inst._handles
    assert agent.transfer(h) == "DONE" and agent.check_xfer_state(h) == "DONE"
    agent.release_xfer_handle(h)
    assert inst._handles == {} and (base is None or h._railtrace_record is None)
    early_agent.script = ["DONE"]
    assert early_agent.transfer(early) == "DONE" and id(early) in inst._handles
    early_agent.release_xfer_handle(early)
    assert inst._handles == {}
    assert len(finished_kv_spans(inst, traced[1])) == 2
    inst.uninstrument()
    assert getattr(api, "nixl_xfer_handle", None) is base
