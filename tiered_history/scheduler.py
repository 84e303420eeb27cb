"""Periodic ``maintain()``: in the bot's own event loop (APScheduler) or as a standalone worker."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime
from typing import Any, Protocol

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from .maintenance import MaintenanceReport

log = logging.getLogger("tiered_history.scheduler")


class Maintainer(Protocol):
    """Anything with an async ``maintain()``: a :class:`~tiered_history.HistoryCompressor`."""

    async def maintain(self) -> MaintenanceReport: ...


#: Longest pause between attempts of a worker whose ``maintain()`` keeps failing.
MAX_BACKOFF_SECONDS = 300.0


def _log_report(report: MaintenanceReport) -> None:
    for error in report.errors:
        log.warning("maintenance error: %s", error)
    if report.sealed or report.summarized or report.merged or report.rolled_up or report.lease_lost:
        log.info(
            "maintenance: %d conversations, %d sealed, %d summarised (%d provisional), "
            "%d merged, %d rolled up, %d leases lost",
            report.conversations,
            report.sealed,
            report.summarized,
            report.provisional,
            report.merged,
            report.rolled_up,
            report.lease_lost,
        )


class BackgroundMaintenance:
    """Runs ``compressor.maintain()`` every ``interval_seconds`` on the running event loop.

    One run at a time (``max_instances=1``), missed runs coalesced, exceptions logged.
    ``stop()`` lets a run in progress finish, so no lease is left behind.
    """

    def __init__(self, compressor: Maintainer, interval_seconds: float) -> None:
        if interval_seconds <= 0:
            raise ValueError("interval_seconds must be positive")
        self.compressor = compressor
        self.interval_seconds = float(interval_seconds)
        self.runs = 0
        self.failures = 0
        self._scheduler: Any = None
        self._current: asyncio.Future[None] | None = None
        self._stopping = False

    @property
    def running(self) -> bool:
        return self._scheduler is not None

    def start(self) -> None:
        """Schedule the job (the first run starts at once). Call from inside the running loop."""
        if self._scheduler is not None:
            return
        self._stopping = False
        loop = asyncio.get_running_loop()
        scheduler = AsyncIOScheduler(event_loop=loop, timezone=UTC)
        scheduler.add_job(
            self._tick,
            "interval",
            seconds=self.interval_seconds,
            id="tiered_history_maintain",
            name="tiered_history maintain()",
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
            next_run_time=datetime.now(UTC),
        )
        scheduler.start()
        self._scheduler = scheduler

    async def _tick(self) -> None:
        if self._stopping or (self._current is not None and not self._current.done()):
            return
        # Shielded: APScheduler cancels running jobs on shutdown; a maintain() pass always completes.
        self._current = asyncio.ensure_future(self._maintain_once())
        await asyncio.shield(self._current)

    async def _maintain_once(self) -> None:
        try:
            report = await self.compressor.maintain()
        except Exception:
            self.failures += 1
            log.exception("background maintenance failed; retrying in %.3g s", self.interval_seconds)
            return
        finally:
            self.runs += 1
        _log_report(report)

    async def stop(self) -> None:
        """Stop scheduling, wait for a run in progress to finish, then shut the scheduler down."""
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is None:
            return
        self._stopping = True  # a run already handed to the executor returns at once
        scheduler.pause()
        await self._wait_current()
        if scheduler.running:
            scheduler.shutdown(wait=False)
        await asyncio.sleep(0)  # AsyncIOScheduler shuts down on the next loop iteration
        await self._wait_current()

    async def _wait_current(self) -> None:
        current = self._current
        if current is not None:
            with contextlib.suppress(Exception):
                await current
            if self._current is current:
                self._current = None


async def run_worker(
    compressor: Maintainer, interval_seconds: float, stop_event: asyncio.Event | None = None
) -> None:
    """Standalone worker: ``maintain()``, then wait ``interval_seconds`` (or until ``stop_event``).

    Failures are logged and retried with exponential backoff (at most ``MAX_BACKOFF_SECONDS``).
    Returns when ``stop_event`` is set; runs forever (until cancelled) without one.
    """
    if interval_seconds <= 0:
        raise ValueError("interval_seconds must be positive")
    failures = 0
    while stop_event is None or not stop_event.is_set():
        try:
            _log_report(await compressor.maintain())
            failures = 0
            delay = interval_seconds
        except Exception:
            failures += 1
            delay = min(interval_seconds * 2 ** min(failures, 30), max(MAX_BACKOFF_SECONDS, interval_seconds))
            log.exception("maintenance failed (%d in a row); retrying in %.3g s", failures, delay)
        if stop_event is None:
            await asyncio.sleep(delay)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop_event.wait(), timeout=delay)
