"""Drop `ix_traces_request`, an index of `traces.request_trace_id` that no query reads.

Both lookups through that column (a request by a stitched trace of it, and the summaries a
group of traces supersedes) find the trace by its primary key and then the request by its own,
on SQLite and PostgreSQL alike (`tests/server/test_request_lookup.py` checks the plans). The
index still cost an entry for every row version of `traces`: three per request (the ingest
insert, the assembly lease, the assembled mark), each a write into a B-tree of random keys.

Revision ID: 0007
Revises: 0006
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_traces_request", table_name="traces")


def downgrade() -> None:
    op.create_index("ix_traces_request", "traces", ["request_trace_id"])
