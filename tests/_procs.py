"""Helpers for tests and benchmarks that run maintenance workers (often in child processes)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from tiered_history import HistoryCompressor, MaintenanceReport
from tiered_history.scheduler import run_worker

__all__ = ["CountingMaintainer", "join_all", "maintain_until_quiet", "run_worker_until", "wait_out_leases"]


class CountingMaintainer:
    """Wraps the compressor given to ``run_worker`` and adds up its reports."""

    def __init__(self, hc: HistoryCompressor) -> None:
        self.hc = hc
        self.totals = {
            "passes": 0,
            "summarized": 0,
            "merged": 0,
            "rolled_up": 0,
            "dropped": 0,
            "lease_lost": 0,
        }
        self.errors: list[str] = []

    async def maintain(self, conversation_id: str | None = None, now: Any = None) -> Any:
        try:
            report = await self.hc.maintain(conversation_id, now)
        except Exception as exc:
            self.errors.append(repr(exc))
            raise
        self.totals["passes"] += 1
        for key in ("summarized", "merged", "rolled_up", "dropped", "lease_lost"):
            self.totals[key] += getattr(report, key)
        self.errors.extend(report.errors)
        return report


def join_all(procs: Sequence[Any], timeout: float) -> None:
    """Wait for every process (killing stragglers) and fail unless all exited with 0."""
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(deadline - time.monotonic(), 0.1))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
        p.join(5)
    assert not alive, f"{len(alive)} child processes did not finish in {timeout} s"
    assert [p.exitcode for p in procs] == [0] * len(procs), "a child process failed (see its stderr)"


async def run_worker_until(maintainer: Any, interval: float, stop: Any, poll: float = 0.05) -> None:
    """``run_worker(maintainer, interval)`` until ``stop`` (a process-shared event) is set."""
    done = asyncio.Event()

    async def bridge() -> None:
        while not stop.is_set():
            await asyncio.sleep(poll)
        done.set()

    watcher = asyncio.create_task(bridge())
    await run_worker(maintainer, interval, done)
    await watcher


async def maintain_until_quiet(hc: HistoryCompressor, limit: int = 30) -> list[MaintenanceReport]:
    """Run ``maintain()`` until a pass finds nothing to do; fail on errors or after ``limit`` passes."""
    reports = []
    for _ in range(limit):
        r = await hc.maintain()
        reports.append(r)
        assert not r.errors, r.errors
        if not (r.sealed or r.summarized or r.merged or r.dropped or r.conversations):
            return reports
    raise AssertionError(f"maintain() never went quiet: {reports[-3:]}")


async def wait_out_leases(hc: HistoryCompressor, cids: Sequence[str]) -> None:
    """Sleep until every lease on ``cids`` (say, a killed worker's) has expired."""
    for cid in cids:
        state = await hc.store.state(cid)
        assert state is not None
        if state.lease_expires_at is not None:
            delay = (state.lease_expires_at - datetime.now(UTC)).total_seconds()
            await asyncio.sleep(max(delay, 0) + 0.2)
