"""In-memory store (``memory://``): dicts behind one lock, for tests and throwaway bots.

It knows no domain rule: it applies the writes the core computes, under the same guards as
the SQL store. Rows are frozen dataclasses; their mutable fields (metadata, tool calls, extra
fields) are copied in and out, so nothing the caller holds can change stored history.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

from ..core.ranking import Query, Scored, bm25_term, phrase_count, words
from ..core.state import Committed, ConversationState, Guard, NewMessage, NewRef, NewSummary, Outcome, Writes
from ..models import ConversationStats, StoredMessage, Summary
from .base import ContextRequest, Hit, LeaseLostError, Snapshot, newest_summaries, newest_window

T = TypeVar("T")


def _copy(value: T) -> T:
    return copy.deepcopy(value) if value else value


def _detached(m: StoredMessage) -> StoredMessage:
    if not (m.metadata or m.tool_calls or m.extra):
        return m
    return replace(m, metadata=_copy(m.metadata), tool_calls=_copy(m.tool_calls), extra=_copy(m.extra))


def to_stored(cid: str, m: NewMessage) -> StoredMessage:
    """The record of a message row as every store returns it."""
    name = tool_calls = tool_call_id = wire = None
    if m.wire:  # (most messages: a string content and nothing else)
        wire = dict(m.wire)
        name = wire.pop("name", None)
        tool_calls = wire.pop("tool_calls", None)
        tool_call_id = wire.pop("tool_call_id", None)
    return StoredMessage(
        conversation_id=cid,
        sequence=m.sequence,
        role=m.role,  # type: ignore[arg-type]
        content=m.content,
        timestamp=m.timestamp,
        token_count=m.token_count,
        full_token_count=m.full_token_count,
        name=name,
        tool_calls=tool_calls,
        tool_call_id=tool_call_id,
        pinned=m.pinned,
        metadata=dict(m.metadata or {}),
        extra=wire or None,
        pin_key=m.pin_key,
    )


def to_summary(cid: str, row_id: int, s: NewSummary, ids: Sequence[int] = ()) -> Summary:
    parent = ids[s.parent.index] if isinstance(s.parent, NewRef) else s.parent
    return Summary(
        id=row_id,
        conversation_id=cid,
        tier="topic" if s.kind == "topic" else "bulk",
        sequence=s.ordinal,
        first_sequence=s.first_sequence,
        last_sequence=s.last_sequence,
        content=s.content,
        rendered=s.rendered,
        token_count=s.token_count,
        source_tokens=s.source_tokens,
        started_at=s.started_at,
        ended_at=s.ended_at,
        status=s.status,  # type: ignore[arg-type]
        sealed_at=s.sealed_at,
        sealed_reason=s.sealed_reason,
        summarizer=s.summarizer,
        model=s.model,
        prompt_tokens=s.prompt_tokens,
        completion_tokens=s.completion_tokens,
        cost=s.cost,
        latency_ms=s.latency_ms,
        attempts=s.attempts,
        created_at=s.created_at,
        next_attempt_at=s.next_attempt_at,
        last_error=s.last_error,
        level=s.level,
        merged_into=parent,
        dropped_at=s.dropped_at,
    )


#: Columns whose update adds to the stored value (spend accumulates over attempts).
ADDITIVE = frozenset({"prompt_tokens", "completion_tokens", "cost"})
#: Update columns named as in the schema, where the record's field has another name.
_FIELD = {"parent_id": "merged_into"}


class _Index:
    """An inverted index of one kind of document (messages by sequence, summaries by id)."""

    def __init__(self) -> None:
        self.postings: dict[str, dict[int, int]] = {}
        self.docs: dict[int, list[str]] = {}
        self.total = 0

    def put(self, key: int, text: str) -> None:
        self.remove(key)
        found = words(text)
        self.docs[key] = found
        self.total += len(found)
        for w, n in Counter(found).items():
            self.postings.setdefault(w, {})[key] = n

    def remove(self, key: int) -> None:
        old = self.docs.pop(key, None)
        if old is None:
            return
        self.total -= len(old)
        for w in set(old):
            self.postings[w].pop(key, None)

    def rank(self, query: Query, recency: Callable[[int], int], keep: Callable[[int], bool]) -> list[Scored]:
        """BM25 of every matching document (core.ranking's formula, this index's statistics)."""
        n = len(self.docs)
        if not n:
            return []
        avg = self.total / n
        scores: dict[int, float] = {}
        for i, group in enumerate(query.groups):
            lists = [self.postings.get(w, {}) for w in group]
            if len(group) == 1:
                tfs = dict(lists[0])
            else:
                keys = set(sorted(lists, key=len)[0]).intersection(*lists)
                tfs = {k: c for k in keys if (c := phrase_count(self.docs[k], group))}
            for key, tf in tfs.items():
                term = bm25_term(tf, len(tfs), n, len(self.docs[key]), avg)
                scores[key] = scores.get(key, 0.0) + query.weight(i) * term
        out = [Scored(k, v, recency(k)) for k, v in scores.items() if keep(k)]
        out.sort(key=lambda x: (-x.score, -x.recency))
        return out


@dataclass
class _Conversation:
    state: ConversationState
    messages: list[StoredMessage] = field(default_factory=list)
    summaries: dict[int, Summary] = field(default_factory=dict)
    message_index: _Index = field(default_factory=_Index)
    summary_index: _Index = field(default_factory=_Index)


class MemoryStore:
    """Keeps everything in this process; lost when it exits. Never blocks."""

    blocking = False

    def __init__(self) -> None:
        self._convs: dict[str, _Conversation] = {}
        self._lock = threading.RLock()
        self._ids = itertools.count(1)

    def initialize(self) -> None:
        return None

    def close(self) -> None:
        return None

    # -- reads ---------------------------------------------------------------------------------

    def read_state(self, conversation_id: str) -> ConversationState | None:
        with self._lock:
            conv = self._convs.get(conversation_id)
            return None if conv is None else conv.state

    def read_context(
        self, conversation_id: str, request: ContextRequest, expect_version: int | None = None
    ) -> Snapshot | None:
        with self._lock:
            conv = self._convs.get(conversation_id)
            if conv is None or (expect_version is not None and conv.state.version != expect_version):
                return None
            state = conv.state
            pinned_seqs = set(state.pinned_sequences)
            pinned = [_detached(conv.messages[s - 1]) for s in sorted(pinned_seqs)]
            windows = []
            for w in request.windows:
                rows = [m for m in conv.messages[w.lo : w.hi] if not m.pinned]
                windows.append([_detached(m) for m in newest_window(rows, w.token_cap)])
            summaries = []
            ordered = sorted(conv.summaries.values(), key=lambda s: s.sequence)
            for sw in request.summaries:
                picked = [
                    s
                    for s in ordered
                    if s.tier == sw.kind and s.sequence > sw.after and _selected(s, sw.merged, sw.upto)
                ]
                summaries.append(newest_summaries(picked, sw.token_cap))
            by_id = [conv.summaries[i] for i in request.summary_ids if i in conv.summaries]
            return Snapshot(state, pinned, windows, summaries, by_id)

    def read_messages(self, conversation_id: str, first: int, last: int) -> list[StoredMessage]:
        with self._lock:
            conv = self._convs.get(conversation_id)
            if conv is None:
                return []
            return [_detached(m) for m in conv.messages[max(first, 1) - 1 : max(last, 0)]]

    def read_summaries(self, conversation_id: str, kind: str, after: int = 0) -> list[Summary]:
        with self._lock:
            conv = self._convs.get(conversation_id)
            if conv is None:
                return []
            rows = [s for s in conv.summaries.values() if s.tier == kind and s.sequence > after]
            return sorted(rows, key=lambda s: s.sequence)

    def search(self, conversation_id: str, query: Query, limit: int, kind: str = "message") -> list[Hit]:
        with self._lock:
            conv = self._convs.get(conversation_id)
            if conv is None or query.empty:
                return []
            if query.literal is not None:
                needle = query.literal.lower()
                found = [m for m in reversed(conv.messages) if needle in m.content.lower()][:limit]
                return [Hit(1.0, message=_detached(m)) for m in found]
            if kind == "message":
                ranked = conv.message_index.rank(query, lambda seq: seq, lambda seq: True)
                return [Hit(r.score, message=_detached(conv.messages[r.key - 1])) for r in ranked[:limit]]
            summaries = conv.summaries
            ranked = conv.summary_index.rank(
                query,
                lambda i: summaries[i].last_sequence,
                lambda i: summaries[i].status not in ("pending", "superseded"),
            )
            return [Hit(r.score, summary=summaries[r.key]) for r in ranked[:limit]]

    def search_each(
        self, conversation_id: str, query: Query, limits: Mapping[str, int]
    ) -> dict[str, list[Hit]]:
        with self._lock:  # re-entrant: the searches see one state
            return {kind: self.search(conversation_id, query, n, kind) for kind, n in limits.items()}

    def conversation_ids(self) -> list[str]:
        with self._lock:
            return sorted(self._convs)

    def list_conversations(
        self, platform: str | None, after: str | None, limit: int
    ) -> list[ConversationState]:
        with self._lock:
            out = [
                c.state
                for cid, c in sorted(self._convs.items())
                if (after is None or cid > after) and (platform is None or c.state.platform == platform)
            ]
            return out[:limit]

    def stats(self, conversation_id: str | None) -> list[ConversationStats]:
        with self._lock:
            ids = sorted(self._convs) if conversation_id is None else [conversation_id]
            return [_stats(self._convs[c]) for c in ids if c in self._convs]

    # -- writes --------------------------------------------------------------------------------

    def commit(self, conversation_id: str, guard: Guard, writes: Writes) -> Committed:
        with self._lock:
            conv = self._convs.get(conversation_id)
            if guard.lease_owner is not None and (
                conv is None or conv.state.lease_owner != guard.lease_owner
            ):
                raise LeaseLostError(conversation_id)
            if conv is None:
                if guard.version is not None or not writes.create:
                    return Committed(Outcome.VERSION_CONFLICT)
            elif writes.create or conv.state.version != guard.version:
                return Committed(Outcome.VERSION_CONFLICT)
            have = len(conv.messages) if conv is not None else 0
            if [m.sequence for m in writes.messages] != list(
                range(have + 1, have + 1 + len(writes.messages))
            ):
                return Committed(Outcome.VERSION_CONFLICT)  # a sequence taken already (a unique key in SQL)
            summaries = conv.summaries if conv is not None else {}
            for u in writes.updates:
                row = summaries.get(_row_id(summaries, u))
                if u.required and (row is None or not _matches(row, u)):
                    return Committed(Outcome.ROW_CONFLICT)
            # Every check passed: apply it all (nothing below can fail).
            lease = (
                (conv.state.lease_owner, conv.state.lease_expires_at) if conv is not None else (None, None)
            )
            if writes.release and guard.lease_owner is not None and lease[0] == guard.lease_owner:
                lease = (None, None)
            if conv is None:
                conv = self._convs[conversation_id] = _Conversation(writes.state)
            conv.state = replace(writes.state, lease_owner=lease[0], lease_expires_at=lease[1])
            for m in writes.messages:
                conv.messages.append(_detached(to_stored(conversation_id, m)))
                conv.message_index.put(m.sequence, m.content)
            ids = []
            for s in writes.summaries:
                row_id = next(self._ids)
                ids.append(row_id)
                conv.summaries[row_id] = to_summary(conversation_id, row_id, s, ids)
                conv.summary_index.put(row_id, s.content)
            for u in writes.updates:
                row_id = _row_id(conv.summaries, u)
                row = conv.summaries.get(row_id)
                if row is None or not _matches(row, u):
                    continue
                values: dict[str, Any] = {}
                for key, value in u.values.items():
                    name = _FIELD.get(key, key)
                    if isinstance(value, NewRef):
                        value = ids[value.index]
                    if key in ADDITIVE:
                        value = getattr(row, name) + value
                    values[name] = value
                conv.summaries[row_id] = replace(row, **values)
                if "content" in values:
                    conv.summary_index.put(row_id, values["content"])
            return Committed(Outcome.COMMITTED, tuple(ids), writes)

    def update(
        self,
        conversation_id: str,
        plan: Callable[[ConversationState | None], Writes | None],
        lease_owner: str | None = None,
    ) -> Committed:
        with self._lock:
            conv = self._convs.get(conversation_id)
            state = None if conv is None else conv.state
            if lease_owner is not None and (state is None or state.lease_owner != lease_owner):
                raise LeaseLostError(conversation_id)
            writes = plan(state)
            if writes is None:
                return Committed(Outcome.COMMITTED)
            return self.commit(
                conversation_id, Guard(None if state is None else state.version, lease_owner), writes
            )

    def delete(self, conversation_id: str) -> bool:
        with self._lock:
            return self._convs.pop(conversation_id, None) is not None

    # -- leases --------------------------------------------------------------------------------

    def claim(
        self,
        owner: str,
        now: datetime,
        lease_seconds: float,
        limit: int,
        after: str | None = None,
        conversation_id: str | None = None,
    ) -> list[str]:
        with self._lock:
            out: list[str] = []
            for cid in sorted(self._convs):
                if len(out) >= limit:
                    break
                if after is not None and cid <= after:
                    continue
                if conversation_id is not None and cid != conversation_id:
                    continue
                s = self._convs[cid].state
                if s.lease_owner is not None and s.lease_expires_at is not None and s.lease_expires_at >= now:
                    continue
                due = s.due_at
                if conversation_id is None and (due is None or due > now):
                    continue
                self._convs[cid].state = replace(
                    s, lease_owner=owner, lease_expires_at=now + timedelta(seconds=lease_seconds)
                )
                out.append(cid)
            return out

    def renew(self, owner: str, conversation_id: str, until: datetime) -> bool:
        with self._lock:
            conv = self._convs.get(conversation_id)
            if conv is None or conv.state.lease_owner != owner:
                return False
            conv.state = replace(conv.state, lease_expires_at=until)
            return True

    def release(self, owner: str, conversation_id: str) -> None:
        with self._lock:
            conv = self._convs.get(conversation_id)
            if conv is not None and conv.state.lease_owner == owner:
                conv.state = replace(conv.state, lease_owner=None, lease_expires_at=None)


def _row_id(summaries: dict[int, Summary], u: Any) -> int:
    """The id an update names: its own, or that of the topic with its ordinal."""
    if u.ordinal is None:
        return int(u.id)
    return next((i for i, s in summaries.items() if s.tier == "topic" and s.sequence == u.ordinal), 0)


def _selected(s: Summary, merged: bool, upto: int | None) -> bool:
    if upto is not None:
        return s.dropped_at is not None and s.sequence <= upto
    if s.dropped_at is not None or s.status in ("pending", "superseded"):
        return False
    return (s.merged_into is not None) == merged


def _matches(row: Summary, u: Any) -> bool:
    if u.expect_status is not None and row.status != u.expect_status:
        return False
    if u.expect_attempts is not None and row.attempts != u.expect_attempts:
        return False
    if u.expect_unmerged and row.merged_into is not None:
        return False
    if u.expect_not_pending and row.status == "pending":
        return False
    return not (u.expect_undropped and row.dropped_at is not None)


def _stats(conv: _Conversation) -> ConversationStats:
    s = conv.state
    topics = [x for x in conv.summaries.values() if x.tier == "topic"]
    archives = [x for x in conv.summaries.values() if x.tier == "bulk"]
    live = [x for x in conv.summaries.values() if x.merged_into is None and x.dropped_at is None]
    spend: Sequence[Summary] = list(conv.summaries.values())
    return ConversationStats(
        conversation_id=s.id,
        platform=s.platform,
        messages=len(conv.messages),
        message_tokens=sum(m.full_token_count for m in conv.messages),
        topics=len(topics),
        topics_pending=sum(t.status == "pending" for t in topics),
        archives=len(archives),
        archives_dropped=sum(a.dropped_at is not None for a in archives),
        tier_tokens={
            "current": sum(m.token_count for m in conv.messages if m.sequence > s.summarized_upto),
            "topic": sum(x.token_count for x in live if x.tier == "topic"),
            "bulk": sum(x.token_count for x in live if x.tier == "bulk"),
        },
        compressions=s.compressions,
        summarizer_prompt_tokens=sum(x.prompt_tokens for x in spend),
        summarizer_completion_tokens=sum(x.completion_tokens for x in spend),
        summarizer_cost=float(sum(x.cost for x in spend)),
        summaries_provisional=sum(x.status == "provisional" and x.merged_into is None for x in spend),
    )
