"""Many processes appending to ONE conversation while maintenance workers compress it.

PostgreSQL (the issue's figure): 8 writer processes x 500 messages, 2 worker processes running
``maintain()`` in a loop. Every message is stored exactly once, sequences are unique and gap-free,
each writer's messages keep its order, each topic is summarised once, and topic and archive ranges
are disjoint and contiguous.

SQLite file: the same with 4 x 150. What SQLite supports: several processes on ONE machine sharing a
database file (WAL journal). Writers are serialised by ``BEGIN IMMEDIATE`` (one write transaction at
a time, others wait up to the 30 s busy timeout); readers are never blocked. There is no
``SKIP LOCKED``, so workers coordinate through the same leases only; SQLite errors are not retried,
so a writer that waits longer than the busy timeout gets a ``StoreError``. Not for network file systems.

``TIERED_HISTORY_TEST_CONCURRENCY_SCALE`` (default 1) scales the message counts down for quick runs.

Child processes use the ``spawn`` start method, so everything they run lives at module level here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tiered_history import HistoryCompressor, Settings

from ._procs import CountingMaintainer, join_all, maintain_until_quiet, run_worker_until
from .test_crash import check_context, check_invariants

pytestmark = pytest.mark.slow

SPAWN = multiprocessing.get_context("spawn")
SCALE = float(os.environ.get("TIERED_HISTORY_TEST_CONCURRENCY_SCALE", "1"))
CID = "shared-conversation"
FILLER = "alpha bravo charlie delta echo foxtrot golf hotel"

SETTINGS: dict[str, Any] = {
    "context_budget": 600,
    "lease_seconds": 30,
    "summarize_inline": False,
    "boundaries": {"temporal": False, "min_topic_tokens": 0},
}


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.name}: {record.getMessage()}")


def _worker_main(url: str, stop: Any, result_path: str) -> None:
    async def main() -> dict[str, Any]:
        logged = _Errors()
        logging.getLogger("tiered_history").addHandler(logged)
        async with HistoryCompressor(url, settings=Settings.load(**SETTINGS)) as hc:
            counting = CountingMaintainer(hc)
            await run_worker_until(counting, 0.05, stop)
        return {**counting.totals, "errors": counting.errors, "logged": logged.messages}

    Path(result_path).write_text(json.dumps(asyncio.run(main())))


def writer_text(w: int, i: int) -> str:
    return f"{'New topic: ' if i % 10 == 9 else ''}w{w} m{i} {FILLER}"


def _writer_main(url: str, w: int, count: int, go: Any, result_path: str) -> None:
    async def main() -> dict[str, Any]:
        errors: list[str] = []
        over_budget = 0
        async with HistoryCompressor(url, settings=Settings.load(**SETTINGS)) as hc:
            go.wait(120)
            started = time.monotonic()
            for i in range(count):
                role = "user" if i % 2 == 0 else "assistant"
                try:
                    await hc.add_message(CID, {"role": role, "content": writer_text(w, i)})
                except Exception as exc:  # recorded: the test requires none
                    errors.append(f"add {i}: {exc!r}")
                if i % 50 == 49:
                    ctx = await hc.get_context(CID, 400)
                    over_budget += ctx.total_tokens > 400
            elapsed = time.monotonic() - started
        return {"errors": errors, "over_budget": over_budget, "seconds": elapsed}

    Path(result_path).write_text(json.dumps(asyncio.run(main())))


async def _run(url: str, tmp_path: Path, *, writers: int, per_writer: int, workers: int) -> None:
    per_writer = max(int(per_writer * SCALE), 20)
    stop, go = SPAWN.Event(), SPAWN.Event()
    worker_procs = [
        SPAWN.Process(target=_worker_main, args=(url, stop, str(tmp_path / f"worker{k}.json")))
        for k in range(workers)
    ]
    writer_procs = [
        SPAWN.Process(target=_writer_main, args=(url, w, per_writer, go, str(tmp_path / f"writer{w}.json")))
        for w in range(writers)
    ]
    async with HistoryCompressor(url, settings=Settings.load(**SETTINGS)) as hc:  # schema first
        for p in worker_procs + writer_procs:
            p.start()
        try:
            await asyncio.sleep(0.5)
            go.set()  # writers start together once booted (each waits for the event)
            join_all(writer_procs, 240)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                [st] = await hc.stats(CID)
                if st.topics_pending == 0:
                    break
                await asyncio.sleep(0.2)
        finally:
            stop.set()
            go.set()
            join_all(worker_procs, 60)

        wrote = [json.loads((tmp_path / f"writer{w}.json").read_text()) for w in range(writers)]
        for r in wrote:
            assert r["errors"] == [], r["errors"][:5]
            assert r["over_budget"] == 0
        worked = [json.loads((tmp_path / f"worker{k}.json").read_text()) for k in range(workers)]
        for r in worked:
            assert r["errors"] == [] and r["logged"] == [], r
            assert r["lease_lost"] == 0, "a lease was lost although none expired"
        assert sum(r["summarized"] for r in worked) > 0, "the workers did no work"
        parent = await maintain_until_quiet(hc)

        sent = [writer_text(w, i) for w in range(writers) for i in range(per_writer)]
        counts = await check_invariants(hc, CID, sent, ordered=False)
        assert counts["messages"] == writers * per_writer
        h = await hc.get_history(CID)
        # get_history covers every sequence exactly once by a raw message.
        assert sorted(m.sequence for m in h.messages) == list(range(1, writers * per_writer + 1))
        stored = [m.content for m in h.messages]
        for w in range(writers):  # each writer's messages keep the order it sent them in
            prefix = f"w{w} "
            mine = [s for s in stored if s.startswith(prefix) or s.startswith("New topic: " + prefix)]
            assert mine == [writer_text(w, i) for i in range(per_writer)], f"writer {w} reordered"
        summarized = sum(r["summarized"] for r in worked) + sum(r.summarized for r in parent)
        merged = sum(r["merged"] + r["rolled_up"] for r in worked) + sum(
            r.merged + r.rolled_up for r in parent
        )
        assert summarized == counts["topics"], "a topic was summarised twice (or never)"
        assert merged == counts["archives"]
        assert counts["topics"] >= writers * per_writer // 12, "too few topics: sealing was not exercised"
        assert counts["archives"] > 0, "no merges: escalation was not exercised"
        for budget in (600, 5000, 50_000):
            ctx = await hc.get_context(CID, budget)
            check_context(ctx, budget)
            assert ctx.current_topic[-1].sequence == writers * per_writer


@pytest.mark.postgres
@pytest.mark.timeout(300)
async def test_eight_writers_two_workers_one_conversation_postgres(pg_url: str, tmp_path: Path) -> None:
    await _run(pg_url, tmp_path, writers=8, per_writer=500, workers=2)


@pytest.mark.timeout(300)
async def test_four_writers_two_workers_one_conversation_sqlite_file(tmp_path: Path) -> None:
    await _run(f"sqlite:///{tmp_path / 'shared.db'}", tmp_path, writers=4, per_writer=150, workers=2)


@pytest.mark.timeout(120)
def test_more_threads_than_connections_take_turns_on_postgresql(pg_url: str) -> None:
    # The store keeps its connections between calls; past the engine pool's limit a thread asked
    # the pool for one, while busy threads kept taking the kept ones: it waited until the others
    # went idle (30 s timeouts, retried). Now it waits in line for the next one given back.
    import threading

    from tiered_history import SyncHistoryCompressor

    with SyncHistoryCompressor.from_url(pg_url) as h:
        for c in range(11):
            h.add_message(f"c{c}", {"role": "user", "content": "hello"})
        stop = time.monotonic() + 8.0
        start = threading.Barrier(11)

        def busy(t: int) -> None:
            start.wait()
            while time.monotonic() < stop:
                h.get_context(f"c{t}", max_tokens=1000)

        threads = [threading.Thread(target=busy, args=(t,)) for t in range(10)]
        for t in threads:
            t.start()
        start.wait()
        time.sleep(1.0)
        began = time.monotonic()
        h.add_message("c10", {"role": "user", "content": "my turn"})
        waited = time.monotonic() - began
        finished_while_busy = time.monotonic() < stop
        for t in threads:
            t.join()
        # A liveness bound, not a speed figure: before, the call waited for the 7 s left.
        assert finished_while_busy, f"the 11th thread waited {waited:.1f} s, until the others stopped"
        assert [m.content for m in h.get_messages("c10")] == ["hello", "my turn"]
