"""Per-hour TTFT histograms (`ttft_hourly`) and the covering index of the window edges.

The overview's TTFT quantiles read the newest 5,000 request rows of the window, so over a busy
day they described its last minutes. Every request now counts in a log bucket of its TTFT, per
hour and per path class and pairing level (`rollup.py`), and a window's partial hours read
(start, path class, pairing level, TTFT) from `ix_requests_start_ttft` without visiting a row.
Its key starts as the list's start order does (start_ns, trace_id): were path_class second, the
planner would take it for `?path_class=` pages and sort their ties of start time.
The histograms are backfilled from the request rows already stored.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

from railtrace.store import rollup

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ttft_hourly",
        sa.Column("dimension", sa.String(16), nullable=False),
        sa.Column("hour_ns", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("key", sa.String(256), nullable=False),
        sa.Column("key_null", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("bucket", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("request_count", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("dimension", "hour_ns", "key", "key_null", "bucket"),
    )
    op.create_index(
        "ix_requests_start_ttft",
        "requests",
        ["start_ns", "trace_id", "path_class", "pairing_level", "ttft_s"],
    )
    rollup.rebuild_ttft(op.get_bind())


def downgrade() -> None:
    op.drop_index("ix_requests_start_ttft", table_name="requests")
    op.drop_table("ttft_hourly")
