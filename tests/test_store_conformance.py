"""Behaviour every backend (memory, SQLite, PostgreSQL) must share, through the service and the store."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta, timezone
from itertools import pairwise
from typing import Any

import pytest

from tiered_history import (
    ConversationNotFoundError,
    HistoryCompressor,
    InvalidMessageError,
    Message,
    StoredMessage,
    Summary,
)
from tiered_history.core.render import item_line

CID = "conv-1"
T0 = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)

# Small budget: topic share int(597 * 0.3) = 179, bulk share int(597 * 0.2) = 119.
SMALL = {"context_budget": 600}


def ts(i: int) -> datetime:
    return T0 + timedelta(minutes=i)


def call(call_id: str, name: str = "lookup", arguments: str = '{"q":"x"}') -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@asynccontextmanager
async def compressor(url: str, **overrides: Any) -> AsyncIterator[HistoryCompressor]:
    async with HistoryCompressor.from_url(url, **overrides) as hc:
        yield hc


class Feed:
    """Adds messages one minute apart to one conversation and remembers what was added."""

    def __init__(self, hc: HistoryCompressor, cid: str = CID, start: int = 0) -> None:
        self.hc = hc
        self.cid = cid
        self.i = start
        self.added: list[tuple[Message, StoredMessage]] = []

    async def add(self, role: str, content: str = "", **kw: Any) -> StoredMessage:
        self.i += 1
        msg = Message(role=role, content=content, timestamp=ts(self.i), **kw)  # type: ignore[arg-type]
        stored = await self.hc.add_message(self.cid, msg)
        self.added.append((msg, stored))
        return stored

    async def topic(self, n: int, label: str, words: int = 6) -> None:
        """One topic of ``n`` user/assistant turns; the first user turn announces a new topic."""
        filler = " ".join(f"{label}word{k}" for k in range(words))
        for k in range(n):
            role = "user" if k % 2 == 0 else "assistant"
            prefix = "new topic: " if k == 0 else ""
            await self.add(role, f"{prefix}{label} turn {k} {filler}")

    @property
    def now(self) -> datetime:
        """A maintenance time just after the newest message (no silence seal)."""
        return ts(self.i + 1)


def assert_partition(topics: list[Summary], open_start: int, last: int) -> None:
    """Topic ranges are contiguous, disjoint and, with the open range, cover 1..last exactly."""
    expected_first = 1
    for t in sorted(topics, key=lambda t: t.sequence):
        assert t.first_sequence == expected_first, (t.sequence, t.first_sequence, expected_first)
        assert t.last_sequence >= t.first_sequence
        expected_first = t.last_sequence + 1
    assert open_start == expected_first
    assert open_start <= last + 1


# -- sequences and stored content -----------------------------------------------------------------


async def test_sequences_are_gap_free_and_unique_across_seals(db_url: str) -> None:
    async with compressor(db_url) as hc:
        feed = Feed(hc)
        returned = []
        for k in range(24):
            role = "user" if k % 2 == 0 else "assistant"
            text = f"new topic: item {k}" if k % 8 == 0 else f"item {k}"
            returned.append((await feed.add(role, text)).sequence)
            if k == 13:
                await hc.seal_current_topic(CID)
        assert returned == list(range(1, 25))
        h = await hc.get_history(CID)
        assert [m.sequence for m in h.messages] == list(range(1, 25))
        assert [m.content for m in h.messages] == [m.content for m, _ in feed.added]
        # Seals at the "new topic" turns (9, 17) and the manual one after 14.
        assert [(t.first_sequence, t.last_sequence) for t in h.topics] == [(1, 8), (9, 14), (15, 16)]
        assert [t.sealed_reason for t in h.topics] == ["explicit", "manual", "explicit"]
        assert h.open_topic_start == 17


async def test_messages_are_stored_exactly_as_given_and_never_modified(db_url: str) -> None:
    ist = timezone(timedelta(hours=5, minutes=30))
    pst = timezone(timedelta(hours=-8))
    big = "".join(f"{k:05d} " for k in range(900))  # 5400 chars, above max_message_chars
    given = [
        Message(
            role="system",
            content="Be terse. ✓ ünïcödé 𝄞 🎉",
            name="sys_1",
            pinned=True,
            timestamp=datetime(2026, 1, 5, 15, 30, 1, 123456, tzinfo=ist),
            metadata={"k": [1, 2.5, None, True, "x"], "nested": {"a": "ü"}},
        ),
        Message(role="user", content="  hello\n\tworld  \n", name="alice-1", timestamp=ts(1)),
        Message(
            role="assistant",
            content="",
            tool_calls=[call("call_1"), call("call_2", "weather", '{"city":"Zürich"}')],
            timestamp=ts(2),
        ),
        Message(role="tool", content='{"result": 42}', tool_call_id="call_1", timestamp=ts(3)),
        Message(role="tool", content="sunny", tool_call_id="call_2", name="weather", timestamp=ts(4)),
        Message(role="user", content=big, timestamp=ts(5), metadata={"source": "paste"}),
        Message(
            role="user",
            content="Remember: my name is Ana.",
            pinned=True,
            timestamp=datetime(2026, 1, 5, 2, 6, 0, 999999, tzinfo=pst),
        ),
        Message(role="assistant", content="Noted, Ana.", timestamp=ts(7)),
    ]
    async with compressor(db_url, **SMALL) as hc:
        returned = [await hc.add_message(CID, m) for m in given]
        before = (await hc.get_history(CID)).messages
        assert before == returned
        for m, s in zip(given, before, strict=True):
            assert s.conversation_id == CID
            assert s.role == m.role
            assert s.content == m.content
            assert s.timestamp == m.timestamp  # the same instant, whatever zone it is reported in
            assert s.timestamp.utcoffset() is not None
            assert s.name == m.name
            assert s.tool_calls == m.tool_calls
            assert s.tool_call_id == m.tool_call_id
            assert s.pinned == m.pinned
            assert s.metadata == m.metadata
            assert s.full_token_count == hc.counter.message_tokens(m.to_openai())
        assert before[0].timestamp == datetime(2026, 1, 5, 10, 0, 1, 123456, tzinfo=UTC)
        # Long messages are stored and sent whole: cutting is a last resort under budget pressure.
        assert all(m.truncated_content is None for m in before)

        # Compress everything (seal, summarise, merge, drop); the messages stay as they were.
        await hc.seal_current_topic(CID)
        await hc.maintain(CID, now=ts(8))
        for k in range(6):
            await hc.add_message(
                CID, Message(role="user", content=f"new topic: filler {k} " * 12, timestamp=ts(9 + k))
            )
        await hc.seal_current_topic(CID)
        await hc.maintain(CID, now=ts(20))
        await hc.maintain(CID, now=ts(21))
        after = (await hc.get_history(CID)).messages
        assert after[: len(before)] == before
        assert [m.sequence for m in after] == list(range(1, len(given) + 7))


async def test_platform_is_recorded_and_the_first_one_given_wins(db_url: str) -> None:
    async with compressor(db_url) as hc:
        await hc.add_message("p", {"role": "user", "content": "hi"}, platform="telegram")
        await hc.add_message("p", {"role": "assistant", "content": "hello"})
        await hc.add_message("p", {"role": "user", "content": "again"}, platform="discord")
        await hc.add_message("q", {"role": "user", "content": "hi"})
        assert (await hc.get_history("p")).platform == "telegram"
        assert (await hc.get_history("q")).platform is None
        await hc.add_message("q", {"role": "user", "content": "later"}, platform="slack")
        assert (await hc.get_history("q")).platform == "slack"
        stats = {s.conversation_id: s for s in await hc.stats()}
        assert stats["p"].platform == "telegram"
        assert stats["q"].platform == "slack"
        assert stats["p"].messages == 3


async def test_unknown_conversation_raises_not_found(db_url: str) -> None:
    async with compressor(db_url) as hc:
        await hc.add_message("exists", {"role": "user", "content": "hi"})
        with pytest.raises(ConversationNotFoundError):
            await hc.get_context("missing", 1000)
        with pytest.raises(ConversationNotFoundError):
            await hc.get_history("missing")
        with pytest.raises(ConversationNotFoundError):
            await hc.seal_current_topic("missing")
        with pytest.raises(ConversationNotFoundError):
            await hc.stats("missing")
        # Looking did not create it.
        assert await hc.conversation_ids() == ["exists"]
        assert await hc.store.state("missing") is None


async def test_search_in_an_unknown_conversation_raises_not_found(db_url: str) -> None:
    async with compressor(db_url) as hc:
        await hc.add_message("exists", {"role": "user", "content": "hi"})
        with pytest.raises(ConversationNotFoundError):
            await hc.search("missing", "hi")


# -- sealing ----------------------------------------------------------------------------------


async def test_manual_seal_creates_a_pending_topic_over_exactly_the_open_range(db_url: str) -> None:
    async with compressor(db_url) as hc:
        feed = Feed(hc)
        await feed.add("user", "first question")
        await feed.add("assistant", "first answer")
        await feed.add("user", "pinned fact", pinned=True)
        await feed.add("user", "second question")
        await feed.add("assistant", "second answer")
        sealed = await hc.seal_current_topic(CID)
        assert sealed is not None
        assert (sealed.tier, sealed.sequence, sealed.first_sequence, sealed.last_sequence) == (
            "topic",
            1,
            1,
            5,
        )
        assert (sealed.status, sealed.sealed_reason, sealed.content, sealed.rendered) == (
            "pending",
            "manual",
            "",
            "",
        )
        assert sealed.merged_into is None and sealed.dropped_at is None
        assert sealed.started_at == ts(1) and sealed.ended_at == ts(5)
        # Pinned messages are always sent verbatim, so they are not part of what the topic represents.
        assert sealed.source_tokens == sum(s.full_token_count for m, s in feed.added if not m.pinned)
        h = await hc.get_history(CID)
        assert h.topics == [sealed]
        assert h.open_topic_start == 6

        assert await hc.seal_current_topic(CID) is None  # nothing open
        assert len((await hc.get_history(CID)).topics) == 1

        for k in range(3):
            await feed.add("user" if k % 2 == 0 else "assistant", f"more {k}")
        second = await hc.seal_current_topic(CID)
        assert second is not None
        assert (second.sequence, second.first_sequence, second.last_sequence) == (2, 6, 8)
        assert second.started_at == ts(6) and second.ended_at == ts(8)
        h = await hc.get_history(CID)
        assert [t.id for t in h.topics] == [sealed.id, second.id]
        assert len({t.id for t in h.topics}) == 2
        assert h.open_topic_start == 9
        stats = (await hc.stats(CID))[0]
        assert (stats.topics, stats.topics_pending) == (2, 2)


async def test_a_seal_never_splits_a_tool_call_from_its_results(db_url: str) -> None:
    async with compressor(db_url) as hc:
        feed = Feed(hc)
        await feed.add("user", "what is the weather in Oslo and Rome?")  # 1
        await feed.add("assistant", tool_calls=[call("a"), call("b")])  # 2
        await feed.add("tool", "Oslo: rain", tool_call_id="a")  # 3
        first = await hc.seal_current_topic(CID)
        assert first is not None
        assert (first.first_sequence, first.last_sequence) == (1, 1)
        assert (await hc.get_history(CID)).open_topic_start == 2
        # While call "b" is still open, nothing more can be sealed.
        assert await hc.seal_current_topic(CID) is None
        await feed.add("tool", "Rome: sun", tool_call_id="b")  # 4
        second = await hc.seal_current_topic(CID)
        assert second is not None
        assert (second.first_sequence, second.last_sequence) == (2, 4)

        await feed.add("user", "and Paris?")  # 5
        await feed.add("assistant", tool_calls=[call("c")])  # 6
        # An explicit boundary phrase is not a boundary while the call awaits its result.
        await feed.add("assistant", "new topic: still waiting on the call", tool_calls=[call("d")])  # 7
        await feed.add("tool", "Paris: fog", tool_call_id="d")  # 8
        await feed.add("user", "new topic: let's talk about books")  # 9 -> seals 5..8
        h = await hc.get_history(CID)
        assert [(t.first_sequence, t.last_sequence, t.sealed_reason) for t in h.topics] == [
            (1, 1, "manual"),
            (2, 4, "manual"),
            (5, 8, "explicit"),
        ]
        assert h.open_topic_start == 9
        for t in h.topics:
            covered = [m for m in h.messages if t.first_sequence <= m.sequence <= t.last_sequence]
            open_ids: set[str] = set()
            for m in covered:
                if m.tool_calls:
                    open_ids = {c["id"] for c in m.tool_calls}
                elif m.role == "tool":
                    assert m.tool_call_id in open_ids, (t.sequence, m.sequence)
            # The message after the topic is never a result of a call inside it.
            nxt = next((m for m in h.messages if m.sequence == t.last_sequence + 1), None)
            assert nxt is None or nxt.role != "tool"


async def test_orphan_tool_result_is_rejected_and_nothing_is_stored(db_url: str) -> None:
    async with compressor(db_url) as hc:
        with pytest.raises(InvalidMessageError):
            await hc.add_message("fresh", {"role": "tool", "content": "42", "tool_call_id": "x"})
        assert await hc.conversation_ids() == []
        with pytest.raises(ConversationNotFoundError):
            await hc.get_history("fresh")

        feed = Feed(hc)
        await feed.add("user", "hello")
        with pytest.raises(InvalidMessageError):
            await hc.add_message(CID, {"role": "tool", "content": "42", "tool_call_id": "x"})
        await feed.add("assistant", tool_calls=[call("a")])
        await feed.add("tool", "ok", tool_call_id="a")
        with pytest.raises(InvalidMessageError):  # already answered
            await hc.add_message(CID, {"role": "tool", "content": "again", "tool_call_id": "a"})
        await feed.add("assistant", tool_calls=[call("b")])
        await feed.add("user", "never mind")  # a new turn abandons call b
        with pytest.raises(InvalidMessageError):
            await hc.add_message(CID, {"role": "tool", "content": "late", "tool_call_id": "b"})
        nxt = await feed.add("assistant", "fine")
        assert nxt.sequence == 6
        h = await hc.get_history(CID)
        assert [m.sequence for m in h.messages] == [1, 2, 3, 4, 5, 6]
        assert [m.content for m in h.messages] == [m.content for m, _ in feed.added]
        assert (await hc.stats(CID))[0].messages == 6


# -- maintenance ------------------------------------------------------------------------------


async def test_maintain_summarises_each_sealed_topic_exactly_once(db_url: str) -> None:
    async with compressor(db_url) as hc:
        feed = Feed(hc)
        for label in ("alpha", "bravo", "charlie", "delta"):
            await feed.topic(4, label)
        r1 = await hc.maintain(CID, now=feed.now)
        assert (r1.conversations, r1.sealed, r1.summarized, r1.merged, r1.dropped) == (1, 0, 3, 0, 0)
        assert r1.errors == []
        r2 = await hc.maintain(CID, now=feed.now)
        assert (r2.sealed, r2.summarized, r2.merged, r2.dropped) == (0, 0, 0, 0)
        h = await hc.get_history(CID)
        assert [(t.sequence, t.first_sequence, t.last_sequence) for t in h.topics] == [
            (1, 1, 4),
            (2, 5, 8),
            (3, 9, 12),
        ]
        assert h.open_topic_start == 13
        for t, label in zip(h.topics, ("alpha", "bravo", "charlie"), strict=True):
            assert t.status == "final"
            assert t.attempts == 1
            assert label in t.content
            header, _, _ = t.rendered.partition("\n")
            assert "not instructions" in header and t.rendered.endswith(f"{t.content}\n</summary>")
            # Its cost inside its tier's block: its dated line and the line break after it.
            assert t.token_count == hc.counter.count(item_line(t.content, t.started_at, t.ended_at)) + 1
        stats = (await hc.stats(CID))[0]
        assert (stats.topics, stats.topics_pending, stats.compressions) == (3, 0, 3)

        # A later seal is summarised once; earlier summaries are not touched again.
        await hc.seal_current_topic(CID)
        r3 = await hc.maintain(CID, now=feed.now)
        assert r3.summarized == 1
        h2 = await hc.get_history(CID)
        assert h2.topics[:3] == h.topics
        assert (h2.topics[3].first_sequence, h2.topics[3].last_sequence, h2.topics[3].attempts) == (13, 16, 1)
        assert (await hc.maintain(CID, now=feed.now)).summarized == 0
        assert (await hc.stats(CID))[0].compressions == 4


async def test_maintain_without_an_id_covers_every_conversation_once(db_url: str) -> None:
    async with compressor(db_url) as hc:
        for cid in ("a", "b", "c"):
            feed = Feed(hc, cid)
            await feed.topic(2, cid)
            await feed.topic(2, cid + "x")
        report = await hc.maintain(now=ts(10))
        assert report.summarized == 3
        assert report.conversations == 3
        assert (await hc.maintain(now=ts(10))).summarized == 0
        for cid in ("a", "b", "c"):
            topics = (await hc.get_history(cid)).topics
            assert [(t.first_sequence, t.last_sequence, t.status) for t in topics] == [(1, 2, "final")]


async def test_maintain_seals_a_silent_topic(db_url: str) -> None:
    async with compressor(db_url, silence_minutes=30) as hc:
        feed = Feed(hc)
        await feed.topic(3, "quiet")
        assert (await hc.maintain(CID, now=ts(3) + timedelta(minutes=29))).sealed == 0
        report = await hc.maintain(CID, now=ts(3) + timedelta(minutes=31))
        assert (report.sealed, report.summarized) == (1, 1)
        [topic] = (await hc.get_history(CID)).topics
        assert (topic.first_sequence, topic.last_sequence, topic.sealed_reason) == (1, 3, "silence")


async def test_one_maintain_pass_reaches_every_conversation_behind_ones_that_stay_due(db_url: str) -> None:
    # 20 conversations whose silent open topic is only a tool call still awaiting its result:
    # it cannot be sealed, so they stay due after every pass (and sort first, both by id and by
    # age). One pass must still reach the conversation behind them.
    async with compressor(db_url, silence_minutes=30) as hc:
        for k in range(20):
            await Feed(hc, cid=f"a-waiting-{k:02d}").add("assistant", tool_calls=[call(f"c{k}")])
        late = Feed(hc, cid="z-late")
        await late.topic(3, "late")
        report = await hc.maintain(now=ts(3) + timedelta(minutes=31))
        assert report.conversations == 21
        assert (report.sealed, report.summarized) == (1, 1)
        [topic] = (await hc.get_history("z-late")).topics
        assert (topic.sealed_reason, topic.status) == ("silence", "final")
        for k in range(20):
            assert (await hc.get_history(f"a-waiting-{k:02d}")).topics == []


async def _many_small_topics(hc: HistoryCompressor, n: int, start: int = 0) -> Feed:
    feed = Feed(hc, start=start)
    for k in range(n):
        await feed.topic(2, f"subject{start + k}", words=10)
    await hc.seal_current_topic(CID)
    return feed


async def test_merges_create_archives_and_merged_topics_stay_in_history(db_url: str) -> None:
    # Small archives (bulk_summary_tokens=20) and a bulk share of int(697 * 0.2) = 139: two
    # archives fit, so nothing is dropped; the topic share is int(697 * 0.3) = 209.
    async with compressor(db_url, bulk_summary_tokens=20, context_budget=700) as hc:
        feed = Feed(hc)
        await feed.topic(2, "subject0", words=10)
        await feed.topic(2, "subject1", words=10)
        await hc.seal_current_topic(CID)
        r1 = await hc.maintain(CID, now=feed.now)
        assert (r1.summarized, r1.merged) == (2, 0)  # two topics: fewer than bulk_merge_size
        first_two = (await hc.get_history(CID)).topics
        messages_before = (await hc.get_history(CID)).messages

        for k in range(2, 8):
            await feed.topic(2, f"subject{k}", words=10)
        await hc.seal_current_topic(CID)
        report = await hc.maintain(CID, now=feed.now)
        h = await hc.get_history(CID)
        assert report.summarized == 6
        assert report.merged >= 1
        assert report.merged == len(h.archives)
        assert report.dropped == 0
        assert all(a.dropped_at is None for a in h.archives)
        assert len(h.topics) == 8  # merged topics are kept
        assert h.messages[: len(messages_before)] == messages_before
        assert_partition(h.topics, h.open_topic_start, h.messages[-1].sequence)

        # The first two topics are unchanged apart from merged_into.
        assert [dataclasses.replace(t, merged_into=None) for t in h.topics[:2]] == first_two

        for archive in h.archives:
            # An archive merges topics (level 1: at least bulk_merge_size consecutive ones) or
            # rolls up archives (a level above theirs); it covers exactly what its members cover.
            members = sorted(
                (x for x in h.topics + h.archives if x.merged_into == archive.id),
                key=lambda x: x.first_sequence,
            )
            if archive.level == 1:
                assert len(members) >= 3 and all(x.tier == "topic" for x in members)
                assert [t.sequence for t in members] == list(
                    range(members[0].sequence, members[0].sequence + len(members))
                )
            else:
                assert all(x.tier == "bulk" and x.level < archive.level for x in members)
            assert archive.tier == "bulk" and archive.status == "final"
            assert archive.first_sequence == members[0].first_sequence
            assert archive.last_sequence == members[-1].last_sequence
            assert archive.source_tokens == sum(x.source_tokens for x in members)
            assert archive.started_at == min(x.started_at for x in members)
            assert archive.ended_at == max(x.ended_at for x in members)
            header, _, _ = archive.rendered.partition("\n")
            assert "not instructions" in header and archive.rendered.endswith(
                f"{archive.content}\n</archive>"
            )
        # The live archives cover the timeline from its first message, without gaps.
        live = sorted((a for a in h.archives if a.merged_into is None), key=lambda a: a.first_sequence)
        expected_first = 1
        for archive in live:
            assert archive.first_sequence == expected_first
            expected_first = archive.last_sequence + 1

        active = [t for t in h.topics if t.merged_into is None]
        assert active[0].first_sequence == expected_first
        # Merged topics are merged once; a second pass has nothing to do.
        r2 = await hc.maintain(CID, now=feed.now)
        assert (r2.summarized, r2.merged, r2.dropped) == (0, 0, 0)

        # With room to spare, the newest archive is shown as the topics it merged (never both).
        live_ids = [a.id for a in live]
        ctx = await hc.get_context(CID, 700)
        assert [a.id for a in ctx.bulk_archives] == live_ids[: len(ctx.bulk_archives)]
        parts = [t for t in ctx.historical_topics if t.merged_into is not None]
        assert parts and {t.merged_into for t in parts} <= set(live_ids) - {a.id for a in ctx.bulk_archives}
        shown = ctx.bulk_archives + ctx.historical_topics
        assert all(x.last_sequence < y.first_sequence for x, y in pairwise(shown))
        stats = (await hc.stats(CID))[0]
        assert (stats.topics, stats.archives, stats.archives_dropped) == (8, len(h.archives), 0)
        assert stats.compressions == 8 + len(h.archives)


async def test_rollups_keep_the_whole_timeline_and_every_archive_in_history(db_url: str) -> None:
    async with compressor(db_url, **SMALL) as hc:
        # Maintenance after each burst of topics: merges fill the archive share, then roll up.
        merged = rolled_up = 0
        for burst in range(5):
            feed = await _many_small_topics(hc, 6, start=12 * burst)
            r = await hc.maintain(CID, now=feed.now)
            merged, rolled_up = merged + r.merged, rolled_up + r.rolled_up
        now = feed.now
        h = await hc.get_history(CID)
        messages_before = h.messages
        assert merged >= 2 and rolled_up >= 1
        assert merged + rolled_up == len(h.archives)
        rolled = [a for a in h.archives if a.merged_into is not None]
        live = sorted((a for a in h.archives if a.merged_into is None), key=lambda a: a.first_sequence)
        assert rolled and all(a.dropped_at is None for a in h.archives)
        # The oldest part of the conversation is still represented, by the coarsest archive.
        assert live[0].first_sequence == 1 and live[0].level == max(a.level for a in h.archives) >= 1
        for a in rolled:  # still complete, and pointing at what replaced it
            assert a.content and a.rendered and a.first_sequence <= a.last_sequence
            assert a.merged_into in {x.id for x in h.archives}
        # Below cache_min_tokens the archives hold the bulk share and the topic tier's: 0.2 + 0.3.
        assert sum(a.token_count for a in live) <= int((600 - 3) * (0.2 + 0.3))
        assert h.messages == messages_before

        by_id = {a.id: a for a in h.archives}
        for max_tokens in (150, 300, 600, 5000):
            ctx = await hc.get_context(CID, max_tokens)
            # Live archives, or (a short context with room) the parts of the newest in its place.
            for a in ctx.bulk_archives:
                top = a
                while top.merged_into is not None:
                    top = by_id[top.merged_into]
                assert top.merged_into is None and top.dropped_at is None
            shown = ctx.bulk_archives + ctx.historical_topics
            assert all(x.last_sequence < y.first_sequence for x, y in pairwise(shown))
            assert ctx.total_tokens <= max_tokens
        stats = (await hc.stats(CID))[0]
        assert (stats.archives, stats.archives_dropped) == (len(h.archives), 0)
        again = await hc.maintain(CID, now=now)
        assert (again.merged, again.rolled_up, again.dropped) == (0, 0, 0)


async def test_history_covers_every_message_sequence_exactly_once(db_url: str) -> None:
    async with compressor(db_url, **SMALL) as hc:
        feed = await _many_small_topics(hc, 7)
        await feed.add("user", "pinned note", pinned=True)
        await feed.add("assistant", tool_calls=[call("t1")])
        await feed.add("tool", "result", tool_call_id="t1")
        await feed.add("user", "open topic message")
        await hc.maintain(CID, now=feed.now)
        h = await hc.get_history(CID)
        n = feed.i
        seqs = [m.sequence for m in h.messages]
        assert seqs == list(range(1, n + 1))
        assert len(set(seqs)) == n
        assert [m.content for m in h.messages] == [m.content for m, _ in feed.added]
        assert_partition(h.topics, h.open_topic_start, n)
        # Every merged topic points at an archive that exists.
        archive_ids = {a.id for a in h.archives}
        assert {t.merged_into for t in h.topics if t.merged_into is not None} == archive_ids
        # Archives cover contiguous ranges of whole topics.
        for a in h.archives:
            members = [t for t in h.topics if t.merged_into == a.id]
            assert (a.first_sequence, a.last_sequence) == (
                members[0].first_sequence,
                members[-1].last_sequence,
            )


async def test_a_summarised_tool_call_is_sent_whole_with_all_its_results(db_url: str) -> None:
    # Everything is summarised, so the context falls back to the newest unit: the call and
    # every one of its 70 results (more than any fixed look-back window), nothing cut off.
    async with compressor(db_url, redistribute_unused=False) as hc:
        feed = Feed(hc)
        await feed.topic(4, "alpha")
        ids = [f"r{k}" for k in range(70)]
        await feed.add("assistant", tool_calls=[call(i) for i in ids])
        for i in ids:
            await feed.add("tool", f"result {i}", tool_call_id=i)
        await hc.seal_current_topic(CID)
        await hc.maintain(CID, now=feed.now)
        state = await hc.store.state(CID)
        assert state is not None and state.summarized_upto == feed.i
        ctx = await hc.get_context(CID, max_tokens=4000)
        assert [m.sequence for m in ctx.current_topic] == list(range(5, feed.i + 1))
        assert ctx.current_topic[0].tool_calls is not None


async def test_search_finds_old_messages_after_compression(db_url: str) -> None:
    async with compressor(db_url, **SMALL) as hc:
        feed = Feed(hc)
        await feed.add("user", "My locker code is Needle-4711, remember it")
        await feed.add("assistant", "Stored: needle-4711.")
        await feed.add("user", "I scored 100% on the test")
        await feed.add("user", "and 1000 points in a_b mode")
        for burst in range(4):
            await _many_small_topics(hc, 6, start=feed.i + 12 * burst)
            await hc.maintain(CID, now=ts(200 + burst))
        h = await hc.get_history(CID)
        assert any(a.merged_into is not None for a in h.archives)  # rolled up into a coarser one
        ctx = await hc.get_context(CID, 600)
        assert [m.sequence for m in ctx.current_topic if m.sequence <= 4] == []  # not verbatim any more

        found = await hc.search(CID, "NEEDLE-4711")
        assert [(m.sequence, m.content) for m in found] == [
            (2, "Stored: needle-4711."),
            (1, "My locker code is Needle-4711, remember it"),
        ]
        assert [m.sequence for m in await hc.search(CID, "needle", limit=1)] == [2]
        # Wildcards are literal text.
        assert [m.sequence for m in await hc.search(CID, "100%")] == [3]
        assert [m.sequence for m in await hc.search(CID, "a_b")] == [4]
        # Words (issue 13): "a%b" is the phrase "a b", which only message 4 holds; "%" alone is text.
        assert [m.sequence for m in await hc.search(CID, "a%b")] == [4]
        assert [m.sequence for m in await hc.search(CID, "%")] == [3]
        assert await hc.search(CID, "no such text anywhere") == []


async def test_search_is_case_insensitive_beyond_ascii(db_url: str) -> None:
    async with compressor(db_url) as hc:
        await hc.add_message(CID, {"role": "user", "content": "Meeting in ZÜRICH at the CAFÉ"})
        await hc.add_message(CID, {"role": "assistant", "content": "Zürich café it is"})
        assert [m.sequence for m in await hc.search(CID, "ZURICH")] == []
        assert [m.sequence for m in await hc.search(CID, "zürich")] == [2, 1]
        assert [m.sequence for m in await hc.search(CID, "CAFÉ")] == [2, 1]


async def test_conversation_ids_are_exact_strings(db_url: str) -> None:
    async with compressor(db_url) as hc:
        ids = ["Room", "room", "room ", "röom", "room/1"]
        for k, cid in enumerate(ids):
            await hc.add_message(cid, {"role": "user", "content": f"message for {k}"})
        assert sorted(await hc.conversation_ids()) == sorted(ids)
        for k, cid in enumerate(ids):
            h = await hc.get_history(cid)
            assert [(m.sequence, m.content, m.conversation_id) for m in h.messages] == [
                (1, f"message for {k}", cid)
            ]


async def test_conversations_are_isolated(db_url: str) -> None:
    async with compressor(db_url) as hc:
        a, b = Feed(hc, "A"), Feed(hc, "B")
        for k in range(4):
            await a.add("user", f"alpha secret {k}")
            await b.add("user", f"bravo secret {k}" if k != 2 else "new topic: bravo secret 2")
        assert [m.sequence for m in (await hc.get_history("A")).messages] == [1, 2, 3, 4]
        assert [m.sequence for m in (await hc.get_history("B")).messages] == [1, 2, 3, 4]
        hb = await hc.get_history("B")
        assert [(t.first_sequence, t.last_sequence) for t in hb.topics] == [(1, 2)]
        assert (await hc.get_history("A")).topics == []

        await hc.seal_current_topic("A")
        assert (await hc.get_history("B")).open_topic_start == 3
        await hc.maintain("A", now=ts(10))
        assert [t.status for t in (await hc.get_history("A")).topics] == ["final"]
        assert [t.status for t in (await hc.get_history("B")).topics] == ["pending"]

        assert await hc.search("A", "bravo") == []
        assert len(await hc.search("B", "bravo")) == 4
        assert "bravo" not in str((await hc.get_context("A", 5000)).to_messages())
        assert "alpha" not in str((await hc.get_context("B", 5000)).to_messages())
        assert "bravo" not in str(await hc.get_history("A"))
        assert await hc.conversation_ids() == ["A", "B"]
        assert [s.conversation_id for s in await hc.stats()] == ["A", "B"]
        assert [s.messages for s in await hc.stats()] == [4, 4]


async def test_reopening_the_database_keeps_everything(sql_url: str) -> None:
    async with compressor(sql_url, **SMALL) as hc:
        feed = await _many_small_topics(hc, 5)
        await hc.maintain(CID, now=feed.now)
        await feed.add("user", "pinned rule", pinned=True)
        await feed.add("user", "still open")
        await feed.add("assistant", tool_calls=[call("z")])
        history = await hc.get_history(CID)
        ctx = await hc.get_context(CID, 400)
        stats = await hc.stats(CID)
    async with compressor(sql_url, **SMALL) as hc:
        assert await hc.get_history(CID) == history
        again = await hc.get_context(CID, 400)
        assert again.to_messages() == ctx.to_messages()
        assert again.total_tokens == ctx.total_tokens
        assert await hc.stats(CID) == stats
        # The open topic and the open tool call survived: the result is accepted, numbering continues.
        stored = await hc.add_message(
            CID, Message(role="tool", content="r", tool_call_id="z", timestamp=ts(99))
        )
        assert stored.sequence == feed.i + 1
        sealed = await hc.seal_current_topic(CID)
        assert sealed is not None
        assert (sealed.first_sequence, sealed.last_sequence) == (history.open_topic_start, feed.i + 1)


# -- concurrency ------------------------------------------------------------------------------


async def test_concurrent_adds_on_one_compressor_get_unique_gap_free_sequences(db_url: str) -> None:
    async with compressor(db_url) as hc:
        n = 40

        async def add(k: int) -> StoredMessage:
            text = f"new topic: msg {k}" if k % 7 == 0 else f"msg {k}"
            return await hc.add_message(CID, {"role": "user", "content": text})

        stored = await asyncio.gather(*(add(k) for k in range(n)))
        assert sorted(s.sequence for s in stored) == list(range(1, n + 1))
        h = await hc.get_history(CID)
        assert [m.sequence for m in h.messages] == list(range(1, n + 1))
        by_seq = {m.sequence: m.content for m in h.messages}
        assert all(by_seq[s.sequence] == s.content for s in stored)
        assert_partition(h.topics, h.open_topic_start, n)


async def test_concurrent_adds_from_two_compressors_on_one_database(sql_url: str) -> None:
    async with compressor(sql_url) as one, compressor(sql_url) as two:
        n = 60

        async def add(k: int) -> StoredMessage:
            hc = one if k % 2 else two
            text = f"new topic: msg {k}" if k % 9 == 0 else f"msg {k}"
            return await hc.add_message(CID, {"role": "user", "content": text})

        async def seal_some() -> None:
            for _ in range(5):
                await asyncio.sleep(0.01)
                with contextlib.suppress(ConversationNotFoundError):
                    await one.seal_current_topic(CID)

        results = await asyncio.gather(*(add(k) for k in range(n)), seal_some())
        stored = [r for r in results if isinstance(r, StoredMessage)]
        assert sorted(s.sequence for s in stored) == list(range(1, n + 1))
        for hc in (one, two):
            h = await hc.get_history(CID)
            assert [m.sequence for m in h.messages] == list(range(1, n + 1))
            assert sorted(m.content for m in h.messages) == sorted(s.content for s in stored)
            assert_partition(h.topics, h.open_topic_start, n)
            assert [t.sequence for t in h.topics] == list(range(1, len(h.topics) + 1))


async def test_concurrent_maintenance_by_two_workers_summarises_each_topic_once(sql_url: str) -> None:
    async with compressor(sql_url, **SMALL) as one, compressor(sql_url, **SMALL) as two:
        cids = [f"w{k}" for k in range(6)]
        for cid in cids:
            await _many_small_topics_in(one, cid, 4)
        r1, r2, r3 = await asyncio.gather(
            one.maintain(now=ts(50)), two.maintain(now=ts(50)), two.maintain(cids[0], now=ts(50))
        )
        assert r1.errors == r2.errors == r3.errors == []
        assert r1.summarized + r2.summarized + r3.summarized == 4 * len(cids)
        for cid in cids:
            h = await one.get_history(cid)
            assert [t.attempts for t in h.topics] == [1, 1, 1, 1]
            assert all(t.status == "final" for t in h.topics)
            merged = [t for t in h.topics if t.merged_into is not None]
            assert len(merged) == 3 * len(h.archives)
            assert (await one.stats(cid))[0].compressions == 4 + len(h.archives)
        assert (await one.maintain(now=ts(50))).summarized == 0


async def _many_small_topics_in(hc: HistoryCompressor, cid: str, n: int) -> None:
    feed = Feed(hc, cid)
    for k in range(n):
        await feed.topic(2, f"{cid}subject{k}", words=10)
    await hc.seal_current_topic(cid)
