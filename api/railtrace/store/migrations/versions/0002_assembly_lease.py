"""Assembly lease on traces: replicas sharing one database claim traces before assembling them.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("traces") as batch:
        batch.add_column(sa.Column("claimed_by", sa.String(64), nullable=True))
        batch.add_column(sa.Column("claimed_until_ns", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("traces") as batch:
        batch.drop_column("claimed_until_ns")
        batch.drop_column("claimed_by")
