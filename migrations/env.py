"""Alembic environment. The library passes its own connection; the CLI/alembic use a URL."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import Connection

from tiered_history.store.migrate import include_name
from tiered_history.store.schema import metadata

config = context.config
target_metadata = metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things: batch mode rebuilds tables instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        include_name=include_name,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _run_url(url: str) -> None:
    from tiered_history.store.dialect import create_engine

    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            _run(conn)
    finally:
        engine.dispose()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("TIERED_HISTORY_DATABASE_URL")
    if not url:
        raise SystemExit("set sqlalchemy.url or TIERED_HISTORY_DATABASE_URL")
    _run_url(url)


if context.is_offline_mode():
    run_offline()
else:
    run_online()
