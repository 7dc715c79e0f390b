"""Tables. The Alembic migrations create exactly these (a test compares them).

Why this shape: ingest must reach tens of thousands of spans per second, so spans are not rows:
the spans of one trace from one export call are one row of `span_chunks`, keyed by trace, with
each span's own OTLP protobuf encoding (attributes, events, status message) kept as received.
What queries filter on lives in `traces` (per trace) and `requests` (per assembled request).
Resource attribute sets (with the instrumentation scope) repeat across every span of a
process, so they are stored once, keyed by a hash. See `rows.py`.
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
    and_,
    true,
)

metadata = MetaData()

resources = Table(
    "resources",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=False),  # 63-bit hash of the content
    Column("attributes", LargeBinary, nullable=False),  # JSON {"resource": {...}, "scope": name}
)

# A trace's spans from one export call, as one row: an llm-d request is ~8-25 spans from a few
# processes, and a row per span made the insert (and its primary-key index) most of ingest's
# cost. Nothing queries a single span: the assembler and the trace API read whole traces.
span_chunks = Table(
    "span_chunks",
    metadata,
    Column("trace_id", String(32), primary_key=True),
    Column("chunk_id", BigInteger, primary_key=True, autoincrement=False),  # hash of body
    Column("received_ns", BigInteger, nullable=False),
    Column("span_count", Integer, nullable=False),
    # Records of (resource id: 8 bytes, length: 4 bytes, the OTLP protobuf Span minus content
    # attributes), big-endian; see rows.py. PostgreSQL compresses it with lz4 where the server
    # has it (migration 0006: a quarter of pglz's cost).
    Column("body", LargeBinary, nullable=False),
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
# Traces awaiting (re)assembly. Queries that look for them use this very expression: SQLite
# uses a partial index only for a query holding its predicate term as written, and PostgreSQL
# cannot use an index for `dirty IS true`.
READY = traces.c.dirty == true()
# The ready traces no replica holds, oldest first: what a look for work walks. Only these are in
# the index, so a look costs the same whatever the history kept, and however many traces the
# replicas hold assembled ahead of their quiet period (those once made up nearly all of every
# look's walk; migration 0008).
FREE = traces.c.claimed_until_ns.is_(None)
Index(
    "ix_traces_ready",
    traces.c.last_arrival_ns,
    postgresql_where=and_(READY, FREE),
    sqlite_where=and_(READY, FREE),
)
# Held traces, by when their lease runs out: a replica that died leaves its traces here.
LEASED = traces.c.claimed_until_ns.is_not(None)
Index("ix_traces_leased", traces.c.claimed_until_ns, postgresql_where=LEASED, sqlite_where=LEASED)
Index("ix_traces_last_arrival", traces.c.last_arrival_ns)

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
    # Tracing coverage (`semconv.Recipe`) and how both legs resolved (`<prefill>+<decode>`
    # identity methods, or `unresolved`): the `coverage` stats dimension (migration 0009).
    Column("coverage", String(32)),
    Column("resolution", String(64)),
    Column("flag_names", Text, nullable=False),  # comma list, for display and stats
    Column("summary", LargeBinary, nullable=False),  # the RequestSummary as JSON
    Column("updated_ns", BigInteger, nullable=False),
    # Several requests under one primary trace (a client span holding them): the first is keyed
    # by the trace id, each other one by a digest, with the trace here (migration 0012).
    Column("trace_of", String(32)),
)
Index("ix_requests_start", requests.c.start_ns, requests.c.trace_id)
_shares = requests.c.trace_of.is_not(None)
Index("ix_requests_trace_of", requests.c.trace_of, postgresql_where=_shares, sqlite_where=_shares)
Index("ix_requests_request_id", requests.c.request_id)
Index("ix_requests_path_class", requests.c.path_class, requests.c.start_ns)
# The list slowest first (`?order=ttft|kv_time`, migration 0010), alone and by path class: only
# requests that have the value are in these indexes, and the list's query names the predicate
# as written (SQLite uses a partial index only then).
for _name, _key in (("ttft", requests.c.ttft_s), ("kv_time", requests.c.kv_duration_s)):
    _has = _key.is_not(None)
    Index(f"ix_requests_{_name}", _key, requests.c.trace_id, postgresql_where=_has, sqlite_where=_has)
    Index(
        f"ix_requests_path_class_{_name}",
        requests.c.path_class,
        _key,
        requests.c.trace_id,
        postgresql_where=_has,
        sqlite_where=_has,
    )

# One row per (flag, request): the filtered list `?flag=` walks its primary key in start order.
request_flags = Table(
    "request_flags",
    metadata,
    Column("flag", String(64), primary_key=True),
    Column("start_ns", BigInteger, primary_key=True),
    Column("trace_id", String(32), primary_key=True),
    # The request's sort keys, so that `?flag=&order=ttft|kv_time` walks one index too.
    Column("ttft_s", Float),
    Column("kv_duration_s", Float),
)
Index("ix_request_flags_trace", request_flags.c.trace_id)
for _name, _key in (("ttft", request_flags.c.ttft_s), ("kv_time", request_flags.c.kv_duration_s)):
    Index(
        f"ix_request_flags_{_name}",
        request_flags.c.flag,
        _key,
        request_flags.c.trace_id,
        postgresql_where=_key.is_not(None),
        sqlite_where=_key.is_not(None),
    )

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

# Per-hour TTFT histograms (see `quantiles.py`), kept in the same transactions as the request rows
# (`rollup.RollupDelta`), so the overview's quantiles over a day read a few thousand bucket rows
# instead of every request. One row per (dimension, hour, group, bucket): `dimension` is
# `path_class` or `pairing_level`, `key` the group's value ('' with `key_null` = 1 for NULL),
# `bucket` the log bucket of the TTFT (relative error ≤ 1 %; `quantiles.NO_TTFT` counts the
# requests without a first token).
ttft_hourly = Table(
    "ttft_hourly",
    metadata,
    Column("dimension", String(16), primary_key=True),
    Column("hour_ns", BigInteger, primary_key=True, autoincrement=False),
    Column("key", String(256), primary_key=True),
    Column("key_null", Integer, primary_key=True, autoincrement=False),
    Column("bucket", Integer, primary_key=True, autoincrement=False),
    Column("request_count", BigInteger, nullable=False),
)
# The partial hours at a window's edges read the request rows: this index holds all they need,
# so the read never visits a row (each row carries its whole summary: a page read apiece). Its
# key begins with the list's start order (start_ns, trace_id), so that a planner that takes it
# for a `?path_class=` page still walks it in order instead of sorting ties of start time.
Index(
    "ix_requests_start_ttft",
    requests.c.start_ns,
    requests.c.trace_id,
    requests.c.path_class,
    requests.c.pairing_level,
    requests.c.ttft_s,
)
