"""Initial schema: resources, spans, trace_keys, traces, requests, request_flags.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "resources",
        sa.Column("id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("attributes", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
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
    op.create_table(
        "trace_keys",
        sa.Column("request_key", sa.String(256), nullable=False),
        sa.Column("trace_id", sa.String(32), nullable=False),
        sa.PrimaryKeyConstraint("request_key", "trace_id"),
    )
    op.create_index("ix_trace_keys_trace", "trace_keys", ["trace_id"])
    op.create_table(
        "traces",
        sa.Column("trace_id", sa.String(32), nullable=False),
        sa.Column("first_arrival_ns", sa.BigInteger(), nullable=False),
        sa.Column("last_arrival_ns", sa.BigInteger(), nullable=False),
        sa.Column("span_count", sa.Integer(), nullable=False),
        sa.Column("has_root", sa.Boolean(), nullable=False),
        sa.Column("dirty", sa.Boolean(), nullable=False),
        sa.Column("late_spans", sa.Integer(), nullable=False),
        sa.Column("assembled_ns", sa.BigInteger()),
        sa.Column("request_trace_id", sa.String(32)),
        sa.PrimaryKeyConstraint("trace_id"),
    )
    op.create_index("ix_traces_dirty", "traces", ["dirty", "last_arrival_ns"])
    op.create_index("ix_traces_last_arrival", "traces", ["last_arrival_ns"])
    op.create_index("ix_traces_request", "traces", ["request_trace_id"])
    op.create_table(
        "requests",
        sa.Column("trace_id", sa.String(32), nullable=False),
        sa.Column("request_id", sa.String(256)),
        sa.Column("model", sa.String(256)),
        sa.Column("start_ns", sa.BigInteger(), nullable=False),
        sa.Column("ttft_s", sa.Float()),
        sa.Column("e2e_s", sa.Float()),
        sa.Column("path_class", sa.String(32), nullable=False),
        sa.Column("transport", sa.String(32), nullable=False),
        sa.Column("kv_duration_s", sa.Float()),
        sa.Column("kv_bytes", sa.BigInteger()),
        sa.Column("prefill_pod", sa.String(256)),
        sa.Column("prefill_node", sa.String(256)),
        sa.Column("decode_pod", sa.String(256)),
        sa.Column("decode_node", sa.String(256)),
        sa.Column("pairing_level", sa.String(32)),
        sa.Column("flag_names", sa.Text(), nullable=False),
        sa.Column("summary", sa.LargeBinary(), nullable=False),
        sa.Column("updated_ns", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("trace_id"),
    )
    op.create_index("ix_requests_start", "requests", ["start_ns", "trace_id"])
    op.create_index("ix_requests_request_id", "requests", ["request_id"])
    op.create_index("ix_requests_path_class", "requests", ["path_class", "start_ns"])
    op.create_table(
        "request_flags",
        sa.Column("flag", sa.String(64), nullable=False),
        sa.Column("start_ns", sa.BigInteger(), nullable=False),
        sa.Column("trace_id", sa.String(32), nullable=False),
        sa.PrimaryKeyConstraint("flag", "start_ns", "trace_id"),
    )
    op.create_index("ix_request_flags_trace", "request_flags", ["trace_id"])


def downgrade() -> None:
    for table in ("request_flags", "requests", "traces", "trace_keys", "spans", "resources"):
        op.drop_table(table)
