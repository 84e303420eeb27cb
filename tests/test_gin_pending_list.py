"""Migration 0004: PostgreSQL's full-text indexes keep a small pending list, on either layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

from tiered_history.store import migrate
from tiered_history.store.dialect import create_engine

from .conftest import database_url

pytestmark = pytest.mark.postgres


def _limits(engine: sa.Engine) -> dict[str, list[str] | None]:
    """Each full-text index holding rows (the partitions', or the plain one) with its storage
    parameters."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT c.relname, c.reloptions FROM pg_class c JOIN pg_index x ON x.indexrelid = c.oid "
                "JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'gin' AND c.relkind = 'i'"
            )
        )
        return {r[0]: r[1] for r in rows}


@pytest.mark.parametrize("partitions", [0, 4])
def test_the_search_indexes_keep_a_small_pending_list(tmp_path: Path, partitions: int) -> None:
    with database_url("postgresql", tmp_path) as url:
        engine = create_engine(url)
        try:
            migrate.upgrade(engine, options={"partitions": partitions} if partitions else None)
            found = _limits(engine)
            assert len(found) == (2 * partitions or 2)
            assert all(v == ["gin_pending_list_limit=64"] for v in found.values()), found
            command.downgrade(migrate.alembic_config(url), "0003")
            assert all(v is None for v in _limits(engine).values())
        finally:
            engine.dispose()
