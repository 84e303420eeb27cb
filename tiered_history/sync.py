"""``SyncHistoryCompressor``: the blocking twin, built on the async one (never a copy).

A private event loop runs in a daemon thread; each method submits the async
method's coroutine to it and waits. So the two share every line of logic.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import sqlalchemy as sa

from .models import CompressedContext, ConversationStats, History, Message, StoredMessage, Summary
from .service import HistoryCompressor, MaintenanceReport
from .settings import Settings
from .store.base import Store
from .summarizers import Summarizer

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="tiered-history", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class SyncHistoryCompressor:
    """Blocking version of :class:`HistoryCompressor` with the same methods."""

    def __init__(
        self,
        target: str | sa.Engine | Store | None = None,
        *,
        settings: Settings | None = None,
        summarizer: Summarizer | Mapping[str, Any] | None = None,
        **overrides: Any,
    ) -> None:
        self._loop = _LoopThread()
        try:
            self.aio = HistoryCompressor(target, settings=settings, summarizer=summarizer, **overrides)
        except BaseException:
            self._loop.stop()
            raise
        self.settings = self.aio.settings

    @classmethod
    def from_url(
        cls,
        url: str | None = None,
        *,
        settings: Settings | None = None,
        summarizer: Summarizer | Mapping[str, Any] | None = None,
        **overrides: Any,
    ) -> SyncHistoryCompressor:
        return cls(url, settings=settings, summarizer=summarizer, **overrides)

    def initialize(self) -> None:
        self._loop.run(self.aio.initialize())

    def close(self) -> None:
        try:
            self._loop.run(self.aio.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> SyncHistoryCompressor:
        self.initialize()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def add_message(
        self, conversation_id: str, message: Message | Mapping[str, Any], *, platform: str | None = None
    ) -> StoredMessage:
        return self._loop.run(self.aio.add_message(conversation_id, message, platform=platform))

    def get_context(self, conversation_id: str, max_tokens: int | None = None) -> CompressedContext:
        return self._loop.run(self.aio.get_context(conversation_id, max_tokens))

    def seal_current_topic(self, conversation_id: str) -> Summary | None:
        return self._loop.run(self.aio.seal_current_topic(conversation_id))

    def get_history(self, conversation_id: str) -> History:
        return self._loop.run(self.aio.get_history(conversation_id))

    def search(self, conversation_id: str, text: str, limit: int = 20) -> list[StoredMessage]:
        return self._loop.run(self.aio.search(conversation_id, text, limit))

    def exists(self, conversation_id: str) -> bool:
        return self._loop.run(self.aio.exists(conversation_id))

    def stats(self, conversation_id: str | None = None) -> list[ConversationStats]:
        return self._loop.run(self.aio.stats(conversation_id))

    def conversation_ids(self) -> list[str]:
        return self._loop.run(self.aio.conversation_ids())

    def maintain(self, conversation_id: str | None = None, now: datetime | None = None) -> MaintenanceReport:
        return self._loop.run(self.aio.maintain(conversation_id, now))

    def start_background(self, interval_seconds: float | None = None) -> None:
        self._loop.run(self.aio.start_background(interval_seconds))

    def stop_background(self) -> None:
        self._loop.run(self.aio.stop_background())
