"""The request list slowest first (`?order=ttft`, `?order=kv_time`): indexes on each key.

`requests` gets (key, trace_id) and (path_class, key, trace_id) indexes, and `request_flags`
repeats each request's TTFT and KV time (filled here from `requests`) under (flag, key,
trace_id) indexes, so a page of any order, unfiltered, by path class or by flag, walks one index
from its slow end and stops after the page instead of sorting the requests kept. Each index
holds only the rows that have the value: a request without a first token or without a KV
transfer is not in that order.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

KEYS = {"ttft": "ttft_s", "kv_time": "kv_duration_s"}


def upgrade() -> None:
    for column in KEYS.values():
        op.add_column("request_flags", sa.Column(column, sa.Float))
    requests = sa.table("requests", *(sa.column(c) for c in ("trace_id", *KEYS.values())))
    flags = sa.table("request_flags", *(sa.column(c) for c in ("trace_id", *KEYS.values())))
    of_request = requests.c.trace_id == flags.c.trace_id
    op.execute(
        flags.update().values(
            {c: sa.select(requests.c[c]).where(of_request).scalar_subquery() for c in KEYS.values()}
        )
    )
    for name, column in KEYS.items():
        has_value = sa.column(column, sa.Float).is_not(None)
        for index, table, key in (
            (f"ix_requests_{name}", "requests", [column, "trace_id"]),
            (f"ix_requests_path_class_{name}", "requests", ["path_class", column, "trace_id"]),
            (f"ix_request_flags_{name}", "request_flags", ["flag", column, "trace_id"]),
        ):
            op.create_index(index, table, key, postgresql_where=has_value, sqlite_where=has_value)


def downgrade() -> None:
    for name, column in KEYS.items():
        op.drop_index(f"ix_request_flags_{name}", table_name="request_flags")
        op.drop_index(f"ix_requests_path_class_{name}", table_name="requests")
        op.drop_index(f"ix_requests_{name}", table_name="requests")
        op.drop_column("request_flags", column)
