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

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from ..errors import SchemaError
from .schema import FULL_TEXT

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
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


@lru_cache(maxsize=1)
def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise SchemaError("no migration head found")
    return head


def _current(conn: sa.Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()


def _upgrade(conn: sa.Connection, target: str, options: Mapping[str, object]) -> None:
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
            known = {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}
            if current is not None and current not in known:
                raise SchemaError(
                    f"the database schema is at revision {current!r}, which this version of "
                    "tiered-history does not know (is the database newer than the library?)"
                )
            _upgrade(conn, target, options or {})
