"""The store on PostgreSQL tables hash-partitioned by conversation (the layout Citus also runs).

The migrations create it when asked (option ``partitions``, or ``TIERED_HISTORY_PG_PARTITIONS``):
``messages`` and ``summaries`` partitioned by ``conv`` into 8 partitions. The whole store
conformance suite runs on it, and every statement the store runs on those tables touches one
partition only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tiered_history.core.state import SummaryUpdate
from tiered_history.store import migrate
from tiered_history.store.dialect import create_engine
from tiered_history.store.sql import SQLStore
from tiered_history.testing import StoreConformance

from .conftest import database_url
from .test_migrations import autogenerate_diff

PARTITIONS = 8


def partitioned_store(url: str) -> SQLStore:
    engine = create_engine(url)
    migrate.upgrade(engine, options={"partitions": PARTITIONS})
    store = SQLStore(engine)
    store.initialize()  # already at head: nothing more to do
    return store


@pytest.fixture
def pg_partitioned(tmp_path: Path) -> Iterator[SQLStore]:
    with database_url("postgresql", tmp_path) as url:
        store = partitioned_store(url)
        try:
            yield store
        finally:
            store.engine.dispose()


class TestPartitioned(StoreConformance):
    @pytest.fixture
    def store(self, pg_partitioned: SQLStore) -> SQLStore:
        return pg_partitioned


def test_the_tables_are_hash_partitioned_by_conversation(pg_partitioned: SQLStore) -> None:
    with pg_partitioned.engine.connect() as conn:
        for table in ("messages", "summaries"):
            strategy, keys = conn.execute(
                sa.text(
                    "SELECT p.partstrat, pg_get_partkeydef(p.partrelid) FROM pg_partitioned_table p "
                    "WHERE p.partrelid = CAST(:t AS regclass)"
                ),
                {"t": table},
            ).one()
            assert (strategy, keys) == ("h", "HASH (conv)")
            parts = conn.execute(
                sa.text(
                    "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = CAST(:t AS regclass)"
                ),
                {"t": table},
            ).scalars()
            assert sorted(parts) == sorted(f"{table}_p{k}" for k in range(PARTITIONS))
            pk = conn.execute(
                sa.text(
                    "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                    "WHERE conrelid = CAST(:t AS regclass) AND contype = 'p'"
                ),
                {"t": table},
            ).scalar_one()
            assert pk == "PRIMARY KEY (conv, id)"
        # conversations is not partitioned (it is looked up by id); its key is a plain primary key.
        kind = conn.execute(
            sa.text("SELECT relkind FROM pg_class WHERE relname = 'conversations'")
        ).scalar_one()
        assert kind == "r"


def test_autogenerate_sees_the_parent_tables_only(pg_partitioned: SQLStore) -> None:
    assert autogenerate_diff(pg_partitioned.engine.url.render_as_string(hide_password=False)) == []


def test_rows_spread_over_partitions_and_each_statement_reads_one(pg_partitioned: SQLStore) -> None:
    store = pg_partitioned
    suite = StoreConformance()
    cids = [f"conv-{k}" for k in range(24)]
    for cid in cids:
        suite.chat(store, cid, 4)
        suite.seal(store, cid)
    with store.engine.connect() as conn:
        used = conn.execute(sa.text("SELECT count(DISTINCT tableoid) FROM messages")).scalar_one()
        key = conn.execute(sa.text("SELECT key FROM conversations WHERE id = 'conv-0'")).scalar_one()
    assert used > PARTITIONS // 2  # 24 conversations hash over most of the 8 partitions

    q = store.q
    params: dict[str, Any] = {
        "conv": key,
        "seqs": [1, 2],
        "lo": 0,
        "hi": 10,
        "lim": 16,
        "false": False,
        "kind": "topic",
        "after": 0,
        "pattern": "%message%",
        "upto": 2,
        "tsq": "message",
        "terms": ["message"],
        "n": 10,
        "avg": 5.0,
        "dfcap": 1000,
        "cap": 400,
        "ids": [1, 2],
    }
    statements = {
        "pinned": q.pinned,
        "window": q.window,
        "range": q.range,
        "summaries_live": q.summaries_live,
        "summaries_dropped": q.summaries_dropped,
        "summaries_all": q.summaries_all,
        "search_literal": q.search_literal,
        "search_messages": q.pg_candidates([("message",), ("two", "words")], False),
        "search_summaries": q.pg_candidates([("message",)], True),
        "search_rows_messages": q.pg_rows_messages,
        "search_rows_summaries": q.pg_rows_summaries,
        "stats_messages": q.stats_messages,
        "stats_summaries": q.stats_summaries,
        "delete_messages": q.delete_messages,
        "delete_summaries": q.delete_summaries,
        "summary_update": q.summary_update(
            SummaryUpdate(
                1, {"status": "final", "parent_id": 7}, expect_status="pending", expect_unmerged=True
            )
        ),
    }
    raw = store.engine.raw_connection()
    try:
        cur = raw.cursor()
        for name, sql in statements.items():
            bound = {**params, "id": 1, "v_status": "final", "v_parent_id": 7, "expect_status": "pending"}
            cur.execute("EXPLAIN " + sql, bound)
            plan = "\n".join(r[0] for r in cur.fetchall())
            touched = set(re.findall(r"\b(messages_p\d+|summaries_p\d+)\b", plan))
            assert len(touched) == 1, (name, plan)
        # The check is live: a statement without the conversation reads every partition.
        cur.execute("EXPLAIN SELECT id FROM messages WHERE seq = %(seq)s", {"seq": 1})
        plan = "\n".join(r[0] for r in cur.fetchall())
        assert len(set(re.findall(r"\bmessages_p\d+\b", plan))) == PARTITIONS
        raw.rollback()
    finally:
        raw.close()


def test_the_environment_variable_chooses_the_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(migrate.PARTITIONS_ENV, "4")
    with database_url("postgresql", tmp_path) as url:
        store = SQLStore(url)
        store.initialize()  # the library's own migration on first use
        try:
            with store.engine.connect() as conn:
                n = conn.execute(
                    sa.text("SELECT count(*) FROM pg_inherits WHERE inhparent = 'messages'::regclass")
                ).scalar_one()
            assert n == 4
            suite = StoreConformance()
            suite.chat(store, "c", 3)
            assert [m.sequence for m in store.read_messages("c", 1, 3)] == [1, 2, 3]
        finally:
            store.close()


def test_sqlite_ignores_the_option(tmp_path: Path) -> None:
    with database_url("sqlite", tmp_path) as url:
        engine = create_engine(url)
        try:
            migrate.upgrade(engine, options={"partitions": PARTITIONS})
            assert set(sa.inspect(engine).get_table_names()) >= {"conversations", "messages", "summaries"}
            assert not [t for t in sa.inspect(engine).get_table_names() if re.fullmatch(r"messages_p\d+", t)]
        finally:
            engine.dispose()


@pytest.mark.parametrize("bad", ["eight", "-1"])
def test_a_bad_partition_count_is_refused(tmp_path: Path, bad: str) -> None:
    with database_url("postgresql", tmp_path) as url:
        engine = create_engine(url)
        try:
            with pytest.raises(Exception, match="partitions"):
                migrate.upgrade(engine, options={"partitions": bad})
            assert migrate.current_revision(engine) is None  # nothing was created
        finally:
            engine.dispose()


def test_a_0_1_0_database_upgrades_into_the_partitioned_layout(tmp_path: Path) -> None:
    from tiered_history import HistoryCompressor, SyncHistoryCompressor

    from .test_migrations import at_revision, build_v1, expected_message, insert_v1

    with database_url("postgresql", tmp_path) as url:
        at_revision(url, "0001")
        convs = build_v1(HistoryCompressor("memory://"))
        insert_v1(url, convs)
        at_revision(url, "head", {"partitions": PARTITIONS, "batch": 3})
        with SyncHistoryCompressor.from_url(url) as hc:
            for c in convs:
                assert hc.get_history(c.id).messages == [expected_message(c.id, r) for r in c.messages]
            assert hc.add_message("beta", {"role": "user", "content": "more"}).sequence == 4
            assert hc.maintain(now=datetime(2027, 1, 1, tzinfo=UTC)).errors == []
