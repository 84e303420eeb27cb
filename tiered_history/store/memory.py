"""In-memory store with the same contract as the SQL store: for tests and throwaway bots.

State lives in plain dicts guarded by one asyncio lock, so every operation is
atomic; rows are frozen dataclasses replaced (never mutated) on change.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from ..errors import ConversationNotFoundError, InvalidMessageError
from ..models import ConversationStats, History, StoredMessage, Summary
from .base import (
    BoundaryPolicy,
    ContextRows,
    ConversationState,
    CoveredBudget,
    LeaseLostError,
    PreparedMessage,
    SummaryWrite,
    newest_summaries,
    newest_unit,
    newest_window,
)


@dataclass
class _Conversation:
    state: ConversationState
    last_clean_seq: int = 0
    topic_count: int = 0
    bulk_count: int = 0
    compressions: int = 0
    messages: list[StoredMessage] = field(default_factory=list)
    topics: list[Summary] = field(default_factory=list)
    archives: list[Summary] = field(default_factory=list)


class MemoryStore:
    """Keeps everything in this process; lost when it exits."""

    def __init__(self) -> None:
        self._convs: dict[str, _Conversation] = {}
        self._lock = asyncio.Lock()
        self._ids = itertools.count(1)

    async def initialize(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def _get(self, cid: str) -> _Conversation:
        conv = self._convs.get(cid)
        if conv is None:
            raise ConversationNotFoundError(f"no conversation {cid!r}")
        return conv

    def _fence(self, owner: str, cid: str) -> _Conversation:
        conv = self._convs.get(cid)
        if conv is None or conv.state.lease_owner != owner:
            raise LeaseLostError(cid)
        return conv

    # -- writing messages -----------------------------------------------------------------

    async def append(
        self,
        conversation_id: str,
        platform: str | None,
        prepared: PreparedMessage,
        policy: BoundaryPolicy,
        now: datetime,
    ) -> tuple[StoredMessage, Summary | None]:
        m = prepared.message
        async with self._lock:
            conv = self._convs.get(conversation_id)
            fresh = conv is None
            if conv is None:
                conv = _Conversation(
                    ConversationState(
                        id=conversation_id,
                        platform=platform,
                        encoding="",
                        last_sequence=0,
                        last_message_at=None,
                        topic_start_seq=1,
                        open_topic_tokens=0,
                        open_topic_messages=0,
                        open_tool_calls=[],
                        summarized_upto=0,
                        pinned_count=0,
                        needs_maintenance=False,
                        lease_owner=None,
                        lease_expires_at=None,
                        next_retry_at=None,
                    )
                )
            st = conv.state
            open_calls = list(st.open_tool_calls)
            if m.role == "tool" and m.tool_call_id not in open_calls:
                raise InvalidMessageError(
                    f"tool result {m.tool_call_id!r} answers no open tool call in this conversation "
                    "(add the assistant message with the matching tool_calls first)"
                )
            reason = policy(st.open_topic, prepared)
            if fresh:
                self._convs[conversation_id] = conv
            sealed = self._seal_locked(conv, reason, now) if reason else None
            st = conv.state
            seq = st.last_sequence + 1
            stored = prepared.stored(conversation_id, seq)
            conv.messages.append(stored)
            if m.tool_calls:
                open_calls = [str(c["id"]) for c in m.tool_calls]
                conv.last_clean_seq = seq - 1
            elif m.role == "tool":
                open_calls.remove(str(m.tool_call_id))
            elif not m.pinned:
                open_calls = []  # a new turn abandons calls that never got results
            if not open_calls:
                conv.last_clean_seq = seq
            conv.state = replace(
                st,
                platform=st.platform or platform,
                last_sequence=seq,
                last_message_at=m.timestamp
                if st.last_message_at is None or m.timestamp > st.last_message_at
                else st.last_message_at,
                open_topic_tokens=st.open_topic_tokens + (0 if m.pinned else prepared.token_count),
                open_topic_messages=st.open_topic_messages + 1,
                open_tool_calls=open_calls,
                pinned_count=st.pinned_count + int(m.pinned),
            )
            return stored, sealed

    def _seal_range(self, conv: _Conversation, reason: str, now: datetime, upto: int) -> Summary | None:
        st = conv.state
        first = st.topic_start_seq
        if upto < first:
            return None
        covered = [x for x in conv.messages if first <= x.sequence <= upto]
        conv.topic_count += 1
        topic = Summary(
            id=next(self._ids),
            conversation_id=st.id,
            tier="topic",
            sequence=conv.topic_count,
            first_sequence=first,
            last_sequence=upto,
            content="",
            rendered="",
            token_count=0,
            source_tokens=sum(x.full_token_count for x in covered if not x.pinned),
            started_at=min(x.timestamp for x in covered),
            ended_at=max(x.timestamp for x in covered),
            status="pending",
            sealed_at=now,
            sealed_reason=reason,
            created_at=now,
        )
        conv.topics.append(topic)
        rest = [x for x in conv.messages if x.sequence > upto]
        conv.state = replace(
            st,
            topic_start_seq=upto + 1,
            open_topic_messages=len(rest),
            open_topic_tokens=sum(x.token_count for x in rest if not x.pinned),
            needs_maintenance=True,
            next_retry_at=None,
        )
        return topic

    def _seal_locked(self, conv: _Conversation, reason: str, now: datetime) -> Summary | None:
        st = conv.state
        upto = st.last_sequence if not st.open_tool_calls else conv.last_clean_seq
        return self._seal_range(conv, reason, now, upto)

    async def seal(self, conversation_id: str, reason: str, now: datetime) -> Summary | None:
        async with self._lock:
            return self._seal_locked(self._get(conversation_id), reason, now)

    # -- reading --------------------------------------------------------------------------

    async def state(self, conversation_id: str) -> ConversationState | None:
        conv = self._convs.get(conversation_id)
        return None if conv is None else conv.state

    async def read_context(
        self, conversation_id: str, token_cap: int, covered_budget: CoveredBudget | None = None
    ) -> ContextRows:
        async with self._lock:
            conv = self._get(conversation_id)
            st = conv.state
            pinned = [x for x in conv.messages if x.pinned]
            unpinned = [x for x in conv.messages if not x.pinned]
            verbatim = newest_window([m for m in unpinned if m.sequence > st.summarized_upto], token_cap)
            if not verbatim:
                verbatim = newest_unit(unpinned)
            topics = [t for t in conv.topics if t.merged_into is None and t.status != "pending"]
            archives = [a for a in conv.archives if a.dropped_at is None]
            dropped = [a for a in conv.archives if a.dropped_at is not None]
            rows = ContextRows(
                st,
                pinned,
                verbatim,
                newest_summaries(topics, token_cap),
                newest_summaries(archives, token_cap),
            )
            want_dropped, want_covered = covered_budget(rows) if covered_budget else (0, 0)
            revived = False
            if want_dropped > 0:
                rows = replace(rows, dropped=newest_summaries(dropped, want_dropped))
                revived = bool(rows.dropped)
            if revived and covered_budget:
                _, want_covered = covered_budget(rows)  # revived archives take room first
            if want_covered > 0:
                below = min([st.summarized_upto + 1, *(m.sequence for m in verbatim)])
                covered = newest_window([m for m in unpinned if m.sequence < below], want_covered)
                rows = replace(rows, covered=covered)
            return rows

    async def history(self, conversation_id: str) -> History:
        async with self._lock:
            conv = self._get(conversation_id)
            return History(
                conversation_id=conversation_id,
                platform=conv.state.platform,
                messages=list(conv.messages),
                topics=list(conv.topics),
                archives=list(conv.archives),
                open_topic_start=conv.state.topic_start_seq,
            )

    async def search(self, conversation_id: str, text: str, limit: int) -> list[StoredMessage]:
        async with self._lock:
            conv = self._get(conversation_id)
            needle = text.lower()
            return [x for x in reversed(conv.messages) if needle in x.content.lower()][:limit]

    async def conversation_ids(self) -> list[str]:
        return sorted(self._convs)

    # -- background work ------------------------------------------------------------------

    async def claim(
        self,
        owner: str,
        now: datetime,
        lease_seconds: float,
        silence_before: datetime | None,
        conversation_id: str | None,
        limit: int,
        min_tokens: int = 0,
        after: str | None = None,
    ) -> list[ConversationState]:
        async with self._lock:
            out = []
            for cid in sorted(self._convs) if conversation_id is None else [conversation_id]:
                conv = self._convs.get(cid)
                if conv is None or (after is not None and cid <= after):
                    continue
                st = conv.state
                if (
                    st.lease_owner is not None
                    and st.lease_expires_at is not None
                    and st.lease_expires_at >= now
                ):
                    continue
                due = st.needs_maintenance and (st.next_retry_at is None or st.next_retry_at <= now)
                silent = (
                    silence_before is not None
                    and st.open_topic_messages > 0
                    and st.open_topic_tokens >= min_tokens
                    and st.last_message_at is not None
                    and st.last_message_at < silence_before
                )
                if conversation_id is None and not (due or silent):
                    continue
                conv.state = replace(
                    st, lease_owner=owner, lease_expires_at=now + timedelta(seconds=lease_seconds)
                )
                out.append(conv.state)
                if len(out) >= limit:
                    break
            return out

    async def renew(self, owner: str, conversation_id: str, until: datetime) -> bool:
        async with self._lock:
            conv = self._convs.get(conversation_id)
            if conv is None or conv.state.lease_owner != owner:
                return False
            conv.state = replace(conv.state, lease_expires_at=until)
            return True

    async def release(
        self, owner: str, conversation_id: str, needs_maintenance: bool, next_retry_at: datetime | None
    ) -> None:
        async with self._lock:
            conv = self._convs.get(conversation_id)
            if conv is None or conv.state.lease_owner != owner:
                return
            pending = any(t.status == "pending" for t in conv.topics)
            conv.state = replace(
                conv.state,
                lease_owner=None,
                lease_expires_at=None,
                needs_maintenance=pending or needs_maintenance,
                next_retry_at=None if pending else next_retry_at,
            )

    async def seal_if_silent(
        self, owner: str, conversation_id: str, silence_before: datetime, now: datetime, min_tokens: int = 0
    ) -> Summary | None:
        async with self._lock:
            conv = self._fence(owner, conversation_id)
            st = conv.state
            if (
                st.open_topic_messages == 0
                or st.last_message_at is None
                or st.last_message_at >= silence_before
            ):
                return None
            return self._seal_locked(conv, "silence", now)

    async def topics_to_summarize(
        self, conversation_id: str, now: datetime, max_attempts: int
    ) -> list[Summary]:
        async with self._lock:
            conv = self._get(conversation_id)
            return [
                t
                for t in conv.topics
                if t.merged_into is None
                and (
                    t.status == "pending"
                    or (
                        t.status == "provisional"
                        and t.attempts < max_attempts
                        and (t.next_attempt_at is None or t.next_attempt_at <= now)
                    )
                )
            ]

    async def next_retry(self, conversation_id: str, max_attempts: int) -> datetime | None:
        async with self._lock:
            conv = self._get(conversation_id)
            times = [
                t.next_attempt_at
                for t in conv.topics
                if t.status == "provisional" and t.merged_into is None and t.attempts < max_attempts
            ]
            known = [x for x in times if x is not None]
            return min(known) if known else None

    async def topic_messages(self, conversation_id: str, first: int, last: int) -> list[StoredMessage]:
        async with self._lock:
            conv = self._get(conversation_id)
            return [x for x in conv.messages[first - 1 : last] if not x.pinned]

    async def save_topic_summary(
        self, owner: str, topic: Summary, write: SummaryWrite, now: datetime
    ) -> bool:
        async with self._lock:
            conv = self._fence(owner, topic.conversation_id)
            idx = next((i for i, t in enumerate(conv.topics) if t.id == topic.id), None)
            if idx is None:
                return False
            cur = conv.topics[idx]
            if cur.status != topic.status or cur.attempts != topic.attempts or cur.merged_into is not None:
                return False
            conv.topics[idx] = replace(
                cur,
                content=write.content,
                rendered=write.rendered,
                token_count=write.token_count,
                status=write.status,  # type: ignore[arg-type]
                summarizer=write.summarizer,
                model=write.model,
                prompt_tokens=cur.prompt_tokens + write.prompt_tokens,
                completion_tokens=cur.completion_tokens + write.completion_tokens,
                cost=cur.cost + write.cost,
                latency_ms=write.latency_ms,
                attempts=cur.attempts + 1,
                next_attempt_at=write.next_attempt_at,
                last_error=write.last_error,
            )
            st = conv.state
            if st.summarized_upto == topic.first_sequence - 1:
                conv.state = replace(st, summarized_upto=topic.last_sequence)
            if topic.status == "pending":
                conv.compressions += 1
            return True

    async def active_summaries(self, conversation_id: str, tier: str) -> list[Summary]:
        async with self._lock:
            conv = self._get(conversation_id)
            if tier == "topic":
                return [t for t in conv.topics if t.merged_into is None and t.status != "pending"]
            return [a for a in conv.archives if a.dropped_at is None]

    async def save_archive(
        self, owner: str, conversation_id: str, topics: Sequence[Summary], write: SummaryWrite, now: datetime
    ) -> Summary | None:
        async with self._lock:
            conv = self._fence(owner, conversation_id)
            ids = {t.id for t in topics}
            current = [t for t in conv.topics if t.id in ids]
            if len(current) != len(topics) or any(
                t.merged_into is not None or t.status == "pending" for t in current
            ):
                return None
            conv.bulk_count += 1
            archive = Summary(
                id=next(self._ids),
                conversation_id=conversation_id,
                tier="bulk",
                sequence=conv.bulk_count,
                first_sequence=topics[0].first_sequence,
                last_sequence=topics[-1].last_sequence,
                content=write.content,
                rendered=write.rendered,
                token_count=write.token_count,
                source_tokens=sum(t.source_tokens for t in topics),
                started_at=min(t.started_at for t in topics),
                ended_at=max(t.ended_at for t in topics),
                status=write.status,  # type: ignore[arg-type]
                sealed_at=now,
                summarizer=write.summarizer,
                model=write.model,
                prompt_tokens=write.prompt_tokens,
                completion_tokens=write.completion_tokens,
                cost=write.cost,
                latency_ms=write.latency_ms,
                attempts=1,
                created_at=now,
            )
            conv.archives.append(archive)
            conv.topics = [replace(t, merged_into=archive.id) if t.id in ids else t for t in conv.topics]
            conv.compressions += 1
            return archive

    async def drop_archives(self, owner: str, conversation_id: str, ids: Sequence[int], now: datetime) -> int:
        async with self._lock:
            conv = self._fence(owner, conversation_id)
            wanted = set(ids)
            n = sum(1 for a in conv.archives if a.id in wanted and a.dropped_at is None)
            conv.archives = [
                replace(a, dropped_at=now) if a.id in wanted and a.dropped_at is None else a
                for a in conv.archives
            ]
            return n

    async def stats(self, conversation_id: str | None) -> list[ConversationStats]:
        async with self._lock:
            ids = sorted(self._convs) if conversation_id is None else [conversation_id]
            out = []
            for cid in ids:
                conv = self._get(cid)
                st = conv.state
                summaries = conv.topics + conv.archives
                out.append(
                    ConversationStats(
                        conversation_id=cid,
                        platform=st.platform,
                        messages=len(conv.messages),
                        message_tokens=sum(x.full_token_count for x in conv.messages),
                        topics=len(conv.topics),
                        topics_pending=sum(t.status == "pending" for t in conv.topics),
                        archives=len(conv.archives),
                        archives_dropped=sum(a.dropped_at is not None for a in conv.archives),
                        tier_tokens={
                            "current": sum(x.token_count for x in conv.messages[st.summarized_upto :]),
                            "topic": sum(t.token_count for t in conv.topics if t.merged_into is None),
                            "bulk": sum(a.token_count for a in conv.archives if a.dropped_at is None),
                        },
                        compressions=conv.compressions,
                        summarizer_prompt_tokens=sum(s.prompt_tokens for s in summaries),
                        summarizer_completion_tokens=sum(s.completion_tokens for s in summaries),
                        summarizer_cost=float(sum(s.cost for s in summaries)),
                    )
                )
            return out
