"""Alembic environment: always run programmatically with a connection from `migrate()`."""

from alembic import context

from railtrace.store.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - offline/CLI use is not supported
    raise RuntimeError("railtrace migrations run through railtrace.store.migrate(engine)")
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
