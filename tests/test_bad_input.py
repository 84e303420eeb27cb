"""Bad input catalogue: every kind of malformed call gets its documented outcome on every backend.

Either a clear ``tiered_history.errors`` exception (right type, a message that says what is wrong)
with NOTHING stored -- the conversation is not created, or its sequence and messages are unchanged --
or documented acceptance. One database per backend serves the whole module (each test uses its own
conversation ids), so the catalogue stays cheap on PostgreSQL.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from tiered_history import (
    BudgetTooSmallError,
    ConversationNotFoundError,
    HistoryCompressor,
    InvalidConversationIdError,
    InvalidMessageError,
    Message,
    SyncHistoryCompressor,
    TieredHistoryError,
)
from tiered_history.core.budget import MIN_MAX_TOKENS
from tiered_history.models import MAX_CONVERSATION_ID_LENGTH

from .conftest import database_url

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module", params=["memory", "sqlite", "postgresql"])
def backend_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One database per backend for the module (the in-memory store is fresh per compressor)."""
    with database_url(request.param, tmp_path_factory.mktemp("bad-input")) as url:
        yield url


@pytest.fixture
async def hc(backend_url: str) -> AsyncIterator[HistoryCompressor]:
    async with HistoryCompressor(backend_url, boundaries={"temporal": False}) as compressor:
        yield compressor


def new_cid(prefix: str = "bad") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def call(call_id: str, arguments: Any = '{"q": "x"}', name: Any = "lookup") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


async def snapshot(hc: HistoryCompressor, cid: str) -> tuple[Any, ...] | None:
    """Everything stored for ``cid`` (None when the conversation does not or cannot exist)."""
    try:
        known = await hc.exists(cid)
    except InvalidConversationIdError:
        return None
    if not known:
        return None
    state = await hc.store.state(cid)
    assert state is not None
    h = await hc.get_history(cid)
    return (
        state.last_sequence,
        state.topic_start_seq,
        state.open_topic_messages,
        state.open_topic_tokens,
        tuple(state.open_tool_calls),
        tuple((m.sequence, m.role, m.content, m.timestamp) for m in h.messages),
        tuple((t.sequence, t.first_sequence, t.last_sequence, t.status) for t in h.topics),
    )


async def assert_rejected(
    hc: HistoryCompressor,
    cid: str,
    action: Callable[[], Awaitable[Any]],
    error: type[TieredHistoryError],
    match: str,
) -> None:
    """``action`` raises ``error`` (message matching ``match``) and nothing is stored for ``cid``."""
    before = await snapshot(hc, cid)
    ids_before = await hc.conversation_ids()
    with pytest.raises(error, match=match) as info:
        await action()
    # A library error, not a pydantic/driver one leaking through.
    assert type(info.value).__module__ == "tiered_history.errors", type(info.value)
    assert await snapshot(hc, cid) == before, "a rejected call changed what is stored"
    assert await hc.conversation_ids() == ids_before, "a rejected call created a conversation"
    if before is None:
        assert await snapshot(hc, cid) is None


async def existing(hc: HistoryCompressor, n: int = 2) -> str:
    """A conversation with ``n`` messages already stored."""
    cid = new_cid()
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        await hc.add_message(cid, {"role": role, "content": f"hello {i}", "timestamp": T0 + timedelta(i)})
    return cid


# -- conversation ids ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cid", "match"),
    [
        ("", "must not be empty, whitespace or invisible"),
        ("   ", "must not be empty, whitespace or invisible"),
        ("\t\n ", "must not be empty, whitespace or invisible"),
        ("\u200b\u200d\ufeff", "must not be empty, whitespace or invisible"),
        ("a" * (MAX_CONVERSATION_ID_LENGTH + 1), "256 characters long; the maximum is 255"),
        ("nul\x00byte", "control characters"),
        ("bad\ud800id", "surrogate"),
        (12345, "must be a string, not int"),
        (None, "must be a string, not NoneType"),
    ],
    ids=["empty", "spaces", "whitespace", "zero-width", "256-chars", "nul", "surrogate", "int", "none"],
)
async def test_invalid_conversation_id_is_rejected_for_every_method(
    hc: HistoryCompressor, cid: Any, match: str
) -> None:
    msg = {"role": "user", "content": "hello"}
    calls: list[Callable[[], Awaitable[Any]]] = [
        lambda: hc.add_message(cid, msg),
        lambda: hc.get_context(cid, 1000),
        lambda: hc.get_history(cid),
        lambda: hc.search(cid, "hello"),
        lambda: hc.exists(cid),
        lambda: hc.stats(cid),
        lambda: hc.seal_current_topic(cid),
        lambda: hc.maintain(cid),
    ]
    if cid is None:
        calls = [*calls[:5], calls[6]]  # stats(None) and maintain(None) mean "every conversation"
    for action in calls:
        await assert_rejected(hc, new_cid(), action, InvalidConversationIdError, match)
    assert cid not in await hc.conversation_ids()


async def test_id_of_255_characters_is_accepted_and_256_rejected(hc: HistoryCompressor) -> None:
    for char in ("a", "é", "😀"):  # one code point each; PostgreSQL's varchar(255) counts characters
        longest = (new_cid() + char * MAX_CONVERSATION_ID_LENGTH)[:MAX_CONVERSATION_ID_LENGTH]
        stored = await hc.add_message(longest, {"role": "user", "content": "fits"})
        assert (stored.conversation_id, stored.sequence) == (longest, 1)
        assert [m.content for m in (await hc.get_history(longest)).messages] == ["fits"]
        assert longest in await hc.conversation_ids()
        too_long = longest + char
        await assert_rejected(
            hc,
            too_long,
            lambda too_long=too_long: hc.add_message(too_long, {"role": "user", "content": "x"}),
            InvalidConversationIdError,
            "the maximum is 255",
        )


@pytest.mark.parametrize(
    "raw",
    [
        "'; DROP TABLE conversations; --",
        '"; DROP TABLE conversation_history; --',
        "%",
        "_",
        "a%b_c",
        "back\\slash",
        "😀🎉 emoji",
        "مرحبا بالعالم",  # RTL (Arabic)
        "\u202eRTL override שלום",
        "对话-会话-日本語-한국어",
    ],
    ids=[
        "sql-quote",
        "sql-dquote",
        "percent",
        "underscore",
        "like-mix",
        "backslash",
        "emoji",
        "rtl",
        "rtl-override",
        "cjk",
    ],
)
async def test_unusual_ids_are_accepted_and_isolated(hc: HistoryCompressor, raw: str) -> None:
    tag = uuid.uuid4().hex[:8]
    cid = f"{raw}{tag}"
    # Neighbours a LIKE-based or escaping bug would confuse with ``cid``.
    neighbours = [f"x{tag}", f"{raw}{tag}x", f"ab{tag}"]
    await hc.add_message(cid, {"role": "user", "content": f"mine {tag}"})
    await hc.add_message(cid, {"role": "assistant", "content": f"also mine {tag}"})
    for n in neighbours:
        await hc.add_message(n, {"role": "user", "content": f"other {n}"})
    h = await hc.get_history(cid)
    assert h.conversation_id == cid
    assert [m.content for m in h.messages] == [f"mine {tag}", f"also mine {tag}"]
    assert all(m.conversation_id == cid for m in h.messages)
    found = await hc.search(cid, tag)
    assert sorted(m.sequence for m in found) == [1, 2]  # ranked by BM25 (issue 13): order by relevance
    ctx = await hc.get_context(cid, 1000)
    assert [m.content for m in ctx.current_topic] == [f"mine {tag}", f"also mine {tag}"]
    [st] = await hc.stats(cid)
    assert (st.conversation_id, st.messages) == (cid, 2)
    ids = await hc.conversation_ids()
    assert cid in ids and all(n in ids for n in neighbours)
    for n in neighbours:
        assert [m.content for m in (await hc.get_history(n)).messages] == [f"other {n}"]
    # The tables are all still there (the id was a parameter, never SQL).
    assert await hc.exists(neighbours[0])


async def test_search_text_with_like_wildcards_matches_literally(hc: HistoryCompressor) -> None:
    cid = new_cid()
    for text in ("100% sure", "snake_case", "plain words", "back\\slash"):
        await hc.add_message(cid, {"role": "user", "content": text})
    assert [m.content for m in await hc.search(cid, "%")] == ["100% sure"]
    assert [m.content for m in await hc.search(cid, "_")] == ["snake_case"]
    assert [m.content for m in await hc.search(cid, "\\")] == ["back\\slash"]
    assert await hc.search(cid, "'; DROP TABLE conversations; --") == []
    await assert_rejected(hc, cid, lambda: hc.search(cid, ""), InvalidMessageError, "must not be empty")


# -- messages --------------------------------------------------------------------------------


BAD_MESSAGES: list[tuple[str, Any, str]] = [
    ("unknown-role", {"role": "robot", "content": "beep"}, r"invalid message \(role\)"),
    ("missing-role", {"content": "hi"}, r"invalid message \(role\): Field required"),
    ("empty-content", {"role": "user", "content": ""}, "content must not be empty"),
    ("no-content", {"role": "assistant"}, "content must not be empty"),
    ("whitespace-content", {"role": "user", "content": " \n\t  "}, "content must not be empty"),
    ("nul-content", {"role": "user", "content": "a\x00b"}, "NUL byte"),
    ("surrogate-content", {"role": "user", "content": "half \udc00 pair"}, "lone UTF-16 surrogate"),
    ("non-string-content", {"role": "user", "content": ["a", "b"]}, r"invalid message \(content\)"),
    (
        "naive-timestamp",
        {"role": "user", "content": "hi", "timestamp": datetime(2026, 1, 1, 12)},
        "timezone-aware",
    ),
    (
        "bad-timestamp",
        {"role": "user", "content": "hi", "timestamp": "yesterday"},
        r"invalid message \(timestamp\)",
    ),
    ("bad-name", {"role": "user", "content": "hi", "name": "has spaces"}, "OpenAI's rule"),
    (
        "unserialisable-metadata",
        {"role": "user", "content": "hi", "metadata": {"k": object()}},
        "JSON-serialisable",
    ),
    (
        "tool-calls-on-user",
        {"role": "user", "content": "hi", "tool_calls": [call("c1")]},
        "only assistant messages may carry tool_calls",
    ),
    (
        "empty-tool-calls",
        {"role": "assistant", "content": "hi", "tool_calls": []},
        "must not be an empty list",
    ),
    (
        "duplicate-call-ids",
        {"role": "assistant", "content": "", "tool_calls": [call("c1"), call("c1")]},
        "'c1' appears twice",
    ),
    (
        "call-without-id",
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        "non-empty string 'id'",
    ),
    (
        "dict-arguments",
        {"role": "assistant", "content": "", "tool_calls": [call("c1", {"q": "x"})]},
        "string 'arguments'",
    ),
    (
        "int-arguments",
        {"role": "assistant", "content": "", "tool_calls": [call("c1", 42)]},
        "string 'arguments'",
    ),
    (
        "none-name",
        {"role": "assistant", "content": "", "tool_calls": [call("c1", "{}", None)]},
        "string 'name'",
    ),
    (
        "wrong-call-type",
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "code", "function": {"name": "f", "arguments": "{}"}}],
        },
        "'type': 'function'",
    ),
    ("tool-without-call-id", {"role": "tool", "content": "42"}, "need the tool_call_id"),
    (
        "call-id-on-user",
        {"role": "user", "content": "hi", "tool_call_id": "c1"},
        "only tool messages may carry tool_call_id",
    ),
    (
        "pinned-tool-result",
        {"role": "tool", "content": "42", "tool_call_id": "c1", "pinned": True},
        "cannot be pinned",
    ),
    (
        "pinned-tool-call",
        {"role": "assistant", "content": "", "tool_calls": [call("c1")], "pinned": True},
        "cannot be pinned",
    ),
    ("not-a-mapping", ["user", "hi"], "invalid message"),
]


@pytest.mark.parametrize(
    ("message", "match"), [c[1:] for c in BAD_MESSAGES], ids=[c[0] for c in BAD_MESSAGES]
)
async def test_bad_message_is_rejected_and_nothing_stored(
    hc: HistoryCompressor, message: Any, match: str
) -> None:
    fresh = new_cid()
    error: type[TieredHistoryError] = InvalidMessageError
    if isinstance(message, list):
        # dict(["user", "hi"]) fails inside Message.parse: a ValueError, not InvalidMessageError.
        with pytest.raises(ValueError):
            await hc.add_message(fresh, message)
        assert not await hc.exists(fresh)
        return
    await assert_rejected(hc, fresh, lambda: hc.add_message(fresh, message), error, match)
    cid = await existing(hc)
    await assert_rejected(hc, cid, lambda: hc.add_message(cid, message), error, match)
    # The conversation still works afterwards and sequences carry on without a gap.
    stored = await hc.add_message(cid, {"role": "user", "content": "after the rejection"})
    assert stored.sequence == 3


async def test_ten_megabyte_message_is_rejected_over_max_content_chars(hc: HistoryCompressor) -> None:
    huge = "x" * (10 * 1024 * 1024)
    limit = hc.settings.max_content_chars
    assert len(huge) > limit
    match = f"{len(huge)} characters long; the maximum is {limit} \\(setting max_content_chars\\)"
    fresh = new_cid()
    await assert_rejected(
        hc,
        fresh,
        lambda: hc.add_message(fresh, {"role": "user", "content": huge}),
        InvalidMessageError,
        match,
    )
    cid = await existing(hc)
    await assert_rejected(
        hc, cid, lambda: hc.add_message(cid, {"role": "user", "content": huge}), InvalidMessageError, match
    )
    # Exactly at the limit is accepted and stored whole; the context cuts it (head + tail) only
    # when it cannot fit its budget whole.
    at_limit = "y" * limit
    stored = await hc.add_message(cid, {"role": "user", "content": at_limit})
    assert stored.sequence == 3 and stored.truncated_content is None
    [m] = [m for m in (await hc.get_history(cid)).messages if m.sequence == 3]
    assert m.content == at_limit
    ctx = await hc.get_context(cid, 2000)
    assert ctx.total_tokens <= 2000
    [newest] = [m for m in ctx.current_topic if m.sequence == 3]
    assert newest.truncated_content is not None and len(newest.truncated_content) < limit


async def test_message_object_with_naive_timestamp_cannot_even_be_built() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        Message(role="user", content="hi", timestamp=datetime(2026, 1, 1))
    with pytest.raises(InvalidMessageError, match="timezone-aware"):
        Message.parse({"role": "user", "content": "hi", "timestamp": datetime(2026, 1, 1)})


async def test_bad_platform_is_rejected(hc: HistoryCompressor) -> None:
    cid = new_cid()
    msg = {"role": "user", "content": "hi"}
    for platform in ("", "   ", "p" * 65):
        await assert_rejected(
            hc, cid, lambda p=platform: hc.add_message(cid, msg, platform=p), InvalidMessageError, "platform"
        )


# -- timestamps ------------------------------------------------------------------------------


async def test_future_timestamp_is_accepted_and_stored_as_given(hc: HistoryCompressor) -> None:
    cid = new_cid()
    future = datetime(2999, 12, 31, 23, 59, 59, 123456, tzinfo=timezone(timedelta(hours=9)))
    stored = await hc.add_message(cid, {"role": "user", "content": "from the future", "timestamp": future})
    assert stored.timestamp == future
    [m] = (await hc.get_history(cid)).messages
    assert m.timestamp == future  # the same instant (the SQL stores normalise to UTC)
    assert m.timestamp.utcoffset() is not None
    ctx = await hc.get_context(cid, 1000)
    assert [x.content for x in ctx.current_topic] == ["from the future"]
    # A maintain pass "now" neither seals it as silent nor fails.
    report = await hc.maintain(cid)
    assert not report.errors and report.sealed == 0


async def test_out_of_order_timestamps_are_accepted_in_arrival_order(hc: HistoryCompressor) -> None:
    cid = new_cid()
    stamps = [T0 + timedelta(hours=h) for h in (5, 1, 3, 0, 4)]
    for i, t in enumerate(stamps):
        role = "user" if i % 2 == 0 else "assistant"
        stored = await hc.add_message(cid, {"role": role, "content": f"arrived {i}", "timestamp": t})
        assert stored.sequence == i + 1
    h = await hc.get_history(cid)
    assert [(m.sequence, m.content, m.timestamp) for m in h.messages] == [
        (i + 1, f"arrived {i}", t) for i, t in enumerate(stamps)
    ]
    ctx = await hc.get_context(cid, 1000)
    assert [m.content for m in ctx.current_topic] == [f"arrived {i}" for i in range(5)]
    topic = await hc.seal_current_topic(cid)
    assert topic is not None and (topic.first_sequence, topic.last_sequence) == (1, 5)
    assert (topic.started_at, topic.ended_at) == (min(stamps), max(stamps))


# -- max_tokens ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_tokens", "match"),
    [
        (0, "below the minimum of 32"),
        (-1, "below the minimum of 32"),
        (-(10**9), "below the minimum of 32"),
        (MIN_MAX_TOKENS - 1, f"max_tokens={MIN_MAX_TOKENS - 1} is below the minimum"),
        (100.0, "must be an integer, not float"),
        (1.5, "must be an integer, not float"),
        ("1000", "must be an integer, not str"),
        (True, "must be an integer, not bool"),
    ],
    ids=["zero", "minus-one", "very-negative", "below-min", "float-100", "float", "string", "bool"],
)
async def test_bad_max_tokens_is_rejected(hc: HistoryCompressor, max_tokens: Any, match: str) -> None:
    cid = await existing(hc)
    await assert_rejected(hc, cid, lambda: hc.get_context(cid, max_tokens), BudgetTooSmallError, match)
    # Checked before the lookup: an unknown conversation gets the budget error, not a lookup error.
    await assert_rejected(
        hc, new_cid(), lambda: hc.get_context(new_cid(), max_tokens), BudgetTooSmallError, match
    )


async def test_minimum_and_enormous_max_tokens_work(hc: HistoryCompressor) -> None:
    cid = await existing(hc, 6)
    ctx = await hc.get_context(cid, MIN_MAX_TOKENS)
    assert ctx.total_tokens <= MIN_MAX_TOKENS
    assert ctx.current_topic and ctx.current_topic[-1].sequence == 6
    big = await hc.get_context(cid, 10**9)
    assert big.max_tokens == 10**9 and big.total_tokens <= 10**9
    assert [m.sequence for m in big.current_topic] == list(range(1, 7))
    assert big.omitted_messages == 0


# -- unknown conversations -------------------------------------------------------------------


async def test_unknown_conversation_for_every_read_method(hc: HistoryCompressor) -> None:
    await existing(hc)  # the store is not empty
    cid = new_cid("never-seen")
    calls: list[tuple[Callable[[], Awaitable[Any]], type[TieredHistoryError]]] = [
        (lambda: hc.get_context(cid, 1000), ConversationNotFoundError),
        (lambda: hc.get_context(cid), ConversationNotFoundError),
        (lambda: hc.get_history(cid), ConversationNotFoundError),
        (lambda: hc.search(cid, "hello"), ConversationNotFoundError),
        (lambda: hc.stats(cid), ConversationNotFoundError),
        (lambda: hc.seal_current_topic(cid), ConversationNotFoundError),
        (lambda: hc.maintain(cid), ConversationNotFoundError),
    ]
    for action, error in calls:
        await assert_rejected(hc, cid, action, error, "no conversation 'never-seen-")
    assert await hc.exists(cid) is False
    assert cid not in await hc.conversation_ids()


# -- tool calls across messages --------------------------------------------------------------


async def test_tool_result_without_matching_call_is_rejected(hc: HistoryCompressor) -> None:
    result = {"role": "tool", "content": "42", "tool_call_id": "nope"}
    fresh = new_cid()
    await assert_rejected(
        hc,
        fresh,
        lambda: hc.add_message(fresh, result),
        InvalidMessageError,
        "^tool result 'nope' answers no open tool call",  # one message: no "message 0 of the batch"
    )
    cid = await existing(hc)
    await assert_rejected(
        hc, cid, lambda: hc.add_message(cid, result), InvalidMessageError, "answers no open tool call"
    )
    await hc.add_message(cid, {"role": "assistant", "content": "", "tool_calls": [call("c1"), call("c2")]})
    await assert_rejected(
        hc, cid, lambda: hc.add_message(cid, result), InvalidMessageError, "answers no open tool call"
    )
    await hc.add_message(cid, {"role": "tool", "content": "one", "tool_call_id": "c1"})
    # c1 was answered already: a second result for it matches no open call.
    await assert_rejected(
        hc,
        cid,
        lambda: hc.add_message(cid, {"role": "tool", "content": "again", "tool_call_id": "c1"}),
        InvalidMessageError,
        "'c1' answers no open tool call",
    )
    await hc.add_message(cid, {"role": "tool", "content": "two", "tool_call_id": "c2"})
    # A new turn abandons open calls: a late result is then rejected too.
    await hc.add_message(cid, {"role": "assistant", "content": "", "tool_calls": [call("c3")]})
    await hc.add_message(cid, {"role": "user", "content": "never mind"})
    await assert_rejected(
        hc,
        cid,
        lambda: hc.add_message(cid, {"role": "tool", "content": "late", "tool_call_id": "c3"}),
        InvalidMessageError,
        "'c3' answers no open tool call",
    )
    h = await hc.get_history(cid)
    assert [m.sequence for m in h.messages] == list(range(1, 8))
    ctx = await hc.get_context(cid, 2000)
    assert ctx.total_tokens <= 2000


async def test_pinned_plain_message_is_accepted(hc: HistoryCompressor) -> None:
    cid = new_cid()
    await hc.add_message(cid, {"role": "system", "content": "Be terse.", "pinned": True})
    await hc.add_message(cid, {"role": "user", "content": "hi"})
    ctx = await hc.get_context(cid, 1000)
    assert [m.content for m in ctx.pinned] == ["Be terse."]


# -- text inside metadata and tool calls ------------------------------------------------------


async def test_nul_inside_json_fields_is_accepted_and_round_trips(hc: HistoryCompressor) -> None:
    """JSON escapes NUL as \\u0000, so metadata and tool-call arguments may carry it on every backend."""
    cid = new_cid()
    await hc.add_message(cid, {"role": "user", "content": "hi", "metadata": {"k": "a\x00b"}})
    await hc.add_message(
        cid, {"role": "assistant", "content": "", "tool_calls": [call("c1", '{"q": "\x00"}')]}
    )
    h = await hc.get_history(cid)
    assert h.messages[0].metadata == {"k": "a\x00b"}
    assert h.messages[1].tool_calls == [call("c1", '{"q": "\x00"}')]


SURROGATES_IN_JSON: list[tuple[str, Any]] = [
    ("metadata-value", {"role": "user", "content": "hi", "metadata": {"k": "a\ud800b"}}),
    ("metadata-key", {"role": "user", "content": "hi", "metadata": {"\udc00": 1}}),
    ("call-arguments", {"role": "assistant", "content": "", "tool_calls": [call("c1", "a\ud800")]}),
    ("call-id", {"role": "assistant", "content": "", "tool_calls": [call("c\ud800")]}),
]


@pytest.mark.parametrize(
    "message", [c[1] for c in SURROGATES_IN_JSON], ids=[c[0] for c in SURROGATES_IN_JSON]
)
async def test_lone_surrogate_inside_json_fields_is_rejected(hc: HistoryCompressor, message: Any) -> None:
    cid = await existing(hc)
    await assert_rejected(hc, cid, lambda: hc.add_message(cid, message), InvalidMessageError, "surrogate")


async def test_nul_in_tool_call_id_is_rejected_before_storing(hc: HistoryCompressor) -> None:
    # Rejected at the call (issue 16's validation): stored, it could never be answered.
    cid = await existing(hc)
    caller = {"role": "assistant", "content": "", "tool_calls": [call("c\x00")]}
    await assert_rejected(hc, cid, lambda: hc.add_message(cid, caller), InvalidMessageError, "NUL")
    result = {"role": "tool", "content": "r", "tool_call_id": "c\x00"}
    await assert_rejected(hc, cid, lambda: hc.add_message(cid, result), InvalidMessageError, "NUL")


async def test_overlong_tool_call_id_gets_the_same_outcome_on_every_backend(hc: HistoryCompressor) -> None:
    cid = await existing(hc)
    long_id = "c" * 300
    try:
        await hc.add_message(cid, {"role": "assistant", "content": "", "tool_calls": [call(long_id)]})
    except InvalidMessageError:
        return  # rejected up front, with nothing stored: the documented outcome
    result = {"role": "tool", "content": "r", "tool_call_id": long_id}
    await assert_rejected(hc, cid, lambda: hc.add_message(cid, result), InvalidMessageError, "tool_call_id")


@pytest.mark.parametrize("text", ["a\x00b", "a\ud800b", 5], ids=["nul", "surrogate", "int"])
async def test_bad_search_text_is_rejected_with_a_library_error(hc: HistoryCompressor, text: Any) -> None:
    cid = await existing(hc)
    await assert_rejected(hc, cid, lambda: hc.search(cid, text), InvalidMessageError, "search text")


@pytest.mark.parametrize("platform", ["tele\x00gram", "tele\ud800gram"], ids=["nul", "surrogate"])
async def test_platform_with_invalid_text_is_rejected(hc: HistoryCompressor, platform: str) -> None:
    cid = new_cid()
    msg = {"role": "user", "content": "hi"}
    await assert_rejected(
        hc, cid, lambda: hc.add_message(cid, msg, platform=platform), InvalidMessageError, "platform"
    )


async def test_pinned_messages_larger_than_max_tokens(hc: HistoryCompressor) -> None:
    cid = new_cid()
    await hc.add_message(cid, {"role": "system", "content": "Rule. " * 100, "pinned": True})
    await hc.add_message(cid, {"role": "user", "content": "hi"})
    await assert_rejected(
        hc, cid, lambda: hc.get_context(cid, 64), BudgetTooSmallError, "cannot hold the pinned messages"
    )
    ctx = await hc.get_context(cid, 1000)
    assert ctx.total_tokens <= 1000 and [m.sequence for m in ctx.current_topic] == [2]


# -- arguments of the reading and maintenance calls (a QA pass found raw errors) ---------------


async def test_odd_arguments_to_listing_reading_and_maintenance_are_library_errors(
    hc: HistoryCompressor,
) -> None:
    cid = await existing(hc)
    calls: list[Callable[[], Awaitable[Any]]] = [
        lambda: hc.list_conversations(active_since=datetime(2020, 1, 1)),  # naive
        lambda: hc.list_conversations(active_since="2020-01-01"),  # type: ignore[arg-type]
        lambda: hc.list_conversations(after="\ud800"),
        lambda: hc.list_conversations(platform="a\x00b"),
        lambda: hc.list_conversations(after=5),  # type: ignore[arg-type]
        lambda: hc.get_messages(cid, first=None),  # type: ignore[arg-type]
        lambda: hc.maintain(now="2020-01-01T00:00:00+00:00"),  # type: ignore[arg-type]
        lambda: hc.maintain(cid, now=datetime.max.replace(tzinfo=UTC)),
        lambda: hc.maintain(now=datetime(2026, 1, 1)),  # naive
    ]
    for call in calls:
        await assert_rejected(hc, cid, call, InvalidMessageError, ".")
    # A cursor may be any text an id follows (the inspector steps back one character from an id).
    assert [c.conversation_id for c in await hc.list_conversations(after=" ")] == sorted(
        await hc.conversation_ids()
    )[:100]
    # Past a database's integers: nothing there, not an error.
    assert await hc.get_messages(cid, first=2**63) == []
    assert [m.sequence for m in await hc.get_messages(cid, first=-(2**70), last=2**70)] == [1, 2]


def test_a_mapping_whose_reads_fail_is_an_invalid_message() -> None:
    class Broken(dict[str, Any]):
        def items(self) -> Any:
            raise KeyError("role")

    with (
        SyncHistoryCompressor.from_url("memory://") as h,
        pytest.raises(InvalidMessageError, match="fields failed"),
    ):
        h.add_message("c", Broken(role="user", content="hi"))
    with (
        SyncHistoryCompressor.from_url("memory://") as h,
        pytest.raises(InvalidMessageError, match="fields failed"),
    ):
        h.pin("c", Broken(role="system", content="hi"))


def test_a_tool_result_for_a_call_another_compressor_stored_is_accepted(tmp_path: Any) -> None:
    # Judged against this compressor's own (stale) state, the result answered no open call.
    url = f"sqlite:///{tmp_path / 'two.db'}"
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    with SyncHistoryCompressor(url) as a, SyncHistoryCompressor(url) as b:
        a.add_message("c", {"role": "user", "content": "look it up"})
        b.add_message("c", {"role": "user", "content": "please"})  # b knows the state now
        a.add_message("c", {"role": "assistant", "content": None, "tool_calls": [call]})
        b.add_message("c", {"role": "tool", "tool_call_id": "call_1", "content": "42"})
        assert [m.role for m in a.get_messages("c")] == ["user", "user", "assistant", "tool"]
        with pytest.raises(InvalidMessageError, match="answers no open tool call"):
            b.add_message("c", {"role": "tool", "tool_call_id": "call_1", "content": "again"})
