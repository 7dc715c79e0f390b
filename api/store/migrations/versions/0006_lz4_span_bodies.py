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

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# One row on PostgreSQL 14 and later, none before (no per-column compression then).
_HAS_LZ4 = "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"


def _lz4_available(bind: sa.Connection) -> bool:
    return bind.dialect.name == "postgresql" and bool(bind.exec_driver_sql(_HAS_LZ4).scalar())


def upgrade() -> None:
    if _lz4_available(op.get_bind()):
        op.execute("ALTER TABLE span_chunks ALTER COLUMN body SET COMPRESSION lz4")


def downgrade() -> None:
    if _lz4_available(op.get_bind()):
        op.execute("ALTER TABLE span_chunks ALTER COLUMN body SET COMPRESSION default")
