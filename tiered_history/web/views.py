"""What the pages show, computed from the library's public types (pure: no I/O, no web framework)."""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .. import CompressedContext, SearchHit, StoredMessage, Summary
from ..core.excerpt import ELLIPSIS

#: Tiers in the order the model reads them, with the labels the page shows.
TIER_LABELS = {
    "pinned": "pinned",
    "bulk": "bulk archives",
    "topic": "topic summaries",
    "recall": "recalled",
    "recent": "recent topics (verbatim)",
    "current": "current topic",
    "framing": "framing",
}
#: The tiers the 50/30/20 shares are allotted to.
SHARED_TIERS = ("current", "topic", "bulk")
#: Most messages of one tier listed at once; the rest are loaded on demand.
TIER_LIST_LIMIT = 400


@dataclass(frozen=True, slots=True)
class Item:
    """One message or summary as the page shows it."""

    tier: str
    role: str
    label: str
    content: str
    tokens: int
    when: datetime | None = None
    first: int | None = None
    last: int | None = None
    note: str = ""


@dataclass(frozen=True, slots=True)
class Gap:
    """Messages of a long tier that are not listed inline (loaded on demand)."""

    tier: str
    first: int
    last: int
    count: int


@dataclass(frozen=True, slots=True)
class Segment:
    """One part of a tier bar, in percent of the bar's width."""

    tier: str
    label: str
    x: float
    width: float
    fill: float
    used: int
    allotted: int | None


@dataclass(frozen=True, slots=True)
class RecallGroup:
    query: str
    items: list[Item]


@dataclass(frozen=True, slots=True)
class ContextView:
    max_tokens: int
    total_tokens: int
    compression_ratio: float
    omitted_messages: int
    truncated_newest: bool
    shares: list[Segment]
    """The allotted tiers, each as wide as its share, filled by the tokens it used."""
    usage: list[Segment]
    """Every tier's tokens stacked against ``max_tokens``."""
    rows: list[Item | Gap]
    recall: list[RecallGroup]
    counts: dict[str, int]


def message_item(m: StoredMessage, tier: str) -> Item:
    notes = []
    if m.pinned:
        notes.append("pinned" + (f" as {m.pin_key!r}" if m.pin_key else ""))
    if m.truncated_content is not None and tier == "recall" and ELLIPSIS in m.truncated_content:
        notes.append(f"excerpt: the sentences that match sent ({m.full_token_count} tokens stored)")
    elif m.truncated_content is not None:
        notes.append(f"too long: head and tail sent ({m.full_token_count} tokens stored)")
    if m.name:
        notes.append(f"name {m.name}")
    if m.tool_call_id:
        notes.append(f"answers tool call {m.tool_call_id}")
    content = m.context_content
    if m.tool_calls:
        calls = ", ".join(
            f"{c.get('function', {}).get('name', '?')}({c.get('function', {}).get('arguments', '')})"
            for c in m.tool_calls
        )
        content = f"[tool calls: {calls}]\n{content}".rstrip()
    return Item(
        tier=tier,
        role=m.role,
        label=f"#{m.sequence}",
        content=content,
        tokens=m.token_count,
        when=m.timestamp,
        first=m.sequence,
        last=m.sequence,
        note="; ".join(notes),
    )


def summary_item(s: Summary, tier: str) -> Item:
    kind = "archive" if s.tier == "bulk" else "topic"
    return Item(
        tier=tier,
        role=kind,
        label=f"{kind} {s.sequence} · messages {s.first_sequence}–{s.last_sequence}",
        content=s.rendered or s.content,
        tokens=s.token_count,
        when=s.ended_at,
        first=s.first_sequence,
        last=s.last_sequence,
        note=f"{s.status}, represents {s.source_tokens} tokens"
        + (", set aside but sent: the budget had room" if s.dropped_at else ""),
    )


def _listed(messages: Sequence[StoredMessage], tier: str, limit: int) -> list[Item | Gap]:
    """The tier's messages, or its first and newest ones around a gap loaded on demand."""
    if len(messages) <= limit:
        return [message_item(m, tier) for m in messages]
    head = limit // 8
    tail = limit - head
    hidden = messages[head : len(messages) - tail]
    return [
        *(message_item(m, tier) for m in messages[:head]),
        Gap(tier, hidden[0].sequence, hidden[-1].sequence, len(hidden)),
        *(message_item(m, tier) for m in messages[len(messages) - tail :]),
    ]


def _share_segments(ctx: CompressedContext) -> list[Segment]:
    total = sum(max(ctx.allocation.get(t, 0), 0) for t in SHARED_TIERS)
    out: list[Segment] = []
    x = 0.0
    for tier in SHARED_TIERS:
        allotted = max(ctx.allocation.get(tier, 0), 0)
        used = ctx.tier_tokens.get(tier, 0)
        width = 100.0 * allotted / total if total else 100.0 / len(SHARED_TIERS)
        ratio = min(used / allotted, 1.0) if allotted else (1.0 if used else 0.0)
        out.append(
            Segment(
                tier, TIER_LABELS[tier], round(x, 3), round(width, 3), round(width * ratio, 3), used, allotted
            )
        )
        x += width
    return out


def _usage_segments(ctx: CompressedContext) -> list[Segment]:
    out: list[Segment] = []
    x = 0.0
    scale = 100.0 / ctx.max_tokens if ctx.max_tokens else 0.0
    for tier in ("pinned", "bulk", "topic", "recall", "recent", "current", "framing"):
        used = ctx.tier_tokens.get(tier, 0)
        if tier not in ctx.tier_tokens and tier not in SHARED_TIERS:
            continue
        width = min(used * scale, 100.0 - x)
        out.append(
            Segment(tier, TIER_LABELS[tier], round(x, 3), round(width, 3), round(width, 3), used, None)
        )
        x += width
    return out


def _recall_item(hit: object) -> Item | None:
    for name in ("message", "summary", "item"):
        inner = getattr(hit, name, None)
        if isinstance(inner, StoredMessage | Summary):
            hit = inner
            break
    if isinstance(hit, StoredMessage):
        return message_item(hit, "recall")
    if isinstance(hit, Summary):
        return summary_item(hit, "recall")
    return None


def recall_groups(ctx: object) -> list[RecallGroup]:
    """The ``recall`` part of a context, if the library's context has one: what was recalled for
    which query. Accepts a mapping ``{query: hits}``, objects with ``query`` and ``items`` /
    ``hits`` / ``messages``, or bare hits (each maybe with its own ``query``)."""
    raw: Any = getattr(ctx, "recall", None)
    if not raw:
        return []
    pairs: list[tuple[str, Iterable[object]]] = []
    if isinstance(raw, Mapping):
        pairs = [(str(q), hits if isinstance(hits, Iterable) else [hits]) for q, hits in raw.items()]
    else:
        entries = raw if isinstance(raw, Iterable) else [raw]
        for entry in entries:
            hits = next(
                (
                    getattr(entry, n)
                    for n in ("items", "hits", "messages")
                    if getattr(entry, n, None) is not None
                ),
                None,
            )
            query = getattr(entry, "query", None)
            pairs.append((str(query) if query is not None else "", hits if hits is not None else [entry]))
    groups: dict[str, list[Item]] = {}
    for query, hits in pairs:
        items = [i for i in (_recall_item(h) for h in hits) if i is not None]
        if items:
            groups.setdefault(query, []).extend(items)
    return [RecallGroup(q, items) for q, items in groups.items()]


def context_view(ctx: CompressedContext, limit: int = TIER_LIST_LIMIT) -> ContextView:
    recall = recall_groups(ctx)
    rows: list[Item | Gap] = [message_item(m, "pinned") for m in ctx.pinned]
    rows += [summary_item(s, "bulk") for s in ctx.bulk_archives]
    rows += [summary_item(s, "topic") for s in ctx.historical_topics]
    rows += [i for g in recall for i in g.items]
    rows += _listed(ctx.recent_topics, "recent", limit)
    rows += _listed(ctx.current_topic, "current", limit)
    return ContextView(
        max_tokens=ctx.max_tokens,
        total_tokens=ctx.total_tokens,
        compression_ratio=ctx.compression_ratio,
        omitted_messages=ctx.omitted_messages,
        truncated_newest=ctx.truncated_newest,
        shares=_share_segments(ctx),
        usage=_usage_segments(ctx),
        rows=rows,
        recall=recall,
        counts={
            "pinned": len(ctx.pinned),
            "bulk": len(ctx.bulk_archives),
            "topic": len(ctx.historical_topics),
            "recall": sum(len(g.items) for g in recall),
            "recent": len(ctx.recent_topics),
            "current": len(ctx.current_topic),
        },
    )


# -- timeline ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicRow:
    topic: Summary
    archives: list[Summary]
    """The archive that merged this topic, then the archives that merged that one, in order."""

    @property
    def messages(self) -> int:
        return self.topic.last_sequence - self.topic.first_sequence + 1


@dataclass(frozen=True, slots=True)
class Timeline:
    rows: list[TopicRow]
    """One page of topics, newest first."""
    older: int | None
    """Ordinal to continue from (the next page holds topics with a smaller one), if any."""
    archives: list[Summary]
    """One page of archives, newest first."""
    older_archives: int | None
    open_first: int
    open_last: int
    """The open topic's message range (empty when ``open_first > open_last``)."""
    total_topics: int
    total_archives: int


def _chain(start: int | None, archives: Mapping[int, Summary]) -> list[Summary]:
    chain: list[Summary] = []
    seen: set[int] = set()
    while start is not None and start in archives and start not in seen:
        seen.add(start)
        chain.append(archives[start])
        start = archives[start].merged_into
    return chain


def newest_page(rows: Sequence[Summary], before: int | None, page: int) -> tuple[list[Summary], int | None]:
    """Up to ``page`` rows with ordinal < ``before``, newest first, and the ordinal to continue from."""
    ordered = sorted(rows, key=lambda r: r.sequence, reverse=True)
    if before is not None:
        ordered = [r for r in ordered if r.sequence < before]
    shown = ordered[:page]
    return shown, (shown[-1].sequence if len(ordered) > page else None)


def timeline(
    topics: Sequence[Summary],
    archives: Sequence[Summary],
    last_sequence: int,
    page: int,
    before: int | None = None,
    archives_before: int | None = None,
) -> Timeline:
    """A page of topics (each with the archives that cover it) and a page of archives."""
    by_id = {a.id: a for a in archives}
    shown, older = newest_page(topics, before, page)
    shown_archives, older_archives = newest_page(archives, archives_before, page)
    return Timeline(
        rows=[TopicRow(t, _chain(t.merged_into, by_id)) for t in shown],
        older=older,
        archives=shown_archives,
        older_archives=older_archives,
        open_first=max((t.last_sequence for t in topics), default=0) + 1,
        open_last=last_sequence,
        total_topics=len(topics),
        total_archives=len(archives),
    )


def topic_of(sequence: int, topics: Sequence[Summary]) -> Summary | None:
    """The topic whose message range holds ``sequence`` (None: the open topic)."""
    ordered = sorted(topics, key=lambda t: t.first_sequence)
    i = bisect.bisect_right([t.first_sequence for t in ordered], sequence) - 1
    if i >= 0 and ordered[i].first_sequence <= sequence <= ordered[i].last_sequence:
        return ordered[i]
    return None


# -- search -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hit:
    message: Item
    parts: list[tuple[str, bool]]
    """The text around the matches: (text, is a match), to render with each part escaped."""
    topic: Summary | None


def highlight(text: str, query: str, width: int = 480) -> list[tuple[str, bool]]:
    """``text`` (cut to about ``width`` characters around the first match) split into matching
    and non-matching parts, case-insensitively."""
    needle = query.strip()
    if not needle:
        return [(text[:width] + ("…" if len(text) > width else ""), False)]
    pattern = re.compile(re.escape(needle), re.IGNORECASE)
    first = pattern.search(text)
    start, end = 0, len(text)
    if len(text) > width:
        centre = first.start() if first else 0
        start = max(0, centre - width // 3)
        end = min(len(text), start + width)
    parts: list[tuple[str, bool]] = [("…", False)] if start > 0 else []
    pos = start
    for m in pattern.finditer(text, start, end):
        if m.start() > pos:
            parts.append((text[pos : m.start()], False))
        parts.append((m.group(), True))
        pos = m.end()
    if pos < end:
        parts.append((text[pos:end], False))
    if end < len(text):
        parts.append(("…", False))
    return parts


def hits(found: Sequence[SearchHit], query: str, topics: Sequence[Summary]) -> list[Hit]:
    """Search results as rows; a hit's own topic wins over a lookup in ``topics``."""
    return [
        Hit(
            message_item(h.message, "hit"),
            highlight(h.content, query),
            h.topic or topic_of(h.sequence, topics),
        )
        for h in found
    ]


# -- formatting -------------------------------------------------------------------------------


def when(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if value else "–"


def money(value: float) -> str:
    return f"${value:,.4f}" if value else "$0"


def number(value: int | float) -> str:
    return f"{value:,}"
