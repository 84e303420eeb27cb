"""The write path's shape: what each write costs the database, and what keeps it correct.

* An append is a few statements (SQLite: the state update and the message; PostgreSQL: one
  statement, its own transaction); a seal adds one (the pending topic row), whatever the topic's length.
* The state document is formatted by hand (it is written on every message): exactly the text
  ``json.dumps`` gives for the same structure.
* A write whose answer was lost (a dropped connection after the server committed it) is not
  applied twice when retried.
* On SQLite the async API writes on the event loop, and only a write that would wait for another
  process's lock goes to a thread: the loop stays responsive while it waits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tiered_history import HistoryCompressor, SyncHistoryCompressor
from tiered_history.core.state import ConversationState
from tiered_history.store.sql import SQLStore

from .conftest import database_url

FILLER = "words about the matter at hand, enough of them to count"


def reference_body(st: ConversationState) -> str:
    """The state document as ``json.dumps`` writes it (the format's definition)."""
    return json.dumps(
        {
            "last": st.last_sequence,
            "last_at": None if st.last_message_at is None else st.last_message_at.isoformat(),
            "start": st.topic_start_seq,
            "open": st.open.to_json(),
            "calls": list(st.open_tool_calls),
            "clean_seq": st.last_clean_seq,
            "clean": st.clean.to_json(),
            "tail": st.tail.to_json(),
            "recent": [r.to_json() for r in st.recent],
            "detector": st.detector,
            "last_seal": st.last_seal.to_json() if st.last_seal else None,
            "topics": st.topic_count,
            "archives": st.archive_count,
            "summarized": st.summarized_upto,
            "merged": st.topics_merged_upto,
            "dropped": st.archives_dropped_upto,
            "compressions": st.compressions,
            "pins": [list(p) for p in st.pins],
            "budget": st.budget,
            "ctx_tokens": st.context_tokens,
            "epoch": st.epoch,
            "window": st.window.to_json() if st.window else None,
            "windows": [w.to_json() for w in st.other_windows],
            "words": st.words,
            "channel": st.channel,
            "users": list(st.users),
            "detected": st.detected_upto,
            "maint": st.needs_maintenance,
            "retry_at": None if st.next_retry_at is None else st.next_retry_at.isoformat(),
            "silence_at": None if st.silence_due_at is None else st.silence_due_at.isoformat(),
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )


def test_the_state_document_is_what_json_dumps_writes() -> None:
    seen: set[str] = set()
    with SyncHistoryCompressor("memory://", context_budget=400) as h:
        for i in range(160):
            if i % 37 == 5:
                h.pin("c", {"role": "system", "content": f"pin {i}"}, key=f'k"é\\{i % 3}')
            if i % 11 == 3:
                call = f'call"{i}ü\n'
                h.add_message(
                    "c",
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {"id": call, "type": "function", "function": {"name": "f", "arguments": "{}"}}
                        ],
                    },
                    user_id=f'u"{i % 5}',
                    channel="ch\\ü",
                    platform="discord",
                )
                st = h.reply.states.get("c")
                assert st is not None and st.open_tool_calls
                assert st.body() == reference_body(st)
                seen.add("calls")
                h.add_message("c", {"role": "tool", "tool_call_id": call, "content": "ok"})
            text = f"{'New topic: ' if i % 23 == 0 else ''}message {i} {FILLER}"
            h.add_message("c", {"role": "user" if i % 2 == 0 else "assistant", "content": text})
            if i % 50 == 10:
                h.get_context("c", 300)
                # Window marks: none below cache_min_tokens, one per budget read above it.
                h.get_context("c", 4000 if i % 100 == 10 else 2500)
            if i % 70 == 20:
                h.maintain()
            st = h.reply.states.get("c")
            assert st is not None
            assert st.body() == reference_body(st)
            assert (
                ConversationState.from_row(
                    id=st.id,
                    version=st.version,
                    platform=st.platform,
                    encoding=st.encoding,
                    created_at=st.created_at,
                    updated_at=st.updated_at,
                    body=st.body(),
                )
                == st
            )
            seen.update(k for k, v in json.loads(st.body()).items() if v not in (None, [], 0, False))
    # The run reached every part of the document that can hold something.
    assert {"calls", "last_seal", "pins", "window", "windows", "users", "channel", "budget", "maint"} <= seen


def test_a_state_copied_with_changes_is_what_dataclasses_replace_makes() -> None:
    """``with_changes`` (and ``bumped``) copy a state field by field instead of through ``replace``:
    the same state, whichever fields change, and an unknown field is refused as replace refuses it."""
    with SyncHistoryCompressor("memory://", context_budget=400) as h:
        for i in range(40):
            h.add_message(
                "c", {"role": "user", "content": f"{'New topic: ' if i % 9 == 0 else ''}m {i} {FILLER}"}
            )
        h.pin("c", "be brief", key="k")
        st = h.reply.states.get("c")
    assert st is not None and st.last_seal is not None and st.pins
    every = {f.name: getattr(st, f.name) for f in dataclasses.fields(st)}
    other = ConversationState(id="other", version=7, users=("u",), budget=300, needs_maintenance=True)
    for name in every:
        for changes in ({}, {name: getattr(other, name)}, {n: getattr(other, n) for n in every if n >= name}):
            copied = st.with_changes(changes)
            assert copied == dataclasses.replace(st, **changes)
            assert {f.name: getattr(copied, f.name) for f in dataclasses.fields(st)} == {**every, **changes}
            assert hash(copied) == hash(dataclasses.replace(st, **changes))
    assert st.bumped(epoch=9) == dataclasses.replace(st, version=st.version + 1, epoch=9)
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.with_changes({}).version = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        st.with_changes({"no_such_field": 1})
    with pytest.raises(TypeError):
        st.bumped(version=5)


# -- statements per write ------------------------------------------------------------------------------


@pytest.fixture
def traced_sqlite(tmp_path: Path) -> Iterator[tuple[SyncHistoryCompressor, list[str]]]:
    """A compressor on a SQLite file whose connections report every statement they run."""
    statements: list[str] = []
    with SyncHistoryCompressor(f"sqlite:///{tmp_path / 't.db'}", boundaries={"temporal": False}) as h:
        store = h.sync_store
        assert isinstance(store, SQLStore)

        @sa.event.listens_for(store.engine, "connect")
        def _trace(dbapi: Any, _record: Any) -> None:
            dbapi.set_trace_callback(statements.append)

        assert store._held is not None
        store._held.close()
        store.engine.dispose()  # connections made from now on are traced
        yield h, statements


def _data_statements(statements: list[str]) -> list[str]:
    """The statements a transaction ran, less its framing and the full-text triggers' own (SQLite
    reports a trigger's steps as comments, and its statement again as the trigger runs)."""
    out: list[str] = []
    last = None
    for s in statements:
        if s.startswith(("--", "BEGIN", "COMMIT", "PRAGMA")) or "_fts" in s or s == last:
            continue
        words = s.split()
        out.append(" ".join(words[:2] if words[0] == "UPDATE" else words[:3]))
        last = s
    return out


def test_sqlite_append_and_seal_run_two_and_three_statements(
    traced_sqlite: tuple[SyncHistoryCompressor, list[str]],
) -> None:
    h, statements = traced_sqlite
    h.add_message("c", {"role": "user", "content": f"first {FILLER}"})
    for i in range(40):  # a long open topic: a seal must not cost more for it
        h.add_message("c", {"role": "assistant" if i % 2 else "user", "content": f"{i} {FILLER}"})
    statements.clear()
    h.add_message("c", {"role": "assistant", "content": f"plain {FILLER}"})
    assert _data_statements(statements) == ["UPDATE conversations", "INSERT INTO messages"]
    assert statements[0] == "BEGIN IMMEDIATE" and statements[-1] == "COMMIT"
    statements.clear()
    h.add_message("c", {"role": "user", "content": f"New topic: gardening. {FILLER}"})
    assert h.reply.states.get("c").topic_count == 1  # type: ignore[union-attr]
    assert _data_statements(statements) == [
        "UPDATE conversations",
        "INSERT INTO messages",
        "INSERT INTO summaries",
    ]


def test_sqlite_writes_reach_a_conversation_made_again_under_another_key(tmp_path: Path) -> None:
    """A SQLite store remembers the row key of the conversations it writes (its update then needs no
    RETURNING): a conversation another process deleted and made again has a new key, and the next
    write lands in the new row, at the version the guard expects, whatever the old key was."""
    url = f"sqlite:///{tmp_path / 'k.db'}"
    with SyncHistoryCompressor(url) as a, SyncHistoryCompressor(url) as b:
        for i in range(2):
            a.add_message("c", {"role": "user", "content": f"old {i} {FILLER}"})
        store = a.sync_store
        assert isinstance(store, SQLStore)
        old_key = store._keys["c"]
        assert b.delete_conversation("c")
        for _ in range(2):  # takes the old key, at the version of a's stale state
            b.add_message("other", {"role": "user", "content": f"takes a key {FILLER}"})
        for i in range(2):  # the same version again: only the key and the id tell the rows apart
            b.add_message("c", {"role": "user", "content": f"new {i} {FILLER}"})
        a.add_message("c", {"role": "assistant", "content": f"from a {FILLER}"})
        assert store._keys["c"] != old_key
        got = [m.content for m in b.get_history("c").messages]
        assert got == [f"new 0 {FILLER}", f"new 1 {FILLER}", f"from a {FILLER}"]
        assert [m.content for m in b.get_history("other").messages] == [f"takes a key {FILLER}"] * 2
        a.add_message("c", {"role": "user", "content": f"again {FILLER}"})  # the kept key now
        assert len(b.get_history("c").messages) == 4


def test_store_retry_runs_the_first_attempt_bare_and_then_waits_as_tenacity_did(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Five attempts, 0.05 s doubling between them (at most 1 s), transient failures only, the last
    failure raised: the schedule tenacity ran alone, now entered only after a first failure."""
    from tiered_history import retry
    from tiered_history.errors import StoreError, TransientStoreError

    waits: list[float] = []
    monkeypatch.setattr(time, "sleep", waits.append)

    def failing(times: int, error: type[Exception] = TransientStoreError) -> tuple[Any, list[int]]:
        calls: list[int] = []

        def fn() -> str:
            calls.append(len(calls) + 1)
            if len(calls) <= times:
                raise error(f"attempt {len(calls)}")
            return "done"

        return fn, calls

    for times in range(retry.STORE_ATTEMPTS):
        waits.clear()
        fn, calls = failing(times)
        assert retry.store_retry(fn) == "done"
        assert calls == list(range(1, times + 2))
        assert waits == pytest.approx([0.05, 0.1, 0.2, 0.4][:times])
    waits.clear()
    fn, calls = failing(retry.STORE_ATTEMPTS)
    with pytest.raises(TransientStoreError, match=f"attempt {retry.STORE_ATTEMPTS}"):
        retry.store_retry(fn)
    assert len(calls) == retry.STORE_ATTEMPTS and waits == pytest.approx([0.05, 0.1, 0.2, 0.4])
    for times in (1, 2):  # not transient: raised at once, wherever it comes
        waits.clear()
        fn, calls = failing(times, StoreError)
        with pytest.raises(StoreError, match="attempt 1"):
            retry.store_retry(fn)
        assert len(calls) == 1 and waits == []
    attempts: list[int] = []

    def transient_then_permanent() -> str:
        attempts.append(1)
        raise (TransientStoreError if len(attempts) == 1 else StoreError)(f"attempt {len(attempts)}")

    waits.clear()
    with pytest.raises(StoreError, match="attempt 2"):
        retry.store_retry(transient_then_permanent)
    assert len(attempts) == 2
    assert waits == pytest.approx([0.05])


class _Recording:
    """A cursor that notes the first word of every statement it is given."""

    def __init__(self, cur: Any, sent: list[str]) -> None:
        self._cur = cur
        self._sent = sent

    def execute(self, sql: str, *args: Any) -> Any:
        self._sent.append(sql.split()[0])
        return self._cur.execute(sql, *args)

    def executemany(self, sql: str, *args: Any) -> Any:
        self._sent.append(sql.split()[0])
        return self._cur.executemany(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)


@pytest.mark.postgres
def test_postgres_append_is_one_statement_and_a_seal_three(tmp_path: Path) -> None:
    with (
        database_url("postgresql", tmp_path) as url,
        SyncHistoryCompressor(url, boundaries={"temporal": False}) as h,
    ):
        store = h.sync_store
        assert isinstance(store, SQLStore)
        h.add_message("c", {"role": "user", "content": f"first {FILLER}"})
        for i in range(20):
            h.add_message("c", {"role": "assistant" if i % 2 else "user", "content": f"{i} {FILLER}"})
        sent: list[str] = []
        real = store._on_held

        def spy(action: str, fn: Any, write: bool, single: bool) -> Any:
            def traced(cur: Any) -> Any:
                return fn(_Recording(cur, sent))

            if not single:
                sent.append("BEGIN")
            try:
                return real(action, traced, write, single)
            finally:
                if not single:
                    sent.append("COMMIT")

        store._on_held = spy  # type: ignore[method-assign]
        h.add_message("c", {"role": "assistant", "content": f"plain {FILLER}"})
        assert sent == ["WITH"]  # the guarded state update and the insert, one statement
        sent.clear()
        h.add_message("c", {"role": "user", "content": f"New topic: gardening. {FILLER}"})
        assert sent == ["BEGIN", "UPDATE", "INSERT", "INSERT", "COMMIT"]
        sent.clear()
        h.add_messages("c", [{"role": "assistant", "content": f"{i} {FILLER}"} for i in range(50)])
        assert sent == ["WITH"]
        assert [m.sequence for m in h.get_messages("c")] == list(range(1, 74))


# -- a write whose answer was lost ------------------------------------------------------------------------


@pytest.mark.postgres
def test_a_write_committed_before_its_connection_dropped_is_not_repeated(tmp_path: Path) -> None:
    """The server committed the append; the answer never arrived (the connection dropped). The
    retry must find the write in place rather than plan the message again at the next sequence."""
    import psycopg

    with (
        database_url("postgresql", tmp_path) as url,
        SyncHistoryCompressor(url, boundaries={"temporal": False}) as h,
    ):
        store = h.sync_store
        assert isinstance(store, SQLStore)
        h.add_message("c", {"role": "user", "content": "one"})
        real = store._append_alone
        lost = []

        def committed_then_lost(cur: Any, *args: Any) -> Any:
            real(cur, *args)  # autocommitted: it is in the database now
            if not lost:
                lost.append(True)
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            raise AssertionError("the write was attempted twice")

        store._append_alone = committed_then_lost  # type: ignore[method-assign]
        stored = h.add_message("c", {"role": "assistant", "content": "two"})
        store._append_alone = real  # type: ignore[method-assign]
        assert lost and stored.sequence == 2
        assert [m.content for m in h.get_messages("c")] == ["one", "two"]
        h.add_message("c", {"role": "user", "content": "three"})
        assert [m.sequence for m in h.get_messages("c")] == [1, 2, 3]


# -- async: on the loop unless a lock is held elsewhere ---------------------------------------------------

_HOLDER = textwrap.dedent(
    """
    import sqlite3, sys, time
    db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=0)
    db.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    db.execute("ROLLBACK")
    """
)


@pytest.mark.timeout(60)
async def test_a_write_waiting_for_another_process_lock_leaves_the_event_loop_free(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    hold = 1.5
    async with HistoryCompressor(f"sqlite:///{path}", boundaries={"temporal": False}) as hc:
        store = hc.sync_store
        assert isinstance(store, SQLStore)
        threads: list[str] = []
        real = store.commit

        def commit(*args: Any) -> Any:
            threads.append(threading.current_thread().name)
            return real(*args)

        store.commit = commit  # type: ignore[method-assign]
        await hc.add_message("c", {"role": "user", "content": "before the lock"})
        loop_thread = threading.current_thread().name
        assert threads == [loop_thread], "an uncontended write runs on the event loop (no thread hop)"

        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(path), str(hold)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            gaps: list[float] = []
            done = asyncio.Event()

            async def ticker() -> None:
                while not done.is_set():
                    t = time.monotonic()
                    await asyncio.sleep(0.01)
                    gaps.append(time.monotonic() - t)

            tick = asyncio.create_task(ticker())
            threads.clear()
            started = time.monotonic()
            stored = await hc.add_message("c", {"role": "user", "content": "during the lock"})
            waited = time.monotonic() - started
            done.set()
            await tick
        finally:
            holder.wait(10)
        assert stored.sequence == 2
        assert waited >= hold * 0.5, f"the write did not wait for the lock ({waited:.2f} s)"
        # Tried on the loop (refused at once), then waited for on a thread of the store's pool.
        assert threads[0] == loop_thread and threads[-1] != loop_thread, threads
        assert len(gaps) >= 20 and max(gaps) < 0.25, f"the event loop stalled for {max(gaps):.2f} s"
        assert [m.content for m in (await hc.get_history("c")).messages] == [
            "before the lock",
            "during the lock",
        ]


async def test_a_task_writing_in_a_loop_does_not_starve_the_others(tmp_path: Path) -> None:
    """Writes on the event loop still suspend the writing task once per call."""
    async with HistoryCompressor(f"sqlite:///{tmp_path / 'fair.db'}") as hc:
        other_ran = asyncio.Event()
        seen_at: list[int] = []

        async def writer() -> None:
            for i in range(20):
                await hc.add_message("w", {"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"})
                if other_ran.is_set() and not seen_at:
                    seen_at.append(i)

        async def other() -> None:
            other_ran.set()

        await asyncio.gather(writer(), other())
        assert seen_at == [0], "the other task waited for the writer's whole loop"
