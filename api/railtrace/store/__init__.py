"""Storage: SQLAlchemy schema, Alembic migrations, the SQL of the span/trace write path and typed
queries. What a row holds is decided by the OTLP codec (`railtrace.otlp.rows`); the store only
writes and reads it.

One schema serves SQLite (WAL, embedded default) and PostgreSQL (production). The spans of a
trace from one export call are one row (a chunk of their OTLP protobuf encodings); resources
are stored once and referenced.
"""

from railtrace.store.engine import make_engine, migrate
from railtrace.store.queries import Cursor, Page, RequestQuery, StoreError
from railtrace.store.store import AssembledGroup, InsertResult, Store

__all__ = [
    "AssembledGroup",
    "Cursor",
    "InsertResult",
    "Page",
    "RequestQuery",
    "Store",
    "StoreError",
    "make_engine",
    "migrate",
]
