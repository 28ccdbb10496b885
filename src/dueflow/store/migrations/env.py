"""Alembic environment: runs on the connection dueflow hands over (see store/migrate.py)."""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import engine_from_config, pool

from dueflow.store.schema import metadata

config = context.config


def run_on(connection: Any) -> None:
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    run_on(connection)
else:  # plain `alembic` use with a sync URL, e.g. for autogenerate during development
    engine = engine_from_config(
        config.get_section(config.config_ini_section) or {},
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    with engine.connect() as conn:
        run_on(conn)
