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
    reply_sequence,
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
    # Issue 14: a phrase in an assistant message never triggers, whatever trigger_roles say.
    with_assistant = replace(RULES, trigger_roles=("user", "assistant"))
    assert decide(with_assistant, topic(), "assistant", content, at(1), 10) is None


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


def test_topic_size_limit_is_capped_by_max_topic_tokens() -> None:
    assert topic_size_limit(8000, 0.5, 0.6, 1200) == 1200
    assert topic_size_limit(4000, 0.5, 0.6, 1200) == topic_size_limit(4000, 0.5, 0.6) == 1199
    assert topic_size_limit(8000, 0.5, 0.6, 0) == topic_size_limit(8000, 0.5, 0.6) == 2399


async def test_a_long_topic_is_sealed_at_max_topic_tokens_in_a_large_context(url: str) -> None:
    """At the default 8,000-token budget a topic is sealed by size at 1,200 tokens (the default
    cap), not at the 2,399 the share alone gives; with the cap off (0), at 2,399."""
    counter = TokenCounter()
    text = "the depot report lists crates vans and shelves " * 8
    size = counter.message_tokens({"role": "user", "content": text})
    for cap, limit in ((None, 1200), (0, 2399)):
        capped = {} if cap is None else {"max_topic_tokens": cap}
        settings = Settings.load(
            **capped, boundaries={"explicit": False, "temporal": False, "cohesion": False}
        )
        async with HistoryCompressor(url, settings=settings) as hc:
            for k in range(3 * limit // size):
                await hc.add_message(f"c{cap}", msg("user" if k % 2 == 0 else "assistant", text, k))
            topics = (await hc.get_history(f"c{cap}")).topics
            assert topics and all(t.sealed_reason == SIZE for t in topics)
            sizes = [t.source_tokens for t in topics]
            assert all(limit - size <= n <= limit for n in sizes), (cap, sizes)


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
    # The sealed topic is shorter word for word than its summary: it is sent as it was said.
    ctx = await hc.get_context("c", 2000)
    assert [m.sequence for m in ctx.current_topic] == [1, 2, 3, 4] and ctx.historical_topics == []


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


async def test_a_reply_to_the_topic_sealed_just_before_reopens_it(url: str) -> None:
    # ``metadata["reply_to"]`` names the sequence replied to (a threaded reply, a quote).
    async with HistoryCompressor(url, boundaries={"min_topic_tokens": 0}) as hc:
        for cid, meta in (("reply", {"reply_to": 2}), ("plain", {}), ("older", {"reply_to": 3})):
            await hc.add_message(cid, msg("user", "How do I water tomato seedlings?", 0))
            await hc.add_message(cid, msg("assistant", "Deeply, in the morning.", 1))
            await hc.add_message(cid, msg("user", "Any plans for the weekend?", 90))  # silence seals
            assert [t.sealed_reason for t in (await hc.get_history(cid)).topics] == ["silence"]
            await hc.add_message(cid, msg("user", "Thanks, that helped a lot!", 91, metadata=meta))
        reopened = await hc.get_history("reply")
        assert reopened.open_topic_start == 1 and [t.status for t in reopened.topics] == ["superseded"]
        ctx = await hc.get_context("reply", 4000)
        assert [m.sequence for m in ctx.current_topic] == [1, 2, 3, 4]
        # Without it, or replying inside the open topic, the seal stands.
        for cid in ("plain", "older"):
            h = await hc.get_history(cid)
            assert h.open_topic_start == 3 and [t.sealed_reason for t in h.topics] == ["silence"]


def test_reply_sequence_reads_whole_numbers_only() -> None:
    assert reply_sequence({"reply_to": 7}) == 7
    assert reply_sequence({"reply_to": True}) is None
    assert reply_sequence({"reply_to": "7"}) is None
    assert reply_sequence({"reply_to": -1}) is None
    assert reply_sequence(None) is None and reply_sequence({}) is None


async def test_custom_phrases_and_roles_via_settings(url: str) -> None:
    # No default language: only the phrases given count. Assistant messages never trigger (issue 14).
    boundaries = {"languages": [], "trigger_phrases": ["nuevo tema"], "trigger_roles": ["user", "assistant"]}
    async with HistoryCompressor(url, boundaries=boundaries) as hc:
        await hc.add_message("c", msg("user", "hola", 0))
        await hc.add_message("c", msg("user", "new topic: ignored now", 1))
        await hc.add_message("c", msg("user", "Nuevo tema: ¿fútbol?", 2))
        await hc.add_message("c", msg("assistant", "Vale, nuevo tema entonces", 3))
        h = await hc.get_history("c")
        assert [(t.first_sequence, t.last_sequence, t.sealed_reason) for t in h.topics] == [(1, 2, EXPLICIT)]
        assert h.open_topic_start == 3


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


async def test_results_past_the_size_limit_seal_before_their_call(url: str) -> None:
    """A tool result starts no topic, but one that pushes the open topic past the size limit
    seals it before the call: the call and its results go whole into the next topic (else a
    large result outgrows the window with no event, a rewrite of the cached prefix)."""
    settings = Settings.load(
        context_budget=1000, boundaries={"explicit": False, "temporal": False, "cohesion": False}
    )
    limit = topic_size_limit(1000, settings.tiers.current_topic, settings.token_threshold)
    calls = [
        {"id": f"call_{k}", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
        for k in range(3)
    ]
    async with HistoryCompressor(url, settings=settings) as hc:
        await hc.add_message("c", msg("user", "Look up the three depots, please. " * 3, 0))
        await hc.add_message("c", msg("assistant", "", 1, tool_calls=calls))
        result = "depot row with crates and vans. " * (limit // 16)
        await hc.add_message("c", msg("tool", result, 2, tool_call_id="call_0"))
        assert (await hc.get_history("c")).topics == []  # under the limit still
        await hc.add_message("c", msg("tool", result, 3, tool_call_id="call_1"))
        h = await hc.get_history("c")
        [t] = h.topics
        assert (t.first_sequence, t.last_sequence, t.sealed_reason) == (1, 1, SIZE)
        assert h.open_topic_start == 2  # the call and its results so far, whole
        await hc.add_message("c", msg("tool", "depot 3: empty", 4, tool_call_id="call_2"))
        assert len((await hc.get_history("c")).topics) == 1
        ctx = await hc.get_context("c", 1000)
        sent = ctx.to_messages()
        at_call = next(i for i, m in enumerate(sent) if m.get("tool_calls"))
        assert [m.get("tool_call_id") for m in sent[at_call + 1 : at_call + 4]] == [
            "call_0",
            "call_1",
            "call_2",
        ]


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


# == issue 14: the combined decision, unseal, properties, pluggable detectors ======================

from collections.abc import Sequence  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tiered_history.core.boundaries import (  # noqa: E402
    COHESION,
    PROPOSAL_CONFIDENCE,
    UNSEAL,
    BoundaryDetector,
    Decision,
    Incoming,
    Proposal,
    Turn,
    choose_proposal,
)
from tiered_history.core.cohesion import UNSEAL_MESSAGES  # noqa: E402
from tiered_history.core.phrases import phrases_for  # noqa: E402

COOKING = [
    "How long should I boil fresh pasta for carbonara?",
    "Fresh pasta needs two or three minutes; dried spaghetti about nine.",
    "And the carbonara sauce: eggs, pecorino and guanciale only?",
    "Yes: eggs, pecorino, guanciale and black pepper, tossed with the pasta.",
    "Guanciale or pancetta for the carbonara?",
    "Guanciale is traditional; pancetta works if you cannot find it.",
]
GARDEN = [
    "My tomato seedlings wilt every afternoon on the balcony.",
    "Wilting seedlings on a sunny balcony usually need deeper watering and afternoon shade.",
]
NEW_RULES = BoundaryRules(
    explicit=True,
    temporal=True,
    size=True,
    phrases=phrases_for(),
    trigger_roles=("user",),
    silence=SILENCE,
    size_limit=100_000,
    min_tokens=0,
)


class Convo:
    """A tiny engine: keeps the open topic as ``add_message`` would and applies each decision."""

    def __init__(self, rules: BoundaryRules = NEW_RULES) -> None:
        self.rules = rules
        self.start, self.messages, self.tokens = 1, 0, 0
        self.state: str | None = None
        self.last: datetime | None = None
        self.cuts: list[int] = []
        self.call_open = False
        self.seq = 0

    def topic(self) -> OpenTopic:
        return OpenTopic(
            messages=self.messages,
            tokens=self.tokens,
            last_timestamp=self.last,
            tool_call_open=self.call_open,
            start=self.start,
            detector=self.state,
            last_seal_start=self.cuts[-1] if self.cuts else None,
        )

    def add(
        self,
        text: str,
        role: str = "user",
        minutes: float | None = None,
        reply_to: int | None = None,
        tool_call: bool = False,
    ) -> Decision:
        self.seq += 1
        ts = at(self.seq * 0.5 if minutes is None else minutes)
        d = decide(self.rules, self.topic(), Incoming(role, text, ts, 30, tool_call, False, reply_to))
        self.state = d.detector
        if d.reason == UNSEAL:
            self.start = self.cuts.pop()
            self.messages = self.seq - self.start
        elif d.reason is not None:
            self.cuts.append(self.start)
            self.start, self.messages = self.seq - d.keep, d.keep
        self.messages += 1
        self.tokens = 30 * self.messages
        self.last = ts if self.last is None else max(self.last, ts)
        if role == "assistant" and tool_call:
            self.call_open = True
        elif role in ("tool", "user"):
            self.call_open = False
        return d

    def seal_outside(self) -> None:
        """``maintain()`` or ``seal_current_topic`` sealed the open topic without asking ``decide``."""
        self.cuts.append(self.start)
        self.start, self.messages, self.tokens = self.seq + 1, 0, 0


def seal_by_cohesion(c: Convo) -> None:
    for i, text in enumerate(COOKING):
        c.add(text, "user" if i % 2 == 0 else "assistant")
    c.add(GARDEN[0], "user")
    d = c.add(GARDEN[1], "assistant")
    assert (d.reason, d.keep) == (COHESION, 1)
    assert c.start == 7


def test_new_contract_returns_a_decision_with_the_state_to_persist() -> None:
    c = Convo()
    d = c.add("How long should I boil fresh pasta?")
    assert isinstance(d, Decision) and d.reason is None and d.keep == 0
    assert d.detector is not None and d.detector.startswith('{"v":')


def test_legacy_call_form_still_answers_with_the_reason_only() -> None:
    legacy = decide(NEW_RULES, topic(), "user", "New topic: billing", at(1), 10)
    assert legacy == EXPLICIT
    assert decide(NEW_RULES, topic(), "user", "hello there", at(1), 10) is None


BACK = "Back to the carbonara: how much pecorino and guanciale for four?"
LEXICAL = replace(NEW_RULES, unseal_after_cohesion=True)


def test_unseal_when_the_next_message_continues_the_sealed_topic() -> None:
    c = Convo(LEXICAL)
    seal_by_cohesion(c)
    d = c.add(BACK, "user")
    assert d.reason == UNSEAL
    assert c.start == 1 and c.cuts == []


def test_by_default_only_a_reply_undoes_a_detector_seal() -> None:
    c = Convo()
    seal_by_cohesion(c)
    assert c.add(BACK, "user").reason is None


def test_unseal_when_the_message_replies_to_a_message_before_the_seal() -> None:
    c = Convo()
    seal_by_cohesion(c)
    assert c.add("thanks", "user", reply_to=3).reason == UNSEAL


def test_a_reply_to_an_older_topic_or_to_the_open_one_does_not_unseal() -> None:
    c = Convo()
    seal_by_cohesion(c)
    assert c.add("yes", "user", reply_to=7).reason is None  # the open topic itself
    c2 = Convo()
    seal_by_cohesion(c2)
    assert c2.add("yes", "user", reply_to=None).reason is None


def test_no_unseal_after_the_window_has_passed() -> None:
    c = Convo(LEXICAL)
    seal_by_cohesion(c)
    for _ in range(UNSEAL_MESSAGES):
        c.add("Wilting tomato seedlings on the balcony: more shade?", "user")
    assert c.add("Back to the carbonara: pecorino and guanciale for four?", "user").reason is None


def test_explicit_and_manual_seals_are_never_undone() -> None:
    c = Convo()
    for i, text in enumerate(COOKING):
        c.add(text, "user" if i % 2 == 0 else "assistant")
    assert c.add("New topic: my tomato seedlings wilt.", "user").reason == EXPLICIT
    assert c.add("Back to the carbonara: pecorino and guanciale?", "user", reply_to=2).reason is None
    m = Convo()
    for i, text in enumerate(COOKING):
        m.add(text, "user" if i % 2 == 0 else "assistant")
    m.seal_outside()  # by hand: the next message comes within the silence
    assert m.add("Back to the carbonara: pecorino and guanciale?", "user", reply_to=2).reason is None


def test_a_silence_seal_made_by_maintain_is_undone_when_the_topic_goes_on() -> None:
    c = Convo()
    for i, text in enumerate(COOKING):
        c.add(text, "user" if i % 2 == 0 else "assistant", minutes=i)
    c.seal_outside()  # maintain() sealed it after 30 quiet minutes
    d = c.add("Back to the carbonara: pecorino and guanciale for four?", "user", minutes=120)
    assert d.reason == UNSEAL


def test_a_trigger_phrase_never_unseals() -> None:
    c = Convo(LEXICAL)
    seal_by_cohesion(c)
    d = c.add("New topic: carbonara with pecorino and guanciale for four?", "user")
    assert d.reason != UNSEAL


def test_unseal_can_be_disabled() -> None:
    c = Convo(replace(LEXICAL, unseal=False))
    seal_by_cohesion(c)
    assert c.add(BACK, "user", reply_to=3).reason is None


def test_size_seal_keeps_its_cut_before_the_incoming_message_when_asked() -> None:
    r = replace(NEW_RULES, cohesion=False, size_limit=8 * 30 + 10, size_cut_at_shift=False)
    c = Convo(r)
    for i, text in enumerate(COOKING + GARDEN):
        c.add(text, "user" if i % 2 == 0 else "assistant")
    d = c.add("and how often should I water?", "user")
    assert (d.reason, d.keep) == (SIZE, 0)


WORDS = COOKING + GARDEN + ["", "ok", "New topic: billing", "Let's move on.", '{"temp": 21}', "why?"]


@st.composite
def conversations(draw: st.DrawFn) -> list[tuple[str, str, bool, float, int | None]]:
    n = draw(st.integers(1, 40))
    out = []
    minute = 0.0
    for i in range(n):
        role = draw(st.sampled_from(["user", "assistant", "tool", "system"]))
        text = draw(st.sampled_from(WORDS))
        call = role == "assistant" and draw(st.booleans())
        minute += draw(st.sampled_from([0.0, 0.5, 1.0, 45.0, -5.0]))
        reply = draw(st.none() | st.integers(0, i + 1))
        out.append((role, text, call, minute, reply))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), st.booleans())
def test_properties_of_every_decision(
    convo: list[tuple[str, str, bool, float, int | None]], small: bool
) -> None:
    rules = replace(NEW_RULES, size_limit=120 if small else 100_000, min_tokens=0)
    c = Convo(rules)
    kinds: list[tuple[str, bool]] = []  # per stored message: role, whether a call was open when it came
    for role, text, call, minute, reply in convo:
        opened = c.call_open
        topic = c.topic()
        again = decide(rules, topic, Incoming(role, text, at(minute), 30, call, False, reply))
        d = c.add(text, role, minutes=minute, reply_to=reply, tool_call=call)
        assert d == again  # deterministic
        assert d.detector is not None and len(d.detector.encode()) <= 2048
        if d.reason is not None and d.reason != UNSEAL:
            assert 0 <= d.keep < topic.messages  # the sealed part is never empty
            cut_role, cut_opened = (role, opened) if d.keep == 0 else kinds[-d.keep]
            assert cut_role != "tool"  # never a topic opened by a tool result
            assert not (cut_role == "assistant" and cut_opened)  # never inside an open call
        kinds.append((role, opened))


# -- pluggable detectors ------------------------------------------------------------------------


class FixedDetector:
    name = "fixed"
    window = 8

    def __init__(self, proposals: list[Proposal]) -> None:
        self.proposals = proposals

    async def propose(self, turns: Sequence[Turn]) -> Sequence[Proposal]:
        return self.proposals


TURNS = [
    Turn(10 + i, role, f"message {i}", at(i), 40)
    for i, role in enumerate(["user", "assistant", "tool", "assistant", "user", "assistant"])
]
OPEN = OpenTopic(
    messages=6, tokens=240, last_timestamp=at(5), tool_call_open=False, start=10, last_seal_start=3
)


async def test_a_detector_class_satisfies_the_protocol() -> None:
    det = FixedDetector([Proposal(14, 0.9)])
    assert isinstance(det, BoundaryDetector)
    assert list(await det.propose(TURNS)) == [Proposal(14, 0.9)]


def test_choose_proposal_policy() -> None:
    rules = replace(NEW_RULES, min_tokens=100)
    assert choose_proposal([Proposal(14, 0.9)], rules, OPEN, TURNS) == Proposal(14, 0.9)
    assert choose_proposal([Proposal(14, PROPOSAL_CONFIDENCE - 0.01)], rules, OPEN, TURNS) is None
    assert choose_proposal([Proposal(12, 0.9)], rules, OPEN, TURNS) is None  # a tool result
    assert choose_proposal([Proposal(10, 0.9)], rules, OPEN, TURNS) is None  # the topic's own start
    assert choose_proposal([Proposal(11, 0.9)], rules, OPEN, TURNS) is None  # under min_tokens before it
    assert choose_proposal([Proposal(99, 0.9)], rules, OPEN, TURNS) is None  # not in the window
    two = choose_proposal([Proposal(14, 0.4), Proposal(14, 0.4), Proposal(15, 0.6)], rules, OPEN, TURNS)
    assert two is not None and two.sequence == 14 and abs(two.confidence - 0.64) < 1e-9  # agreement adds up
    tie = choose_proposal([Proposal(15, 0.8), Proposal(13, 0.8)], rules, OPEN, TURNS)
    assert tie is not None and tie.sequence == 13  # the earliest of equals
    merge = choose_proposal([Proposal(12, 0.7, "merge")], rules, OPEN, TURNS)
    assert merge is not None and merge.kind == "merge"
    no_seal = replace(OPEN, last_seal_start=None)
    assert choose_proposal([Proposal(12, 0.7, "merge")], rules, no_seal, TURNS) is None
    assert choose_proposal([Proposal(14, 1.5)], rules, OPEN, TURNS) is None  # out of range
