"""One QMSum meeting through every system at every budget (runs in a worker process)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._common import WarningCounter
from tiered_history import CompressedContext, HistoryCompressor
from tiered_history.tokens import TokenCounter

from . import peers
from .data import Meeting, content_words, context_text, load_meeting, retention

#: ``maintain()`` runs after every this many messages during a replay, and once at the end.
MAINTAIN_EVERY = 50
CONVERSATION = "meeting"

OURS = "tiered_history"
RECENCY = "recency truncation"
LANGCHAIN = "langchain trim_messages"
SLIDING = "pydantic-ai SlidingWindow"
SUMMARIZATION = "pydantic-ai Summarization"
FULL = "full history"
SYSTEMS = (OURS, RECENCY, LANGCHAIN, SLIDING, SUMMARIZATION)

#: Where an evidence turn is in our final context.
TIERS = ("verbatim", "topic summary", "archive", "not in context")


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
    scores: dict[str, list[float]]
    """Per system, one retention value per query (in query order)."""
    used: dict[str, int]
    """Per system, framed tokens of the final context."""
    full_fits: bool
    tiers: TierTally
    ours_shape: str
    cost: dict[str, peers.Cost]
    seconds: dict[str, float]
    summary_keep: tuple[int, int]
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


def _scores(meeting: Meeting, words: set[str]) -> list[float]:
    return [retention(set(q.words), words) for q in meeting.queries]


async def replay_ours(
    meeting: Meeting, budget: int
) -> tuple[CompressedContext, peers.Cost, HistoryCompressor]:
    counter = TokenCounter()
    summarizer = peers.CountingSummarizer(counter)
    h = HistoryCompressor.from_url("memory://", summarizer=summarizer, context_budget=budget)
    await h.initialize()
    last = meeting.turns[-1].timestamp
    for n, turn in enumerate(meeting.turns, 1):
        await h.add_message(
            CONVERSATION,
            {"role": "user", "content": turn.content, "name": turn.name, "timestamp": turn.timestamp},
        )
        if n % MAINTAIN_EVERY == 0:
            await h.maintain(CONVERSATION, now=turn.timestamp)
    await h.maintain(CONVERSATION, now=last)
    ctx = await h.get_context(CONVERSATION, max_tokens=budget)
    return ctx, summarizer.cost, h


def _tiers(
    meeting: Meeting, ctx: CompressedContext, text_of_summaries: set[str]
) -> tuple[TierTally, int, int]:
    verbatim = {m.sequence for m in ctx.current_topic} | {m.sequence for m in ctx.pinned}
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


async def run_meeting_async(path: Path, budgets: Sequence[int]) -> MeetingResult:
    meeting = load_meeting(path)
    counter = TokenCounter()
    warn = WarningCounter()
    logging.getLogger("tiered_history").addHandler(warn)
    framed = peers.Framed(counter, memo=True)
    costs = [framed.one("user", t.content, t.name) for t in meeting.turns]
    total_tokens = 3 + sum(costs)
    lc_all = peers.langchain_messages(meeting.turns)
    lc_counter = peers.langchain_counter(framed)
    pd_counter = peers.pydantic_counter(framed)
    pd_all = peers.pydantic_messages(meeting.turns)
    results: dict[int, BudgetResult] = {}
    for budget in budgets:
        scores: dict[str, list[float]] = {}
        used: dict[str, int] = {}
        cost: dict[str, peers.Cost] = {}
        seconds: dict[str, float] = {}

        t = time.perf_counter()
        ctx, cost[OURS], h = await replay_ours(meeting, budget)
        seconds[OURS] = time.perf_counter() - t
        msgs = ctx.to_messages()
        used[OURS] = counter.messages_tokens(msgs)
        summaries_text = "\n".join(s.content for s in [*ctx.bulk_archives, *ctx.historical_topics])
        scores[OURS] = _scores(meeting, content_words(context_text(msgs)))
        tiers, sk, st = _tiers(meeting, ctx, content_words(summaries_text))
        stats = (await h.stats(CONVERSATION))[0]
        shape = (
            f"{stats.topics} topics, {stats.archives} archives ({stats.archives_dropped} dropped); context "
            f"{len(ctx.current_topic)} msgs + {len(ctx.historical_topics)} summaries + "
            f"{len(ctx.bulk_archives)} archives = {ctx.total_tokens} tokens"
        )
        await h.close()

        t = time.perf_counter()
        start = peers.recency(costs, budget)
        kept = [x.openai() for x in meeting.turns[start:]]
        seconds[RECENCY] = time.perf_counter() - t
        used[RECENCY] = counter.messages_tokens(kept)
        scores[RECENCY] = _scores(meeting, content_words(context_text(kept)))
        full_fits = start == 0

        t = time.perf_counter()
        trimmed = peers.langchain_dicts(peers.langchain_trim(lc_all, budget, lc_counter))
        seconds[LANGCHAIN] = time.perf_counter() - t
        used[LANGCHAIN] = counter.messages_tokens(trimmed)
        scores[LANGCHAIN] = _scores(meeting, content_words(context_text(trimmed)))

        t = time.perf_counter()
        window = peers.pydantic_dicts(await peers.sliding_window(budget, pd_counter)(list(pd_all)))
        seconds[SLIDING] = time.perf_counter() - t
        used[SLIDING] = counter.messages_tokens(window)
        scores[SLIDING] = _scores(meeting, content_words(context_text(window)))

        t = time.perf_counter()
        model = peers.ExtractiveModel(counter, peers.summary_target(budget))
        proc = peers.summarization(budget, pd_counter, model.model())
        state: list[Any] = []
        for turn in meeting.turns:
            state.append(peers.pydantic_request(turn))
            state = (await proc.process(state)).messages
        summarized = peers.pydantic_dicts(state)
        seconds[SUMMARIZATION] = time.perf_counter() - t
        cost[SUMMARIZATION] = model.cost
        used[SUMMARIZATION] = counter.messages_tokens(summarized)
        scores[SUMMARIZATION] = _scores(meeting, content_words(context_text(summarized)))

        results[budget] = BudgetResult(scores, used, full_fits, tiers, shape, cost, seconds, (sk, st))
    logging.getLogger("tiered_history").removeHandler(warn)
    return MeetingResult(
        id=meeting.id,
        domain=meeting.domain,
        messages=len(meeting.turns),
        tokens=total_tokens,
        queries=len(meeting.queries),
        skipped_turns=meeting.skipped_turns,
        dropped_queries=meeting.dropped_queries,
        budgets=results,
        fallback_warnings=warn.count,
    )


def run_meeting(args: tuple[Path, tuple[int, ...]]) -> MeetingResult:
    """Process-pool entry point."""
    path, budgets = args
    return asyncio.run(run_meeting_async(path, budgets))
