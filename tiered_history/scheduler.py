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
    ``stop()`` lets a run in progress end after the conversation in hand (the rest of its batch is
    given back), so no lease is left behind.
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
        self._stop: asyncio.Future[None] | None = None

    @property
    def running(self) -> bool:
        return self._scheduler is not None

    def start(self) -> None:
        """Schedule the job (the first run starts at once). Call from inside the running loop."""
        if self._scheduler is not None:
            return
        self._stopping = False
        self._stop = None
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
        # A task of its own that the job does not wait for: APScheduler neither cancels it at
        # shutdown nor counts it as a running instance (which it logged as a skipped run at every
        # interval of a long pass); stop() waits for it, and this check keeps one at a time.
        self._current = asyncio.ensure_future(self._maintain_once())

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
        """Stop scheduling, let a run in progress end after the conversation in hand, then shut the
        scheduler down. A second call while the first runs waits for the same stop."""
        if self._stop is None:
            if self._scheduler is None:
                return
            self._stop = asyncio.ensure_future(self._stop_now())
        # Shielded: a caller that gives up waiting (a timeout) leaves the stop to finish.
        await asyncio.shield(self._stop)

    async def _stop_now(self) -> None:
        scheduler, self._scheduler = self._scheduler, None
        assert scheduler is not None
        self._stopping = True  # a run already handed to the executor returns at once
        _stop_passes(self.compressor, True)
        try:
            scheduler.pause()
            await self._wait_current()
            if scheduler.running:
                scheduler.shutdown(wait=False)
            await asyncio.sleep(0)  # AsyncIOScheduler shuts down on the next loop iteration
            await self._wait_current()
        finally:
            _stop_passes(self.compressor, False)

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
    watch = asyncio.ensure_future(_stop_passes_on(stop_event, compressor)) if stop_event else None
    try:
        await _work(compressor, interval_seconds, stop_event)
    finally:
        if watch is not None:
            watch.cancel()
            _stop_passes(compressor, False)


async def _stop_passes_on(stop_event: asyncio.Event, compressor: Maintainer) -> None:
    """Once ``stop_event`` is set, a pass in progress ends after the conversation in hand."""
    await stop_event.wait()
    _stop_passes(compressor, True)


def _stop_passes(compressor: Maintainer, stopping: bool) -> None:
    """Set the stop flag of ``compressor``'s maintenance (``Maintenance.stopping``), if it has one
    (a stand-in with only ``maintain()`` has none)."""
    maintenance = getattr(compressor, "maintenance", None)
    if maintenance is not None:
        maintenance.stopping = stopping


async def _work(compressor: Maintainer, interval_seconds: float, stop_event: asyncio.Event | None) -> None:
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
