"""``HistoryCompressor``: the async API bots call on every reply.

Every method hands its call to the reply path (:class:`~tiered_history.service.ReplyPath`,
synchronous): on the event loop when the store never waits (``memory://``), on the store's
thread pool when it may. The blocking twin (:mod:`.sync`) calls the same reply path directly,
so the two faces share every line of logic; a test checks their methods, signatures and docs match.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, Self, TypeVar

from .core.boundaries import DETECTOR_NAME_CHARS, BoundaryDetector
from .core.recollection import Recollection
from .errors import ConfigurationError
from .maintenance import Maintenance, MaintenanceReport
from .models import (
    CompressedContext,
    ConversationInfo,
    ConversationStats,
    History,
    SearchHit,
    StoredMessage,
    Summary,
)
from .service import STORE_THREADS, ReplyPath, build
from .settings import Settings
from .store.aio import AsyncStore
from .store.base import Store
from .summarizers import Summarizer
from .summarizers.pipeline import Limits, SummaryPipeline

if TYPE_CHECKING:
    import sqlalchemy as sa

P = ParamSpec("P")
T = TypeVar("T")

#: Batches of ``add_messages`` up to this size run like ``add_message`` (on the event loop when
#: the store can write without waiting); bigger ones always on the store's thread pool.
LOOP_BATCH = 32


def check_detectors(detectors: Sequence[BoundaryDetector]) -> tuple[BoundaryDetector, ...]:
    """The detectors, checked once: each needs a short ``name``, a ``window`` and ``propose``."""
    if isinstance(detectors, str | bytes | BoundaryDetector):
        raise ConfigurationError("detectors must be a list of BoundaryDetector objects")
    out = tuple(detectors)
    for d in out:
        name = getattr(d, "name", None)
        window = getattr(d, "window", None)
        if not isinstance(d, BoundaryDetector) or not callable(getattr(d, "propose", None)):
            raise ConfigurationError(
                f"{d!r} is not a BoundaryDetector (it needs name, window and async propose(turns))"
            )
        if not isinstance(name, str) or not 0 < len(name) <= DETECTOR_NAME_CHARS or not name.isprintable():
            raise ConfigurationError(
                f"a detector's name must be 1 to {DETECTOR_NAME_CHARS} printable characters, not {name!r}"
            )
        if type(window) is not int or window < 1:
            raise ConfigurationError(f"detector {name!r}: window must be a positive integer, not {window!r}")
    return out


class BaseCompressor:
    """What both faces share: settings, the store, the reply path, maintenance."""

    def __init__(
        self,
        target: str | sa.Engine | Store | None = None,
        *,
        settings: Settings | None = None,
        summarizer: Summarizer | Mapping[str, Any] | None = None,
        detectors: Sequence[BoundaryDetector] = (),
        **overrides: Any,
    ) -> None:
        parts = build(target, settings, summarizer, overrides)
        s = self.settings = parts.settings
        self.detectors = check_detectors(detectors)
        self.counter = parts.counter
        self.summarizer: Summarizer = parts.summarizer
        self.fallback = parts.fallback
        # The reply path only counts what the detectors have not seen; maintenance asks them.
        every = s.boundaries.detector_every if self.detectors else 0
        self.reply = ReplyPath(s, parts.counter, parts.store, detect_every=every)
        threads = 1 if getattr(parts.store, "single_connection", False) else STORE_THREADS
        self.store = AsyncStore(parts.store, threads)
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        # The pipeline's own targets (a merge planned with none: a budget too small for any
        # archive) are those of the configured budget's plan.
        plan = self.reply.plan_at(s.context_budget)
        limits = Limits(
            topic_target=plan.topic_target,
            archive_target=plan.bulk_target,
            timeout=s.summarizer.timeout,
            deadline=s.summarizer.deadline,
            max_attempts=s.summary_max_attempts,
            retry_backoff_seconds=s.retry_backoff_seconds,
        )
        self.pipeline = SummaryPipeline(parts.counter, self.summarizer, limits, self.fallback)
        self.maintenance = Maintenance(
            self.store,
            self.pipeline,
            self.reply.rules_for,
            self.reply.plan_for,
            worker_id=self.worker_id,
            lease_seconds=s.lease_seconds,
            max_attempts=s.summary_max_attempts,
            retry_backoff_seconds=s.retry_backoff_seconds,
            merge_size=s.bulk_merge_size,
            detectors=self.detectors,
            detect_every=s.boundaries.detector_every,
            detector_timeout_seconds=s.boundaries.detector_timeout_seconds,
        )
        self._initialized = False
        self._background: Any = None

    @classmethod
    def from_url(
        cls,
        url: str | None = None,
        *,
        settings: Settings | None = None,
        summarizer: Summarizer | Mapping[str, Any] | None = None,
        detectors: Sequence[BoundaryDetector] = (),
        **overrides: Any,
    ) -> Self:
        """A compressor on the database at ``url`` (see the class docstring)."""
        return cls(url, settings=settings, summarizer=summarizer, detectors=detectors, **overrides)

    @property
    def sync_store(self) -> Store:
        """The store itself (its synchronous methods)."""
        return self.reply.store

    def default_max_tokens(self) -> int:
        """The model's input window minus ``reserve_output_tokens``, else ``context_budget``."""
        return self.reply.default_max_tokens()


class HistoryCompressor(BaseCompressor):
    """Stores conversations and answers ``get_context`` within a token budget (async).

    ``target`` is a database URL (``sqlite:///history.db``, ``sqlite://``,
    ``postgresql://user@host/db``, ``memory://``), a SQLAlchemy ``Engine`` you own
    (it is not disposed on close) or a store object.

    ``detectors`` are pluggable topic-boundary detectors (:class:`~tiered_history.BoundaryDetector`:
    embeddings, an LLM). Only background maintenance asks them, never ``add_message`` or
    ``get_context``; see docs/configuration.md, "Pluggable boundary detectors".
    """

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
        self._init_lock = asyncio.Lock()
        # One start, one stop and one close at a time: a second call waits for the first (a
        # second close() returned at once before, closing the store under a pass still running).
        self._life_lock = asyncio.Lock()
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------------

    async def initialize(self) -> None:
        """Create or upgrade the schema (runs the Alembic migrations). Called on first use."""
        async with self._init_lock:
            if not self._initialized:
                await self.store.initialize()
                self._initialized = True

    async def _run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        if not self._initialized:
            await self.initialize()
        return await self.store.run(fn, *args, **kwargs)

    async def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """A short reply-path call: on the event loop unless it would wait for a database lock."""
        if not self._initialized:
            await self.initialize()
        return await self.store.call(fn, *args, **kwargs)

    async def close(self) -> None:
        """Stop the background job and close the store (an Engine you passed stays open). Calling
        it again, or while it runs, waits for the first close and does nothing more."""
        async with self._life_lock:
            if self._closed:
                return
            await self._stop_background()
            self._closed = True
            await self.store.close()
            self.store.shutdown()

    async def __aenter__(self) -> Self:
        await self.initialize()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- the reply path ------------------------------------------------------------------------

    async def add_message(
        self,
        conversation_id: str,
        message: object,
        *,
        platform: str | None = None,
        channel: str | None = None,
        user_id: str | None = None,
    ) -> StoredMessage:
        """Store one message exactly as given (an OpenAI-format dict, a litellm or OpenAI SDK
        message, any pydantic model with ``model_dump()``), with its exact token count. Seals the
        open topic first when a boundary rule says so. ``platform``, ``channel`` and ``user_id``
        describe where it comes from (kept on the conversation, for :meth:`list_conversations`)."""
        reply = self.reply
        stored, sealed = await self._call(
            reply.add_message, conversation_id, message, platform=platform, channel=channel, user_id=user_id
        )
        if sealed and self.settings.summarize_inline:
            await self._maintain_inline(conversation_id)
        return stored

    async def add_messages(
        self,
        conversation_id: str,
        messages: Sequence[object],
        *,
        platform: str | None = None,
        channel: str | None = None,
        user_id: str | None = None,
    ) -> list[StoredMessage]:
        """Store a batch in order, in one transaction: all of them, or (one invalid) none."""
        reply = self.reply
        # A big batch (an import) is long work of its own: the loop is not the place for it.
        small = isinstance(messages, Sequence) and len(messages) <= LOOP_BATCH
        run = self._call if small else self._run
        stored, sealed = await run(
            reply.add_messages, conversation_id, messages, platform=platform, channel=channel, user_id=user_id
        )
        if sealed and self.settings.summarize_inline:
            await self._maintain_inline(conversation_id)
        return stored

    async def pin(
        self,
        conversation_id: str,
        message: object,
        *,
        key: str | None = None,
        platform: str | None = None,
        channel: str | None = None,
    ) -> StoredMessage:
        """Store ``message`` (a string is a system message) pinned: always sent first, never cut or
        summarised. Pinning again under the same ``key`` replaces it in the context; the earlier
        message stays stored. A bot that pins its system prompt with ``key="system"`` on every
        start keeps exactly one."""
        return await self._call(
            self.reply.pin, conversation_id, message, key=key, platform=platform, channel=channel
        )

    async def unpin(self, conversation_id: str, key: str) -> bool:
        """Take pin ``key`` out of the context (its message stays stored). False if there is none."""
        return await self._call(self.reply.unpin, conversation_id, key)

    async def get_context(
        self,
        conversation_id: str,
        max_tokens: int | None = None,
        *,
        query: str | None = None,
        record: bool = True,
    ) -> CompressedContext:
        """What to send to the model: never more than ``max_tokens`` tokens, framing included.

        Without ``max_tokens``: the model's input window minus ``reserve_output_tokens`` when the
        ``model`` setting names a known model, else ``context_budget``. What is recalled from
        earlier in the conversation matches the newest user message, or ``query`` when given.
        ``record=False`` previews: the budget and the window's start are not recorded (topic sizes
        and the cache-stable window follow the bot's own reads, not an operator's look)."""
        if max_tokens is None:
            # Reading the model's window may load litellm's tables: keep it off the event loop.
            max_tokens = await asyncio.to_thread(self.reply.default_max_tokens)
        # On the pool: reading and assembling costs milliseconds (no hop is worth the loop's
        # time), and a read whose closing record met a busy lock would be read all over again.
        return await self._run(self.reply.get_context, conversation_id, max_tokens, query, record)

    async def seal_current_topic(self, conversation_id: str) -> Summary | None:
        """Close the open topic now; it is summarised by the next ``maintain()``."""
        sealed = await self._run(self.reply.seal_current_topic, conversation_id)
        if sealed is not None and self.settings.summarize_inline:
            await self._maintain_inline(conversation_id)
        return sealed

    async def get_history(self, conversation_id: str) -> History:
        """Every message, topic summary and archive (dropped ones included)."""
        return await self._run(self.reply.get_history, conversation_id)

    async def get_messages(
        self, conversation_id: str, first: int = 1, last: int | None = None
    ) -> list[StoredMessage]:
        """Stored messages with ``first <= sequence <= last`` (default: to the newest), oldest first."""
        return await self._run(self.reply.get_messages, conversation_id, first, last)

    async def search(self, conversation_id: str, text: str, limit: int = 20) -> list[SearchHit]:
        """Stored messages matching ``text``, best first: BM25 over its words (a piece like
        ``NEEDLE-4711`` is a phrase), newest first on equal scores; text with no word at all is
        matched literally. Each hit carries its topic and the summary that represents it now."""
        return await self._run(self.reply.search, conversation_id, text, limit)

    async def recall(self, conversation_id: str, query: str, max_tokens: int = 1000) -> Recollection:
        """What the recall tool (:func:`recall_tool`) answers: the excerpts of this conversation that
        best match ``query`` (messages word for word, tool calls with their results, summaries),
        each cited with its message numbers and dates, within ``max_tokens``. Send
        ``recollection.text()`` back as the tool result."""
        return await self._run(self.reply.recall, conversation_id, query, max_tokens)

    async def exists(self, conversation_id: str) -> bool:
        """True once a message was stored for ``conversation_id``."""
        return await self._run(self.reply.exists, conversation_id)

    async def stats(self, conversation_id: str | None = None) -> list[ConversationStats]:
        """Tier usage, compressions and summariser spend per conversation."""
        return await self._run(self.reply.stats, conversation_id)

    async def conversation_ids(self) -> list[str]:
        """Every stored conversation id."""
        return await self._run(self.reply.conversation_ids)

    async def list_conversations(
        self,
        *,
        platform: str | None = None,
        channel: str | None = None,
        user_id: str | None = None,
        active_since: datetime | None = None,
        after: str | None = None,
        limit: int = 100,
    ) -> list[ConversationInfo]:
        """Conversations in id order (after ``after``), filtered by platform, channel, user and activity."""
        return await self._run(
            self.reply.list_conversations,
            platform=platform,
            channel=channel,
            user_id=user_id,
            active_since=active_since,
            after=after,
            limit=limit,
        )

    async def delete_conversation(self, conversation_id: str) -> bool:
        """Remove every row of a conversation (messages, summaries, archives, index entries, lease)
        in one transaction, for privacy requests. False if it did not exist."""
        return await self._run(self.reply.delete_conversation, conversation_id)

    async def fork(
        self, conversation_id: str, new_id: str, at_sequence: int | None = None
    ) -> ConversationInfo:
        """A new conversation ``new_id`` with this one's messages up to ``at_sequence`` (default: all)
        and the summaries of the topics that end by then (for retry and edit flows)."""
        return await self._run(self.reply.fork, conversation_id, new_id, at_sequence)

    async def export_conversation(self, conversation_id: str, *, summaries: bool = True) -> str:
        """The conversation as JSONL text (format: :mod:`tiered_history.exchange`): every message
        exactly as stored, with its timestamp, metadata and pin, the active pins, the platform,
        channel and users, and (``summaries``) its topic summaries and archives. Token counts are
        not written: the importing side counts them with its own tokenizer."""
        return await self._run(self.reply.export_conversation, conversation_id, summaries)

    async def import_conversation(
        self, data: str | Iterable[str], *, conversation_id: str | None = None
    ) -> ConversationInfo:
        """Store a conversation exported by :meth:`export_conversation` (its JSONL text, or its
        lines), under ``conversation_id`` if given. The whole file is checked first and stored in
        one transaction: all of it or, on any error, nothing. Importing the same file again is a
        no-op; an existing conversation with other content is refused. A file without summaries
        has its topics found again by the boundary rules (summarised by ``maintain()``)."""
        info, pending = await self._run(self.reply.import_conversation, data, conversation_id)
        if pending and self.settings.summarize_inline:
            await self.maintain(info.conversation_id)
        return info

    # -- background work -----------------------------------------------------------------------

    async def maintain(
        self, conversation_id: str | None = None, now: datetime | None = None
    ) -> MaintenanceReport:
        """Do all pending compression work now: seal silent topics, summarise, merge, drop, retry.

        Safe to run from many workers at once: each conversation is leased to one of them.
        """
        if conversation_id is not None:
            await self._run(self.reply.require, conversation_id)
        elif not self._initialized:
            await self.initialize()
        return await self.maintenance.run(conversation_id, now)

    async def _maintain_inline(self, conversation_id: str) -> MaintenanceReport:
        """``maintain(conversation_id)`` run by a reply (``summarize_inline``): without the pluggable
        detectors, which never slow a reply."""
        return await self.maintenance.run(conversation_id, detect=False)

    async def start_background(self, interval_seconds: float | None = None) -> None:
        """Run ``maintain()`` every ``maintenance_interval_seconds`` inside this event loop."""
        from .scheduler import BackgroundMaintenance

        async with self._life_lock:
            if self._closed:
                raise ConfigurationError("this compressor is closed: make a new one")
            if self._background is None:
                if not self._initialized:
                    await self.initialize()
                self._background = BackgroundMaintenance(
                    self, interval_seconds or self.settings.maintenance_interval_seconds
                )
                self._background.start()

    async def stop_background(self) -> None:
        """Stop the background job: a pass in progress ends after the conversation in hand, and
        gives the rest of its conversations back."""
        async with self._life_lock:
            await self._stop_background()

    async def _stop_background(self) -> None:
        if self._background is not None:
            await self._background.stop()
            self._background = None
