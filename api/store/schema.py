"""Tables. The Alembic migrations create exactly these (a test compares them).

Why this shape: ingest must reach tens of thousands of spans per second, so a span is one
row with the columns queries filter and join on and a single blob for everything else (its
OTLP protobuf encoding: attributes, events, status message). Resource attribute sets (with
the instrumentation scope) repeat across every span of a process, so they are stored once,
keyed by a hash. See `rows.py`.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

resources = Table(
    "resources",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=False),  # 63-bit hash of the content
    Column("attributes", LargeBinary, nullable=False),  # JSON {"resource": {...}, "scope": name}
)

spans = Table(
    "spans",
    metadata,
    Column("trace_id", String(32), primary_key=True),
    Column("span_id", String(16), primary_key=True),
    Column("parent_span_id", String(16)),
    Column("name", String(512), nullable=False),
    Column("service_name", String(256), nullable=False),
    Column("start_ns", BigInteger, nullable=False),
    Column("end_ns", BigInteger, nullable=False),
    Column("status_code", Integer, nullable=False),
    Column("resource_id", BigInteger, nullable=False),
    Column("received_ns", BigInteger, nullable=False),
    Column("body", LargeBinary, nullable=False),  # the OTLP protobuf Span, content attributes removed
)

# Request join keys per trace (not per span: a request's spans repeat the same few keys), so
# the assembler finds the other traces of a request whose context was broken.
trace_keys = Table(
    "trace_keys",
    metadata,
    Column("request_key", String(256), primary_key=True),
    Column("trace_id", String(32), primary_key=True),
)
Index("ix_trace_keys_trace", trace_keys.c.trace_id)

# One row per trace seen: when spans arrived and whether it awaits (re)assembly. Durable, so a
# restart completes half-assembled requests.
traces = Table(
    "traces",
    metadata,
    Column("trace_id", String(32), primary_key=True),
    Column("first_arrival_ns", BigInteger, nullable=False),
    Column("last_arrival_ns", BigInteger, nullable=False),
    Column("span_count", Integer, nullable=False),
    Column("has_root", Boolean, nullable=False),
    Column("dirty", Boolean, nullable=False),
    Column("late_spans", Integer, nullable=False),  # spans that arrived after assembly
    Column("assembled_ns", BigInteger),
    Column("request_trace_id", String(32)),  # primary trace of the request it belongs to
    # Assembly lease: the replica assembling this trace, and until when (see Store.claim_ready).
    Column("claimed_by", String(64)),
    Column("claimed_until_ns", BigInteger),
)
Index("ix_traces_dirty", traces.c.dirty, traces.c.last_arrival_ns)
Index("ix_traces_last_arrival", traces.c.last_arrival_ns)
Index("ix_traces_request", traces.c.request_trace_id)

requests = Table(
    "requests",
    metadata,
    Column("trace_id", String(32), primary_key=True),
    Column("request_id", String(256)),
    Column("model", String(256)),
    Column("start_ns", BigInteger, nullable=False),
    Column("ttft_s", Float),
    Column("e2e_s", Float),
    Column("path_class", String(32), nullable=False),
    Column("transport", String(32), nullable=False),
    Column("kv_duration_s", Float),
    Column("kv_bytes", BigInteger),
    Column("prefill_pod", String(256)),
    Column("prefill_node", String(256)),
    Column("decode_pod", String(256)),
    Column("decode_node", String(256)),
    Column("pairing_level", String(32)),
    Column("flag_names", Text, nullable=False),  # comma list, for display and stats
    Column("summary", LargeBinary, nullable=False),  # the RequestSummary as JSON
    Column("updated_ns", BigInteger, nullable=False),
)
Index("ix_requests_start", requests.c.start_ns, requests.c.trace_id)
Index("ix_requests_request_id", requests.c.request_id)
Index("ix_requests_path_class", requests.c.path_class, requests.c.start_ns)

# One row per (flag, request): the filtered list `?flag=` walks this index in start order.
request_flags = Table(
    "request_flags",
    metadata,
    Column("flag", String(64), primary_key=True),
    Column("start_ns", BigInteger, primary_key=True),
    Column("trace_id", String(32), primary_key=True),
)
Index("ix_request_flags_trace", request_flags.c.trace_id)

# Per-hour rollup of `requests` and `request_flags`, kept in the transactions that write them
# (see `rollup.py`), so a day's stats read ~24 rows per group instead of every request of the
# day. One row per (dimension, hour, group key); the mean of a column is its sum over its
# non-null count, exactly as AVG. Key encoding (no NULLs in the primary key): `key1..key3` hold
# the group's values ('' where there is none or the value is NULL) and `key_nulls` has bit i set
# when key i+1 is NULL, so '' and NULL stay distinct. dimension `flag`: key1 = flag name;
# `path_class`: key1 = path class; `pair`: prefill_node, decode_node, pairing_level.
stats_hourly = Table(
    "stats_hourly",
    metadata,
    Column("dimension", String(16), primary_key=True),
    Column("hour_ns", BigInteger, primary_key=True, autoincrement=False),  # start_ns floored to the hour
    Column("key1", String(256), primary_key=True),
    Column("key2", String(256), primary_key=True),
    Column("key3", String(256), primary_key=True),
    Column("key_nulls", Integer, primary_key=True, autoincrement=False),
    Column("request_count", BigInteger, nullable=False),
    Column("ttft_sum", Float, nullable=False),
    Column("ttft_n", BigInteger, nullable=False),
    Column("kv_sum", Float, nullable=False),
    Column("kv_n", BigInteger, nullable=False),
)
