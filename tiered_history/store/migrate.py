"""Run the Alembic migrations programmatically, one process at a time.

Options reach the migration scripts through :func:`upgrade`'s ``options`` (or ``alembic -x
name=value``, or the environment): ``partitions`` (``TIERED_HISTORY_PG_PARTITIONS``) creates the
PostgreSQL tables hash-partitioned by conversation, ``batch`` sizes the copy of a 0.1.0 database.
See ``migrations/versions/0002_split_tables.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

from ..errors import SchemaError
from .schema import FULL_TEXT

if TYPE_CHECKING:
    from alembic.config import Config

# Alembic is imported only where a migration runs or the scripts must be read by it: importing
# it takes ~80 ms, which a process's first call paid even when the schema was already current.

#: Arbitrary key for PostgreSQL's advisory lock around migrations.
_PG_LOCK_KEY = 0x7469_6572  # "tier"
#: Environment variable read by revision 0002: hash partitions of messages and summaries (PostgreSQL).
PARTITIONS_ENV = "TIERED_HISTORY_PG_PARTITIONS"


#: The partitions of the hash-partitioned layout (option ``partitions``): the parent is the table.
_PARTITION = re.compile(r"(messages|summaries)_p\d+")
_HAND_MADE = frozenset(n for names in FULL_TEXT.values() for n in names)


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """What Alembic compares with the models: not what the migrations create by hand (the
    full-text indexes, FTS5's shadow tables) nor the partitions of a partitioned layout."""
    if name is None:
        return True
    if type_ == "table" and _PARTITION.fullmatch(name):
        return False
    return not any(name == n or name.startswith(f"{n}_") for n in _HAND_MADE)


def migrations_dir() -> Path:
    """The Alembic scripts: packaged in the wheel, or ``migrations/`` of a source checkout."""
    packaged = Path(str(resources.files("tiered_history"))) / "_migrations"
    if (packaged / "env.py").is_file():
        return packaged
    source = Path(__file__).resolve().parents[2] / "migrations"
    if (source / "env.py").is_file():
        return source
    raise SchemaError("the Alembic migration scripts are missing from this installation")


def alembic_config(url: str | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


@lru_cache(maxsize=1)
def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise SchemaError("no migration head found")
    return head


#: ``revision = "0002"`` or ``down_revision = None`` (a type annotation allowed), one a line.
_ASSIGNED = re.compile(
    r"""^(revision|down_revision)\s*(?::[^=\n]*)?=\s*(None|"[^"\n]*"|'[^'\n]*')\s*$""", re.M
)


@lru_cache(maxsize=1)
def scripts_head() -> str | None:
    """The head revision read from the scripts' ``revision`` / ``down_revision`` lines as text,
    without importing Alembic; None unless they form one plain chain (Alembic then decides)."""
    downs: dict[str, str | None] = {}
    for path in (migrations_dir() / "versions").glob("*.py"):
        found = dict(_ASSIGNED.findall(path.read_text(encoding="utf-8")))
        rev, down = found.get("revision", "None"), found.get("down_revision")
        if rev == "None" or down is None or rev[1:-1] in downs:
            return None  # not one literal revision: a merge, a tuple, a computed value...
        downs[rev[1:-1]] = None if down == "None" else down[1:-1]
    heads = set(downs) - set(downs.values())
    return heads.pop() if len(heads) == 1 else None


def is_known(revision: str) -> bool:
    """Whether ``revision`` is one of this library's migrations (else the database was migrated
    by a newer version: the library must be upgraded, not the database)."""
    from alembic.script import ScriptDirectory

    return revision in {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def newer_schema_message(revision: str) -> str:
    return (
        f"the database schema is at revision {revision!r}, which this version of tiered-history "
        "does not know (is the database newer than the library? upgrade tiered-history)"
    )


def _at_head(engine: sa.Engine) -> bool:
    """Whether the schema is at the head, checked with one SELECT and no Alembic; False when
    unsure (no version table yet, an error), so that Alembic checks it properly."""
    head = scripts_head()
    if head is None:
        return False
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT version_num FROM alembic_version")).all()
    except sa.exc.DBAPIError:  # a new database: no version table yet
        return False
    return [r[0] for r in rows] == [head]


def _current(conn: sa.Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(conn).get_current_revision()


def _upgrade(conn: sa.Connection, target: str, options: Mapping[str, object]) -> None:
    from alembic import command

    cfg = alembic_config()
    cfg.attributes["connection"] = conn
    cfg.attributes["tiered_history_options"] = dict(options)
    command.upgrade(cfg, target)


def current_revision(engine: sa.Engine) -> str | None:
    with engine.connect() as conn:
        return _current(conn)


def upgrade(engine: sa.Engine, target: str = "head", options: Mapping[str, object] | None = None) -> None:
    """Bring the schema to ``target``; concurrent callers wait for the first one to finish.

    ``options`` are handed to the migration scripts (they take precedence over ``alembic -x``
    arguments and the environment), for example ``{"partitions": 8}``. They matter only to the
    revisions that run: the partitioned layout is chosen when the tables are created.
    """
    if target == "head" and _at_head(engine):
        return  # the usual start of a process: nothing to migrate, Alembic never imported
    head = head_revision()
    if target == "head" and current_revision(engine) == head:
        return
    from .dialect import WRITE_OPTION

    with engine.connect() as raw:
        conn = raw.execution_options(**{WRITE_OPTION: True})
        with conn.begin():
            if engine.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
            # Re-check under the lock: another process may have migrated meanwhile.
            current = _current(conn)
            if current == head and target == "head":
                return
            if current is not None and not is_known(current):
                raise SchemaError(newer_schema_message(current))
            _upgrade(conn, target, options or {})


def optimize(engine: sa.Engine) -> list[str]:
    """Compact the full-text indexes (and refresh the planner's statistics); returns what ran.

    SQLite: FTS5 ``optimize`` merges each index's segments into one (FTS5 keeps adding a
    segment per transaction and merges them only in part, so that a word lookup reads about
    a dozen of them at 100,000 messages); it holds the write lock while it runs (0.13 s at 100,000
    messages; it grows with the index): for a quiet hour. PostgreSQL: ``VACUUM (ANALYZE)`` of the two
    tables, which also moves the GIN indexes' pending entries into the indexes. Nothing
    stored changes.
    """
    from .dialect import WRITE_OPTION

    done: list[str] = []
    if engine.dialect.name == "sqlite":
        with engine.connect() as raw:
            conn = raw.execution_options(**{WRITE_OPTION: True})
            with conn.begin():
                for table in FULL_TEXT["sqlite"]:
                    conn.execute(sa.text(f"INSERT INTO {table}({table}) VALUES ('optimize')"))
                    done.append(f"{table}: optimize")
            conn.exec_driver_sql("PRAGMA optimize")
            done.append("PRAGMA optimize")
        return done
    with engine.connect() as raw:
        conn = raw.execution_options(isolation_level="AUTOCOMMIT")  # VACUUM runs outside a transaction
        for table in ("messages", "summaries"):
            conn.exec_driver_sql(f"VACUUM (ANALYZE) {table}")
            done.append(f"{table}: VACUUM (ANALYZE)")
    return done
