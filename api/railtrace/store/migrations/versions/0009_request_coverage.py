"""Request rows get their tracing coverage and leg resolution, a new stats dimension.

`coverage` is the tracing recipe a request's spans show (full, decode_only, epp_only, engines,
partial) and `resolution` how both legs reached node, GPU and NIC (`<prefill>+<decode>` identity
methods, or `unresolved`). Both are nullable: rows written before this revision keep NULL and
count under an empty group (the rollup holds no `coverage` rows for them) until they are
assembled again.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("requests", sa.Column("coverage", sa.String(32)))
    op.add_column("requests", sa.Column("resolution", sa.String(64)))


def downgrade() -> None:
    op.drop_column("requests", "resolution")
    op.drop_column("requests", "coverage")
