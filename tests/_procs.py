"""Helpers for tests and benchmarks that run writers and workers in child processes."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from tiered_history import HistoryCompressor

__all__ = ["CountingMaintainer", "join_all"]


class CountingMaintainer:
    """Wraps the compressor given to ``run_worker`` and adds up its reports."""

    def __init__(self, hc: HistoryCompressor) -> None:
        self.hc = hc
        self.totals = {"passes": 0, "summarized": 0, "merged": 0, "dropped": 0, "lease_lost": 0}
        self.errors: list[str] = []

    async def maintain(self, conversation_id: str | None = None, now: Any = None) -> Any:
        try:
            report = await self.hc.maintain(conversation_id, now)
        except Exception as exc:
            self.errors.append(repr(exc))
            raise
        self.totals["passes"] += 1
        for key in ("summarized", "merged", "dropped", "lease_lost"):
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
