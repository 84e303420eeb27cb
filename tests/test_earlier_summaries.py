"""Summaries say what the context does not say yet.

Each topic summary and archive was chosen on its own, so a conversation's recurring words were kept
again in each (on QMSum, 46 % of the content words of the summary blocks repeated another). The
offline summariser is now told what the summaries before it say (``earlier=``) and spends its
room on the rest (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from tiered_history import HistoryCompressor, Message
from tiered_history.core.transitions import earlier_texts
from tiered_history.models import Summary
from tiered_history.summarizers.base import SummaryInput, SummaryPiece, SummaryResult
from tiered_history.summarizers.extractive import ExtractiveSummarizer
from tiered_history.tokens import TokenCounter

T0 = datetime(2026, 2, 9, 9, 0, tzinfo=UTC)
CID = "c"
COUNTER = TokenCounter()


def inputs(*texts: str, start: int = 1) -> list[SummaryInput]:
    return [
        SummaryInput(start + i, "user", t, T0 + timedelta(minutes=start + i)) for i, t in enumerate(texts)
    ]


#: Two sentences of one topic, the first richer in words, all of which an earlier summary holds.
KNOWN = "The harbour festival budget covers copper lanterns, granite steps, violet banners and saffron flags."
NEW = "Someone should ask about softer music near the stage later."
TOPIC = inputs(KNOWN, NEW, "Right, okay, sounds good to me then, thanks a lot everyone.")


async def test_a_topic_summary_leaves_out_what_an_earlier_summary_says() -> None:
    summarizer = ExtractiveSummarizer()
    alone = (await summarizer.summarize(TOPIC, 26)).text
    told = (await summarizer.summarize(TOPIC, 26, earlier=[f'User "Ana": {KNOWN}'])).text
    assert "festival budget" in alone and "softer music" not in alone  # room for one: the richer
    assert "softer music" in told and "festival budget" not in told


async def test_with_room_for_both_nothing_is_left_out() -> None:
    told = (await ExtractiveSummarizer().summarize(TOPIC, 200, earlier=[KNOWN])).text
    assert "festival budget" in told and "softer music" in told


async def test_a_merge_leaves_out_what_older_archives_say() -> None:
    pieces = [
        SummaryPiece(f"User: {KNOWN}\nUser: {NEW}", 1, 2, T0, T0),
        SummaryPiece("User: Anouk repaints the kiosk sign.", 3, 3, T0, T0 + timedelta(minutes=1)),
    ]
    summarizer = ExtractiveSummarizer()
    alone = (await summarizer.merge(pieces, 40)).text
    told = (await summarizer.merge(pieces, 40, earlier=[KNOWN])).text
    assert "festival budget" in alone and "softer music" not in alone and "kiosk" in alone
    assert "softer music" in told and "festival budget" not in told and "kiosk" in told


def summary(id: int, tier: str, first: int, last: int, content: str, **kw: Any) -> Summary:
    return Summary(
        id=id,
        conversation_id=CID,
        tier=tier,  # type: ignore[arg-type]
        sequence=id,
        first_sequence=first,
        last_sequence=last,
        started_at=T0,
        ended_at=T0,
        content=content,
        rendered=content,
        token_count=len(content.split()),
        source_tokens=10,
        status=kw.pop("status", "final"),
        **kw,
    )


def test_earlier_texts_are_the_live_summaries_before_a_range_in_timeline_order() -> None:
    archives = [
        summary(1, "bulk", 1, 10, "a1", merged_into=5),  # rolled up: its roll-up stands for it
        summary(5, "bulk", 1, 20, "a-rollup"),
        summary(2, "bulk", 21, 30, "a2"),
        summary(9, "bulk", 31, 40, "a3", dropped_at=T0),
    ]
    topics = [
        summary(3, "topic", 41, 45, "t1"),
        summary(4, "topic", 46, 50, "t-pending", status="pending"),
        summary(6, "topic", 51, 55, "t-old", status="superseded"),
        summary(7, "topic", 56, 60, ""),  # only pinned messages: nothing to say
        summary(8, "topic", 61, 70, "t-later"),
    ]
    assert earlier_texts(61, archives, topics) == ["a-rollup", "a2", "t1"]
    assert earlier_texts(21, topics, archives) == ["a-rollup"]
    assert earlier_texts(1, archives, topics) == []


class Told:
    """An offline-like summariser that notes what each call was told came before."""

    name = "told"
    reads_earlier = True

    def __init__(self) -> None:
        self.inner = ExtractiveSummarizer()
        self.topics: list[tuple[int, list[str]]] = []
        self.merges: list[tuple[int, list[str]]] = []

    async def summarize(
        self, messages: Sequence[SummaryInput], target_tokens: int, *, earlier: Sequence[str] = ()
    ) -> SummaryResult:
        self.topics.append((messages[0].sequence, list(earlier)))
        return await self.inner.summarize(messages, target_tokens, earlier=earlier)

    async def merge(
        self, pieces: Sequence[SummaryPiece], target_tokens: int, *, earlier: Sequence[str] = ()
    ) -> SummaryResult:
        self.merges.append((pieces[0].first_sequence, list(earlier)))
        return await self.inner.merge(pieces, target_tokens, earlier=earlier)


class Untold(Told):
    """The same behind the protocol only (as an LLM's is): it must never be handed ``earlier``."""

    name = "untold"
    reads_earlier = False

    async def summarize(self, messages: Sequence[SummaryInput], target_tokens: int) -> SummaryResult:  # type: ignore[override]
        self.topics.append((messages[0].sequence, []))
        return await self.inner.summarize(messages, target_tokens)

    async def merge(self, pieces: Sequence[SummaryPiece], target_tokens: int) -> SummaryResult:  # type: ignore[override]
        self.merges.append((pieces[0].first_sequence, []))
        return await self.inner.merge(pieces, target_tokens)


async def feed(hc: HistoryCompressor, topics: int, *, maintain_each: bool = True) -> None:
    """``topics`` sealed topics of four messages, maintained after each (or once, after the last)."""
    n = 0
    for t in range(topics):
        for k in range(4):
            n += 1
            cargo = ("salt", "tin", "rope")[t % 3]
            text = f"Topic {t} item {k}: the crew loads {k + 3} crates of {cargo} today."
            await hc.add_message(CID, Message(role="user", content=text, timestamp=T0 + timedelta(minutes=n)))
        await hc.seal_current_topic(CID)
        if maintain_each or t == topics - 1:
            await hc.maintain(CID, now=T0 + timedelta(minutes=n + 1))


async def test_maintenance_tells_each_summary_and_archive_what_the_live_ones_before_it_say() -> None:
    told = Told()
    # Contexts laid out for the cache (cache_min_tokens and up) show every summary before the window.
    async with HistoryCompressor.from_url(
        "memory://", context_budget=400, cache_min_tokens=400, summarizer=told
    ) as hc:
        await feed(hc, 12)
        history = await hc.get_history(CID)
    assert len(told.topics) == 12 and told.merges
    texts = {(s.first_sequence, s.tier): s.content for s in (*history.topics, *history.archives)}
    first_topic, earlier = told.topics[0]
    assert first_topic == 1 and earlier == []
    for first, earlier in told.topics[1:]:
        # The topic summary just before it is among what it is told, and nothing after it is.
        assert texts[(first - 4, "topic")] in earlier
        assert all(t not in earlier for (f, _), t in texts.items() if f >= first)
    later = [(first, earlier) for first, earlier in told.merges if first > 1]
    assert any(earlier for _, earlier in later)  # an archive after the first is told the older ones
    for first, earlier in told.merges:
        assert all(t not in earlier for (f, _), t in texts.items() if f >= first)


def test_earlier_texts_are_the_nearest_ones_the_limit_holds() -> None:
    topics = [summary(i, "topic", 10 * i, 10 * i + 9, f"t{i} " + "word " * 9) for i in range(1, 6)]
    # Each costs 10 (a word a token here): the nearest two fit 25, in timeline order.
    assert earlier_texts(100, topics, limit=25) == [topics[3].content, topics[4].content]
    assert earlier_texts(100, topics, limit=5) == []
    assert len(earlier_texts(100, topics)) == 5


async def test_a_backlog_summarised_in_one_pass_tells_each_summary_only_what_the_tiers_hold() -> None:
    # Thirty topics sealed before maintenance runs: the thirtieth is not handed the 29 before it,
    # which the tiers could never show beside it (work that grew with the square of the backlog).
    told = Told()
    async with HistoryCompressor.from_url(
        "memory://", context_budget=400, cache_min_tokens=400, summarizer=told
    ) as hc:
        await feed(hc, 30, maintain_each=False)
        plan = hc.reply.plan_at(400)
    assert len(told.topics) == 30
    room = plan.topic_share + plan.bulk_share
    assert max(len(earlier) for _, earlier in told.topics) > 1
    for _, earlier in told.topics:
        assert sum(COUNTER.count(t) for t in earlier) <= room


async def test_below_cache_min_tokens_no_summary_is_told_what_others_say() -> None:
    # There a context shows the summaries that best match the newest message, not all those
    # before the window: a word left out because an earlier summary has it could be left out of it.
    told = Told()
    async with HistoryCompressor.from_url("memory://", context_budget=400, summarizer=told) as hc:
        await feed(hc, 12)
    assert len(told.topics) == 12 and told.merges
    assert all(earlier == [] for _, earlier in (*told.topics, *told.merges))


async def test_a_summariser_that_does_not_say_it_reads_them_is_never_handed_earlier_texts() -> None:
    untold = Untold()
    async with HistoryCompressor.from_url(
        "memory://", context_budget=400, cache_min_tokens=400, summarizer=untold
    ) as hc:
        await feed(hc, 12)
        history = await hc.get_history(CID)
    assert len(untold.topics) == 12 and untold.merges
    # No call failed (a TypeError would have fallen back to the offline summariser).
    assert {(s.status, s.last_error) for s in (*history.topics, *history.archives)} == {("final", None)}
