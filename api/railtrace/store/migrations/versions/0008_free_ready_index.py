"""Held traces leave the ready index; an index of leases finds the ones that ran out.

`ix_traces_ready` held every trace awaiting assembly, also those a replica had leased and was
assembling ahead of their quiet period. A look for work walks the index from its oldest entry
and skipped each held trace on the way, after reading its row: at 1,400 requests a second with
a 1 s lookahead, about 1,400 rows a look, twenty looks a second per assembly process, the
largest statement of assembly on PostgreSQL. Now the index holds the ready traces no replica
holds, and `ix_traces_leased` the held ones by when their lease runs out, which is where a look
finds the traces of a replica that died.

During a rollout a replica still running the previous release keeps working: PostgreSQL
answers its look for work from both new indexes at once (a bitmap OR of the free traces and
the leases; `EXPLAIN` of that release's statement on this schema). Building the indexes reads
the whole table once.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ready = sa.column("dirty", sa.Boolean) == sa.true()
    free = sa.column("claimed_until_ns", sa.BigInteger).is_(None)
    leased = sa.column("claimed_until_ns", sa.BigInteger).is_not(None)
    op.drop_index("ix_traces_ready", table_name="traces")
    op.create_index(
        "ix_traces_ready",
        "traces",
        ["last_arrival_ns"],
        postgresql_where=sa.and_(ready, free),
        sqlite_where=sa.and_(ready, free),
    )
    op.create_index(
        "ix_traces_leased", "traces", ["claimed_until_ns"], postgresql_where=leased, sqlite_where=leased
    )


def downgrade() -> None:
    ready = sa.column("dirty", sa.Boolean) == sa.true()
    op.drop_index("ix_traces_leased", table_name="traces")
    op.drop_index("ix_traces_ready", table_name="traces")
    op.create_index(
        "ix_traces_ready", "traces", ["last_arrival_ns"], postgresql_where=ready, sqlite_where=ready
    )
