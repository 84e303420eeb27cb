"""A short context with room to spare shows the newest archives as what they were made of.

Progressive compression in reverse: below ``cache_min_tokens`` (no provider caches such a
prompt) the room the summaries leave goes to the parts of the newest archive (the archives a
roll-up rolled up, the topic summaries an archive merged) before older messages word for word.
QMSum static retention at 1k / 2k on the train split: +3.2 / +4.9 points (recall off).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from tiered_history import CompressedContext, History, HistoryCompressor, Message
from tiered_history.core import assembly
from tiered_history.core.assembly import _Block, unroll
from tiered_history.models import Summary
from tiered_history.tokens import TokenCounter

T0 = datetime(2026, 4, 1, 8, 0, tzinfo=UTC)
COUNTER = TokenCounter()


def measure(text: str) -> int:
    return COUNTER.message_tokens({"role": "user", "content": text})


def summary(
    id: int, tier: str, first: int, last: int, text: str, merged_into: int | None = None, level: int = 0
) -> Summary:
    return Summary(
        id=id,
        conversation_id="c",
        tier=tier,  # type: ignore[arg-type]
        sequence=id,
        first_sequence=first,
        last_sequence=last,
        content=text,
        rendered=text,
        token_count=COUNTER.count(text) + 12,
        source_tokens=10 * (last - first + 1),
        started_at=T0 + timedelta(minutes=first),
        ended_at=T0 + timedelta(minutes=last),
        status="final",
        merged_into=merged_into,
        level=level,
    )


def block(tier: str, items: list[Summary]) -> _Block:
    b = _Block(tier, list(items))
    b.tokens = measure(b.text()) if items else 0
    return b


# Roll-up 10 (1-30) was made of roll-up 8 (1-18) and archive 9 (19-30); archive 9 of topics 4-6;
# roll-up 8 of archives whose parts were not read. Topic 7 (31-40) is live.
T4 = summary(4, "topic", 19, 22, "User: the copper plan needs 40 crates by Friday.", merged_into=9)
T5 = summary(5, "topic", 23, 26, "User: the violet permit was refused twice.", merged_into=9)
T6 = summary(6, "topic", 27, 30, "Assistant: the falcon route avoids the bridge.", merged_into=9)
A8 = summary(8, "bulk", 1, 18, "User: the harbour audit and the lantern budget.", merged_into=10, level=2)
A9 = summary(9, "bulk", 19, 30, "User: copper crates; violet permit.", merged_into=10, level=1)
R10 = summary(10, "bulk", 1, 30, "User: harbour audit; copper crates.", level=3)
T7 = summary(7, "topic", 31, 40, "User: the granite quote arrived.")
FINER = [T4, T5, T6, A8, A9]


def test_the_newest_archive_gives_way_to_its_parts_as_far_as_they_fit() -> None:
    archives, topics = block("bulk", [R10]), block("topic", [T7])
    bulk, topic = unroll(archives, topics, FINER, 10_000, measure)
    # The roll-up became the roll-up and archive it was made of; that archive its topics; the
    # older roll-up's parts were not read, so it stays.
    assert [x.id for x in bulk.items] == [8]
    assert sorted(x.id for x in topic.items) == [4, 5, 6, 7]
    assert bulk.tokens == measure(bulk.text()) and topic.tokens == measure(topic.text())
    # Room for the first step only: the roll-up's parts, not the archive's.
    first = block("bulk", [A8, A9])
    bulk, topic = unroll(archives, topics, FINER, first.tokens + topics.tokens, measure)
    assert [x.id for x in bulk.items] == [8, 9] and [x.id for x in topic.items] == [7]
    # No room for any step: the blocks as they were.
    bulk, topic = unroll(archives, topics, FINER, first.tokens + topics.tokens - 1, measure)
    assert bulk is archives and topic is topics


def test_an_archive_whose_parts_do_not_cover_its_range_is_left_whole() -> None:
    archives, topics = block("bulk", [A9]), block("topic", [T7])
    for parts in ([T4, T6], [T5, T6], [T4, T5]):  # a gap, no first part, no last part
        bulk, topic = unroll(archives, topics, parts, 10_000, measure)
        assert bulk is archives and topic is topics
    # A part with no text (a topic of pinned messages only: they are sent anyway) covers its range.
    empty = summary(5, "topic", 23, 26, "", merged_into=9)
    bulk, topic = unroll(archives, topics, [T4, empty, T6], 10_000, measure)
    assert bulk.items == [] and sorted(x.id for x in topic.items) == [4, 6, 7]


def test_only_the_newest_archive_is_unrolled_so_the_blocks_stay_in_time_order() -> None:
    older = summary(3, "bulk", 1, 18, "User: harbour.", level=1)
    parts = [summary(1, "topic", 1, 9, "User: a.", merged_into=3), summary(2, "topic", 10, 18, "User: b.", 3)]
    # The newest archive (9) cannot be unrolled: the older one (3) is left whole too, else its
    # topics would sit after archive 9 in the topic block.
    bulk, topic = unroll(block("bulk", [older, A9]), block("topic", [T7]), parts, 10_000, measure)
    assert [x.id for x in bulk.items] == [3, 9] and [x.id for x in topic.items] == [7]


async def _conversation(hc: HistoryCompressor, topics: int, maintain: bool = True) -> None:
    """``topics`` sealed topics of four messages; ``maintain`` after each (else none: a backlog)."""
    n = 0
    for t in range(topics):
        for k in range(4):
            n += 1
            role = "user" if k % 2 == 0 else "assistant"
            text = f"Topic {t} point {k}: the item{t}x{k} order ships {t * 4 + k} crates via depot{t}."
            await hc.add_message("c", Message(role=role, content=text, timestamp=T0 + timedelta(minutes=n)))
        await hc.seal_current_topic("c")
        if maintain:
            await hc.maintain("c", now=T0 + timedelta(minutes=n + 1))


@pytest.mark.parametrize("budget", [700, 1200, 5000])
async def test_a_context_fills_its_room_with_the_parts_of_the_newest_archive(
    budget: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def read() -> tuple[CompressedContext, History]:
        settings = {"context_budget": budget, "recall": {"enabled": False}}
        async with HistoryCompressor.from_url("memory://", **settings) as hc:
            await _conversation(hc, 30 if budget < 2048 else 120)
            return await hc.get_context("c", budget), await hc.get_history("c")

    ctx, history = await read()
    assert any(a.merged_into is not None for a in history.archives)  # roll-ups happened
    shown = ctx.bulk_archives + ctx.historical_topics
    assert any(x.merged_into is not None for x in shown)
    assert all(x.last_sequence < y.first_sequence for x, y in pairwise(shown))
    assert all(x.last_sequence < ctx.current_topic[0].sequence for x in shown)
    assert ctx.total_tokens <= budget
    # The same conversation without unrolling shows only live summaries, and spends less of the
    # budget on them: the room goes unused, or to older messages word for word.
    monkeypatch.setattr(assembly, "unroll", lambda archives, topics, *_: (archives, topics))
    whole, _ = await read()
    assert all(x.merged_into is None for x in whole.bulk_archives + whole.historical_topics)
    summaries = ctx.tier_tokens["bulk"] + ctx.tier_tokens["topic"]
    assert summaries > whole.tier_tokens["bulk"] + whole.tier_tokens["topic"]


async def test_parts_chosen_with_the_window_start_stay_until_it_moves() -> None:
    # A budget providers cache: what the blocks hold is chosen when the window starts, then kept
    # turn after turn (the prefix stays byte-identical) until an event moves the window.
    settings = {"context_budget": 3000, "recall": {"enabled": False}}
    async with HistoryCompressor.from_url("memory://", **settings) as hc:
        await _conversation(hc, 60)
        first = await hc.get_context("c", 3000)
        assert any(x.merged_into is not None for x in first.bulk_archives + first.historical_topics)
        blocks = [m for m in first.to_messages()[:2]]
        for k in range(3):
            at = T0 + timedelta(hours=5, minutes=k)
            await hc.add_message("c", Message(role="user", content=f"one more point {k}", timestamp=at))
            ctx = await hc.get_context("c", 3000)
            assert ctx.maintenance_epoch == first.maintenance_epoch
            assert ctx.to_messages()[:2] == blocks


#: The library's defaults but for recall (the test settings leave ``min_topic_tokens`` at 0).
STRADDLED = {"context_budget": 2500, "recall": {"enabled": False}, "boundaries": {"min_topic_tokens": 120}}


async def _straddled(hc: HistoryCompressor, budget: int) -> tuple[CompressedContext, Summary]:
    """A conversation a little past ``budget`` whose window starts inside an archive."""
    await _conversation(hc, 40)
    ctx = await hc.get_context("c", budget)
    history = await hc.get_history("c")
    start = ctx.current_topic[0].sequence
    inside = [
        a for a in history.archives if a.merged_into is None and a.first_sequence < start <= a.last_sequence
    ]
    assert len(inside) == 1, "the window does not start inside an archive"
    return ctx, inside[0]


async def test_a_window_may_start_inside_an_archive_where_one_of_its_parts_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # At a budget providers cache, a window starting after the whole archive would leave much of
    # the room empty: it starts where a part ends, the parts before it shown in the archive's place.
    async def read() -> tuple[CompressedContext, Summary]:
        async with HistoryCompressor.from_url("memory://", **STRADDLED) as hc:
            return await _straddled(hc, 2500)

    ctx, archive = await read()
    start = ctx.current_topic[0].sequence
    shown = ctx.bulk_archives + ctx.historical_topics
    parts = [x for x in shown if x.merged_into == archive.id]
    assert archive.id not in {x.id for x in shown}
    assert parts[0].first_sequence == archive.first_sequence and parts[-1].last_sequence == start - 1
    assert all(b.first_sequence == a.last_sequence + 1 for a, b in pairwise(parts))
    assert all(x.last_sequence < start for x in shown)
    assert ctx.total_tokens <= 2500
    # Without the archive's parts the window starts after the archive: fewer messages word for word.
    monkeypatch.setattr(assembly, "_pieces", lambda *_: {})
    async with HistoryCompressor.from_url("memory://", **STRADDLED) as hc:
        await _conversation(hc, 40)
        whole = await hc.get_context("c", 2500)
    assert whole.current_topic[0].sequence > archive.last_sequence
    assert len(whole.current_topic) < len(ctx.current_topic)


async def test_the_parts_a_moving_window_leaves_are_shown_in_its_place() -> None:
    # The window started inside an archive; when it moves on, the parts it held word for word are
    # appended to the blocks (or the blocks are chosen anew): that stretch is never left out.
    async with HistoryCompressor.from_url("memory://", **STRADDLED) as hc:
        ctx, archive = await _straddled(hc, 2500)
        n = ctx.current_topic[-1].sequence
        moved = False
        for k in range(200):
            n += 1
            at = T0 + timedelta(hours=2, minutes=k)
            text = f"Later point {k}: the widget{k} goes to bay{k % 7} with {k} boxes."
            await hc.add_message(
                "c", Message(role="user" if k % 2 == 0 else "assistant", content=text, timestamp=at)
            )
            if k % 10 == 9:
                await hc.maintain("c", now=at)
            ctx = await hc.get_context("c", 2500)
            start = ctx.current_topic[0].sequence
            covered = {
                s
                for x in ctx.bulk_archives + ctx.historical_topics
                for s in range(x.first_sequence, x.last_sequence + 1)
            }
            assert all(
                s in covered for s in range(archive.first_sequence, min(start, archive.last_sequence + 1))
            )
            moved = moved or start > archive.last_sequence
        assert moved, "the window never moved past the archive"


def _missing(ctx: CompressedContext) -> list[int]:
    """Messages before the window that no summary or archive shown stands for."""
    start = ctx.current_topic[0].sequence
    shown = ctx.bulk_archives + ctx.historical_topics
    covered = {s for x in shown for s in range(x.first_sequence, x.last_sequence + 1)}
    return [s for s in range(1, start) if s not in covered]


async def test_topics_a_window_leaves_stay_in_the_context_until_they_are_merged() -> None:
    # At 3,000 tokens the archives hold the topic tier's room: a topic summary the window left is
    # shown only while there is room beside the window. When the window moves, those no archive
    # holds yet are shown first (the archives' unused share is theirs), so the context never
    # lacks a stretch of the conversation that has a summary (60 of 200 reads did before).
    settings = {**STRADDLED, "context_budget": 3000}
    async with HistoryCompressor.from_url("memory://", **settings) as hc:
        await _conversation(hc, 40)
        n = 160
        for k in range(200):
            n += 1
            at = T0 + timedelta(minutes=n)
            text = f"Later point {k}: the widget{k} goes to bay{k % 7} with {k} boxes."
            role = "user" if k % 2 == 0 else "assistant"
            await hc.add_message("c", Message(role=role, content=text, timestamp=at))
            if k % 10 == 9:
                await hc.maintain("c", now=at)
            ctx = await hc.get_context("c", 3000)
            assert ctx.total_tokens <= 3000
            assert _missing(ctx) == [], k
