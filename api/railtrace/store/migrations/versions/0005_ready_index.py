"""Traces waiting for assembly found through a partial index of only those traces.

`ix_traces_dirty` (dirty, last_arrival_ns) held every trace ever seen, and PostgreSQL could not
use it for assembly's look for ready traces (`dirty IS true` is no index condition): it walked
`ix_traces_last_arrival` from the oldest trace kept and filtered every assembled one, a cost
that grew with the history (64 ms a look at 45,000 traces). `ix_traces_ready` holds only the
traces that await (re)assembly, in arrival order, and marking a trace assembled adds no entry to
it. Dropping the old index is safe for a release still running during a rollout: on
PostgreSQL its queries never used it, and SQLite installs stop the old pod first.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ready = sa.column("dirty", sa.Boolean) == sa.true()
    op.create_index(
        "ix_traces_ready", "traces", ["last_arrival_ns"], postgresql_where=ready, sqlite_where=ready
    )
    op.drop_index("ix_traces_dirty", table_name="traces")


def downgrade() -> None:
    op.create_index("ix_traces_dirty", "traces", ["dirty", "last_arrival_ns"])
    op.drop_index("ix_traces_ready", table_name="traces")
