"""The KV shim's C hot path (`railtrace_tracing/kv_transfer/_hotpath.c`) beyond what the four-way
tests of test_kv_patches.py cover: which patches are C and when, calls it hands to the Python patches,
hostile slot contents, and that it keeps no reference it should not (a leak in a C patch would
grow vLLM's engine process by one record per transfer)."""

from __future__ import annotations

import gc
import inspect
import logging
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from railtrace_tracing import semconv as sc
from railtrace_tracing.kv_transfer import instrumentor as mod
from railtrace_tracing.kv_transfer import kv_transfer_scope
from tests.shims.test_kv_patches import MODULE, FakeAgent, Telemetry, finished_kv_spans, install_fake_nixl

HOT = ("make_prepped_xfer", "transfer", "check_xfer_state", "get_xfer_telemetry", "release_xfer_handle")


@pytest.fixture
def fake_nixl(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any, InMemorySpanExporter, Any]]:
    """A NIXL-shaped module with slotted handles, and the instrumentor (not yet instrumented)."""
    monkeypatch.delenv(sc.ENV_KV_HOT_PATH, raising=False)
    inst, cls, mem, tp = install_fake_nixl(monkeypatch, slotted=True)
    yield inst, cls, mem, tp
    inst.uninstrument()


def _instrument(fake_nixl: Any, **kwargs: Any) -> tuple[Any, Any, InMemorySpanExporter]:
    inst, cls, mem, tp = fake_nixl
    inst.instrument(tracer_provider=tp, capture_ucx_log=False, vllm_hook=False, **kwargs)
    return inst, cls, mem


def test_the_hot_patches_are_c_where_built_and_python_when_asked(
    fake_nixl: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert mod._hotpath is not None, f"the test environment builds the C hot path: {mod._HOTPATH_ERROR}"
    inst, cls, _mem = _instrument(fake_nixl)
    assert mod._HOT_METHODS == HOT  # what _hotpath.c says it patches
    kinds = {name: type(cls.__dict__[name]).__name__ for name in mod._METHODS}
    assert {n: k for n, k in kinds.items() if n in HOT} == dict.fromkeys(HOT, "HotPatch")
    assert {k for n, k in kinds.items() if n not in HOT} == {"function"}
    agent = cls("dec-0")
    # A method like NIXL's: bound to the agent, with NIXL's signature and name.
    assert agent.transfer.__self__ is agent and cls.transfer.__name__ == "transfer"
    assert inspect.signature(cls.transfer) == inspect.signature(FakeAgent.transfer)
    inst.uninstrument()
    assert all(cls.__dict__.get(n) is None for n in mod._METHODS)  # the subclass inherited them all

    monkeypatch.setenv(sc.ENV_KV_HOT_PATH, "python")
    inst, cls, _mem = _instrument(fake_nixl)
    assert {type(cls.__dict__[n]).__name__ for n in HOT} == {"function"}
    inst.uninstrument()
    monkeypatch.delenv(sc.ENV_KV_HOT_PATH)

    # A bad choice is logged and leaves NIXL unpatched (the shim never raises into its host).
    for asked, why, hotpath in (("fast", "auto, c or python", mod._hotpath), ("c", "not built", None)):
        monkeypatch.setattr(mod, "_hotpath", hotpath)
        with caplog.at_level(logging.WARNING, logger="railtrace_tracing"):
            _instrument(fake_nixl, hot_path=asked)
        assert why in caplog.text and "transfer" not in cls.__dict__
        inst.uninstrument()
        caplog.clear()
    inst, cls, _mem = _instrument(fake_nixl)  # auto without the extension: the Python patches
    assert {type(cls.__dict__[n]).__name__ for n in HOT} == {"function"}


def test_calls_the_c_path_does_not_take_go_to_the_python_patches(fake_nixl: Any) -> None:
    """Keyword arguments, a handle posted twice, a handle made before instrument(): the C patch
    hands the whole call to the Python patch, and the spans are the same as on the fast path."""
    early_agent = fake_nixl[1]("dec-early")
    early = early_agent.initialize_xfer("READ", [(0, 7, 0)], [(0, 7, 0)], "peer")  # plain class
    inst, cls, mem = _instrument(fake_nixl)
    agent = cls("dec-0")
    h = agent.make_prepped_xfer("READ", local_xfer_side="local-side", local_indices=[0, 1])
    agent.script = ["PROC", "DONE"]
    assert agent.transfer(handle=h, notif_msg=b"x") == "PROC"
    assert agent.check_xfer_state(handle=h) == "DONE"
    assert isinstance(agent.get_xfer_telemetry(handle=h), Telemetry)
    agent.script = ["DONE"]  # the same handle again: a second transfer, a second span
    assert agent.transfer(h) == "DONE"
    agent.release_xfer_handle(handle=h)
    early_agent.script = ["DONE"]
    assert early_agent.transfer(early) == "DONE" and id(early) in inst._handles
    early_agent.release_xfer_handle(early)
    spans = finished_kv_spans(inst, mem)
    assert len(spans) == 3 and all(s.status.status_code.name != "ERROR" for s in spans)
    assert all(s.end_time >= s.start_time > 0 for s in spans)
    assert inst._handles == {} and h._railtrace_record is None


@pytest.mark.parametrize("hot_path", ["c", "python"])
def test_a_slot_holding_something_else_is_left_alone(fake_nixl: Any, hot_path: str) -> None:
    """Whatever else is left in the slot, NIXL's results reach the caller unchanged and the
    transfer gets a record of its own (and a span)."""
    inst, cls, mem = _instrument(fake_nixl, hot_path=hot_path)
    agent = cls("dec-0")
    for odd in ("not a record", [None] * 3, None, 42):
        h = agent.initialize_xfer("READ", [(0, 10, 0)], [(0, 10, 0)], "peer")
        h._railtrace_record = odd
        agent.script = ["PROC", "DONE"]
        assert agent.transfer(h) == "PROC" and agent.check_xfer_state(h) == "DONE"
        assert isinstance(agent.get_xfer_telemetry(h), Telemetry)
        assert agent.release_xfer_handle(h) is None
    spans = finished_kv_spans(inst, mem)
    assert len(spans) == 4 and all(s.status.status_code.name == "UNSET" for s in spans)

    # The record emptied while NIXL's own call runs: no store lands past the list.
    h = agent.initialize_xfer("READ", [(0, 10, 0)], [(0, 10, 0)], "peer")
    agent.script = ["DONE"]
    real_next = agent._next

    def empties_the_record() -> str:
        h._railtrace_record.clear()
        return real_next()

    agent._next = empties_the_record  # type: ignore[method-assign]
    assert agent.transfer(h) == "DONE" and h._railtrace_record == []
    agent._next = real_next  # type: ignore[method-assign]
    assert agent.check_xfer_state(h) == "DONE" and agent.release_xfer_handle(h) is None
    agent.script = ["DONE"]  # and the emitter goes on: the next transfer has its span
    h = agent.initialize_xfer("READ", [(0, 10, 0)], [(0, 10, 0)], "peer")
    assert agent.transfer(h) == "DONE" and agent.release_xfer_handle(h) is None
    assert len(finished_kv_spans(inst, mem)) == 5


class _SharedTelemetryAgent(FakeAgent):
    shared = Telemetry()

    def get_xfer_telemetry(self, handle: Any) -> Telemetry:
        return self.shared


def test_the_c_patches_keep_no_reference_after_release(fake_nixl: Any) -> None:
    """Thousands of transfers in vLLM's order (prep, post, polls, telemetry, release) leave no
    handle alive and give back every reference to the objects they passed through."""
    cls = sys.modules[MODULE].nixl_agent = type("nixl_agent", (_SharedTelemetryAgent,), {})
    inst, _fixture_cls, mem = _instrument(fake_nixl)
    assert type(cls.__dict__["transfer"]).__name__ == "HotPatch"
    agent = cls("dec-0", types.SimpleNamespace(capture_telemetry=True))
    assert agent._railtrace_telemetry is True
    handle_cls = sys.modules[MODULE].nixl_xfer_handle
    indices = [0, 1, 2]
    tel = cls.shared
    scope_block = kv_transfer_scope("cmpl-leak", remote_engine_id="prefill-1")

    def run(n: int) -> None:
        with scope_block:
            for i in range(n):
                h = agent.make_prepped_xfer("READ", "local", indices, "remote", indices)
                agent.script = ["DONE"] if i % 2 else ["PROC", "PROC", "DONE"]
                state = agent.transfer(h, b"n")
                while state == "PROC":
                    state = agent.check_xfer_state(h)
                agent.get_xfer_telemetry(h)
                agent.release_xfer_handle(h)
        assert inst.force_flush()
        mem.clear()

    def refcounts() -> tuple[int, ...]:  # read outside `assert`: pytest's rewrite holds operands
        gc.collect()
        return tuple(sys.getrefcount(o) for o in (agent, tel, indices, scope_block.scope))

    run(50)  # warm: caches, interned states, the emitter's first batch
    before = refcounts()
    run(3000)
    after = refcounts()
    assert after == before
    assert not [o for o in gc.get_objects() if type(o) is handle_cls]
    assert inst._handles == {} and inst._open == []


@pytest.mark.parametrize("hot_path", ["c", "python"])
def test_nixls_exception_reaches_the_caller_with_its_traceback(fake_nixl: Any, hot_path: str) -> None:
    """What NIXL raised is what the caller catches: the same class, message and traceback down
    to NIXL's own frame (the C patch hands it to the span and sets it again, untouched)."""
    import traceback

    inst, cls, mem = _instrument(fake_nixl, hot_path=hot_path)
    agent = cls("dec-0")
    for call in ("transfer", "check_xfer_state"):
        h = agent.initialize_xfer("READ", [(0, 10, 0)], [(0, 10, 0)], "peer")
        agent.script = (
            ["raise:nixlBackendError"] if call == "transfer" else ["PROC", "raise:nixlBackendError"]
        )
        if call == "check_xfer_state":
            assert agent.transfer(h) == "PROC"
        with pytest.raises(RuntimeError, match="backend failure") as caught:
            getattr(agent, call)(h)
        assert type(caught.value).__name__ == "nixlBackendError"
        frames = [f.name for f in traceback.extract_tb(caught.value.__traceback__)]
        assert frames[-1] == "_next" and call in frames
        agent.release_xfer_handle(h)
    spans = finished_kv_spans(inst, mem)
    assert [s.attributes[sc.ERROR_TYPE] for s in spans] == ["nixlBackendError"] * 2
