"""``HistoryCompressor``: the thin async service bots call on every reply.

It validates input, counts tokens once, and delegates: boundary rules and context
assembly to the pure core, persistence to a store, summaries to a summariser.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any

import sqlalchemy as sa

from .core import escalation
from .core.assembly import Shares, assemble
from .core.boundaries import MANUAL, BoundaryRules, OpenTopic, decide
from .core.budget import check_max_tokens, escalation_budget, topic_size_limit
from .core.render import render_summary
from .core.truncation import head_tail
from .errors import ConfigurationError, ConversationNotFoundError, InvalidMessageError
from .models import (
    CompressedContext,
    ConversationStats,
    History,
    Message,
    StoredMessage,
    Summary,
    validate_conversation_id,
    validate_text_argument,
)
from .settings import Settings
from .store.base import ContextRows, LeaseLostError, PreparedMessage, Store, SummaryWrite
from .summarizers import (
    ExtractiveSummarizer,
    Spend,
    Summarizer,
    SummaryInput,
    SummaryPiece,
    build_summarizer,
    spend_ledger,
)
from .tokens import TokenCounter

log = logging.getLogger("tiered_history")

#: Summaries longer than this multiple of their target are treated as garbage.
_MAX_OVERSHOOT = 1.5
#: Below this many tokens a summary says nothing useful: the topic is kept word for word.
_MIN_SUMMARY_TOKENS = 16


@dataclass
class MaintenanceReport:
    """What one ``maintain()`` call did."""

    conversations: int = 0
    sealed: int = 0
    summarized: int = 0
    provisional: int = 0
    merged: int = 0
    dropped: int = 0
    lease_lost: int = 0
    errors: list[str] = field(default_factory=list)


def _open_store(target: str | sa.Engine | Store, encoding: str) -> Store:
    if isinstance(target, str) and target.startswith("memory://"):
        from .store.memory import MemoryStore

        return MemoryStore()
    if isinstance(target, str | sa.Engine):
        from .store.sql import SQLStore

        return SQLStore(target, encoding=encoding)
    if type(target).__name__ == "AsyncEngine":  # not imported: sqlalchemy.ext.asyncio is slow to load
        raise ConfigurationError(
            "pass a URL or a synchronous sqlalchemy Engine (the store runs its queries on a thread pool); "
            "for an AsyncEngine pass its .sync_engine's URL instead"
        )
    return target


class HistoryCompressor:
    """Stores conversations and answers ``get_context`` within a token budget.

    ``target`` is a database URL (``sqlite:///history.db``, ``sqlite://``,
    ``postgresql://user@host/db``, ``memory://``), a SQLAlchemy ``Engine`` you own
    (it is not disposed on close) or a store object.
    """

    def __init__(
        self,
        target: str | sa.Engine | Store | None = None,
        *,
        settings: Settings | None = None,
        summarizer: Summarizer | Mapping[str, Any] | None = None,
        **overrides: Any,
    ) -> None:
        if isinstance(summarizer, Mapping):
            # ``summarizer={"kind": "litellm", ...}`` is the setting, not a summariser object.
            overrides["summarizer"] = dict(summarizer)
            summarizer = None
        elif summarizer is not None and not isinstance(summarizer, Summarizer):
            raise ConfigurationError(
                "summarizer must implement tiered_history.Summarizer (name, summarize, merge) "
                "or be a mapping of summariser settings"
            )
        if settings is None:
            settings = Settings.load(**overrides)
        elif overrides:
            settings = Settings.load(**{**settings.model_dump(), **overrides})
        self.settings = settings
        self.counter = TokenCounter(settings.model)
        url = target if target is not None else settings.database_url or "sqlite:///tiered_history.db"
        self.store: Store = _open_store(url, self.counter.encoding_name)
        self.fallback = ExtractiveSummarizer(self.counter)
        self.summarizer: Summarizer = summarizer or build_summarizer(settings.summarizer, self.counter)
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        s = settings
        self._rules = BoundaryRules(
            explicit=s.boundaries.explicit,
            temporal=s.boundaries.temporal,
            size=s.boundaries.size,
            phrases=tuple(s.boundaries.trigger_phrases),
            trigger_roles=tuple(s.boundaries.trigger_roles),
            silence=timedelta(minutes=s.silence_minutes),
            size_limit=topic_size_limit(s.context_budget, s.tiers.current_topic, s.token_threshold),
            min_tokens=s.boundaries.min_topic_tokens,
        )
        self._plan = escalation_budget(
            s.context_budget,
            s.tiers.topic_summaries,
            s.tiers.bulk_archives,
            s.topic_summary_tokens,
            s.bulk_summary_tokens,
            s.bulk_merge_size,
        )
        self._shares = Shares(
            s.tiers.current_topic, s.tiers.topic_summaries, s.tiers.bulk_archives, s.redistribute_unused
        )
        self._initialized = False
        self._init_lock = asyncio.Lock()
        self._background: Any = None

    @classmethod
    def from_url(
        cls,
        url: str | None = None,
        *,
        settings: Settings | None = None,
        summarizer: Summarizer | Mapping[str, Any] | None = None,
        **overrides: Any,
    ) -> HistoryCompressor:
        return cls(url, settings=settings, summarizer=summarizer, **overrides)

    # -- lifecycle ------------------------------------------------------------------------

    async def initialize(self) -> None:
        """Create or upgrade the schema (runs the Alembic migrations). Called on first use."""
        async with self._init_lock:
            if not self._initialized:
                await self.store.initialize()
                self._initialized = True

    async def _ready(self) -> None:
        if not self._initialized:
            await self.initialize()

    async def close(self) -> None:
        await self.stop_background()
        await self.store.close()

    async def __aenter__(self) -> HistoryCompressor:
        await self.initialize()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- the reply path -------------------------------------------------------------------

    def prepare(self, message: Message | Mapping[str, Any]) -> PreparedMessage:
        """Validate a message and count its tokens (once, before it is stored)."""
        msg = Message.parse(message)
        if len(msg.content) > self.settings.max_content_chars:
            raise InvalidMessageError(
                f"content is {len(msg.content)} characters long; the maximum is "
                f"{self.settings.max_content_chars} (setting max_content_chars)"
            )
        wire = msg.to_openai()
        full = self.counter.message_tokens(wire)
        shown = head_tail(msg.content, self.settings.max_message_chars)
        tokens = full if shown is None else self.counter.message_tokens({**wire, "content": shown})
        return PreparedMessage(msg, tokens, full, shown)

    def _policy(self, topic: OpenTopic, prepared: PreparedMessage) -> str | None:
        m = prepared.message
        return decide(self._rules, topic, m.role, m.content, m.timestamp, prepared.token_count)

    async def add_message(
        self, conversation_id: str, message: Message | Mapping[str, Any], *, platform: str | None = None
    ) -> StoredMessage:
        """Store one message (with its exact token count). Seals the open topic on a boundary."""
        validate_conversation_id(conversation_id)
        if platform is not None:
            validate_text_argument(platform, "platform", 64)
        prepared = self.prepare(message)
        await self._ready()
        stored, sealed = await self.store.append(
            conversation_id, platform, prepared, self._policy, datetime.now(UTC)
        )
        if sealed is not None and self.settings.summarize_inline:
            await self.maintain(conversation_id)
        return stored

    async def get_context(self, conversation_id: str, max_tokens: int | None = None) -> CompressedContext:
        """What to send to the model: never more than ``max_tokens`` tokens, framing included."""
        validate_conversation_id(conversation_id)
        if max_tokens is None:
            max_tokens = self.default_max_tokens()
        check_max_tokens(max_tokens)
        await self._ready()
        budget = max_tokens

        def covered_budget(rows: ContextRows) -> tuple[int, int]:
            # A dry run on what is read so far: the room it leaves is all the dropped-archive
            # text the real assembly could use, plus the summaries it could swap out for messages.
            if not self._shares.redistribute:
                return 0, 0
            dry = self._assemble(conversation_id, budget, self._checked(rows))
            room = budget - dry.total_tokens
            dropped = room if len(dry.bulk_archives) == len([a for a in rows.archives if a.rendered]) else 0
            covered = 0
            if rows.topics and not dry.omitted_messages and dry.historical_topics:
                covered = room + dry.tier_tokens["topic"]
            return dropped, covered

        rows = self._checked(await self.store.read_context(conversation_id, max_tokens, covered_budget))
        return self._assemble(conversation_id, max_tokens, rows)

    def _checked(self, rows: ContextRows) -> ContextRows:
        """Rows whose stored counts came from this tokenizer (recounted if ``model`` changed)."""
        if rows.state.encoding and rows.state.encoding != self.counter.encoding_name:
            return self._recount(rows)
        return rows

    def _assemble(self, conversation_id: str, max_tokens: int, rows: ContextRows) -> CompressedContext:
        return assemble(
            conversation_id=conversation_id,
            max_tokens=max_tokens,
            shares=self._shares,
            counter=self.counter,
            pinned=rows.pinned,
            verbatim=rows.verbatim,
            topics=[t for t in rows.topics if t.rendered],
            archives=[a for a in rows.archives if a.rendered],
            dropped=[a for a in rows.dropped if a.rendered],
            covered=rows.covered,
            newest_sequence=rows.state.last_sequence or None,
            uncovered_total=rows.state.last_sequence
            - rows.state.summarized_upto
            - sum(1 for p in rows.pinned if p.sequence > rows.state.summarized_upto),
        )

    def _recount(self, rows: ContextRows) -> ContextRows:
        """Stored counts came from another tokenizer (``model`` changed): count the rows read again."""
        count = self.counter.message_tokens

        def msg(m: StoredMessage) -> StoredMessage:
            return replace(
                m, token_count=count(m.to_openai()), full_token_count=count(m.to_openai(m.content))
            )

        def summ(x: Summary) -> Summary:
            return replace(x, token_count=count(x.to_openai()) if x.rendered else 0)

        return replace(
            rows,
            pinned=[msg(m) for m in rows.pinned],
            verbatim=[msg(m) for m in rows.verbatim],
            topics=[summ(t) for t in rows.topics],
            archives=[summ(a) for a in rows.archives],
            dropped=[summ(a) for a in rows.dropped],
            covered=[msg(m) for m in rows.covered],
        )

    def default_max_tokens(self) -> int:
        """The model's input window (litellm) minus ``reserve_output_tokens``, else ``context_budget``."""
        from .modelinfo import input_window

        window = input_window(self.settings.model)
        if window is None:
            return self.settings.context_budget
        return max(window - self.settings.reserve_output_tokens, 1)

    async def seal_current_topic(self, conversation_id: str) -> Summary | None:
        """Close the open topic now; it is summarised by the next ``maintain()``."""
        validate_conversation_id(conversation_id)
        await self._ready()
        sealed = await self.store.seal(conversation_id, MANUAL, datetime.now(UTC))
        if sealed is not None and self.settings.summarize_inline:
            await self.maintain(conversation_id)
        return sealed

    async def get_history(self, conversation_id: str) -> History:
        """Every message, topic summary and archive (dropped ones included)."""
        validate_conversation_id(conversation_id)
        await self._ready()
        return await self.store.history(conversation_id)

    async def search(self, conversation_id: str, text: str, limit: int = 20) -> list[StoredMessage]:
        """Stored messages containing ``text`` (case-insensitive), newest first."""
        validate_conversation_id(conversation_id)
        validate_text_argument(text, "search text", 10_000)
        await self._ready()
        await self._require(conversation_id)
        return await self.store.search(conversation_id, text, max(1, min(limit, 1000)))

    async def exists(self, conversation_id: str) -> bool:
        """True once a message was stored for ``conversation_id``."""
        validate_conversation_id(conversation_id)
        await self._ready()
        return await self.store.state(conversation_id) is not None

    async def _require(self, conversation_id: str) -> None:
        if await self.store.state(conversation_id) is None:
            raise ConversationNotFoundError(f"no conversation {conversation_id!r}")

    async def stats(self, conversation_id: str | None = None) -> list[ConversationStats]:
        if conversation_id is not None:
            validate_conversation_id(conversation_id)
        await self._ready()
        return await self.store.stats(conversation_id)

    async def conversation_ids(self) -> list[str]:
        await self._ready()
        return await self.store.conversation_ids()

    # -- background work ------------------------------------------------------------------

    async def maintain(
        self, conversation_id: str | None = None, now: datetime | None = None
    ) -> MaintenanceReport:
        """Do all pending compression work now: seal silent topics, summarise, merge, drop, retry.

        Safe to run from many workers at once: each conversation is leased to one of them.
        """
        if conversation_id is not None:
            validate_conversation_id(conversation_id)
        await self._ready()
        if conversation_id is not None:
            await self._require(conversation_id)
        report = MaintenanceReport()
        batch = 16
        after: str | None = None  # a pass walks the conversations with work once, in id order
        while True:
            at = now or datetime.now(UTC)
            silence_before = (
                at - timedelta(minutes=self.settings.silence_minutes)
                if self.settings.boundaries.temporal
                else None
            )
            claimed = await self.store.claim(
                self.worker_id,
                at,
                self.settings.lease_seconds,
                silence_before,
                conversation_id,
                batch,
                self._rules.min_tokens,
                after=after,
            )
            for state in claimed:
                report.conversations += 1
                await self._compact(state.id, at, silence_before, report)
            if conversation_id is not None or not claimed:
                return report
            # Conversations that still have work (a topic that cannot be sealed yet, say) stay
            # behind the cursor: they cannot crowd out the ones not visited yet in this pass.
            after = claimed[-1].id  # in the database's own id order (its collation)

    async def _compact(
        self, cid: str, now: datetime, silence_before: datetime | None, report: MaintenanceReport
    ) -> None:
        owner = self.worker_id
        s = self.settings
        next_retry: datetime | None = None
        try:
            if silence_before is not None and await self.store.seal_if_silent(
                owner, cid, silence_before, now
            ):
                report.sealed += 1
            for topic in await self.store.topics_to_summarize(cid, now, s.summary_max_attempts):
                await self._renew(cid)
                write = await self._summarize_topic(topic, now)
                if await self.store.save_topic_summary(owner, topic, write, now):
                    report.summarized += 1
                    report.provisional += write.status == "provisional"
            plan = self._plan
            # Read the active summaries once; each merge removes its group (a backlog stays linear).
            active = await self.store.active_summaries(cid, "topic")
            while True:
                items = [escalation.Item(t.id, t.token_count) for t in active]
                ids = escalation.next_merge(items, plan.topic_share, s.bulk_merge_size)
                if not ids:
                    break
                group = [t for t in active if t.id in ids]
                await self._renew(cid)
                write = await self._merge(group)
                if await self.store.save_archive(owner, cid, group, write, now) is None:
                    break
                report.merged += 1
                active = [t for t in active if t.id not in ids]
            archives = await self.store.active_summaries(cid, "bulk")
            drop = escalation.archives_to_drop(
                [escalation.Item(a.id, a.token_count) for a in archives], plan.bulk_share
            )
            if drop:
                report.dropped += await self.store.drop_archives(owner, cid, drop, now)
            next_retry = await self.store.next_retry(cid, s.summary_max_attempts)
        except asyncio.CancelledError:
            # Give the conversation back now rather than when the lease expires.
            await asyncio.shield(self.store.release(owner, cid, True, None))
            raise
        except LeaseLostError:
            report.lease_lost += 1
            log.warning("lease on %s was taken over by another worker; stopping this pass", cid)
            return
        except Exception as exc:
            # Keep other conversations going; the flag stays set so the work is retried.
            log.exception("maintenance of %s failed", cid)
            report.errors.append(f"{cid}: {exc}")
            await self.store.release(owner, cid, True, now + timedelta(seconds=s.retry_backoff_seconds))
            return
        await self.store.release(owner, cid, next_retry is not None, next_retry)

    async def _renew(self, cid: str) -> None:
        until = datetime.now(UTC) + timedelta(seconds=self.settings.lease_seconds)
        if not await self.store.renew(self.worker_id, cid, until):
            raise LeaseLostError(cid)

    def _write(
        self,
        tier: str,
        text: str,
        status: str,
        first: int,
        last: int,
        started: datetime,
        ended: datetime,
        result: Any = None,
        error: str | None = None,
        next_attempt_at: datetime | None = None,
        spent: Spend | None = None,
    ) -> SummaryWrite:
        rendered = render_summary(tier, text, first, last, started, ended) if text.strip() else ""
        tokens = self.counter.message_tokens({"role": "user", "content": rendered}) if rendered else 0
        write = SummaryWrite(
            content=text,
            rendered=rendered,
            token_count=tokens,
            status=status,
            summarizer=getattr(result, "summarizer", "extractive"),
            model=getattr(result, "model", None),
            prompt_tokens=getattr(result, "prompt_tokens", 0),
            completion_tokens=getattr(result, "completion_tokens", 0),
            cost=getattr(result, "cost", 0.0),
            latency_ms=getattr(result, "latency_ms", 0.0),
            next_attempt_at=next_attempt_at,
            last_error=error,
        )
        return _charged(write, spent)

    async def _call(self, coro: Any) -> Any:
        return await asyncio.wait_for(coro, timeout=self.settings.summarizer.timeout)

    def _acceptable(self, text: Any, limit: int) -> str | None:
        """Why a summariser's text is rejected, or None if it is usable."""
        if not isinstance(text, str) or not text.strip():
            return "empty summary"
        n = self.counter.count(text)
        if n > limit * _MAX_OVERSHOOT:
            return f"summary ({n} tokens) is far over its limit ({limit} tokens)"
        return None

    def _header_tokens(self, tier: str, args: tuple[int, int, datetime, datetime]) -> int:
        """Framed tokens of a rendered summary around its text (the delimiters and date range)."""
        return self.counter.message_tokens({"role": "user", "content": render_summary(tier, "", *args)})

    async def _summarize_topic(self, topic: Summary, now: datetime) -> SummaryWrite:
        s = self.settings
        msgs = await self.store.topic_messages(
            topic.conversation_id, topic.first_sequence, topic.last_sequence
        )
        args = (topic.first_sequence, topic.last_sequence, topic.started_at, topic.ended_at)
        if not msgs:  # only pinned messages: they are always sent verbatim anyway
            return self._write("topic", "", "final", *args)
        source = sum(m.full_token_count for m in msgs)
        # Inflation guard: the rendered summary must cost less than the messages it replaces.
        cap = min(self._plan.topic_target, source - self._header_tokens("topic", args) - 3)
        transcript = "\n".join(f"{_speaker(m)}: {m.content}" for m in msgs)
        if cap < _MIN_SUMMARY_TOKENS or self.counter.count(transcript) <= cap:
            # Small topics fit whole: keep them word for word, with no summariser call. (Only a
            # manual seal makes a topic too small to shrink: phrases and silence wait for min_topic_tokens.)
            return self._write("topic", transcript, "final", *args, result=_Verbatim())
        inputs = [SummaryInput(m.sequence, m.role, m.content, m.timestamp, m.name) for m in msgs]
        error: str | None = None
        spent = Spend()
        if not isinstance(self.summarizer, ExtractiveSummarizer):
            result: Any = None
            with spend_ledger() as spent:
                try:
                    result = await self._call(self.summarizer.summarize(inputs, cap))
                    error = self._acceptable(result.text, cap)
                    if error is None:
                        text = result.text.strip()
                        write = self._write("topic", text, "final", *args, result=result, spent=spent)
                        if write.token_count < source:
                            return write
                        error = (
                            f"summary ({write.token_count} tokens) is not smaller than its source ({source})"
                        )
                except (Exception, asyncio.CancelledError) as exc:  # the LLM may fail in any way
                    _reraise_if_we_are_cancelled(exc)
                    error = f"{type(exc).__name__}: {exc}"[:500]
            spent = _spend_of(spent, result)
            log.warning("summariser failed for %s topic %s: %s", topic.conversation_id, topic.sequence, error)
        if topic.status == "provisional":
            # A retry that failed again: keep the existing extractive text, record the attempt
            # and what it cost.
            retry_at = now + timedelta(
                seconds=escalation.retry_delay(topic.attempts + 1, s.retry_backoff_seconds)
            )
            retry = SummaryWrite(
                content=topic.content,
                rendered=topic.rendered,
                token_count=topic.token_count,
                status="provisional" if topic.attempts + 1 < s.summary_max_attempts else "final",
                summarizer=topic.summarizer or "extractive",
                model=topic.model,
                next_attempt_at=retry_at,
                last_error=error,
            )
            return _charged(retry, spent)
        fb = await self.fallback.summarize(inputs, cap)
        provisional = error is not None
        first_retry: datetime | None = None
        if provisional:
            first_retry = now + timedelta(seconds=escalation.retry_delay(1, s.retry_backoff_seconds))
        status = "provisional" if provisional and s.summary_max_attempts > 1 else "final"
        return self._write(
            "topic", fb.text, status, *args, result=fb, error=error, next_attempt_at=first_retry, spent=spent
        )

    async def _merge(self, topics: Sequence[Summary]) -> SummaryWrite:
        pieces = [
            SummaryPiece(t.content, t.first_sequence, t.last_sequence, t.started_at, t.ended_at)
            for t in topics
        ]
        args = (
            topics[0].first_sequence,
            topics[-1].last_sequence,
            min(t.started_at for t in topics),
            max(t.ended_at for t in topics),
        )
        source = sum(self.counter.count(t.content) for t in topics)
        target = max(min(self._plan.bulk_target, source - 1), 1)
        error: str | None = None
        spent = Spend()
        if not isinstance(self.summarizer, ExtractiveSummarizer):
            result: Any = None
            with spend_ledger() as spent:
                try:
                    result = await self._call(self.summarizer.merge(pieces, target))
                    error = self._acceptable(result.text, target)
                    if error is None and self.counter.count(result.text) >= source:
                        error = "archive is not smaller than the summaries it merges"
                    if error is None:
                        return self._write(
                            "bulk", result.text.strip(), "final", *args, result=result, spent=spent
                        )
                except (Exception, asyncio.CancelledError) as exc:
                    _reraise_if_we_are_cancelled(exc)
                    error = f"{type(exc).__name__}: {exc}"[:500]
            spent = _spend_of(spent, result)
            log.warning("summariser merge failed for %s: %s", topics[0].conversation_id, error)
        fb = await self.fallback.merge(pieces, target)
        return self._write("bulk", fb.text, "final", *args, result=fb, error=error, spent=spent)

    # -- background scheduling (APScheduler) ------------------------------------------------

    async def start_background(self, interval_seconds: float | None = None) -> None:
        """Run ``maintain()`` every ``maintenance_interval_seconds`` inside this event loop."""
        from .scheduler import BackgroundMaintenance

        if self._background is None:
            await self._ready()
            self._background = BackgroundMaintenance(
                self, interval_seconds or self.settings.maintenance_interval_seconds
            )
            self._background.start()

    async def stop_background(self) -> None:
        if self._background is not None:
            await self._background.stop()
            self._background = None


def _spend_of(ledger: Spend, result: object) -> Spend:
    """What an attempt cost: the ledger if the summariser reports to it, else what its result says
    (a summariser may return anything: only well-formed numbers are taken)."""
    if ledger.calls:
        return ledger
    usage = [getattr(result, k, 0) for k in ("prompt_tokens", "completion_tokens", "cost")]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in usage):
        return ledger
    if not any(usage):
        return ledger
    model = getattr(result, "model", None)
    return Spend(1, int(usage[0]), int(usage[1]), float(usage[2]), model if isinstance(model, str) else None)


def _charged(write: SummaryWrite, spent: Spend | None) -> SummaryWrite:
    """``write`` carrying everything its attempt spent on model calls, accepted or not."""
    if spent is None or not spent.calls:
        return write
    return replace(
        write,
        model=write.model if write.summarizer != "extractive" else spent.model or write.model,
        prompt_tokens=spent.prompt_tokens,
        completion_tokens=spent.completion_tokens,
        cost=spent.cost,
    )


def _reraise_if_we_are_cancelled(exc: BaseException) -> None:
    """A summariser's own CancelledError is a failure; cancellation of maintain() itself is not."""
    task = asyncio.current_task()
    if isinstance(exc, asyncio.CancelledError) and task is not None and task.cancelling():
        raise exc


class _Verbatim:
    summarizer = "verbatim"
    model = None
    prompt_tokens = 0
    completion_tokens = 0
    cost = 0.0
    latency_ms = 0.0


def _speaker(m: StoredMessage) -> str:
    role = {"user": "User", "assistant": "Assistant", "system": "System", "tool": "Tool"}[m.role]
    return f"{m.name} ({m.role})" if m.name else role
