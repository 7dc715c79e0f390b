"""Per-hour stats rollup (stats_hourly), backfilled from the request rows already stored.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

from railtrace.store import rollup

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "stats_hourly",
        sa.Column("dimension", sa.String(16), nullable=False),
        sa.Column("hour_ns", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("key1", sa.String(256), nullable=False),
        sa.Column("key2", sa.String(256), nullable=False),
        sa.Column("key3", sa.String(256), nullable=False),
        sa.Column("key_nulls", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("request_count", sa.BigInteger(), nullable=False),
        sa.Column("ttft_sum", sa.Float(), nullable=False),
        sa.Column("ttft_n", sa.BigInteger(), nullable=False),
        sa.Column("kv_sum", sa.Float(), nullable=False),
        sa.Column("kv_n", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("dimension", "hour_ns", "key1", "key2", "key3", "key_nulls"),
    )
    rollup.rebuild(op.get_bind())


def downgrade() -> None:
    op.drop_table("stats_hourly")
