"""PostgreSQL: span chunk bodies compressed with lz4 instead of pglz, where the server has it.

A chunk body (a trace's spans from one export call, ~5.9 KB for a P/D request) is compressed as
it is written. pglz took ~60 us a body, the largest single cost of ingest's COPY and 7 % of the
database's CPU under load; lz4 takes ~15 us, for 4 % more bytes per compressed body and the same
pages (benchmarks/verdicts/README.md). Bodies already stored keep pglz and read as before. A
server without lz4 (built without it, or before PostgreSQL 14) keeps pglz; SQLite stores
bodies as they are.

Revision ID: 0006
Revises: 0005
"""

from alembic import op

from railtrace.store.engine import pg_has_lz4

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if pg_has_lz4(op.get_bind()):
        op.execute("ALTER TABLE span_chunks ALTER COLUMN body SET COMPRESSION lz4")


def downgrade() -> None:
    if pg_has_lz4(op.get_bind()):
        op.execute("ALTER TABLE span_chunks ALTER COLUMN body SET COMPRESSION default")
