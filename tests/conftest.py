"""Shared fixtures. Every test runs with a guard that refuses non-loopback connections."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# Most tests exercise the boundary rules on tiny messages; the size gate that keeps tiny topics
# open (boundaries.min_topic_tokens, default 120) has its own tests that set it explicitly.
os.environ.setdefault("TIERED_HISTORY_BOUNDARIES__MIN_TOPIC_TOKENS", "0")

_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex
_real_getaddrinfo = socket.getaddrinfo


class NetworkAccessError(RuntimeError):
    """A test tried to reach a host other than this machine."""


def _is_local(host: Any) -> bool:
    if host is None:
        return True
    host = host.decode() if isinstance(host, bytes) else str(host)
    if host in {"localhost", "", "localhost.localdomain"}:
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _check_address(address: Any) -> None:
    if isinstance(address, tuple) and address and not _is_local(address[0]):
        raise NetworkAccessError(f"tests must not reach the network (tried {address[0]!r})")


def _guarded_connect(self: socket.socket, address: Any) -> None:
    if self.family in (socket.AF_INET, socket.AF_INET6):
        _check_address(address)
    return _real_connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    if self.family in (socket.AF_INET, socket.AF_INET6):
        _check_address(address)
    return _real_connect_ex(self, address)


def _guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    if not _is_local(host):
        raise NetworkAccessError(f"tests must not resolve or reach {host!r}")
    return _real_getaddrinfo(host, *args, **kwargs)


def pytest_configure(config: pytest.Config) -> None:
    socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign]
    socket.getaddrinfo = _guarded_getaddrinfo


# -- database backends ------------------------------------------------------------------------

PG_ADMIN_URL = os.environ.get("TIERED_HISTORY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _pg_available() -> str | None:
    """None if PostgreSQL answers, else why not."""
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


_PG_STATUS: list[str | None] = []


def pg_status() -> str | None:
    if not _PG_STATUS:
        _PG_STATUS.append(_pg_available())
    return _PG_STATUS[0]


def require_pg() -> None:
    """Skip locally when PostgreSQL is absent; under CI=true a missing PostgreSQL fails the test."""
    why = pg_status()
    if why is not None:
        if IN_CI:
            pytest.fail(f"PostgreSQL is required in CI but unreachable at {PG_ADMIN_URL}: {why}")
        pytest.skip(f"PostgreSQL unreachable: {why}")


def make_pg_database() -> tuple[str, Any]:
    """Create a throwaway database; returns (url, drop callable)."""
    import uuid

    import psycopg

    require_pg()
    name = f"th_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]

    def drop() -> None:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return f"{base}/{name}", drop


@pytest.fixture
def pg_url(tmp_path: Any) -> Iterator[str]:
    with database_url("postgresql", tmp_path) as url:
        yield url


@contextlib.contextmanager
def database_url(kind: str, directory: Any) -> Iterator[str]:
    """A fresh database of ``kind`` (memory, sqlite in ``directory``, postgresql), dropped afterwards."""
    if kind == "memory":
        yield "memory://"
    elif kind == "sqlite":
        yield f"sqlite:///{directory / 'history.db'}"
    else:
        url, drop = make_pg_database()
        try:
            yield url
        finally:
            drop()


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    """A fresh database URL for each backend: the in-memory store, a SQLite file, PostgreSQL."""
    with database_url(request.param, tmp_path) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    """A fresh SQL database URL (SQLite file or PostgreSQL)."""
    with database_url(request.param, tmp_path) as url:
        yield url
