"""Engines, dialect capabilities (probed once) and driver-error translation."""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.engine import make_url
from sqlalchemy.pool import StaticPool

from ..errors import ConfigurationError, StoreError, TransientStoreError

T = TypeVar("T")

#: Execution option that makes a SQLite transaction start with BEGIN IMMEDIATE.
WRITE_OPTION = "tiered_history_write"

_DRIVERS = {
    "sqlite": "sqlite+pysqlite",
    "sqlite+pysqlite": "sqlite+pysqlite",
    "sqlite+aiosqlite": "sqlite+pysqlite",
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "postgresql+psycopg": "postgresql+psycopg",
    "postgresql+psycopg2": "postgresql+psycopg",
    "postgresql+psycopg_async": "postgresql+psycopg",
    "postgresql+asyncpg": "postgresql+psycopg",
}
#: Threads (and pooled connections) per store: enough for a bot's concurrent replies.
_THREADS = 8


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What the database can do, decided once per engine."""

    name: str
    skip_locked: bool
    single_connection: bool
    """In-memory SQLite: one shared connection, so transactions are serialised in-process."""
    threads: int
    retry_transient: bool
    read_options: dict[str, Any]
    write_options: dict[str, Any]

    def insert(self, table: sa.Table) -> Any:
        """An INSERT that supports ``on_conflict_do_nothing`` on this dialect."""
        # Imported here: SQLAlchemy's PostgreSQL dialect costs a SQLite process ~15 ms to load.
        from sqlalchemy.dialects import postgresql, sqlite

        return postgresql.insert(table) if self.name == "postgresql" else sqlite.insert(table)

    def retry(self, fn: Callable[[], T]) -> T:
        """``fn()``, retried on transient errors where that is safe (PostgreSQL), else run once.

        SQLite is not retried: a locked database has already waited its busy timeout.
        """
        if not self.retry_transient:
            return fn()
        from ..retry import store_retry  # tenacity: loaded by the stores that retry only

        return store_retry(fn)


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages, logs and JSON output).

    The one helper every message, log line and ``--json`` output that shows a URL goes through.
    """
    import re

    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
        if "@" not in (parsed.host or ""):
            return parsed.render_as_string(hide_password=True)
    except Exception:
        pass
    # Not a URL SQLAlchemy can parse, or a careless password holding a raw "@": mask everything
    # from "://user:" to the last "@" (masking too much is the safe side).
    return re.sub(r"(://[^:/@]*:).*@", r"\1***@", url, flags=re.DOTALL)


def database_url(url: str) -> sa.URL:
    """Turn a plain URL into one naming the driver we use, or raise :class:`ConfigurationError`."""
    try:
        parsed = make_url(url)
    except Exception:
        raise ConfigurationError(
            f"invalid database URL {mask_url(url)!r}: expected sqlite:///path, sqlite:// or "
            "postgresql://user@host/db"
        ) from None
    driver = _DRIVERS.get(parsed.drivername)
    if driver is None:
        raise ConfigurationError(
            f"unsupported database {parsed.drivername!r} in URL: use sqlite:///path or postgresql://..."
        )
    return parsed.set(drivername=driver)


def create_engine(url: str) -> sa.Engine:
    """Create an engine for a plain URL; callers that pass their own engine keep ownership of it."""
    parsed = database_url(url)
    kwargs: dict[str, Any] = {}
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            kwargs["poolclass"] = StaticPool
        else:
            # The store holds up to _THREADS connections between transactions: never make a
            # thread wait for a pool slot (a SQLite connection is only a file handle).
            kwargs.update(pool_size=_THREADS, max_overflow=-1)
        kwargs["connect_args"] = {"timeout": 30, "check_same_thread": False}
    else:
        kwargs.update(pool_pre_ping=True, pool_size=_THREADS, max_overflow=2)
    try:
        engine = sa.create_engine(parsed, **kwargs)
    except Exception as e:
        raise ConfigurationError(
            f"cannot create a database engine for {parsed.render_as_string()}: {e}"
        ) from None
    prepare_engine(engine)
    return engine


_prepared: weakref.WeakSet[sa.Engine] = weakref.WeakSet()


def prepare_engine(engine: sa.Engine) -> None:
    """Install the SQLite pragmas and transaction handling (idempotent)."""
    sync = engine
    if sync.dialect.name != "sqlite" or sync in _prepared:
        return
    _prepared.add(sync)
    memory = sync.url.database in (None, "", ":memory:")

    @event.listens_for(sync, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control from the driver so BEGIN IMMEDIATE works (SQLAlchemy's recipe).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        if not memory:
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()
        # SQLite's lower() folds ASCII only; search must find "ZÜRICH" from "zürich".
        dbapi_conn.create_function("lower", 1, _lower, deterministic=True)

    @event.listens_for(sync, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # Writers take the write lock up front: no deadlock-prone lock upgrades mid-transaction.
        immediate = conn.get_execution_options().get(WRITE_OPTION)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def _lower(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


def capabilities(engine: sa.Engine) -> Capabilities:
    dialect = engine.dialect
    if dialect.name == "postgresql":
        return Capabilities(
            name="postgresql",
            skip_locked=True,
            single_connection=False,
            threads=_THREADS,
            retry_transient=True,
            # One snapshot for the several reads of get_context.
            read_options={"isolation_level": "REPEATABLE READ"},
            write_options={},
        )
    if dialect.name == "sqlite":
        return Capabilities(
            name="sqlite",
            skip_locked=False,
            single_connection=engine.url.database in (None, "", ":memory:"),
            threads=_THREADS,
            retry_transient=False,
            read_options={},
            write_options={WRITE_OPTION: True},
        )
    raise ConfigurationError(f"unsupported database dialect {dialect.name!r}")


_TRANSIENT_PG = re.compile(r"^(08|40001|40P01|57P0[123]|53300)")


def _driver_error(error: BaseException) -> BaseException:
    orig = getattr(error, "orig", None)
    return orig if isinstance(orig, BaseException) else error


def translate(error: BaseException, action: str) -> StoreError:
    """Turn a driver or SQLAlchemy error into a library error with a clear message (no traceback)."""
    orig = _driver_error(error)
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None) or ""
    text = str(orig).strip()
    detail = text.splitlines()[0] if text else type(orig).__name__
    kind = type(orig).__name__
    transient = bool(
        (isinstance(error, exc.DBAPIError) and error.connection_invalidated)
        or (code and _TRANSIENT_PG.match(code))
        or isinstance(error, exc.TimeoutError)
        or isinstance(orig, OSError)
        or "database is locked" in detail
        or ("connection" in detail.lower() and "OperationalError" in kind)
        or kind in {"ConnectionTimeout", "ConnectionFailure", "AdminShutdown"}
    )
    cls = TransientStoreError if transient else StoreError
    err = cls(f"database error while {action}: {detail}")
    err.integrity = code.startswith("23") or "IntegrityError" in kind or "UniqueViolation" in kind
    return err


def is_integrity_error(error: StoreError) -> bool:
    """A unique or foreign-key constraint refused the write (another writer got there first)."""
    return bool(getattr(error, "integrity", False))
