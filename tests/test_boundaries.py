"""Topic-boundary rules: the pure functions, then the same rules through ``HistoryCompressor``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tiered_history import HistoryCompressor, Message
from tiered_history.core.boundaries import (
    EXPLICIT,
    MANUAL,
    SIZE,
    TEMPORAL,
    BoundaryRules,
    OpenTopic,
    decide,
    explicit_boundary,
    phrase_pattern,
    silence_elapsed,
    size_boundary,
    temporal_boundary,
)
from tiered_history.core.budget import topic_size_limit
from tiered_history.settings import DEFAULT_TRIGGER_PHRASES, Settings
from tiered_history.tokens import REPLY_PRIMING_TOKENS, TokenCounter

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)
SILENCE = timedelta(minutes=30)
PHRASES = DEFAULT_TRIGGER_PHRASES

RULES = BoundaryRules(
    explicit=True,
    temporal=True,
    size=True,
    phrases=PHRASES,
    trigger_roles=("user",),
    silence=SILENCE,
    size_limit=1000,
)


def topic(
    messages: int = 2, tokens: int = 50, last: datetime | None = T0, tool_call_open: bool = False
) -> OpenTopic:
    return OpenTopic(messages=messages, tokens=tokens, last_timestamp=last, tool_call_open=tool_call_open)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


# -- explicit phrases -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        "new topic",
        "OK, new topic: what about dogs?",
        "NEW TOPIC please",
        "New Topic!",
        "Let's move on to the budget",
        "let’s move on to the budget",  # curly apostrophe (U+2019), as phones type it
        "let‘s move on",  # U+2018
        "letʼs move on",  # U+02BC modifier letter apostrophe
        "lets move on",
        "Anyway, what time is it?",
        "unrelated, but how do I boil an egg?",
        "On another note\nwhat's the weather?",
        "so...(new topic) cooking",
        "Switching gears — taxes.",
        "new\u00a0topic".replace("\u00a0", " "),
        "Changing the subject: I got a cat",
    ],
)
def test_default_phrases_match(content: str) -> None:
    assert explicit_boundary(content, PHRASES)
    assert decide(RULES, topic(), "user", content, at(1), 10) == EXPLICIT


@pytest.mark.parametrize(
    "content",
    [
        "renew topic",  # the phrase inside a longer word
        "please renew topics",
        "new topics are welcome",  # the phrase continues into a longer word
        "a brand-newtopic",
        "the newest topic",
        "anyway let's keep going",  # "anyway," needs its comma
        "moving online is hard",  # "moving on" + "line"
        "let’s move onward",
        "topic new",
        "",
        "this is about topics in general",
    ],
)
def test_phrases_do_not_match_inside_words(content: str) -> None:
    assert not explicit_boundary(content, PHRASES)
    assert decide(RULES, topic(), "user", content, at(1), 10) is None


def test_curly_apostrophe_in_the_configured_phrase_matches_straight_text() -> None:
    assert explicit_boundary("let's change track", ["let’s change track"])
    assert explicit_boundary("let’s change track", ["let's change track"])


def test_phrase_match_is_case_insensitive_for_non_ascii_letters() -> None:
    assert explicit_boundary("ÜBRIGENS, wie spät ist es?", ["übrigens"])
    assert explicit_boundary("НОВАЯ ТЕМА: погода", ["новая тема"])


def test_phrases_are_literal_not_regular_expressions() -> None:
    assert explicit_boundary("ok (off topic) question", ["(off topic)"])
    assert not explicit_boundary("ok off topic question", ["(off topic)"])
    assert not explicit_boundary("new-topic", ["new.topic"])
    assert explicit_boundary("new.topic", ["new.topic"])


def test_blank_phrases_are_ignored() -> None:
    assert phrase_pattern(()) is None
    assert phrase_pattern(("", "   ")) is None
    assert not explicit_boundary("new topic", [])
    assert not explicit_boundary("anything", ["", " "])
    assert explicit_boundary("ok  New Topic", ["  new topic  "])


def test_phrase_in_assistant_message_does_not_seal_by_default() -> None:
    content = "New topic: let me tell you about dogs."
    assert decide(RULES, topic(), "assistant", content, at(1), 10) is None
    assert decide(RULES, topic(), "system", content, at(1), 10) is None
    with_assistant = replace(RULES, trigger_roles=("user", "assistant"))
    assert decide(with_assistant, topic(), "assistant", content, at(1), 10) == EXPLICIT


def test_custom_phrases_in_another_language() -> None:
    rules = replace(RULES, phrases=("nuevo tema", "cambiando de tema", "neues Thema"))
    assert decide(rules, topic(), "user", "Bueno, NUEVO TEMA: ¿qué tal el fútbol?", at(1), 10) == EXPLICIT
    assert decide(rules, topic(), "user", "Also, neues Thema.", at(1), 10) == EXPLICIT
    assert decide(rules, topic(), "user", "new topic", at(1), 10) is None  # defaults were replaced
    assert decide(rules, topic(), "user", "nuevo temario", at(1), 10) is None


def test_custom_phrase_in_a_language_without_spaces() -> None:
    assert explicit_boundary("では話題を変えましょう", ["話題を変え"])


def test_explicit_rule_can_be_disabled() -> None:
    rules = replace(RULES, explicit=False)
    assert decide(rules, topic(), "user", "new topic", at(1), 10) is None


# -- silence ------------------------------------------------------------------------------


def test_temporal_boundary_is_strictly_after_the_silence() -> None:
    assert not temporal_boundary(T0, T0 + SILENCE, SILENCE)
    assert temporal_boundary(T0, T0 + SILENCE + timedelta(microseconds=1), SILENCE)
    assert not temporal_boundary(None, T0 + timedelta(days=9), SILENCE)


def test_out_of_order_and_identical_timestamps_are_no_temporal_boundary() -> None:
    assert not temporal_boundary(T0, T0, SILENCE)
    assert not temporal_boundary(T0, T0 - timedelta(days=3), SILENCE)
    assert decide(RULES, topic(last=T0), "user", "hello", T0, 10) is None
    assert decide(RULES, topic(last=T0), "user", "hello", T0 - timedelta(hours=5), 10) is None


def test_silence_seals_before_the_message_after_the_gap() -> None:
    assert decide(RULES, topic(last=T0), "user", "back again", at(31), 10) == TEMPORAL
    assert decide(RULES, topic(last=T0), "user", "back again", at(29), 10) is None
    assert decide(replace(RULES, temporal=False), topic(last=T0), "user", "back", at(300), 10) is None


def test_silence_counts_for_any_role() -> None:
    assert decide(RULES, topic(last=T0), "assistant", "sorry for the delay", at(45), 10) == TEMPORAL


def test_silence_elapsed() -> None:
    assert not silence_elapsed(None, at(999), SILENCE)
    assert not silence_elapsed(T0, at(30), SILENCE)
    assert silence_elapsed(T0, at(30.01), SILENCE)
    assert not silence_elapsed(T0, T0 - timedelta(hours=1), SILENCE)  # clock behind the message


# -- size ---------------------------------------------------------------------------------


def test_size_boundary_needs_a_non_empty_topic() -> None:
    assert not size_boundary(0, 0, 5000, 1000)
    assert size_boundary(1, 1, 1000, 1000)
    assert not size_boundary(500, 3, 500, 1000)  # exactly at the limit still fits
    assert size_boundary(500, 3, 501, 1000)


def test_huge_single_message_does_not_seal_an_empty_topic_the_next_one_seals() -> None:
    empty = topic(messages=0, tokens=0, last=None)
    assert decide(RULES, empty, "user", "x " * 5000, at(0), 5000) is None
    after_huge = topic(messages=1, tokens=5000, last=at(0))
    assert decide(RULES, after_huge, "assistant", "ok", at(1), 5) == SIZE


def test_empty_topic_is_never_sealed_by_any_rule() -> None:
    empty = topic(messages=0, tokens=0, last=at(0))
    assert decide(RULES, empty, "user", "new topic", at(500), 5000) is None


def test_size_rule_can_be_disabled() -> None:
    assert decide(replace(RULES, size=False), topic(tokens=999), "user", "hi", at(1), 50) is None
    assert decide(RULES, topic(tokens=999), "user", "hi", at(1), 50) == SIZE


def test_topic_size_limit_follows_the_budget() -> None:
    assert topic_size_limit(8000, 0.5, 0.6) == int((8000 - REPLY_PRIMING_TOKENS) * 0.5 * 0.6)
    assert topic_size_limit(1000, 0.5, 1.0) < topic_size_limit(2000, 0.5, 1.0)


# -- tool calls and precedence -------------------------------------------------------------


def test_only_a_user_turn_may_open_a_topic_while_a_tool_call_is_open() -> None:
    busy = topic(tokens=5000, last=T0, tool_call_open=True)
    # A user turn abandons the open call; the store then seals before the call, never inside it.
    assert decide(RULES, busy, "user", "new topic", at(120), 5000) == EXPLICIT
    assert decide(RULES, busy, "assistant", "still waiting", at(120), 5000) is None


def test_tool_results_never_open_a_topic() -> None:
    assert decide(RULES, topic(tokens=5000), "tool", "new topic", at(120), 5000) is None
    all_roles = replace(RULES, trigger_roles=("user", "assistant", "system", "tool"))
    assert decide(all_roles, topic(), "tool", "new topic", at(1), 5) is None


def test_reason_precedence_explicit_then_silence_then_size() -> None:
    big = topic(tokens=999, last=T0)
    assert decide(RULES, big, "user", "new topic", at(60), 50) == EXPLICIT
    assert decide(RULES, big, "user", "hello", at(60), 50) == TEMPORAL
    assert decide(RULES, big, "user", "hello", at(1), 50) == SIZE


# -- through HistoryCompressor ------------------------------------------------------------


def msg(role: str, content: str, minutes: float, **extra: Any) -> dict[str, Any]:
    return {"role": role, "content": content, "timestamp": at(minutes), **extra}


@pytest.fixture
def url(db_url: str) -> str:
    """Each integration test runs on the in-memory store, a SQLite file and PostgreSQL."""
    return db_url


@pytest.fixture
async def hc(url: str) -> AsyncIterator[HistoryCompressor]:
    async with HistoryCompressor(url) as compressor:
        yield compressor


async def test_message_with_the_phrase_opens_the_new_topic(hc: HistoryCompressor) -> None:
    await hc.add_message("c", msg("user", "Tell me about cats", 0))
    await hc.add_message("c", msg("assistant", "Cats are small carnivores.", 1))
    before = datetime.now(UTC)
    await hc.add_message("c", msg("user", "Let’s move on: what about dogs?", 2))
    after = datetime.now(UTC)
    await hc.add_message("c", msg("assistant", "Dogs are loyal.", 3))
    h = await hc.get_history("c")
    assert len(h.topics) == 1
    t = h.topics[0]
    assert (t.first_sequence, t.last_sequence) == (1, 2)
    assert t.sealed_reason == EXPLICIT
    assert t.status == "pending"
    assert t.sealed_at is not None and before <= t.sealed_at <= after
    assert (t.started_at, t.ended_at) == (at(0), at(1))
    assert h.open_topic_start == 3
    assert h.messages[2].content.startswith("Let’s move on")
    report = await hc.maintain(now=at(4))  # the open topic is not silent yet: only topic 1
    assert report.summarized == 1 and report.sealed == 0
    [done] = (await hc.get_history("c")).topics
    assert done.status == "final" and done.attempts == 1
    assert "cats" in done.content.lower() and "dogs" not in done.content.lower()
    ctx = await hc.get_context("c", 2000)
    assert [m.content for m in ctx.current_topic] == ["Let’s move on: what about dogs?", "Dogs are loyal."]


async def test_phrase_inside_a_word_or_from_the_assistant_does_not_seal(hc: HistoryCompressor) -> None:
    await hc.add_message("c", msg("user", "How do I renew topics in the forum?", 0))
    await hc.add_message("c", msg("assistant", "New topic: click renew.", 1))
    await hc.add_message("c", msg("user", "new topics are locked", 2))
    h = await hc.get_history("c")
    assert h.topics == [] and h.open_topic_start == 1


async def test_first_message_with_the_phrase_seals_nothing(hc: HistoryCompressor) -> None:
    await hc.add_message("c", msg("user", "New topic: hello", 0))
    h = await hc.get_history("c")
    assert h.topics == [] and h.open_topic_start == 1


async def test_custom_phrases_and_roles_via_settings(url: str) -> None:
    async with HistoryCompressor(
        url, boundaries={"trigger_phrases": ["nuevo tema"], "trigger_roles": ["user", "assistant"]}
    ) as hc:
        await hc.add_message("c", msg("user", "hola", 0))
        await hc.add_message("c", msg("user", "new topic: ignored now", 1))
        await hc.add_message("c", msg("user", "Nuevo tema: ¿fútbol?", 2))
        await hc.add_message("c", msg("assistant", "Vale, nuevo tema entonces", 3))
        h = await hc.get_history("c")
        assert [(t.first_sequence, t.last_sequence, t.sealed_reason) for t in h.topics] == [
            (1, 2, EXPLICIT),
            (3, 3, EXPLICIT),
        ]
        assert h.open_topic_start == 4


async def test_explicit_boundaries_disabled_via_settings(url: str) -> None:
    async with HistoryCompressor(url, boundaries={"explicit": False}) as hc:
        await hc.add_message("c", msg("user", "hello", 0))
        await hc.add_message("c", msg("user", "new topic", 1))
        assert (await hc.get_history("c")).topics == []


async def test_silence_between_messages_seals_on_add(hc: HistoryCompressor) -> None:
    await hc.add_message("c", msg("user", "morning", 0))
    await hc.add_message("c", msg("assistant", "morning!", 1))
    await hc.add_message("c", msg("user", "back after lunch", 1 + 31))
    [t] = (await hc.get_history("c")).topics
    assert (t.first_sequence, t.last_sequence, t.sealed_reason) == (1, 2, TEMPORAL)


async def test_out_of_order_and_identical_timestamps_do_not_seal(hc: HistoryCompressor) -> None:
    await hc.add_message("c", msg("user", "one", 60))
    await hc.add_message("c", msg("assistant", "two", 60))  # identical
    await hc.add_message("c", msg("user", "three (clock skew)", 0))  # an hour earlier
    await hc.add_message("c", msg("assistant", "four", 61))  # 61 min after "three", 1 after "two"
    h = await hc.get_history("c")
    assert h.topics == []
    assert [m.content for m in h.messages] == ["one", "two", "three (clock skew)", "four"]
    # The open topic's last activity is the newest timestamp seen, not the last one added.
    assert (await hc.maintain(now=at(60 + 29))).sealed == 0


async def test_silence_sealing_via_maintain(hc: HistoryCompressor) -> None:
    await hc.add_message("c", msg("user", "quiet topic", 0))
    await hc.add_message("c", msg("assistant", "indeed", 2))
    await hc.add_message("busy", msg("user", "still talking", 25))
    early = await hc.maintain(now=at(2 + 29))
    assert early.sealed == 0
    assert (await hc.get_history("c")).topics == []
    now = at(2 + 31)
    report = await hc.maintain(now=now)
    assert report.sealed == 1 and report.summarized == 1 and not report.errors
    h = await hc.get_history("c")
    [t] = h.topics
    assert t.sealed_reason == TEMPORAL
    assert t.sealed_at == now
    assert (t.first_sequence, t.last_sequence) == (1, 2)
    assert t.status == "final" and t.attempts == 1
    assert h.open_topic_start == 3
    assert (await hc.get_history("busy")).topics == []  # 8 minutes quiet only
    assert (await hc.maintain(now=at(2 + 45))).sealed == 0  # nothing left to seal in "c"
    again = await hc.maintain(now=at(25 + 31))
    assert again.sealed == 1
    assert (await hc.get_history("busy")).topics[0].sealed_reason == TEMPORAL


async def test_silence_sealing_disabled_with_the_temporal_rule(url: str) -> None:
    async with HistoryCompressor(url, boundaries={"temporal": False}) as hc:
        await hc.add_message("c", msg("user", "quiet", 0))
        await hc.add_message("c", msg("user", "much later", 600))
        assert (await hc.maintain(now=at(6000))).sealed == 0
        assert (await hc.get_history("c")).topics == []


async def test_silence_seal_keeps_an_open_tool_call_with_its_result(hc: HistoryCompressor) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    await hc.add_message("c", msg("user", "weather?", 0))
    await hc.add_message("c", msg("assistant", "", 1, tool_calls=[call]))
    report = await hc.maintain(now=at(120))
    assert report.sealed == 1
    [t] = (await hc.get_history("c")).topics
    assert (t.first_sequence, t.last_sequence) == (1, 1)  # the call stays in the open topic
    # While the call is open, even an explicit phrase does not seal.
    await hc.add_message("c", msg("tool", "new topic: sunny", 121, tool_call_id="call_1"))
    h = await hc.get_history("c")
    assert len(h.topics) == 1 and h.open_topic_start == 2


async def test_no_seal_between_a_tool_call_and_its_result(hc: HistoryCompressor) -> None:
    call = {"id": "call_9", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    await hc.add_message("c", msg("user", "look it up", 0))
    await hc.add_message("c", msg("assistant", "", 1, tool_calls=[call]))
    await hc.add_message("c", msg("tool", "result", 90, tool_call_id="call_9"))  # silence, but a result
    assert (await hc.get_history("c")).topics == []
    await hc.add_message("c", msg("assistant", "found it", 91))
    await hc.add_message("c", msg("user", "new topic: thanks", 92))
    [t] = (await hc.get_history("c")).topics
    assert (t.first_sequence, t.last_sequence, t.sealed_reason) == (1, 4, EXPLICIT)


async def test_new_topic_during_an_open_tool_call_seals_before_the_call(hc: HistoryCompressor) -> None:
    call = {"id": "call_7", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    await hc.add_message("c", msg("user", "look it up", 0))
    await hc.add_message("c", msg("assistant", "", 1, tool_calls=[call]))
    await hc.add_message("c", msg("user", "new topic: never mind", 2))
    h = await hc.get_history("c")
    [t] = h.topics
    assert (t.first_sequence, t.last_sequence, t.sealed_reason) == (1, 1, EXPLICIT)
    assert h.open_topic_start == 2
    # The abandoned call has no result, so it is never sent (a lone call is a 400 from the API).
    ctx = await hc.get_context("c", 1000)
    assert [
        m["content"] for m in ctx.to_messages() if m["role"] != "user" or "<summary>" not in m["content"]
    ][-1:] == ["new topic: never mind"]
    assert all("tool_calls" not in m for m in ctx.to_messages())


async def test_huge_message_alone_then_next_message_seals_by_size(url: str) -> None:
    counter = TokenCounter()
    settings = Settings.load(context_budget=1000, boundaries={"explicit": False, "temporal": False})
    limit = topic_size_limit(1000, settings.tiers.current_topic, settings.token_threshold)
    huge = "word " * 395  # under max_message_chars, so counted whole
    assert counter.message_tokens({"role": "user", "content": huge}) > limit
    async with HistoryCompressor(url, settings=settings) as hc:
        await hc.add_message("c", msg("user", huge, 0))
        assert (await hc.get_history("c")).topics == []
        await hc.add_message("c", msg("assistant", "that was long", 1))
        h = await hc.get_history("c")
        [t] = h.topics
        assert (t.first_sequence, t.last_sequence, t.sealed_reason) == (1, 1, SIZE)
        assert h.open_topic_start == 2
        await hc.add_message("c", msg("user", "short", 2))
        assert len((await hc.get_history("c")).topics) == 1


async def test_size_seal_when_small_messages_add_up(url: str) -> None:
    async with HistoryCompressor(
        url, context_budget=1000, boundaries={"explicit": False, "temporal": False}
    ) as hc:
        text = "sentence number {0} is about the same subject again. " * 4
        for i in range(40):
            await hc.add_message("c", msg("user" if i % 2 == 0 else "assistant", text.format(i), i))
        h = await hc.get_history("c")
        assert len(h.topics) >= 3
        assert {t.sealed_reason for t in h.topics} == {SIZE}
        limit = topic_size_limit(1000, 0.5, 0.6)
        for t in h.topics:
            assert t.source_tokens <= limit
        # Topics tile the sealed range with no gap and no overlap.
        assert h.topics[0].first_sequence == 1
        for a, b in zip(h.topics, h.topics[1:], strict=False):
            assert b.first_sequence == a.last_sequence + 1
        assert h.open_topic_start == h.topics[-1].last_sequence + 1


async def test_manual_seal_records_reason_and_time(hc: HistoryCompressor) -> None:
    await hc.add_message("c", msg("user", "something", 0))
    before = datetime.now(UTC)
    sealed = await hc.seal_current_topic("c")
    after = datetime.now(UTC)
    assert sealed is not None and sealed.sealed_reason == MANUAL
    assert sealed.sealed_at is not None and before <= sealed.sealed_at <= after
    assert await hc.seal_current_topic("c") is None  # nothing open: no empty topic
    [t] = (await hc.get_history("c")).topics
    assert t.sealed_reason == MANUAL and t.sealed_at == sealed.sealed_at


# -- the minimum topic size gate ---------------------------------------------------------------


def test_phrases_and_silence_wait_for_min_topic_tokens() -> None:
    gated = BoundaryRules(
        explicit=True,
        temporal=True,
        size=True,
        phrases=("new topic",),
        trigger_roles=("user",),
        silence=timedelta(minutes=30),
        size_limit=10_000,
        min_tokens=120,
    )
    small = OpenTopic(messages=2, tokens=40, last_timestamp=T0, tool_call_open=False)
    big = OpenTopic(messages=9, tokens=120, last_timestamp=T0, tool_call_open=False)
    later = T0 + timedelta(hours=2)
    assert decide(gated, small, "user", "new topic: hi", T0, 5) is None
    assert decide(gated, small, "user", "hi again", later, 5) is None
    assert decide(gated, big, "user", "new topic: hi", T0, 5) == EXPLICIT
    assert decide(gated, big, "user", "hi again", later, 5) == TEMPORAL


async def test_default_gate_keeps_a_tiny_exchange_open_and_summaries_never_inflate() -> None:
    async with HistoryCompressor("memory://", boundaries={"min_topic_tokens": 120}) as hc:
        await hc.add_message("g", Message(role="user", content="hi", timestamp=T0))
        await hc.add_message("g", Message(role="assistant", content="hello!", timestamp=T0))
        await hc.add_message("g", Message(role="user", content="new topic: pasta?", timestamp=T0))
        assert (await hc.get_history("g")).topics == []
        report = await hc.maintain(now=T0 + timedelta(hours=1))
        assert report.sealed == 0  # 3 tiny messages: silence does not seal them either
        long_text = "We compared three database engines for the billing service in detail. " * 12
        await hc.add_message("g", Message(role="user", content=long_text, timestamp=T0))
        await hc.add_message("g", Message(role="user", content="new topic: the trip", timestamp=T0))
        await hc.maintain(now=T0)
        topics = (await hc.get_history("g")).topics
        assert [t.sealed_reason for t in topics] == [EXPLICIT]
        assert all(0 < t.token_count < t.source_tokens for t in topics)
