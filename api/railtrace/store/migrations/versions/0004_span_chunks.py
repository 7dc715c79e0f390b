"""Spans stored as one chunk row per trace and export call instead of one row per span.

Existing spans are regrouped: the spans of a trace committed together (same receive time)
become one chunk, in start order. Downgrade splits chunks back into span rows.

Revision ID: 0004
Revises: 0003
"""

from collections import defaultdict
from collections.abc import Iterator

import orjson
import sqlalchemy as sa
from alembic import op
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from railtrace.otlp.bounds import MAX_NAME
from railtrace.otlp.rows import RECORD_HEADER, chunk_id, chunk_records, service_name_of

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

BATCH_TRACES = 2000


def _trace_batches(conn: sa.Connection, table: str) -> Iterator[list[str]]:
    """Trace ids of `table` in batches, by keyset (no OFFSET scans over a large table), one
    batch at a time (a large history's ids never all in memory)."""
    last = ""
    while True:
        ids = [
            r[0]
            for r in conn.execute(
                sa.text(
                    f"SELECT DISTINCT trace_id FROM {table} WHERE trace_id > :last ORDER BY trace_id LIMIT :n"
                ),
                {"last": last, "n": BATCH_TRACES},
            )
        ]
        if not ids:
            return
        yield ids
        last = ids[-1]


def upgrade() -> None:
    op.create_table(
        "span_chunks",
        sa.Column("trace_id", sa.String(32), nullable=False),
        sa.Column("chunk_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("received_ns", sa.BigInteger(), nullable=False),
        sa.Column("span_count", sa.Integer(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("trace_id", "chunk_id"),
    )
    conn = op.get_bind()
    insert = sa.text(
        "INSERT INTO span_chunks (trace_id, chunk_id, received_ns, span_count, body)"
        " VALUES (:trace_id, :chunk_id, :received_ns, :span_count, :body) ON CONFLICT DO NOTHING"
    )
    select = sa.text(
        "SELECT trace_id, received_ns, resource_id, body FROM spans WHERE trace_id IN :ids"
        " ORDER BY trace_id, received_ns, start_ns, span_id"
    ).bindparams(sa.bindparam("ids", expanding=True))
    for ids in _trace_batches(conn, "spans"):
        groups: dict[tuple[str, int], list[bytes]] = defaultdict(list)
        for tid, received, rid, body in conn.execute(select, {"ids": ids}):
            groups[(tid, received)] += [RECORD_HEADER.pack(rid, len(body)), bytes(body)]
        rows = []
        for (tid, received), pieces in groups.items():
            body = b"".join(pieces)
            rows.append(
                {
                    "trace_id": tid,
                    "chunk_id": chunk_id(body),
                    "received_ns": received,
                    "span_count": len(pieces) // 2,
                    "body": body,
                }
            )
        if rows:
            conn.execute(insert, rows)
    op.drop_table("spans")


def downgrade() -> None:
    op.create_table(
        "spans",
        sa.Column("trace_id", sa.String(32), nullable=False),
        sa.Column("span_id", sa.String(16), nullable=False),
        sa.Column("parent_span_id", sa.String(16)),
        sa.Column("name", sa.String(512), nullable=False),
        sa.Column("service_name", sa.String(256), nullable=False),
        sa.Column("start_ns", sa.BigInteger(), nullable=False),
        sa.Column("end_ns", sa.BigInteger(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=False),
        sa.Column("resource_id", sa.BigInteger(), nullable=False),
        sa.Column("received_ns", sa.BigInteger(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("trace_id", "span_id"),
    )
    conn = op.get_bind()
    services = {
        rid: service_name_of(orjson.loads(blob).get("resource", {}))
        for rid, blob in conn.execute(sa.text("SELECT id, attributes FROM resources"))
    }
    insert = sa.text(
        "INSERT INTO spans (trace_id, span_id, parent_span_id, name, service_name, start_ns, end_ns,"
        " status_code, resource_id, received_ns, body) VALUES (:trace_id, :span_id, :parent_span_id,"
        " :name, :service_name, :start_ns, :end_ns, :status_code, :resource_id, :received_ns, :body)"
        " ON CONFLICT DO NOTHING"
    )
    select = sa.text(
        "SELECT trace_id, received_ns, body FROM span_chunks WHERE trace_id IN :ids"
        " ORDER BY trace_id, received_ns"
    ).bindparams(sa.bindparam("ids", expanding=True))
    for ids in _trace_batches(conn, "span_chunks"):
        rows = []
        for tid, received, chunk in conn.execute(select, {"ids": ids}):
            for rid, enc in chunk_records(bytes(chunk)):
                pb = PbSpan.FromString(enc)
                rows.append(
                    {
                        "trace_id": tid,
                        "span_id": pb.span_id.hex(),
                        "parent_span_id": pb.parent_span_id.hex() or None,
                        "name": pb.name[:MAX_NAME],
                        "service_name": services.get(rid, "unknown_service"),
                        "start_ns": pb.start_time_unix_nano,
                        "end_ns": pb.end_time_unix_nano,
                        "status_code": int(pb.status.code),
                        "resource_id": rid,
                        "received_ns": received,
                        "body": enc,
                    }
                )
        if rows:
            conn.execute(insert, rows)
    op.drop_table("span_chunks")
