"""``SyncHistoryCompressor``: the blocking twin of :class:`~tiered_history.HistoryCompressor`.

Its reply-path methods call the same :class:`~tiered_history.service.ReplyPath` the async class
runs, directly on the caller's thread: no event loop, no thread hop. Maintenance is async by
nature (summarisers are), so ``maintain()`` and the background job run the same
:class:`~tiered_history.maintenance.Maintenance` on a private event loop in a daemon thread.
The docstrings are the async class's (set below), so the two faces cannot drift apart.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from .compressor import BaseCompressor, HistoryCompressor
from .core.boundaries import BoundaryDetector
from .core.recollection import Recollection
from .errors import ConfigurationError
from .maintenance import MaintenanceReport
from .models import (
    CompressedContext,
    ConversationInfo,
    ConversationStats,
    History,
    SearchHit,
    StoredMessage,
    Summary,
)
from .service import ReplyPath
from .settings import Settings
from .store.base import Store
from .summarizers import Summarizer

if TYPE_CHECKING:
    import sqlalchemy as sa

T = TypeVar("T")


class _LoopThread:
    """A private event loop in a daemon thread, started on first use."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self._lock = threading.Condition()
        self._running = 0  # calls of any thread in progress on the loop
        self._stopped = False

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            if self._stopped:
                coro.close()
                raise ConfigurationError("this compressor is closed: make a new one")
            if self.loop is None:
                self.loop = asyncio.new_event_loop()
                self.thread = threading.Thread(
                    target=self.loop.run_forever, name="tiered-history", daemon=True
                )
                self.thread.start()
            self._running += 1
            loop = self.loop
        try:
            return asyncio.run_coroutine_threadsafe(coro, loop).result()
        finally:
            with self._lock:
                self._running -= 1
                self._lock.notify_all()

    def stop(self) -> None:
        """Stop the loop once the calls in progress on it (other threads') have returned: a loop
        stopped under one leaves its caller waiting for ever."""
        with self._lock:
            self._stopped = True
            self._lock.wait_for(lambda: self._running == 0)
            loop, thread = self.loop, self.thread
        if loop is None or loop.is_closed():
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join()
        loop.close()


class SyncHistoryCompressor(BaseCompressor):
    """Blocking version of :class:`~tiered_history.HistoryCompressor` with the same methods."""

    def __init__(
        self,
        target: str | sa.Engine | Store | None = None,
        *,
        settings: Settings | None = None,
        summarizer: Summarizer | Mapping[str, Any] | None = None,
        detectors: Sequence[BoundaryDetector] = (),
        **overrides: Any,
    ) -> None:
        super().__init__(target, settings=settings, summarizer=summarizer, detectors=detectors, **overrides)
        self._loop = _LoopThread()
        self._init_lock = threading.Lock()
        # One start, one stop and one close at a time, whichever threads call them.
        self._life_lock = threading.RLock()
        self._closed = False

    def initialize(self) -> None:
        with self._init_lock:
            if not self._initialized:
                self.sync_store.initialize()
                self._initialized = True

    def _ready(self) -> ReplyPath:
        if not self._initialized:
            self.initialize()
        return self.reply

    def close(self) -> None:
        with self._life_lock:
            if self._closed:
                return
            self._closed = True
            try:
                self.stop_background()
                self._loop.stop()  # after the other threads' calls in progress have returned
                self.sync_store.close()
            finally:
                self._loop.stop()
                self.store.shutdown()

    def __enter__(self) -> Self:
        self.initialize()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def add_message(
        self,
        conversation_id: str,
        message: object,
        *,
        platform: str | None = None,
        channel: str | None = None,
        user_id: str | None = None,
    ) -> StoredMessage:
        reply = self._ready()
        stored, sealed = reply.add_message(
            conversation_id, message, platform=platform, channel=channel, user_id=user_id
        )
        if sealed and self.settings.summarize_inline:
            self._loop.run(self.maintenance.run(conversation_id, detect=False))
        return stored

    def add_messages(
        self,
        conversation_id: str,
        messages: Sequence[object],
        *,
        platform: str | None = None,
        channel: str | None = None,
        user_id: str | None = None,
    ) -> list[StoredMessage]:
        reply = self._ready()
        stored, sealed = reply.add_messages(
            conversation_id, messages, platform=platform, channel=channel, user_id=user_id
        )
        if sealed and self.settings.summarize_inline:
            self._loop.run(self.maintenance.run(conversation_id, detect=False))
        return stored

    def pin(
        self,
        conversation_id: str,
        message: object,
        *,
        key: str | None = None,
        platform: str | None = None,
        channel: str | None = None,
    ) -> StoredMessage:
        return self._ready().pin(conversation_id, message, key=key, platform=platform, channel=channel)

    def unpin(self, conversation_id: str, key: str) -> bool:
        return self._ready().unpin(conversation_id, key)

    def get_context(
        self,
        conversation_id: str,
        max_tokens: int | None = None,
        *,
        query: str | None = None,
        record: bool = True,
    ) -> CompressedContext:
        return self._ready().get_context(conversation_id, max_tokens, query, record)

    def seal_current_topic(self, conversation_id: str) -> Summary | None:
        sealed = self._ready().seal_current_topic(conversation_id)
        if sealed is not None and self.settings.summarize_inline:
            self._loop.run(self.maintenance.run(conversation_id, detect=False))
        return sealed

    def get_history(self, conversation_id: str) -> History:
        return self._ready().get_history(conversation_id)

    def get_messages(
        self, conversation_id: str, first: int = 1, last: int | None = None
    ) -> list[StoredMessage]:
        return self._ready().get_messages(conversation_id, first, last)

    def search(self, conversation_id: str, text: str, limit: int = 20) -> list[SearchHit]:
        return self._ready().search(conversation_id, text, limit)

    def recall(self, conversation_id: str, query: str, max_tokens: int = 1000) -> Recollection:
        return self._ready().recall(conversation_id, query, max_tokens)

    def exists(self, conversation_id: str) -> bool:
        return self._ready().exists(conversation_id)

    def stats(self, conversation_id: str | None = None) -> list[ConversationStats]:
        return self._ready().stats(conversation_id)

    def conversation_ids(self) -> list[str]:
        return self._ready().conversation_ids()

    def list_conversations(
        self,
        *,
        platform: str | None = None,
        channel: str | None = None,
        user_id: str | None = None,
        active_since: datetime | None = None,
        after: str | None = None,
        limit: int = 100,
    ) -> list[ConversationInfo]:
        return self._ready().list_conversations(
            platform=platform,
            channel=channel,
            user_id=user_id,
            active_since=active_since,
            after=after,
            limit=limit,
        )

    def delete_conversation(self, conversation_id: str) -> bool:
        return self._ready().delete_conversation(conversation_id)

    def fork(self, conversation_id: str, new_id: str, at_sequence: int | None = None) -> ConversationInfo:
        return self._ready().fork(conversation_id, new_id, at_sequence)

    def export_conversation(self, conversation_id: str, *, summaries: bool = True) -> str:
        return self._ready().export_conversation(conversation_id, summaries)

    def import_conversation(
        self, data: str | Iterable[str], *, conversation_id: str | None = None
    ) -> ConversationInfo:
        info, pending = self._ready().import_conversation(data, conversation_id)
        if pending and self.settings.summarize_inline:
            self.maintain(info.conversation_id)
        return info

    def maintain(self, conversation_id: str | None = None, now: datetime | None = None) -> MaintenanceReport:
        reply = self._ready()
        if conversation_id is not None:
            reply.require(conversation_id)
        return self._loop.run(self.maintenance.run(conversation_id, now))

    async def _start(self, interval_seconds: float) -> None:
        from .scheduler import BackgroundMaintenance

        self._background = BackgroundMaintenance(_Maintainer(self), interval_seconds)
        self._background.start()

    def start_background(self, interval_seconds: float | None = None) -> None:
        with self._life_lock:
            if self._closed:
                raise ConfigurationError("this compressor is closed: make a new one")
            if self._background is None:
                self._ready()
                self._loop.run(self._start(interval_seconds or self.settings.maintenance_interval_seconds))

    def stop_background(self) -> None:
        with self._life_lock:
            if self._background is not None:
                self._loop.run(self._background.stop())
                self._background = None


class _Maintainer:
    """Maintenance passes of a blocking compressor, awaited on its private loop."""

    def __init__(self, compressor: SyncHistoryCompressor) -> None:
        self.compressor = compressor
        self.maintenance = compressor.maintenance  # its stop flag, set while a stop waits

    async def maintain(self) -> MaintenanceReport:
        return await self.compressor.maintenance.run()


#: The public methods both faces have; the blocking one takes the async one's documentation.
TWIN_METHODS = tuple(
    name
    for name, value in vars(HistoryCompressor).items()
    if callable(value) and not name.startswith("_") and name in vars(SyncHistoryCompressor)
)
for _name in TWIN_METHODS:
    getattr(SyncHistoryCompressor, _name).__doc__ = getattr(HistoryCompressor, _name).__doc__
