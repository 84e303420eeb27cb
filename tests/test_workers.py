"""Concurrent maintenance: many worker processes, killed and stalled workers, the background scheduler.

Child processes use the ``spawn`` start method, so everything they run lives at module level here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

from tiered_history import ConfigurationError, HistoryCompressor, MaintenanceReport, Summarizer
from tiered_history.scheduler import BackgroundMaintenance, run_worker
from tiered_history.settings import Settings
from tiered_history.summarizers.base import SummaryInput, SummaryPiece, SummaryResult

from ._procs import join_all, maintain_until_quiet, run_worker_until, wait_out_leases

pytestmark = pytest.mark.slow

SPAWN = multiprocessing.get_context("spawn")

#: Settings shared by every process of the multi-process test: small, so seals and merges happen.
CONCURRENT_SETTINGS: dict[str, Any] = {
    "context_budget": 600,
    "lease_seconds": 30,
    "summarize_inline": False,
    "boundaries": {"explicit": True, "temporal": False, "size": True},
}

FILLER = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima"


# -- helpers that run in child processes ---------------------------------------------------------


class _ErrorLog(logging.Handler):
    """Collects ERROR records (``maintain()`` logs failures instead of raising them)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.name}: {record.getMessage()}")


def _watch_errors() -> _ErrorLog:
    handler = _ErrorLog()
    logging.getLogger("tiered_history").addHandler(handler)
    return handler


class _Recorder:
    """Stands in for the compressor given to ``run_worker``; records every report."""

    def __init__(self, hc: HistoryCompressor) -> None:
        self.hc = hc
        self.reports: list[MaintenanceReport] = []
        self.exceptions: list[str] = []

    async def maintain(self, conversation_id: str | None = None, now: datetime | None = None) -> Any:
        try:
            report = await self.hc.maintain(conversation_id, now)
        except Exception as exc:
            self.exceptions.append(repr(exc))
            raise
        self.reports.append(report)
        return report


def _totals(reports: Sequence[MaintenanceReport]) -> dict[str, Any]:
    return {
        "passes": len(reports),
        "sealed": sum(r.sealed for r in reports),
        "summarized": sum(r.summarized for r in reports),
        "merged": sum(r.merged for r in reports),
        "rolled_up": sum(r.rolled_up for r in reports),
        "dropped": sum(r.dropped for r in reports),
        "lease_lost": sum(r.lease_lost for r in reports),
        "errors": [e for r in reports for e in r.errors],
    }


def _worker_main(url: str, stop: Any, result_path: str) -> None:
    """A standalone maintenance worker: ``run_worker`` until the parent sets ``stop``."""

    async def main() -> dict[str, Any]:
        errors = _watch_errors()
        hc = HistoryCompressor(url, **CONCURRENT_SETTINGS)
        rec = _Recorder(hc)
        await run_worker_until(rec, 0.05, stop, poll=0.02)
        await hc.close()
        return {**_totals(rec.reports), "exceptions": rec.exceptions, "logged": errors.messages}

    result = asyncio.run(main())
    Path(result_path).write_text(json.dumps(result))


def _writer_main(url: str, writer: int, conversations: list[str], rounds: int, result_path: str) -> None:
    """Appends ``rounds`` messages to each conversation, interleaved, a "new topic" every 4th."""

    async def main() -> list[list[str]]:
        sent: list[list[str]] = []
        async with HistoryCompressor(url, **CONCURRENT_SETTINGS) as hc:
            for i in range(rounds):
                for cid in conversations:
                    if i % 4 == 3:
                        role, text = "user", f"New topic: w{writer} {cid} m{i} {FILLER}"
                    else:
                        role = "user" if i % 2 == 0 else "assistant"
                        text = f"w{writer} {cid} m{i} {FILLER}"
                    await hc.add_message(cid, {"role": role, "content": text})
                    sent.append([cid, text])
        return sent

    Path(result_path).write_text(json.dumps(asyncio.run(main())))


class BlockingSummarizer:
    """Announces that it holds a topic, then blocks until ``release_path`` exists."""

    name = "blocking"

    def __init__(self, marker_path: str, release_path: str, worker_id: str = "") -> None:
        self.marker_path = marker_path
        self.release_path = release_path
        self.worker_id = worker_id

    async def summarize(self, messages: Sequence[SummaryInput], target_tokens: int) -> SummaryResult:
        Path(self.marker_path).write_text(self.worker_id)
        while not os.path.exists(self.release_path):
            await asyncio.sleep(0.02)
        return SummaryResult(text="ZOMBIE summary.", summarizer=self.name)

    async def merge(self, pieces: Sequence[SummaryPiece], target_tokens: int) -> SummaryResult:
        return await self.summarize([], target_tokens)


#: A short lease, and a summariser timeout far beyond the test's length.
LEASE_SETTINGS: dict[str, Any] = {
    "lease_seconds": 2,
    "topic_summary_tokens": 40,
    "summarize_inline": False,
    "summarizer": {"timeout": 600},
    "boundaries": {"temporal": False},
}


def _stalled_worker_main(url: str, paths: dict[str, str]) -> None:
    """Waits for ``go``, then one ``maintain()`` whose summariser blocks: the lease is held, then expires."""

    async def main() -> dict[str, Any]:
        summarizer = BlockingSummarizer(paths["marker"], paths["release"])
        hc = HistoryCompressor(url, settings=Settings.load(**LEASE_SETTINGS), summarizer=summarizer)
        summarizer.worker_id = hc.worker_id
        await hc.initialize()
        while not os.path.exists(paths["go"]):
            await asyncio.sleep(0.02)
        report = await hc.maintain()
        await hc.close()
        return _totals([report])

    Path(paths["result"]).write_text(json.dumps(asyncio.run(main())))


# -- checks ---------------------------------------------------------------------------------


async def check_consistent(hc: HistoryCompressor, cid: str) -> dict[str, int]:
    """Every invariant of a fully maintained conversation; returns its topic and archive counts."""
    h = await hc.get_history(cid)
    assert [m.sequence for m in h.messages] == list(range(1, len(h.messages) + 1)), "sequence gap"
    topics = sorted(h.topics, key=lambda t: t.sequence)
    assert [t.sequence for t in topics] == list(range(1, len(topics) + 1))
    expected_first = 1
    for t in topics:
        assert t.first_sequence == expected_first, f"{cid}: topic {t.sequence} range gap/overlap"
        assert t.last_sequence >= t.first_sequence
        expected_first = t.last_sequence + 1
        assert t.status == "final", f"{cid}: topic {t.sequence} is {t.status}"
        assert t.attempts == 1, f"{cid}: topic {t.sequence} summarised {t.attempts} times"
        assert t.sealed_at is not None and t.sealed_reason in {"explicit", "size"}
    assert h.open_topic_start == expected_first
    archives = sorted(h.archives, key=lambda a: a.sequence)
    assert [a.sequence for a in archives] == list(range(1, len(archives) + 1))
    merged = [t for t in topics if t.merged_into is not None]
    assert merged == topics[: len(merged)], "only the oldest topics are merged"
    # Archives of topics (level 1) tile the merged topics; a roll-up (level 2 and up) covers the
    # archives merged into it, which keep their rows (nothing is deleted).
    by_archive: dict[int, list[int]] = {}
    for t in merged:
        by_archive.setdefault(cast(int, t.merged_into), []).append(t.sequence)
    firsts = [a for a in archives if a.level == 1]
    assert sorted(by_archive) == sorted(a.id for a in firsts), "an archive without its topics"
    expected_first = 1
    for a in firsts:
        members = [t for t in topics if t.merged_into == a.id]
        assert (a.first_sequence, a.last_sequence) == (members[0].first_sequence, members[-1].last_sequence)
        assert a.first_sequence == expected_first, f"{cid}: archive {a.sequence} range gap/overlap"
        expected_first = a.last_sequence + 1
    for a in archives:
        if a.level > 1:
            parts = sorted((x for x in archives if x.merged_into == a.id), key=lambda x: x.first_sequence)
            assert parts and a.level == max(x.level for x in parts) + 1, f"{cid}: roll-up {a.sequence}"
            assert (a.first_sequence, a.last_sequence) == (parts[0].first_sequence, parts[-1].last_sequence)
    [stats] = await hc.stats(cid)
    assert stats.topics_pending == 0
    assert stats.compressions == len(topics) + len(archives), "a topic or archive was written twice"
    state = await hc.store.state(cid)
    assert state is not None
    assert state.lease_owner is None and state.lease_expires_at is None, f"{cid}: lease left behind"
    assert not state.needs_maintenance
    assert state.summarized_upto == (topics[-1].last_sequence if topics else 0)
    return {
        "topics": len(topics),
        "archives": len(archives),
        "dropped": sum(a.dropped_at is not None for a in archives),
    }


# -- (a) many workers, many writers ---------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.timeout(120)
async def test_three_workers_two_writers_postgres(pg_url: str, tmp_path: Path) -> None:
    await _many_workers(pg_url, tmp_path, workers=3, writers=2, conversations=3, rounds=12)


@pytest.mark.timeout(120)
async def test_two_workers_two_writers_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'workers.db'}"
    await _many_workers(url, tmp_path, workers=2, writers=2, conversations=2, rounds=12)


async def _many_workers(
    url: str, tmp_path: Path, *, workers: int, writers: int, conversations: int, rounds: int
) -> None:
    convs = [f"conv-{i}" for i in range(conversations)]
    stop = SPAWN.Event()
    worker_procs = [
        SPAWN.Process(target=_worker_main, args=(url, stop, str(tmp_path / f"worker{i}.json")))
        for i in range(workers)
    ]
    writer_procs = [
        SPAWN.Process(target=_writer_main, args=(url, w, convs, rounds, str(tmp_path / f"writer{w}.json")))
        for w in range(writers)
    ]
    # Everything starts at once on a fresh database, as in a new deployment: the schema is
    # created by whichever process comes first while the others wait for it.
    for p in worker_procs + writer_procs:
        p.start()
    try:
        async with HistoryCompressor(url, **CONCURRENT_SETTINGS) as hc:
            join_all(writer_procs, 60)
            # Let the workers catch up with the last writes, then stop them.
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                if all(s.topics_pending == 0 for s in await hc.stats()):
                    break
                await asyncio.sleep(0.1)
    finally:
        stop.set()
        join_all(worker_procs, 30)

    async with HistoryCompressor(url, **CONCURRENT_SETTINGS) as hc:
        results = [json.loads((tmp_path / f"worker{i}.json").read_text()) for i in range(workers)]
        for r in results:
            assert r["exceptions"] == [] and r["errors"] == [] and r["logged"] == [], r
            assert r["lease_lost"] == 0, "a lease was lost although it never expired"
        assert sum(r["summarized"] for r in results) > 0, "the workers did no work"
        parent = _totals(await maintain_until_quiet(hc, limit=20))

        sent = [
            tuple(x) for w in range(writers) for x in json.loads((tmp_path / f"writer{w}.json").read_text())
        ]
        assert len(sent) == writers * conversations * rounds
        topics = archives = dropped = 0
        for cid in convs:
            h = await hc.get_history(cid)
            stored = [m.content for m in h.messages]
            expected = [text for c, text in sent if c == cid]
            assert Counter(stored) == Counter(expected), f"{cid}: messages lost or duplicated"
            for w in range(writers):  # each writer's messages are stored in the order it sent them
                mine = [s for s in stored if s.startswith((f"w{w} ", f"New topic: w{w} "))]
                assert mine == [t for t in expected if t.startswith((f"w{w} ", f"New topic: w{w} "))]
            counts = await check_consistent(hc, cid)
            topics += counts["topics"]
            archives += counts["archives"]
            dropped += counts["dropped"]
        assert topics >= conversations * 3, "too few topics: the test did not exercise sealing"
        assert archives > 0, "no merges: the test did not exercise escalation"
        everyone = [*results, parent]
        assert sum(r["summarized"] for r in everyone) == topics, "a topic was summarised twice (or lost)"
        # Each archive is written once: by a merge of topics or by a roll-up of archives.
        assert sum(r["merged"] + r["rolled_up"] for r in everyone) == archives
        assert sum(r["dropped"] for r in everyone) == dropped


# -- (b) a worker dies or stalls while holding a lease ---------------------------------------


async def _pending_topics(hc: HistoryCompressor) -> list[str]:
    """Two conversations, each with one sealed topic large enough to need the summariser."""
    convs = ["alpha", "beta"]
    for cid in convs:
        for i in range(4):
            role = "user" if i % 2 == 0 else "assistant"
            await hc.add_message(cid, {"role": role, "content": f"{cid} point {i}: {FILLER} {FILLER}"})
        await hc.add_message(cid, {"role": "user", "content": "New topic: something else"})
        [t] = (await hc.get_history(cid)).topics
        assert t.status == "pending"
    return convs


def _stalled_worker(url: str, tmp_path: Path) -> tuple[Any, dict[str, Path]]:
    paths = {k: tmp_path / k for k in ("go", "marker", "release", "result")}
    child = SPAWN.Process(target=_stalled_worker_main, args=(url, {k: str(v) for k, v in paths.items()}))
    return child, paths


async def _wait_for(path: Path, proc: Any, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.is_alive(), "the stalled worker died early (see its stderr)"
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.05)  # the marker is written before the text is flushed on some systems
    return path.read_text()


def _lease_compressor(url: str) -> HistoryCompressor:
    return HistoryCompressor(url, settings=Settings.load(**LEASE_SETTINGS))


@pytest.mark.timeout(60)
async def test_killed_worker_lease_is_taken_over(sql_url: str, tmp_path: Path) -> None:
    child, paths = _stalled_worker(sql_url, tmp_path)
    async with _lease_compressor(sql_url) as hc:
        child.start()  # it boots while the topics are written
        try:
            convs = await _pending_topics(hc)
            paths["go"].touch()
            owner = await _wait_for(paths["marker"], child)
            states = [await hc.store.state(cid) for cid in convs]
            assert all(s is not None and s.lease_owner == owner for s in states), "child holds no lease"
            child.kill()
            child.join(10)
            assert child.exitcode is not None and child.exitcode < 0

            # Before the lease expires nobody may touch the conversations (checked unless this
            # machine is so loaded that the 2 s lease already ran out).
            expires = min(s.lease_expires_at for s in states if s is not None and s.lease_expires_at)
            if (expires - datetime.now(UTC)).total_seconds() > 0.5:
                early = await hc.maintain()
                assert (early.conversations, early.summarized) == (0, 0), "lease stolen before expiry"
                pending = [t.status for cid in convs for t in (await hc.get_history(cid)).topics]
                assert pending == ["pending", "pending"]

            await wait_out_leases(hc, convs)
            report = await hc.maintain()
            assert report.conversations == 2 and report.summarized == 2 and not report.errors
            await maintain_until_quiet(hc, limit=20)
            for cid in convs:
                h = await hc.get_history(cid)
                assert len(h.messages) == 5
                [t] = h.topics
                assert (t.status, t.attempts, t.summarizer) == ("final", 1, "extractive")
                await check_consistent(hc, cid)
        finally:
            if child.is_alive():
                child.kill()
                child.join(5)


@pytest.mark.timeout(60)
async def test_stalled_worker_cannot_write_after_takeover(sql_url: str, tmp_path: Path) -> None:
    """A worker that wakes up after its lease expired is fenced off: one summary per topic."""
    child, paths = _stalled_worker(sql_url, tmp_path)
    async with _lease_compressor(sql_url) as hc:
        child.start()
        try:
            convs = await _pending_topics(hc)
            paths["go"].touch()
            await _wait_for(paths["marker"], child)
            await wait_out_leases(hc, convs)
            report = await hc.maintain()
            assert report.summarized == 2 and not report.errors
            paths["release"].touch()  # the stalled worker now finishes its summary and tries to save it
            join_all([child], 30)
            zombie = json.loads(paths["result"].read_text())
            assert zombie["summarized"] == 0 and zombie["merged"] == 0, "a fenced-off worker wrote"
            assert zombie["lease_lost"] >= 1
            await maintain_until_quiet(hc, limit=20)
            for cid in convs:
                [t] = (await hc.get_history(cid)).topics
                assert (t.status, t.attempts, t.summarizer) == ("final", 1, "extractive")
                assert "ZOMBIE" not in t.content
                await check_consistent(hc, cid)
        finally:
            paths["release"].touch()
            if child.is_alive():
                child.kill()
                child.join(5)


async def test_summarizer_settings_as_keyword_override(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'kw.db'}"
    try:
        hc = HistoryCompressor(url, summarizer={"timeout": 600})  # type: ignore[arg-type]
    except (ConfigurationError, TypeError):
        return  # rejected up front: fine too
    async with hc:
        assert hc.settings.summarizer.timeout == 600
        assert isinstance(hc.summarizer, Summarizer)


# -- (c) the background scheduler and the standalone worker loop -----------------------------


async def _wait_until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


@pytest.mark.timeout(60)
async def test_start_background_summarises_without_maintain_calls(db_url: str) -> None:
    hc = HistoryCompressor(db_url, summarize_inline=False, boundaries={"temporal": False})
    try:
        await hc.start_background(0.1)
        for i in range(3):
            await hc.add_message("bg", {"role": "user", "content": f"New topic: subject {i}"})
            await hc.add_message("bg", {"role": "assistant", "content": f"answer {i}"})

        async def summarised() -> bool:
            topics = (await hc.get_history("bg")).topics
            return len(topics) == 2 and all(t.status == "final" for t in topics)

        await _wait_until(summarised)
        await hc.stop_background()
        assert hc._background is None
        await hc.stop_background()  # idempotent

        await hc.add_message("bg", {"role": "user", "content": "New topic: after stop"})
        await asyncio.sleep(0.5)
        topics = (await hc.get_history("bg")).topics
        assert [t.status for t in topics] == ["final", "final", "pending"], "maintenance ran after stop"
        state = await hc.store.state("bg")
        assert state is not None and state.lease_owner is None
    finally:
        await hc.close()


class SlowSummarizer:
    name = "slow"

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.entered = asyncio.Event()
        self.finished = 0

    async def summarize(self, messages: Sequence[SummaryInput], target_tokens: int) -> SummaryResult:
        self.entered.set()
        await asyncio.sleep(self.delay)
        self.finished += 1
        return SummaryResult(text="A short slow summary.", summarizer=self.name)

    async def merge(self, pieces: Sequence[SummaryPiece], target_tokens: int) -> SummaryResult:
        return await self.summarize([], target_tokens)


@pytest.mark.timeout(60)
async def test_stop_background_waits_for_the_running_pass(tmp_path: Path) -> None:
    slow = SlowSummarizer(0.8)
    url = f"sqlite:///{tmp_path / 'bg.db'}"
    async with HistoryCompressor(url, settings=Settings.load(**LEASE_SETTINGS), summarizer=slow) as hc:
        for i in range(4):
            await hc.add_message("c", {"role": "user", "content": f"point {i}: {FILLER} {FILLER}"})
        await hc.add_message("c", {"role": "user", "content": "New topic: next"})
        await hc.start_background(0.05)
        await asyncio.wait_for(slow.entered.wait(), 10)
        await hc.stop_background()
        assert slow.finished == 1, "stop_background() cancelled the pass instead of waiting for it"
        [t] = (await hc.get_history("c")).topics
        assert (t.status, t.summarizer, t.attempts) == ("final", "slow", 1)
        state = await hc.store.state("c")
        assert state is not None and state.lease_owner is None, "lease left behind by the stopped pass"


async def _backlog(hc: HistoryCompressor, conversations: int) -> list[str]:
    """``conversations`` conversations, each with one sealed topic too long to keep word for word."""
    ids = [f"c{k}" for k in range(conversations)]
    for cid in ids:
        for i in range(4):
            await hc.add_message(cid, {"role": "user", "content": f"point {i}: {FILLER} {FILLER}"})
        await hc.add_message(cid, {"role": "user", "content": "New topic: next"})
    return ids


def _slow_compressor(tmp_path: Path, delay: float) -> tuple[HistoryCompressor, SlowSummarizer, str]:
    """A compressor on a SQLite file whose summariser takes ``delay`` seconds; and that file's URL."""
    slow = SlowSummarizer(delay)
    url = f"sqlite:///{tmp_path / 'bg.db'}"
    return HistoryCompressor(url, settings=Settings.load(**LEASE_SETTINGS), summarizer=slow), slow, url


async def _leased(url: str, ids: Sequence[str]) -> list[str]:
    async with HistoryCompressor(url) as fresh:
        states = [await fresh.store.state(cid) for cid in ids]
    return [s.id for s in states if s is not None and s.lease_owner is not None]


@pytest.mark.timeout(60)
async def test_a_stop_ends_the_pass_after_the_conversation_in_hand(tmp_path: Path) -> None:
    # A backlog would hold a stop (a worker's SIGTERM, a bot's shutdown) for as long as it takes to
    # work through: the pass ends after the conversation in hand and gives the rest back.
    hc, slow, url = _slow_compressor(tmp_path, 0.5)
    async with hc:
        ids = await _backlog(hc, 5)
        await hc.start_background(0.05)
        await asyncio.wait_for(slow.entered.wait(), 10)
        await hc.stop_background()
        assert slow.finished == 1
        assert await _leased(url, ids) == []
        pending = [cid for cid in ids if (await hc.get_history(cid)).topics[0].status == "pending"]
        assert len(pending) == 4
        assert (await hc.maintain()).summarized == 4  # a maintain() after the stop runs a whole pass


@pytest.mark.timeout(60)
async def test_a_second_close_or_stop_waits_for_the_first(tmp_path: Path) -> None:
    # It returned at once and closed the store under the pass still running (its leases held).
    hc, slow, url = _slow_compressor(tmp_path, 0.5)
    ids = await _backlog(hc, 2)
    await hc.start_background(0.05)
    await asyncio.wait_for(slow.entered.wait(), 10)
    await asyncio.gather(hc.close(), hc.close(), hc.stop_background())
    await hc.close()  # and again, later: nothing to do
    assert slow.finished == 1 and await _leased(url, ids) == []
    with pytest.raises(ConfigurationError, match="closed"):
        await hc.start_background(0.05)


@pytest.mark.timeout(60)
async def test_starting_the_background_job_twice_at_once_runs_one(tmp_path: Path) -> None:
    # Not initialised yet: each start awaited the initialisation after finding no job running.
    hc = HistoryCompressor(f"sqlite:///{tmp_path / 'bg.db'}", summarize_inline=False)
    try:
        passes: list[float] = []
        maintain = hc.maintain

        async def counted(*args: Any, **kwargs: Any) -> MaintenanceReport:
            passes.append(time.monotonic())
            return await maintain(*args, **kwargs)

        hc.maintain = counted  # type: ignore[method-assign]
        await asyncio.gather(*(hc.start_background(0.05) for _ in range(4)))
        await asyncio.sleep(0.3)
        await hc.stop_background()
        stopped = len(passes)
        await asyncio.sleep(0.3)
        assert len(passes) == stopped, "a second scheduler kept running after the stop"
    finally:
        await hc.close()


@pytest.mark.timeout(60)
async def test_a_cancelled_pass_gives_back_every_conversation_it_claimed(tmp_path: Path) -> None:
    hc, slow, url = _slow_compressor(tmp_path, 5.0)
    async with hc:
        ids = await _backlog(hc, 4)
        task = asyncio.ensure_future(hc.maintain())
        await asyncio.wait_for(slow.entered.wait(), 10)
        assert len(await _leased(url, ids)) == 4  # one batch claimed
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await _leased(url, ids) == []


@pytest.mark.timeout(60)
def test_closing_the_blocking_twin_waits_for_calls_of_other_threads(tmp_path: Path) -> None:
    import threading

    from tiered_history import SyncHistoryCompressor

    slow = SlowSummarizer(0.5)
    url = f"sqlite:///{tmp_path / 'bg.db'}"
    h = SyncHistoryCompressor(url, settings=Settings.load(**LEASE_SETTINGS), summarizer=slow)
    for i in range(4):
        h.add_message("c", {"role": "user", "content": f"point {i}: {FILLER} {FILLER}"})
    h.add_message("c", {"role": "user", "content": "New topic: next"})
    reports: list[MaintenanceReport] = []
    worker = threading.Thread(target=lambda: reports.append(h.maintain()))
    worker.start()
    deadline = time.monotonic() + 10
    while not slow.entered.is_set():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    closers = [threading.Thread(target=h.close) for _ in range(2)]
    for t in closers:
        t.start()
    for t in (worker, *closers):
        t.join(20)
        assert not t.is_alive(), "a call was left waiting on a stopped loop"
    assert [r.summarized for r in reports] == [1]
    with SyncHistoryCompressor(url) as fresh:
        state = fresh.reply.store.read_state("c")
        assert state is not None and state.lease_owner is None


class FlakyCompressor:
    """``maintain()`` raises for the first ``failures`` calls; records when it was called."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: list[float] = []

    async def maintain(self, conversation_id: str | None = None, now: datetime | None = None) -> Any:
        self.calls.append(time.monotonic())
        if len(self.calls) <= self.failures:
            raise RuntimeError(f"database down ({len(self.calls)})")
        return MaintenanceReport(conversations=1, summarized=1)


async def test_background_job_logs_exceptions_and_keeps_running(caplog: pytest.LogCaptureFixture) -> None:
    flaky = FlakyCompressor(failures=1000)
    bg = BackgroundMaintenance(cast(Any, flaky), 0.05)
    with caplog.at_level(logging.ERROR, logger="tiered_history"):
        bg.start()
        await asyncio.sleep(0.4)
        await bg.stop()
    assert len(flaky.calls) >= 3, "the job stopped after an exception"
    assert bg.failures == len(flaky.calls)
    assert any("database down" in r.getMessage() or r.exc_info for r in caplog.records)
    calls = len(flaky.calls)
    await asyncio.sleep(0.2)
    assert len(flaky.calls) == calls, "the job still runs after stop()"


async def test_run_worker_backs_off_after_failures_and_stops_on_event() -> None:
    flaky = FlakyCompressor(failures=3)
    stop = asyncio.Event()
    task = asyncio.create_task(run_worker(cast(Any, flaky), 0.05, stop))
    await _wait_until(_async(lambda: len(flaky.calls) >= 5), timeout=10)
    stop.set()
    await asyncio.wait_for(task, 2)
    gaps = [b - a for a, b in zip(flaky.calls, flaky.calls[1:], strict=False)]
    # 0.1, 0.2, 0.4 s after the three failures, then back to the 0.05 s interval.
    assert gaps[0] >= 0.09 and gaps[1] >= 0.19 and gaps[2] >= 0.39
    assert gaps[3] < 0.3


async def test_run_worker_returns_promptly_when_stopped_during_a_long_wait() -> None:
    flaky = FlakyCompressor(failures=0)
    stop = asyncio.Event()
    task = asyncio.create_task(run_worker(cast(Any, flaky), 3600, stop))
    await _wait_until(_async(lambda: len(flaky.calls) == 1), timeout=5)
    started = time.monotonic()
    stop.set()
    await asyncio.wait_for(task, 2)
    assert time.monotonic() - started < 1 and len(flaky.calls) == 1


def _async(fn: Any) -> Any:
    async def predicate() -> bool:
        return bool(fn())

    return predicate
