"""Faults: summarisers that fail in every way, PostgreSQL connections dropped mid-run, a locked SQLite.

Whatever the summariser does, ``maintain()`` completes, every topic gets a usable (extractive)
summary, retries stop after ``summary_max_attempts``, ``get_context`` answers within budget and
the stored messages are never touched. Whatever the database does, callers see library errors only
and no message is lost or stored twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tiered_history import (
    HistoryCompressor,
    MaintenanceReport,
    Settings,
    StoreError,
    TieredHistoryError,
    TransientStoreError,
)
from tiered_history.store.dialect import create_engine
from tiered_history.summarizers.base import SummaryInput, SummaryPiece, SummaryResult

from .conftest import PG_ADMIN_URL, make_pg_database

FILLER = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november"
T0 = datetime(2026, 4, 1, 9, 0, tzinfo=UTC)
TIMEOUT = 0.5
MAX_ATTEMPTS = 3
BACKOFF = 10.0
BUDGETS = (64, 150, 400, 600, 4000)

FAULT_SETTINGS: dict[str, Any] = {
    "context_budget": 2000,
    "topic_summary_tokens": 40,
    "summary_max_attempts": MAX_ATTEMPTS,
    "retry_backoff_seconds": BACKOFF,
    "summarizer": {"timeout": TIMEOUT},
    "lease_seconds": 30,
    "boundaries": {"temporal": False},
}


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def _pg_module_db() -> Iterator[str]:
    url, drop = make_pg_database()
    try:
        yield url
    finally:
        drop()


ALL_BACKENDS = ["memory", "sqlite", "postgresql"]


def catalogue(behaviours: Sequence[str], everywhere: str) -> list[Any]:
    """Every behaviour on the memory store (the fallback logic is the service's, the same for every
    backend) and one representative behaviour on each SQL backend."""
    cases = [pytest.param("memory", b, id=f"memory-{b}") for b in behaviours]
    cases += [pytest.param(db, everywhere, id=f"{db}-{everywhere}") for db in ALL_BACKENDS[1:]]
    return cases


@pytest.fixture(params=ALL_BACKENDS)
def fault_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh store per test; PostgreSQL reuses one database per module, emptied first."""
    if request.param == "memory":
        yield "memory://"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'faults.db'}"
    else:
        url = request.getfixturevalue("_pg_module_db")
        engine = create_engine(url)
        with engine.begin() as conn:
            tables = sa.inspect(conn).get_table_names()
            if "conversations" in tables:
                conn.exec_driver_sql("TRUNCATE messages, summaries, conversations")
        engine.dispose()
        yield url


def settings(**extra: Any) -> Settings:
    return Settings.load(**{**FAULT_SETTINGS, **extra})


@contextlib.asynccontextmanager
async def compressor(url: str, summarizer: Any, **extra: Any) -> AsyncIterator[HistoryCompressor]:
    async with HistoryCompressor(url, settings=settings(**extra), summarizer=summarizer) as hc:
        yield hc


# -- summarisers that misbehave ---------------------------------------------------------------


class FaultySummarizer:
    """Counts calls per topic (first sequence) and per merge; ``behaviour`` decides each outcome."""

    name = "faulty"

    def __init__(
        self, behaviour: str, *, fail_times: int = 10**6, merge_behaviour: str | None = None
    ) -> None:
        self.behaviour = behaviour
        self.merge_behaviour = merge_behaviour or behaviour
        self.fail_times = fail_times
        self.calls: Counter[int] = Counter()
        self.merge_calls: Counter[tuple[int, int]] = Counter()
        self.cancelled = 0

    async def _misbehave(self, behaviour: str, source: str, target: int) -> Any:
        if behaviour == "raise":
            raise RuntimeError("LLM provider returned HTTP 500")
        if behaviour == "hang":
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if behaviour == "empty":
            return SummaryResult(text="", summarizer=self.name)
        if behaviour == "blank":
            return SummaryResult(text=" \n\t ", summarizer=self.name)
        if behaviour == "none":
            return None
        if behaviour == "plain-string":
            return "just a string, not a SummaryResult"
        if behaviour == "text-none":
            return SummaryResult(text=None, summarizer=self.name)  # type: ignore[arg-type]
        if behaviour == "text-int":
            return SummaryResult(text=12345, summarizer=self.name)  # type: ignore[arg-type]
        if behaviour == "text-bytes":
            return SummaryResult(text=b"bytes summary", summarizer=self.name)  # type: ignore[arg-type]
        if behaviour == "larger":
            return SummaryResult(text=(source + " ") * 4, summarizer=self.name)
        if behaviour == "slightly-larger":  # within the overshoot allowance, but bigger than the source
            return SummaryResult(text=source + " and more", summarizer=self.name)
        # What a database refuses (PostgreSQL: a NUL; both: a lone surrogate), in the text or in
        # the error a provider's answer puts in the exception.
        if behaviour == "nul":
            return SummaryResult(text="The trip is booked.\x00 Hotel in Paris.", summarizer=self.name)
        if behaviour == "surrogate":
            return SummaryResult(text="The trip is booked \ud800 hotel in Paris.", summarizer=self.name)
        if behaviour == "raise-nul":
            raise RuntimeError("HTTP 400: bad request \x00\ud800")
        if behaviour == "ok-long-names":  # a good summary; a provider that names its model at length
            return SummaryResult(
                text=f"Good summary in {target} tokens.", summarizer="s" * 100, model="m\x00" * 300
            )
        if behaviour == "ok":
            return SummaryResult(text=f"Good summary in {target} tokens.", summarizer=self.name, model="m1")
        raise AssertionError(behaviour)

    async def summarize(self, messages: Sequence[SummaryInput], target_tokens: int) -> SummaryResult:
        key = messages[0].sequence
        self.calls[key] += 1
        behaviour = self.behaviour if self.calls[key] <= self.fail_times else "ok"
        source = "\n".join(m.content for m in messages)
        result: SummaryResult = await self._misbehave(behaviour, source, target_tokens)
        return result

    async def merge(self, pieces: Sequence[SummaryPiece], target_tokens: int) -> SummaryResult:
        self.merge_calls[(pieces[0].first_sequence, pieces[-1].last_sequence)] += 1
        source = "\n".join(p.text for p in pieces)
        result: SummaryResult = await self._misbehave(self.merge_behaviour, source, target_tokens)
        return result


class WordySummarizer(FaultySummarizer):
    """Summaries that succeed and are long enough for the topic share to overflow (so merges run)."""

    async def summarize(self, messages: Sequence[SummaryInput], target_tokens: int) -> SummaryResult:
        self.calls[messages[0].sequence] += 1
        words = " ".join(m.content for m in messages).split()[: max(target_tokens // 2, 10)]
        return SummaryResult(text=" ".join(words), summarizer=self.name)


class SyncSummarizer:
    """``summarize`` is not a coroutine function: it returns a plain result."""

    name = "sync"

    def __init__(self) -> None:
        self.calls: Counter[int] = Counter()

    def summarize(self, messages: Sequence[SummaryInput], target_tokens: int) -> SummaryResult:
        self.calls[messages[0].sequence] += 1
        return SummaryResult(text="sync", summarizer=self.name)

    def merge(self, pieces: Sequence[SummaryPiece], target_tokens: int) -> SummaryResult:
        return SummaryResult(text="sync", summarizer=self.name)


class CancellingSummarizer:
    """Raises CancelledError itself (as some HTTP clients do on their own internal timeouts)."""

    name = "cancelling"

    def __init__(self) -> None:
        self.calls: Counter[int] = Counter()

    async def summarize(self, messages: Sequence[SummaryInput], target_tokens: int) -> SummaryResult:
        self.calls[messages[0].sequence] += 1
        raise asyncio.CancelledError("client-side cancel")

    async def merge(self, pieces: Sequence[SummaryPiece], target_tokens: int) -> SummaryResult:
        raise asyncio.CancelledError("client-side cancel")


# -- helpers ----------------------------------------------------------------------------------


async def fill(
    hc: HistoryCompressor, cid: str, topics: int, turns: int = 4
) -> list[tuple[str, str, datetime]]:
    """``topics`` sealed topics, each too big to keep word for word, plus an open one."""
    sent: list[tuple[str, str, datetime]] = []
    i = 0
    for t in range(topics + 1):
        for k in range(turns if t < topics else 2):
            role = "user" if k % 2 == 0 else "assistant"
            prefix = "New topic: " if k == 0 and t > 0 else ""
            text = f"{prefix}topic {t} turn {k}. {FILLER}. Details {t}-{k}: {FILLER}."
            stamp = T0 + timedelta(seconds=i)
            i += 1
            await hc.add_message(cid, {"role": role, "content": text, "timestamp": stamp})
            sent.append((role, text, stamp))
    h = await hc.get_history(cid)
    assert len(h.topics) == topics and all(t.status == "pending" for t in h.topics)
    return sent


async def check_intact(hc: HistoryCompressor, cid: str, sent: list[tuple[str, str, datetime]]) -> None:
    h = await hc.get_history(cid)
    assert [(m.sequence, m.role, m.content, m.timestamp) for m in h.messages] == [
        (i + 1, *x) for i, x in enumerate(sent)
    ], "a stored message changed"


async def check_context(hc: HistoryCompressor, cid: str, calls_before: int, summarizer: Any) -> None:
    """Within every budget, quickly, without calling the summariser."""
    for budget in BUDGETS:
        started = time.monotonic()
        ctx = await hc.get_context(cid, budget)
        elapsed = time.monotonic() - started
        assert ctx.total_tokens <= budget, (budget, ctx.total_tokens)
        assert ctx.current_topic, "the newest message is always sent"
        assert elapsed < 3.0, f"get_context took {elapsed:.2f} s"
    assert sum(summarizer.calls.values()) == calls_before, "get_context called the summariser"


async def check_ranges(hc: HistoryCompressor, cid: str) -> None:
    h = await hc.get_history(cid)
    last = len(h.messages)
    expected = 1
    for t in sorted(h.topics, key=lambda t: t.sequence):
        assert t.first_sequence == expected and t.last_sequence >= t.first_sequence
        expected = t.last_sequence + 1
    assert h.open_topic_start == expected and expected <= last + 1
    for a in h.archives:
        assert 1 <= a.first_sequence <= a.last_sequence <= last


async def maintain_timed(hc: HistoryCompressor, now: datetime, limit: float) -> MaintenanceReport:
    started = time.monotonic()
    report = await asyncio.wait_for(hc.maintain(now=now), timeout=limit + 30)
    elapsed = time.monotonic() - started
    assert elapsed < limit, f"maintain() took {elapsed:.2f} s"
    assert not report.errors, report.errors
    return report


# -- summariser faults ------------------------------------------------------------------------

FAULTS = [
    "raise",
    "hang",
    "empty",
    "blank",
    "none",
    "plain-string",
    "text-none",
    "text-int",
    "text-bytes",
    "larger",
    "slightly-larger",
]


#: Answers only a database refuses: the fallback must be written, and retries capped, all the same.
UNSTORABLE = ["nul", "surrogate", "raise-nul"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("fault_url", "behaviour"),
    catalogue(FAULTS, "raise")
    + [pytest.param(db, b, id=f"{db}-{b}") for db in ALL_BACKENDS[1:] for b in UNSTORABLE],
    indirect=["fault_url"],
)
async def test_failing_summarizer_falls_back_and_retries_are_capped(fault_url: str, behaviour: str) -> None:
    summ = FaultySummarizer(behaviour)
    cid = f"faulty-{behaviour}"
    per_call = TIMEOUT + 2.0 if behaviour == "hang" else 2.0
    async with compressor(fault_url, summ) as hc:
        sent = await fill(hc, cid, topics=2)
        now = T0 + timedelta(hours=1)

        # First pass: every topic summarised once by the summariser, which fails; extractive text instead.
        report = await maintain_timed(hc, now, 10 + 2 * per_call)
        assert (report.summarized, report.provisional) == (2, 2)
        assert dict(summ.calls) == {1: 1, 5: 1}
        if behaviour == "hang":
            assert summ.cancelled == 2, "the timed-out call was not cancelled"
        h = await hc.get_history(cid)
        for t in h.topics:
            assert t.status == "provisional" and t.attempts == 1
            assert t.summarizer == "extractive" and t.content.strip() and t.rendered
            assert t.token_count < t.source_tokens
            assert t.next_attempt_at is not None and t.next_attempt_at > now
            assert t.last_error, "the failure reason was not recorded"
        first_texts = {t.sequence: t.content for t in h.topics}
        await check_context(hc, cid, 2, summ)
        await check_intact(hc, cid, sent)

        # Before the backoff expires nothing is retried.
        early = await maintain_timed(hc, now + timedelta(seconds=BACKOFF / 2), 10)
        assert early.summarized == 0 and sum(summ.calls.values()) == 2

        # Keep calling maintain() far in the future: at most MAX_ATTEMPTS calls per topic, then quiet.
        for step in range(2, 12):
            now += timedelta(hours=6 * step)
            await maintain_timed(hc, now, 10 + 2 * per_call)
            assert max(summ.calls.values()) <= MAX_ATTEMPTS, dict(summ.calls)
        assert dict(summ.calls) == {1: MAX_ATTEMPTS, 5: MAX_ATTEMPTS}
        quiet = await maintain_timed(hc, now + timedelta(days=30), 10)
        assert (quiet.conversations, quiet.summarized) == (0, 0), "maintain() keeps picking the conversation"

        h = await hc.get_history(cid)
        for t in h.topics:
            # Out of attempts: the extractive text becomes final and stays as it was.
            assert (t.status, t.attempts, t.summarizer) == ("final", MAX_ATTEMPTS, "extractive")
            assert t.content == first_texts[t.sequence] and t.last_error
        state = await hc.store.state(cid)
        assert state is not None and not state.needs_maintenance and state.lease_owner is None
        assert state.summarized_upto == h.topics[-1].last_sequence
        await check_context(hc, cid, 2 * MAX_ATTEMPTS, summ)
        await check_intact(hc, cid, sent)
        await check_ranges(hc, cid)


@pytest.mark.timeout(60)
async def test_a_good_summary_is_saved_whatever_its_model_is_called(fault_url: str) -> None:
    # The names go in columns of 64 and 255 characters: a row that cannot be saved would leave
    # the topic unsummarised and the model called again at every pass.
    summ = FaultySummarizer("ok-long-names")
    async with compressor(fault_url, summ) as hc:
        await fill(hc, "named", topics=1)
        report = await maintain_timed(hc, T0 + timedelta(hours=1), 15)
        assert (report.summarized, report.provisional) == (1, 0)
        [t] = (await hc.get_history("named")).topics
        assert (t.status, t.summarizer, t.model) == ("final", "s" * 64, "m" * 255)
        assert t.content.startswith("Good summary")


@pytest.mark.timeout(60)
async def test_no_retry_when_a_single_attempt_is_allowed(fault_url: str) -> None:
    summ = FaultySummarizer("raise")
    async with compressor(fault_url, summ, summary_max_attempts=1) as hc:
        sent = await fill(hc, "once", topics=1)
        report = await maintain_timed(hc, T0 + timedelta(hours=1), 15)
        assert (report.summarized, report.provisional) == (1, 0)
        [t] = (await hc.get_history("once")).topics
        assert (t.status, t.attempts, t.summarizer) == ("final", 1, "extractive") and t.last_error
        for k in range(1, 5):
            await maintain_timed(hc, T0 + timedelta(days=k), 10)
        assert dict(summ.calls) == {1: 1}
        await check_context(hc, "once", 1, summ)
        await check_intact(hc, "once", sent)


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("fault_url", "behaviour"), catalogue(["raise", "hang", "garbage"], "raise"), indirect=["fault_url"]
)
async def test_summarizer_that_recovers_replaces_the_provisional_text(fault_url: str, behaviour: str) -> None:
    summ = FaultySummarizer("none" if behaviour == "garbage" else behaviour, fail_times=1)
    async with compressor(fault_url, summ) as hc:
        sent = await fill(hc, "recovers", topics=2)
        now = T0 + timedelta(hours=1)
        await maintain_timed(hc, now, 15)
        assert [t.status for t in (await hc.get_history("recovers")).topics] == ["provisional"] * 2
        report = await maintain_timed(hc, now + timedelta(seconds=BACKOFF + 1), 15)
        assert report.summarized == 2 and report.provisional == 0
        h = await hc.get_history("recovers")
        for t in h.topics:
            assert (t.status, t.attempts, t.summarizer, t.model) == ("final", 2, "faulty", "m1")
            assert t.content.startswith("Good summary") and t.content in t.rendered
            assert t.next_attempt_at is None
        assert dict(summ.calls) == {1: 2, 5: 2}
        for k in range(1, 4):
            await maintain_timed(hc, now + timedelta(days=k), 10)
        assert dict(summ.calls) == {1: 2, 5: 2}, "a final summary was retried"
        # Wherever a context shows a topic summary, it is the replacement, never the extractive text.
        shown = []
        for budget in (120, 160, 200, 300, 400, 600):
            ctx = await hc.get_context("recovers", budget)
            assert ctx.total_tokens <= budget
            shown.extend(t.content for t in ctx.historical_topics)
        assert shown, "no budget showed a topic summary"
        assert all(text.startswith("Good summary") for text in shown), shown
        await check_intact(hc, "recovers", sent)


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("fault_url", "behaviour"),
    catalogue(["raise", "hang", "larger", "none"], "raise"),
    indirect=["fault_url"],
)
async def test_failing_merge_falls_back_to_an_extractive_archive(fault_url: str, behaviour: str) -> None:
    # Summaries succeed, merges fail: archives are extractive, final, made once.
    summ = WordySummarizer("ok", merge_behaviour=behaviour)
    async with compressor(fault_url, summ, topic_summary_tokens=120, bulk_merge_size=2) as hc:
        sent = await fill(hc, "merges", topics=8, turns=6)
        now = T0 + timedelta(hours=1)
        for k in range(4):
            await maintain_timed(hc, now + timedelta(hours=k), 30)
        h = await hc.get_history("merges")
        assert h.archives, "the test did not exercise merging"
        assert all(n == 1 for n in summ.merge_calls.values()), "a merge was attempted twice"
        assert len(summ.merge_calls) == len(h.archives)
        for a in h.archives:
            assert (a.status, a.summarizer) == ("final", "extractive") and a.content.strip()
            members = [t for t in h.topics if t.merged_into == a.id]
            assert (a.first_sequence, a.last_sequence) == (
                members[0].first_sequence,
                members[-1].last_sequence,
            )
        assert all(t.status == "final" and t.attempts == 1 for t in h.topics)
        quiet = await maintain_timed(hc, now + timedelta(days=3), 10)
        assert quiet.conversations == 0
        await check_context(hc, "merges", sum(summ.calls.values()), summ)
        await check_intact(hc, "merges", sent)
        await check_ranges(hc, "merges")


@pytest.mark.timeout(60)
async def test_non_coroutine_summarizer_falls_back() -> None:
    summ = SyncSummarizer()
    async with compressor("memory://", summ) as hc:
        sent = await fill(hc, "sync", topics=1)
        report = await maintain_timed(hc, T0 + timedelta(hours=1), 10)
        assert report.provisional == 1
        [t] = (await hc.get_history("sync")).topics
        assert (t.status, t.summarizer) == ("provisional", "extractive") and t.last_error
        await check_context(hc, "sync", 1, summ)
        await check_intact(hc, "sync", sent)


@pytest.mark.timeout(60)
async def test_summarizer_raising_cancelled_error_does_not_escape_maintain() -> None:
    summ = CancellingSummarizer()
    async with compressor("memory://", summ) as hc:
        await fill(hc, "cancel", topics=1)
        report = await hc.maintain(now=T0 + timedelta(hours=1))
        assert report.provisional == 1
        state = await hc.store.state("cancel")
        assert state is not None and state.lease_owner is None


# -- PostgreSQL: connections dropped mid-run --------------------------------------------------


class BackendKiller(threading.Thread):
    """Terminates every connection to ``dbname`` every ``interval`` seconds."""

    def __init__(self, dbname: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.dbname = dbname
        self.interval = interval
        self.stop = threading.Event()
        self.killed = 0
        self.rounds = 0

    def run(self) -> None:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            while not self.stop.wait(self.interval):
                rows = admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    (self.dbname,),
                ).fetchall()
                self.killed += sum(1 for (ok,) in rows if ok)
                self.rounds += 1


@pytest.mark.postgres
@pytest.mark.timeout(120)
async def test_postgres_connections_dropped_mid_run(pg_url: str) -> None:
    dbname = pg_url.rsplit("/", 1)[1]
    clients, per_client = 6, 60
    outcomes: dict[str, list[tuple[str, bool]]] = {}
    errors: list[BaseException] = []
    context_errors: list[BaseException] = []
    async with HistoryCompressor(pg_url, context_budget=600, boundaries={"temporal": False}) as hc:

        async def client(k: int) -> None:
            cid = f"drop-{k}"
            mine = outcomes.setdefault(cid, [])
            for i in range(per_client):
                role = "user" if i % 2 == 0 else "assistant"
                text = f"{'New topic: ' if i % 10 == 9 else ''}c{k} m{i} {FILLER}"
                try:
                    await hc.add_message(cid, {"role": role, "content": text})
                    mine.append((text, True))
                except BaseException as exc:
                    errors.append(exc)
                    mine.append((text, False))
                if not any(ok for _, ok in mine):
                    continue  # not created yet: get_context would rightly say "no conversation"
                try:
                    ctx = await hc.get_context(cid, 300)
                    assert ctx.total_tokens <= 300
                except BaseException as exc:
                    context_errors.append(exc)
                if i % 15 == 14:
                    try:
                        await hc.maintain(cid)
                    except BaseException as exc:
                        errors.append(exc)

        await hc.add_message("warm-up", {"role": "user", "content": "schema ready"})
        killer = BackendKiller(dbname, 0.15)
        killer.start()
        try:
            await asyncio.gather(*(client(k) for k in range(clients)))
        finally:
            killer.stop.set()
            killer.join(10)
    assert killer.killed >= 5, f"only {killer.killed} connections were terminated: the test did not bite"

    for exc in [*errors, *context_errors]:
        # Only library errors may reach the caller, never a raw psycopg/SQLAlchemy one.
        assert isinstance(exc, StoreError), f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
    async with HistoryCompressor(pg_url, context_budget=600, boundaries={"temporal": False}) as hc:
        for cid, sent in outcomes.items():
            h = await hc.get_history(cid)
            assert [m.sequence for m in h.messages] == list(range(1, len(h.messages) + 1)), "sequence gap"
            stored = Counter(m.content for m in h.messages)
            for text, ok in sent:
                if ok:
                    assert stored[text] == 1, f"{cid}: acknowledged message stored {stored[text]} times"
                else:
                    assert stored[text] <= 1, f"{cid}: failed message stored {stored[text]} times"
            assert set(stored) <= {t for t, _ in sent}
            await check_ranges(hc, cid)
    acked = sum(ok for sent in outcomes.values() for _, ok in sent)
    # Transient errors are retried: nearly every call must have succeeded despite the kills.
    assert acked >= 0.95 * clients * per_client, (acked, [repr(e) for e in errors[:5]])


# -- SQLite: a locked database ---------------------------------------------------------------


@pytest.mark.timeout(60)
async def test_sqlite_locked_database_surfaces_store_error_after_busy_timeout(tmp_path: Path) -> None:
    """SQLite errors are not retried: a writer blocked past the busy timeout gets one StoreError.

    The store sets ``busy_timeout`` to 30 s; an engine we own gets a short one (our "connect"
    listener runs after the store's), so the behaviour is checked in about a second.
    """
    import sqlite3

    path = tmp_path / "locked.db"
    url = f"sqlite:///{path}"
    engine = create_engine(url)
    busy_ms = 300

    begins: list[float] = []

    @sa.event.listens_for(engine, "connect")
    def _short_busy(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.execute(f"PRAGMA busy_timeout={busy_ms}")

    @sa.event.listens_for(engine, "engine_connect")
    def _count(_conn: Any) -> None:  # once per transaction attempt (each opens a connection)
        begins.append(time.monotonic())

    async with HistoryCompressor(engine, boundaries={"temporal": False}) as hc:
        await hc.add_message("locked", {"role": "user", "content": "before the lock"})
        other = sqlite3.connect(path, isolation_level=None, timeout=0)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        try:
            started = time.monotonic()
            begins.clear()
            with pytest.raises(StoreError, match="database is locked") as info:
                await hc.add_message("locked", {"role": "user", "content": "during the lock"})
            elapsed = time.monotonic() - started
            assert isinstance(info.value, TieredHistoryError)
            assert isinstance(info.value, TransientStoreError), "a lock timeout may succeed when retried"
            # One attempt (no retry on SQLite), failing after the busy timeout.
            assert len(begins) == 1, f"{len(begins)} transactions attempted"
            assert elapsed >= busy_ms / 1000 * 0.8, elapsed
            # Readers are not blocked by a writer (WAL).
            ctx = await hc.get_context("locked", 500)
            assert [m.content for m in ctx.current_topic] == ["before the lock"]
        finally:
            other.rollback()
            other.close()
        stored = await hc.add_message("locked", {"role": "user", "content": "after the lock"})
        assert stored.sequence == 2, "the failed write left something behind"
        h = await hc.get_history("locked")
        assert [m.content for m in h.messages] == ["before the lock", "after the lock"]
    engine.dispose()
