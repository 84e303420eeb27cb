"""Schema migrations for a database URL, and URLs shown with their password masked.

The library migrates on first use; these functions are for operators (``tiered-history db``).
"""

from __future__ import annotations

from .errors import ConfigurationError, SchemaError
from .store.dialect import mask_url

__all__ = ["mask_url", "optimize_database", "require_current_schema", "schema_revision", "upgrade_schema"]


def schema_revision(url: str) -> tuple[str | None, str]:
    """(the database's schema revision or None if it has no schema, the newest revision)."""
    before, _, head = _migrate(url, upgrade=False)
    return before, head


def upgrade_schema(url: str) -> tuple[str | None, str | None, str]:
    """Create or migrate the schema to the newest revision: (revision before, after, newest)."""
    return _migrate(url, upgrade=True)


def newer_schema(current: str | None, head: str) -> str | None:
    """What to tell an operator whose database was migrated by a newer tiered-history (a
    revision this one does not know: the library needs the upgrade, not the database), else None."""
    if current is None or current == head:
        return None
    from .store.migrate import is_known, newer_schema_message

    return None if is_known(current) else newer_schema_message(current)


def require_current_schema(url: str) -> None:
    """Raise :class:`SchemaError` unless the database exists with its schema at the newest
    revision; creates nothing (a SQLite file that is not there is not made)."""
    from pathlib import Path

    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    on_disk = parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:")
    if on_disk and not Path(str(parsed.database)).exists():
        raise SchemaError(f"no database at {parsed.database}; run 'tiered-history db upgrade' first")
    current, head = schema_revision(url)
    newer = newer_schema(current, head)
    if newer is not None:
        raise SchemaError(f"{mask_url(url)}: {newer}")
    if current != head:
        state = "has no schema" if current is None else f"is at revision {current}, head is {head}"
        raise SchemaError(f"{mask_url(url)} {state}; run 'tiered-history db upgrade' first")


def optimize_database(url: str) -> list[str]:
    """Compact the full-text indexes and refresh statistics (see
    :func:`tiered_history.store.migrate.optimize`); returns the steps run, in order."""
    if url.startswith("memory://"):
        raise ConfigurationError("memory:// keeps no database to optimize")
    from sqlalchemy import exc

    from .store import migrate
    from .store.dialect import create_engine, translate

    require_current_schema(url)
    engine = create_engine(url)
    try:
        return migrate.optimize(engine)
    except exc.SQLAlchemyError as e:
        raise translate(e, "optimizing the database") from None
    finally:
        engine.dispose()


def _migrate(url: str, upgrade: bool) -> tuple[str | None, str | None, str]:
    if url.startswith("memory://"):
        raise ConfigurationError("memory:// keeps no schema")
    from sqlalchemy import exc

    from .store import migrate
    from .store.dialect import create_engine, translate

    head = migrate.head_revision()
    engine = create_engine(url)
    try:
        before = migrate.current_revision(engine)
        if not upgrade:
            return before, before, head
        migrate.upgrade(engine)
        return before, migrate.current_revision(engine), head
    except exc.SQLAlchemyError as e:
        raise translate(e, "migrating the schema" if upgrade else "reading the schema revision") from None
    finally:
        engine.dispose()
