"""Several requests under one primary trace: each gets a row of its own.

A load generator that wraps its requests in one span puts several EPP roots in one trace, and
assembly finds one request under each (`railtrace.assembly.stitch`). Request rows were keyed by
their primary trace id, so only the first was kept. The first keeps that key; each other one
is keyed by a digest of the trace id and its own request id (`railtrace.store.publish`), and
`trace_of` names the trace it shares, so replacing or expiring that trace's requests removes
them all. NULL where the key is the trace id itself (every row written before this revision).

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

HAS = sa.column("trace_of", sa.String(32)).is_not(None)


def upgrade() -> None:
    op.add_column("requests", sa.Column("trace_of", sa.String(32)))
    op.create_index("ix_requests_trace_of", "requests", ["trace_of"], postgresql_where=HAS, sqlite_where=HAS)


def downgrade() -> None:
    op.drop_index("ix_requests_trace_of", table_name="requests")
    op.drop_column("requests", "trace_of")
