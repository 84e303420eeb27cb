"""One QMSum meeting through every system at every budget (runs in a worker process).

Each system replays the meeting once per budget. Its end-of-meeting context gives the
static retention of every query of the meeting; then each query is stored as the
newest user message (on a copy: the queries do not see each other) and the context
built then gives its query retention.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench._common import WarningCounter
from tiered_history import CompressedContext

from . import peers
from .data import TURN_SECONDS, Meeting, content_words, context_text, load_meeting, retention
from .systems import CONVERSATION, OURS, SYSTEMS, Ours, Shared

#: Where an evidence turn is in our final context.
TIERS = ("verbatim", "topic summary", "archive", "not in context")
#: The two retention measures; ``--only`` picks among them (and ``prefix``).
STATIC, QUERY = "static", "query"


@dataclass
class TierTally:
    """Evidence words by the tier their turn sits in, and how many of them the context keeps."""

    words: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    kept: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))

    def add(self, other: TierTally) -> None:
        for t in TIERS:
            self.words[t] += other.words[t]
            self.kept[t] += other.kept[t]


@dataclass
class BudgetResult:
    static: dict[str, list[float]] = field(default_factory=dict)
    """Per system, one static retention value per query (in query order)."""
    query: dict[str, list[float]] = field(default_factory=dict)
    """Per system, one query retention value per query (in query order)."""
    static_used: dict[str, int] = field(default_factory=dict)
    """Per system, framed tokens of the end-of-meeting context."""
    query_used: dict[str, list[int]] = field(default_factory=dict)
    """Per system, framed tokens of each query's context."""
    full_fits: bool = False
    tiers: TierTally = field(default_factory=TierTally)
    ours_shape: str = ""
    cost: dict[str, peers.Cost] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    """Per system, seconds of the replay (every message, maintenance, the end-of-meeting context)."""
    query_seconds: dict[str, float] = field(default_factory=dict)
    """Per system, seconds spent answering all queries (copies of the store included)."""
    summary_keep: tuple[int, int] = (0, 0)
    """Evidence words whose turn a summary in the context covers: (found in summary texts, total)."""


@dataclass
class MeetingResult:
    id: str
    domain: str
    messages: int
    tokens: int
    queries: int
    skipped_turns: int
    dropped_queries: int
    budgets: dict[int, BudgetResult]
    fallback_warnings: int
    query_texts: tuple[str, ...] = ()


def without_query(messages: Sequence[Mapping[str, Any]], query: str) -> list[Mapping[str, Any]]:
    """``messages`` less the newest user message that is the query itself.

    Its words would count for every system alike (each keeps the newest message), so
    they are not scored: retention measures what a context brings beyond the question.
    """
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.get("role") == "user" and m.get("content") == query:
            return [*messages[:i], *messages[i + 1 :]]
    return list(messages)


def _tiers(
    meeting: Meeting, ctx: CompressedContext, text_of_summaries: set[str]
) -> tuple[TierTally, int, int]:
    verbatim = {m.sequence for m in ctx.current_topic} | {m.sequence for m in ctx.pinned}
    verbatim |= {m.sequence for m in ctx.recent_topics}
    topics = [(s.first_sequence, s.last_sequence) for s in ctx.historical_topics]
    archives = [(s.first_sequence, s.last_sequence) for s in ctx.bulk_archives]
    words = content_words(context_text(ctx.to_messages()))
    seq_of = {t.index: t for t in meeting.turns}
    tally = TierTally()
    in_summary_kept = in_summary_total = 0
    rank = {t: i for i, t in enumerate(TIERS)}
    for q in meeting.queries:
        best: dict[str, str] = {}
        for idx in q.turns:
            turn = seq_of.get(idx)
            if turn is None:
                continue
            s = turn.sequence
            if s in verbatim:
                tier = "verbatim"
            elif any(a <= s <= b for a, b in topics):
                tier = "topic summary"
            elif any(a <= s <= b for a, b in archives):
                tier = "archive"
            else:
                tier = "not in context"
            for w in content_words(turn.content):
                if w not in best or rank[tier] < rank[best[w]]:
                    best[w] = tier
        for w, tier in best.items():
            tally.words[tier] += 1
            tally.kept[tier] += w in words
            if tier in {"topic summary", "archive"}:
                in_summary_total += 1
                in_summary_kept += w in text_of_summaries
    return tally, in_summary_kept, in_summary_total


async def run_budget(shared: Shared, budget: int, sections: Collection[str]) -> BudgetResult:
    meeting = shared.meeting
    counter = shared.counter
    out = BudgetResult(full_fits=peers.recency(shared.costs, budget) == 0)
    asked_at = meeting.turns[-1].timestamp + timedelta(seconds=TURN_SECONDS)
    for system in SYSTEMS:
        wanted = (STATIC in sections and system.static) or (QUERY in sections and system.query)
        if system.make is None or not wanted:
            continue
        name = system.name
        t = time.perf_counter()
        replay = system.make(shared, budget)
        try:
            for turn in meeting.turns:
                await replay.add(turn)
            await replay.end()
            if STATIC in sections and system.static:
                msgs = await replay.context()
                out.static_used[name] = counter.messages_tokens(msgs)
                words = content_words(context_text(msgs))
                out.static[name] = [retention(set(q.words), words) for q in meeting.queries]
                if name == OURS and isinstance(replay, Ours) and replay.final is not None:
                    ctx = replay.final
                    summaries = "\n".join(s.content for s in [*ctx.bulk_archives, *ctx.historical_topics])
                    out.tiers, sk, st = _tiers(meeting, ctx, content_words(summaries))
                    out.summary_keep = (sk, st)
                    stats = (await replay.h.stats(CONVERSATION))[0]
                    out.ours_shape = (
                        f"{stats.topics} topics, {stats.archives} archives ({stats.archives_dropped} "
                        f"dropped); context {len(ctx.current_topic)} msgs + {len(ctx.recent_topics)} "
                        f"recent-topic msgs + {len(ctx.historical_topics)} summaries + "
                        f"{len(ctx.bulk_archives)} archives = {ctx.total_tokens} tokens "
                        f"({', '.join(f'{k} {v}' for k, v in ctx.tier_tokens.items() if v)})"
                    )
            out.seconds[name] = time.perf_counter() - t
            cost = replay.cost
            if cost is not None:
                out.cost[name] = cost
            if QUERY in sections and system.query:
                t = time.perf_counter()
                scores: list[float] = []
                used: list[int] = []
                for q in meeting.queries:
                    msgs = await replay.ask(q.text, asked_at)
                    used.append(counter.messages_tokens(msgs))
                    words = content_words(context_text(without_query(msgs, q.text)))
                    scores.append(retention(set(q.words), words))
                out.query[name], out.query_used[name] = scores, used
                out.query_seconds[name] = time.perf_counter() - t
        finally:
            await replay.close()
    return out


async def run_meeting_async(
    path: Path, budgets: Sequence[int], sections: Collection[str], store: str = "memory"
) -> MeetingResult:
    return await run_loaded(load_meeting(path), budgets, sections, store)


async def run_loaded(
    meeting: Meeting, budgets: Sequence[int], sections: Collection[str], store: str = "memory"
) -> MeetingResult:
    warn = WarningCounter()
    logging.getLogger("tiered_history").addHandler(warn)
    try:
        with tempfile.TemporaryDirectory(prefix="th-retention-") as tmp:
            shared = Shared(meeting, store=store, tmp=Path(tmp))
            results = {b: await run_budget(shared, b, sections) for b in budgets}
    finally:
        logging.getLogger("tiered_history").removeHandler(warn)
    return MeetingResult(
        id=meeting.id,
        domain=meeting.domain,
        messages=len(meeting.turns),
        tokens=3 + sum(shared.costs),
        queries=len(meeting.queries),
        skipped_turns=meeting.skipped_turns,
        dropped_queries=meeting.dropped_queries,
        budgets=results,
        fallback_warnings=warn.count,
        query_texts=tuple(q.text for q in meeting.queries),
    )


def run_meeting(args: tuple[Path, tuple[int, ...], tuple[str, ...], str]) -> MeetingResult:
    """Process-pool entry point."""
    path, budgets, sections, store = args
    return asyncio.run(run_meeting_async(path, budgets, sections, store))
