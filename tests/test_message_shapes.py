"""normalize_message and TokenCounter on every message shape real bots produce (issue 16 item 1)
and on the hostile inputs of issue 17 (items 7, 9, 10, 11, 12): the pure layer, no store.

The replayable cases live in tests/shapes.py; here each is checked for its exact payload, its text
and our own fields, then every validation rule has a test of its own.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiered_history import Message
from tiered_history.errors import ConfigurationError, InvalidMessageError
from tiered_history.messages import EXTENSION_KEYS, MAX_DEPTH, NormalizedMessage, normalize_message
from tiered_history.tokens import (
    DEFAULT_AUDIO_TOKENS,
    DEFAULT_FILE_TOKENS,
    DEFAULT_IMAGE_TOKENS,
    ESTIMATED_SAFETY_MARGIN,
    TokenCounter,
    image_size,
)

from .shapes import (
    HTTPS_IMAGE,
    IMAGE_1024,
    SHAPES,
    SHAPES_BY_NAME,
    SIGNATURE,
    Shape,
    png_data_url,
    weather_call,
)

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
TokenCounter()  # points TIKTOKEN_CACHE_DIR at litellm's bundled copy (offline)
O200K = tiktoken.get_encoding("o200k_base")
CL100K = tiktoken.get_encoding("cl100k_base")


def norm(message: object) -> NormalizedMessage:
    return normalize_message(message, now=NOW)


def rejected(message: object, match: str) -> InvalidMessageError:
    with pytest.raises(InvalidMessageError, match=match) as info:
        norm(message)
    assert type(info.value).__module__ == "tiered_history.errors"
    return info.value


def tokens(enc: tiktoken.Encoding, text: str) -> int:
    return len(enc.encode(text, disallowed_special=()))


# -- every real shape round-trips exactly (issue 16 item 1) -----------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_shape_payload_is_exactly_what_the_bot_gave(shape: Shape) -> None:
    given_message, expected = shape.build()
    n = norm(given_message)
    assert n.payload == expected
    assert n.role == shape.role
    assert n.text == shape.text
    assert n.tool_call_ids == shape.tool_call_ids
    assert n.tool_call_id == shape.tool_call_id
    assert n.pinned is shape.pinned
    assert n.metadata == shape.metadata
    assert n.timestamp == (shape.timestamp or NOW)
    # Strict JSON (no NaN) round trip: what a SQL store writes and reads back.
    assert json.loads(json.dumps(n.payload, allow_nan=False)) == expected
    assert json.loads(json.dumps(n.metadata, allow_nan=False)) == shape.metadata
    # A second normalisation of the stored payload changes nothing (what the store hands back).
    assert norm(n.payload).payload == expected


def test_first_line_of_a_litellm_bot_is_accepted() -> None:
    """Issue 16: ``add_message(cid, litellm.completion(...).choices[0].message)`` raised
    ``InvalidMessageError (function_call): Extra inputs are not permitted``."""
    import litellm

    message = (
        litellm.completion(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], mock_response="hi"
        )
        .choices[0]
        .message
    )
    assert "function_call" in message.model_dump()
    n = norm(message)
    assert n.payload == {"content": "hi", "role": "assistant"}


def test_content_none_beside_tool_calls_comes_back_as_none_and_absent_stays_absent() -> None:
    call = weather_call("c1")
    assert norm({"role": "assistant", "content": None, "tool_calls": [call]}).payload == {
        "role": "assistant",
        "content": None,
        "tool_calls": [call],
    }
    assert norm({"role": "assistant", "tool_calls": [call]}).payload == {
        "role": "assistant",
        "tool_calls": [call],
    }


def test_none_values_are_dropped_for_every_key_but_content() -> None:
    n = norm(
        {
            "role": "assistant",
            "content": "ok",
            "name": None,
            "tool_calls": None,
            "tool_call_id": None,
            "function_call": None,
            "refusal": None,
            "audio": None,
            "annotations": None,
            "reasoning_content": None,
            "thinking_blocks": None,
            "provider_specific_fields": None,
            "x_unknown": None,
            "pinned": None,
            "timestamp": None,
            "metadata": None,
        }
    )
    assert n.payload == {"role": "assistant", "content": "ok"}
    assert (n.pinned, n.timestamp, n.metadata) == (False, NOW, {})
    # Inside provider fields, None is kept exactly.
    inner = {"role": "assistant", "content": "x", "provider_specific_fields": {"citations": None}}
    assert norm(inner).payload == inner


def test_extra_keys_inside_a_tool_call_are_kept() -> None:
    call = {**weather_call("c1"), "provider_specific_fields": {"thought_signature": "abc"}, "index": 0}
    assert norm({"role": "assistant", "content": None, "tool_calls": [call]}).payload["tool_calls"] == [call]


def test_message_object_payload_matches_its_to_openai() -> None:
    for m in (
        Message(role="user", content="hi", name="bob"),
        Message(role="assistant", content="", tool_calls=[weather_call("c1")]),
        Message(role="tool", content="42", tool_call_id="c1"),
        Message(role="system", content="Rules.", pinned=True),
    ):
        n = norm(m)
        assert n.payload == m.to_openai()
        assert (n.pinned, n.timestamp, n.metadata) == (m.pinned, m.timestamp, m.metadata)


# -- detachment (issue 17 item 12) ------------------------------------------------------------


def test_payload_and_metadata_are_detached_from_the_caller() -> None:
    """Issue 17 item 12: mutating tool_calls or metadata after add_message changed stored history."""
    calls = [weather_call("c1")]
    meta: dict[str, Any] = {"tags": ["a"], "nested": {"k": 1}}
    message = {"role": "assistant", "content": None, "tool_calls": calls, "metadata": meta}
    n = norm(message)
    calls[0]["function"]["arguments"] = "changed"
    calls.append(weather_call("c2"))
    meta["tags"].append("b")
    meta["nested"]["k"] = 2
    meta["new"] = True
    assert n.payload["tool_calls"] == [weather_call("c1")]
    assert n.metadata == {"tags": ["a"], "nested": {"k": 1}}
    # And the other way round: changing what we return leaves the caller's objects alone.
    before = copy.deepcopy(message)
    n.payload["tool_calls"][0]["id"] = "zzz"
    n.metadata["tags"].append("x")
    assert message == before


def test_content_parts_are_detached() -> None:
    parts: list[dict[str, Any]] = [
        {"type": "text", "text": "hi"},
        {"type": "image_url", "image_url": {"url": HTTPS_IMAGE}},
    ]
    n = norm({"role": "user", "content": parts})
    parts[1]["image_url"]["url"] = "https://evil.example/"
    parts.append({"type": "text", "text": "more"})
    assert n.payload["content"] == [
        {"type": "text", "text": "hi"},
        {"type": "image_url", "image_url": {"url": HTTPS_IMAGE}},
    ]


# -- non-message inputs (issue 17 item 9) -----------------------------------------------------


class _BrokenDump:
    def model_dump(self) -> dict[str, Any]:
        raise RuntimeError("boom")


class _ListDump:
    def model_dump(self) -> list[str]:
        return ["user", "hi"]


@pytest.mark.parametrize(
    "value",
    [None, "hello", 42, 4.2, True, ["user", "hi"], ("user", "hi"), object(), b"{}", Message, _ListDump()],
    ids=["none", "str", "int", "float", "bool", "list", "tuple", "object", "bytes", "class", "dump-list"],
)
def test_non_message_inputs_raise_invalid_message_error(value: object) -> None:
    """Issue 17 item 9: these raised raw TypeError / ValueError."""
    rejected(value, r"invalid message \(message\)")


def test_model_dump_that_fails_is_an_invalid_message() -> None:
    rejected(_BrokenDump(), "model_dump\\(\\) failed: boom")


def test_non_string_keys_are_rejected() -> None:
    rejected({"role": "user", "content": "hi", 1: "x"}, "field names must be strings")


@pytest.mark.parametrize("value", [True, False, None, "x"])
def test_the_stores_own_no_content_mark_is_a_reserved_field_name(value: object) -> None:
    # Stored beside the message, it would take its content away when the message is sent back.
    rejected({"role": "user", "content": "hello", "~no-content": value}, "'~no-content' is reserved")


# -- role and name (issue 17 item 7) ----------------------------------------------------------


@pytest.mark.parametrize("role", ["system", "developer", "user", "assistant"])
def test_known_roles_are_accepted(role: str) -> None:
    assert norm({"role": role, "content": "hi"}).role == role


@pytest.mark.parametrize(
    "role", ["robot", "USER", "", 5, ["user"]], ids=["robot", "upper", "empty", "int", "list"]
)
def test_unknown_roles_are_rejected(role: object) -> None:
    rejected({"role": role, "content": "hi"}, r"invalid message \(role\): role must be one of")


def test_missing_role_is_rejected() -> None:
    rejected({"content": "hi"}, r"invalid message \(role\): Field required")


@pytest.mark.parametrize(
    "name",
    ["bob\n", "bob\r", "\nbob", " bob", "bo b", "", "b" * 65, "bób", 7],
    ids=[
        "trailing-newline",
        "trailing-cr",
        "leading-newline",
        "space",
        "inner-space",
        "empty",
        "65",
        "accent",
        "int",
    ],
)
def test_name_must_fully_match_openais_pattern(name: object) -> None:
    """Issue 17 item 7: "bob\\n" passed re.match(r"^...$") and OpenAI answered 400 on every request."""
    rejected({"role": "user", "content": "hi", "name": name}, "OpenAI's rule")


def test_name_with_trailing_newline_is_rejected_even_from_a_message_object() -> None:
    """models.Message still uses re.match: the normaliser is the gate that catches it."""
    rejected(Message(role="user", content="hi", name="bob\n"), "OpenAI's rule")


def test_good_names_are_accepted() -> None:
    for name in ("bob", "Bob_the-2nd", "b" * 64):
        assert norm({"role": "user", "content": "hi", "name": name}).name == name


def test_function_result_needs_a_name() -> None:
    rejected({"role": "function", "content": "12:00"}, "function messages need the name")


# -- text validity everywhere -----------------------------------------------------------------


BAD_TEXT: list[tuple[str, dict[str, Any]]] = [
    ("content", {"role": "user", "content": "a\x00b"}),
    ("text-part", {"role": "user", "content": [{"type": "text", "text": "a\x00"}]}),
    (
        "image-url",
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/\x00"}}]},
    ),
    ("metadata-value", {"role": "user", "content": "hi", "metadata": {"k": ["a\x00b"]}}),
    ("metadata-key", {"role": "user", "content": "hi", "metadata": {"k\x00": 1}}),
    ("call-id", {"role": "assistant", "content": None, "tool_calls": [weather_call("c\x00")]}),
    ("tool-call-id", {"role": "tool", "content": "r", "tool_call_id": "c\x00"}),
    (
        "call-arguments",
        {"role": "assistant", "content": None, "tool_calls": [{**weather_call("c"), "x": "\x00"}]},
    ),
    ("reasoning", {"role": "assistant", "content": "x", "reasoning_content": "\x00"}),
    ("unknown-field", {"role": "user", "content": "x", "x_vendor": {"deep": ["\x00"]}}),
    ("name", {"role": "user", "content": "x", "name": "a\x00"}),
]


#: Inside structured fields a NUL survives as JSON's \u0000 (stored as text on every backend).
NUL_KEPT = {"image-url", "metadata-value", "call-arguments", "unknown-field"}


@pytest.mark.parametrize(
    "message",
    [m for n, m in BAD_TEXT if n not in NUL_KEPT],
    ids=[n for n, _ in BAD_TEXT if n not in NUL_KEPT],
)
def test_nul_byte_is_rejected_in_texts_ids_and_keys(message: dict[str, Any]) -> None:
    rejected(message, "NUL byte|OpenAI's rule")


@pytest.mark.parametrize(
    "message", [m for n, m in BAD_TEXT if n in NUL_KEPT], ids=[n for n, _ in BAD_TEXT if n in NUL_KEPT]
)
def test_nul_byte_inside_structured_fields_is_kept(message: dict[str, Any]) -> None:
    normalized = normalize_message(message, now=NOW)
    expected = {k: v for k, v in message.items() if k != "metadata"}
    assert normalized.payload == expected
    assert normalized.metadata == message.get("metadata", {})


@pytest.mark.parametrize("message", [m for _, m in BAD_TEXT], ids=[n for n, _ in BAD_TEXT])
def test_lone_surrogate_is_rejected_anywhere(message: dict[str, Any]) -> None:
    swapped = json.loads(json.dumps(message).replace("\\u0000", "\\ud800"))
    rejected(swapped, "surrogate|OpenAI's rule")


# -- content -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": ""},
        {"role": "user", "content": "  \n\t"},
        {"role": "user", "content": None},
        {"role": "user"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": []},
        {"role": "user", "content": [{"type": "text", "text": " "}]},
        {"role": "tool", "content": None, "tool_call_id": "c1"},
    ],
    ids=["empty", "blank", "none", "absent", "assistant-none", "no-parts", "blank-part", "tool-none"],
)
def test_a_message_needs_something_to_say(message: dict[str, Any]) -> None:
    rejected(message, "content must not be empty")


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (42, "content must be a string, a list of content parts or None"),
        ({"type": "text", "text": "hi"}, "content must be a string"),
        (["hi"], "part 0: content parts must be objects"),
        ([{"text": "hi"}], "part 0: every content part needs a string 'type'"),
        ([{"type": "text"}], "part 0: a text part needs a string 'text'"),
        ([{"type": "image_url", "image_url": {}}], "part 0: an image_url part needs image_url.url"),
        ([{"type": "image_url", "image_url": {"url": " "}}], "image_url.url"),
        ([{"type": "image_url", "image_url": {"url": HTTPS_IMAGE, "detail": 3}}], "detail must be"),
        ([{"type": "input_audio", "input_audio": {"format": "wav"}}], "input_audio.data"),
        ([{"type": "file", "file": {"filename": "a.pdf"}}], "file.file_data or file.file_id"),
        ([{"type": "refusal"}], "a refusal part needs a string 'refusal'"),
    ],
    ids=[
        "int",
        "dict",
        "bare-string-part",
        "no-type",
        "text-without-text",
        "image-without-url",
        "image-blank-url",
        "bad-detail",
        "audio-without-data",
        "file-without-data",
        "refusal-without-text",
    ],
)
def test_malformed_content_is_rejected(content: object, match: str) -> None:
    rejected({"role": "user", "content": content}, r"invalid message \(content\): .*" + match)


def test_media_only_content_is_accepted_and_named_in_the_text() -> None:
    n = norm(
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": HTTPS_IMAGE},  # litellm's bare-URL form
                {"type": "file", "file": {"file_id": "file-abc"}},
                {"type": "file", "file": {"file_id": "f", "filename": "bad\n]name[.pdf"}},
                {"type": "weird type!", "blob": 1},
            ],
        }
    )
    assert n.text == "[image]\n[file]\n[file: bad )name(.pdf]\n[content]"


# -- tool calls and results ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "match"),
    [
        ({"role": "user", "content": "hi", "tool_calls": [weather_call("c1")]}, "only assistant messages"),
        ({"role": "assistant", "content": "hi", "tool_calls": []}, "must not be an empty list"),
        ({"role": "assistant", "content": "hi", "tool_calls": weather_call("c1")}, "must be a list"),
        ({"role": "assistant", "content": "", "tool_calls": ["c1"]}, "'type': 'function'"),
        (
            {"role": "assistant", "content": "", "tool_calls": [weather_call("c1"), weather_call("c1")]},
            "'c1' appears twice",
        ),
        ({"role": "assistant", "content": "", "tool_calls": [weather_call("")]}, "non-empty string 'id'"),
        ({"role": "assistant", "content": "", "tool_calls": [weather_call(" ")]}, "non-empty string 'id'"),
        ({"role": "assistant", "content": "", "tool_calls": [weather_call("c" * 256)]}, "at most 255"),
        (
            {"role": "assistant", "content": "", "tool_calls": [{**weather_call("c1"), "type": "code"}]},
            "'type': 'function'",
        ),
        (
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "c1", "type": "custom", "custom": {"name": "x"}}],
            },
            "string 'input'",
        ),
        (
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": {}}}],
            },
            "string 'arguments'",
        ),
        ({"role": "tool", "content": "42"}, "need the tool_call_id"),
        ({"role": "tool", "content": "42", "tool_call_id": ""}, "need the tool_call_id"),
        ({"role": "tool", "content": "42", "tool_call_id": 7}, "need the tool_call_id"),
        ({"role": "tool", "content": "42", "tool_call_id": "c" * 256}, "tool_call_id must be at most 255"),
        (
            {"role": "user", "content": "hi", "tool_call_id": "c1"},
            "only tool messages may carry tool_call_id",
        ),
        (
            {"role": "user", "content": "hi", "function_call": {"name": "f", "arguments": ""}},
            "only assistant",
        ),
        ({"role": "assistant", "content": None, "function_call": {"name": "f"}}, "function_call must be"),
    ],
    ids=[
        "calls-on-user",
        "empty-list",
        "not-a-list",
        "call-not-object",
        "duplicate-ids",
        "empty-id",
        "blank-id",
        "id-256",
        "wrong-type",
        "custom-without-input",
        "dict-arguments",
        "tool-without-id",
        "tool-empty-id",
        "tool-int-id",
        "tool-id-256",
        "id-on-user",
        "function-call-on-user",
        "function-call-shape",
    ],
)
def test_tool_call_rules(message: dict[str, Any], match: str) -> None:
    rejected(message, match)


def test_ids_of_255_characters_are_accepted() -> None:
    long_id = "c" * 255
    assert norm(
        {"role": "assistant", "content": None, "tool_calls": [weather_call(long_id)]}
    ).tool_call_ids == (long_id,)
    assert norm({"role": "tool", "content": "r", "tool_call_id": long_id}).tool_call_id == long_id


@pytest.mark.parametrize(
    "message",
    [
        {"role": "tool", "content": "42", "tool_call_id": "c1", "pinned": True},
        {"role": "assistant", "content": "", "tool_calls": [weather_call("c1")], "pinned": True},
        {
            "role": "assistant",
            "content": None,
            "function_call": {"name": "f", "arguments": ""},
            "pinned": True,
        },
        {"role": "function", "name": "f", "content": "r", "pinned": True},
    ],
    ids=["tool-result", "tool-calls", "function-call", "function-result"],
)
def test_tool_calls_and_results_cannot_be_pinned(message: dict[str, Any]) -> None:
    rejected(message, "cannot be pinned")


@pytest.mark.parametrize("pinned", ["yes", 1, 0, [True]], ids=["str", "one", "zero", "list"])
def test_pinned_must_be_a_boolean(pinned: object) -> None:
    rejected({"role": "system", "content": "x", "pinned": pinned}, "pinned must be true or false")


# -- timestamps (issue 17 item 10) --------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("9999-12-31T23:59:59-05:00", "outside years 1..9999 in UTC"),
        ("0001-01-01T00:00:00+05:00", "outside years 1..9999 in UTC"),
        (datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-2))), "outside years 1..9999"),
        (datetime(2026, 1, 1, 12), "timezone-aware"),
        ("2026-01-01T12:00:00", "timezone-aware"),
        ("yesterday", "cannot read 'yesterday' as a time"),
        (float("nan"), "cannot read"),
        (float("inf"), "cannot read"),
        (10**20, "cannot read"),
        (True, "not bool"),
        (b"2026-01-01T00:00:00Z", "not bytes"),
        ([2026, 1, 1], "not list"),
    ],
    ids=[
        "past-9999-in-utc",
        "before-year-1-in-utc",
        "aware-past-9999",
        "naive",
        "naive-string",
        "words",
        "nan",
        "inf",
        "huge-epoch",
        "bool",
        "bytes",
        "list",
    ],
)
def test_bad_timestamps_are_rejected(value: object, match: str) -> None:
    """Issue 17 item 10: a UTC instant past 9999 broke SQLite and every later maintain()."""
    rejected(
        {"role": "user", "content": "hi", "timestamp": value}, r"invalid message \(timestamp\): .*" + match
    )


def test_accepted_timestamps() -> None:
    tokyo = timezone(timedelta(hours=9))
    cases: list[tuple[object, datetime]] = [
        (datetime(2026, 3, 1, 12, tzinfo=tokyo), datetime(2026, 3, 1, 3, tzinfo=UTC)),
        ("2026-03-01T12:00:00+09:00", datetime(2026, 3, 1, 3, tzinfo=UTC)),
        ("2026-03-01T03:00:00Z", datetime(2026, 3, 1, 3, tzinfo=UTC)),
        (1_772_334_000, datetime(2026, 3, 1, 3, tzinfo=UTC)),
        (1_772_334_000.5, datetime(2026, 3, 1, 3, 0, 0, 500000, tzinfo=UTC)),
        ("9999-12-31T23:59:59+00:00", datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)),
        (datetime.max.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC)),
        ("0001-01-01T05:00:00+05:00", datetime(1, 1, 1, tzinfo=UTC)),
    ]
    for value, instant in cases:
        ts = norm({"role": "user", "content": "hi", "timestamp": value}).timestamp
        assert ts == instant and ts.utcoffset() is not None, value
    # The caller's offset is kept (only the instant is checked).
    kept = norm({"role": "user", "content": "hi", "timestamp": "2026-03-01T12:00:00+09:00"}).timestamp
    assert kept.utcoffset() == timedelta(hours=9)
    assert type(kept.tzinfo) is timezone  # the standard class, not pydantic's


# -- metadata (issue 17 item 11) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("metadata", "match"),
    [
        ({"score": float("nan")}, "nan is not a JSON number"),
        ({"score": float("inf")}, "inf is not a JSON number"),
        ({"deep": [{"x": -math.inf}]}, "-inf is not a JSON number"),
        ({1: "a"}, "key 1 is not a string"),
        ({"k": {2: "a"}}, "key 2 is not a string"),
        ({"k": object()}, "JSON-serialisable"),
        ({"k": {1, 2}}, "set is not a JSON value"),
        ({"k": 2**64}, "beyond 64 bits"),
        ([("k", "v")], "metadata must be a JSON object"),
        ("tags", "metadata must be a JSON object"),
    ],
    ids=[
        "nan",
        "inf",
        "nested-minus-inf",
        "int-key",
        "nested-int-key",
        "object",
        "set",
        "huge-int",
        "pairs",
        "str",
    ],
)
def test_bad_metadata_is_rejected(metadata: object, match: str) -> None:
    """Issue 17 item 11: NaN/Infinity metadata made ``history --json`` print invalid JSON."""
    rejected({"role": "user", "content": "hi", "metadata": metadata}, match)


def test_non_finite_numbers_are_rejected_in_provider_fields_too() -> None:
    rejected({"role": "assistant", "content": "x", "x_score": float("nan")}, "not a JSON number")


def test_nesting_deeper_than_the_limit_is_rejected_not_a_recursion_error() -> None:
    deep: Any = "leaf"
    for _ in range(10_000):
        deep = [deep]
    rejected({"role": "user", "content": "hi", "metadata": {"d": deep}}, f"more than {MAX_DEPTH} levels")
    rejected({"role": "user", "content": "hi", "x_vendor": deep}, f"more than {MAX_DEPTH} levels")
    ok: Any = "leaf"
    for _ in range(MAX_DEPTH - 1):
        ok = [ok]
    assert norm({"role": "user", "content": "hi", "metadata": {"d": ok}}).metadata == {"d": ok}


def test_tuples_become_lists() -> None:
    n = norm({"role": "user", "content": "hi", "metadata": {"t": (1, (2, "x"))}, "x_pair": (1, 2)})
    assert n.metadata == {"t": [1, [2, "x"]]} and n.payload["x_pair"] == [1, 2]


# -- token counts ---------------------------------------------------------------------------------


def test_plain_string_messages_count_exactly_as_before() -> None:
    """Framing 3 per message, +1 for a name, 3 to prime the reply: an independent tiktoken count."""
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello, wörld! 😀", "name": "alice"},
        {"role": "assistant", "content": "Hi."},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
    ]
    for model, enc in (("gpt-4o", O200K), ("cl100k_base", CL100K), ("claude-3-5-sonnet", CL100K)):
        counter = TokenCounter(model)
        expected = 3
        for m in messages:
            expected += 3 + sum(tokens(enc, v) for v in m.values()) + (1 if "name" in m else 0)
        assert counter.messages_tokens(messages) == expected, model


def test_tool_calls_count_as_their_compact_json() -> None:
    counter = TokenCounter("gpt-4o")
    calls = [weather_call("c1"), weather_call("c2")]
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    assert counter.message_tokens(message) == 3 + tokens(O200K, "assistant") + tokens(
        O200K, json.dumps(calls, separators=(",", ":"))
    )


def test_thinking_blocks_and_provider_fields_are_counted_in_full() -> None:
    shape = SHAPES_BY_NAME["thinking-blocks-tool-use"]
    payload = norm(shape.build()[0]).payload
    counter = TokenCounter("claude-sonnet-4-5")
    bare = {k: v for k, v in payload.items() if k not in ("thinking_blocks", "reasoning_content")}
    extra = counter.message_tokens(payload) - counter.message_tokens(bare)
    assert extra >= tokens(CL100K, SIGNATURE) + 2 * tokens(
        CL100K, "The user wants the weather; call the tool."
    )


def _image_message(url: str, detail: str | None = None, text: str = "What is this?") -> dict[str, Any]:
    image: dict[str, Any] = {"url": url}
    if detail is not None:
        image["detail"] = detail
    return {
        "role": "user",
        "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": image}],
    }


def _text_part_tokens(enc: tiktoken.Encoding, text: str = "What is this?") -> int:
    return 3 + tokens(enc, "user") + tokens(enc, text)


# OpenAI's published examples (vision guide): 1024x1024 high = 765, 2048x4096 high = 1105, low = 85;
# 128x64 high = 85 + 170 (billed usage reported on community.openai.com: no upscaling of small images).
@pytest.mark.parametrize(
    ("size", "detail", "image_tokens"),
    [
        ((1024, 1024), "high", 765),
        ((1024, 1024), "auto", 765),
        ((1024, 1024), None, 765),
        ((2048, 4096), "high", 1105),
        ((4096, 8192), "low", 85),
        ((128, 64), "high", 255),
        ((512, 512), "high", 255),
        ((513, 512), "high", 85 + 2 * 170),
    ],
    ids=["1024-high", "1024-auto", "1024-default", "2048x4096", "low", "small", "one-tile", "two-tiles"],
)
def test_image_parts_follow_openais_tile_formula(
    size: tuple[int, int], detail: str | None, image_tokens: int
) -> None:
    url = png_data_url(*size)
    for model in ("gpt-4o", "openai/gpt-4o-2024-08-06", "gpt-4.1", "azure/gpt-4.1"):
        assert (
            TokenCounter(model).message_tokens(_image_message(url, detail))
            == _text_part_tokens(O200K) + image_tokens
        )


def test_gpt_4o_mini_images_use_its_own_constants() -> None:
    counter = TokenCounter("gpt-4o-mini")
    assert (
        counter.message_tokens(_image_message(IMAGE_1024, "high"))
        == _text_part_tokens(O200K) + 2833 + 4 * 5667
    )
    assert counter.message_tokens(_image_message(IMAGE_1024, "low")) == _text_part_tokens(O200K) + 2833


def test_patch_models_count_32px_patches_times_their_multiplier() -> None:
    # 1024x1024 = 32 x 32 patches = 1024; x 1.62 = 1658.88 -> 1659 (gpt-4.1-mini), x 2.46 -> 2519.04 -> 2520.
    assert (
        TokenCounter("gpt-4.1-mini").message_tokens(_image_message(IMAGE_1024))
        == _text_part_tokens(O200K) + 1659
    )
    assert (
        TokenCounter("gpt-4.1-nano").message_tokens(_image_message(IMAGE_1024))
        == _text_part_tokens(O200K) + 2520
    )
    # 1800x2400 is scaled to 1452 patches (billed 2352 on gpt-4.1-mini); we count the 1536 cap: never below.
    big = TokenCounter("gpt-4.1-mini").message_tokens(_image_message(png_data_url(1800, 2400)))
    assert big == _text_part_tokens(O200K) + math.ceil(1536 * 1.62) >= _text_part_tokens(O200K) + 2352
    # Detail does not change a patch model's cost.
    o4 = TokenCounter("o4-mini")
    assert o4.message_tokens(_image_message(IMAGE_1024, "low")) == _text_part_tokens(O200K) + math.ceil(
        1024 * 1.72
    )


def test_images_of_unknown_size_cost_the_models_largest_image_or_the_configured_cost() -> None:
    text = _text_part_tokens(O200K)
    assert TokenCounter("gpt-4o").message_tokens(_image_message(HTTPS_IMAGE, "high")) == text + 85 + 8 * 170
    assert TokenCounter("gpt-4o").message_tokens(_image_message(HTTPS_IMAGE, "low")) == text + 85
    assert TokenCounter("gpt-4.1-mini").message_tokens(_image_message(HTTPS_IMAGE)) == text + math.ceil(
        1536 * 1.62
    )
    assert TokenCounter("gpt-4o", image_tokens=500).message_tokens(_image_message(HTTPS_IMAGE)) == text + 500
    # A model whose formula we do not know: the flat cost, whatever the size.
    claude_text = _text_part_tokens(CL100K)
    for url in (HTTPS_IMAGE, IMAGE_1024):
        assert (
            TokenCounter("claude-3-5-sonnet").message_tokens(_image_message(url))
            == claude_text + DEFAULT_IMAGE_TOKENS
        )
        assert TokenCounter("claude-3-5-sonnet", image_tokens=900).message_tokens(_image_message(url)) == (
            claude_text + 900
        )


def test_every_known_image_formula_stays_within_the_flat_default_except_where_documented() -> None:
    # The flat default is meant to cover what OpenAI's large tile models charge at most.
    assert TokenCounter("gpt-4o").message_tokens(_image_message(HTTPS_IMAGE)) - _text_part_tokens(O200K) < (
        DEFAULT_IMAGE_TOKENS
    )


def test_audio_and_file_parts_cost_their_configured_amounts() -> None:
    audio = SHAPES_BY_NAME["input-audio"].build()[1]
    file = SHAPES_BY_NAME["file-part-typeddict"].build()[1]
    for counter, a, f in (
        (TokenCounter("gpt-4o"), DEFAULT_AUDIO_TOKENS, DEFAULT_FILE_TOKENS),
        (TokenCounter("gpt-4o", audio_tokens=321, file_tokens=654), 321, 654),
    ):
        assert (
            counter.message_tokens(audio) == 3 + tokens(O200K, "user") + tokens(O200K, "Transcribe this.") + a
        )
        assert (
            counter.message_tokens(file)
            == 3 + tokens(O200K, "user") + tokens(O200K, "Summarise the report.") + f
        )


def test_an_audio_reply_counts_as_audio_not_as_its_base64() -> None:
    payload = SHAPES_BY_NAME["openai-sdk-audio-reply"].build()[1]
    counter = TokenCounter("gpt-4o-audio-preview")
    rest = {k: v for k, v in payload["audio"].items() if k != "data"}
    assert counter.message_tokens(payload) == 3 + tokens(O200K, "assistant") + DEFAULT_AUDIO_TOKENS + tokens(
        O200K, json.dumps(rest, separators=(",", ":"))
    )


def test_unknown_parts_count_as_their_json() -> None:
    part = {"type": "document", "source": {"type": "text", "data": "notes " * 50}}
    counter = TokenCounter("gpt-4o")
    assert counter.message_tokens({"role": "user", "content": [part]}) == 3 + tokens(O200K, "user") + tokens(
        O200K, json.dumps(part, separators=(",", ":"))
    )


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_every_shape_is_counted_at_least_as_its_text(shape: Shape) -> None:
    payload = norm(shape.build()[0]).payload
    counter = TokenCounter("gpt-4o")
    assert counter.message_tokens(payload) >= 3 + tokens(O200K, shape.text.replace("[image]", ""))


@pytest.mark.parametrize("value", [-1, True, 1.5, "10"], ids=["negative", "bool", "float", "str"])
def test_bad_media_costs_are_a_configuration_error(value: Any) -> None:
    for kwarg in ("image_tokens", "audio_tokens", "file_tokens"):
        with pytest.raises(ConfigurationError, match=kwarg):
            TokenCounter("gpt-4o", **{kwarg: value})


# -- encoding facts: exact or estimated (issue 17 item 4) ----------------------------------------


@pytest.mark.parametrize(
    ("model", "encoding", "exact"),
    [
        ("gpt-4o", "o200k_base", True),
        ("openai/gpt-4o-mini", "o200k_base", True),
        ("gpt-4.1", "o200k_base", True),
        ("gpt-3.5-turbo", "cl100k_base", True),
        ("cl100k_base", "cl100k_base", True),
        ("p50k_base", "p50k_base", True),
        ("claude-3-5-sonnet-20241022", "cl100k_base", False),
        ("anthropic/claude-sonnet-4-5", "cl100k_base", False),
        ("gemini/gemini-2.0-flash", "cl100k_base", False),
        ("ollama/llama3", "cl100k_base", False),
        ("no-such-model", "cl100k_base", False),
    ],
)
def test_exact_encoding_and_safety_margin(model: str, encoding: str, exact: bool) -> None:
    counter = TokenCounter(model)
    assert (counter.encoding_name, counter.exact) == (encoding, exact)
    assert counter.safety_margin == (0.0 if exact else ESTIMATED_SAFETY_MARGIN)
    assert counter.usable_budget(1000) == (1000 if exact else 800)


def test_constructing_a_counter_does_not_import_litellm() -> None:
    code = (
        "import sys, time; import tiered_history.tokens as t; "
        "start = time.perf_counter(); c = t.TokenCounter('gpt-4o'); t.TokenCounter('claude-3-opus'); "
        "c.message_tokens({'role': 'user', 'content': [{'type': 'text', 'text': 'x'}]}); "
        "assert 'litellm' not in sys.modules, 'litellm imported'; print(time.perf_counter() - start)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) < 5.0


# -- reading image sizes --------------------------------------------------------------------------


def test_image_size_of_png_gif_jpeg_and_webp() -> None:
    pil = pytest.importorskip("PIL.Image")
    import base64
    import io

    def data_url(image: Any, fmt: str, **save: Any) -> str:
        out = io.BytesIO()
        image.save(out, fmt, **save)
        return f"data:image/{fmt.lower()};base64," + base64.b64encode(out.getvalue()).decode()

    for w, h in ((1, 1), (640, 480), (3000, 17), (16383, 3)):
        rgb = pil.new("RGB", (w, h), (200, 10, 10))
        assert image_size(data_url(rgb, "PNG")) == (w, h)
        assert image_size(data_url(rgb, "GIF")) == (w, h)
        assert image_size(data_url(rgb, "JPEG")) == (w, h)
        assert image_size(data_url(rgb, "JPEG", progressive=True)) == (w, h)
        assert image_size(data_url(rgb, "WEBP")) == (w, h)  # lossy: VP8
        assert image_size(data_url(rgb, "WEBP", lossless=True)) == (w, h)  # VP8L
        assert image_size(data_url(pil.new("RGBA", (w, h)), "WEBP")) == (w, h)  # alpha: VP8X
    # A JPEG whose size marker follows 60 KB of EXIF data.
    exif = pil.Exif()
    exif[0x010E] = "x" * 60_000  # ImageDescription
    assert image_size(data_url(pil.new("RGB", (801, 601)), "JPEG", exif=exif.tobytes())) == (801, 601)


@pytest.mark.parametrize(
    "url",
    [
        HTTPS_IMAGE,
        "http://example.com/a.png",
        "data:image/png,not-base64",
        "data:image/png;base64,",
        "data:image/png;base64,!!!!",
        "data:image/png;base64," + "A" * 100,
        "data:text/plain;base64,aGVsbG8=",
        "data:image/png;base64",
        "",
    ],
)
def test_image_size_is_none_when_unreadable_and_never_fetches(url: str) -> None:
    assert image_size(url) is None


def test_image_size_reads_only_the_head_of_a_huge_data_url() -> None:
    url = png_data_url(300, 200) + "A" * 30_000_000  # trailing junk far past the header
    assert image_size(url) == (300, 200)


# -- fuzz: arbitrary JSON-ish input normalises or raises InvalidMessageError ---------------------


_TEXT = st.one_of(
    st.text(
        alphabet=st.one_of(
            st.characters(codec="utf-8"),
            st.sampled_from(["\x00", "\ud800", "\udfff", "\u200b", "\u202e", "\n"]),
        ),
        max_size=20,
    ),
    st.sampled_from(["</summary>", "", " ", "bob", "c1"]),
)
_SMALL_PNG = png_data_url(64, 48)
_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    _TEXT,
)
_JSONISH = st.recursive(
    _SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(_TEXT, st.integers(0, 3)), inner, max_size=4),
    ),
    max_leaves=20,
)
_PART = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": _TEXT}),
    st.fixed_dictionaries(
        {
            "type": st.just("image_url"),
            "image_url": st.fixed_dictionaries({"url": st.sampled_from([HTTPS_IMAGE, _SMALL_PNG, ""])}),
        }
    ),
    st.fixed_dictionaries(
        {"type": st.just("input_audio"), "input_audio": st.fixed_dictionaries({"data": _TEXT})}
    ),
    st.dictionaries(st.sampled_from(["type", "text", "file", "x"]), _JSONISH, max_size=3),
)
_CALL = st.one_of(
    st.builds(weather_call, st.text(max_size=8)),
    st.dictionaries(st.sampled_from(["id", "type", "function", "custom"]), _JSONISH, max_size=4),
)
_MESSAGE = st.fixed_dictionaries(
    {},
    optional={
        "role": st.one_of(
            st.sampled_from(["system", "developer", "user", "assistant", "tool", "function"]), _JSONISH
        ),
        "content": st.one_of(_TEXT, st.none(), st.lists(_PART, max_size=3), _JSONISH),
        "name": st.one_of(st.sampled_from(["bob", "bob\n", "x" * 65]), _JSONISH),
        "tool_calls": st.one_of(st.lists(_CALL, max_size=3), _JSONISH),
        "tool_call_id": st.one_of(st.text(max_size=8), _JSONISH),
        "function_call": _JSONISH,
        "refusal": _JSONISH,
        "audio": _JSONISH,
        "pinned": st.one_of(st.booleans(), _JSONISH),
        "timestamp": st.one_of(
            st.datetimes(
                timezones=st.sampled_from([UTC, timezone(timedelta(hours=-5)), timezone(timedelta(hours=14))])
            ),
            st.datetimes(),
            _TEXT,
            st.floats(),
            st.integers(),
        ),
        "metadata": _JSONISH,
        "x_vendor": _JSONISH,
    },
)

_GOOD_TEXT = st.text(st.characters(codec="utf-8"), min_size=1, max_size=30)
_JSON_VALUE = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**63),
        st.floats(allow_nan=False, allow_infinity=False),
        _TEXT,
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_TEXT, inner, max_size=3)),
    max_leaves=10,
)
_GOOD_PART = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, _GOOD_TEXT),
    st.builds(
        lambda u, d: {"type": "image_url", "image_url": {"url": u, "detail": d}},
        st.sampled_from([HTTPS_IMAGE, _SMALL_PNG]),
        st.sampled_from(["low", "high", "auto"]),
    ),
    st.builds(lambda t: {"type": "file", "file": {"file_id": "f1", "filename": t}}, _TEXT),
)
_AWARE = st.datetimes(
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=-5)), timezone(timedelta(hours=14))])
)


def _mostly_valid(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(st.sampled_from(["system", "developer", "user", "assistant", "tool"]))
    message: dict[str, Any] = {
        "role": role,
        "content": draw(st.one_of(_TEXT, st.lists(_GOOD_PART, max_size=3))),
    }
    if role == "assistant" and draw(st.booleans()):
        ids = draw(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=3, unique=True))
        message["tool_calls"] = [weather_call(i) for i in ids]
        message["content"] = draw(st.one_of(st.none(), _TEXT))
    if role == "tool":
        message["tool_call_id"] = draw(st.text(min_size=1, max_size=8))
    for key, strategy in (
        ("name", st.sampled_from(["bob", "Bob_2", "bob\n"])),
        ("pinned", st.booleans()),
        ("timestamp", st.one_of(_AWARE, st.integers(-(10**11), 10**11))),
        ("metadata", st.dictionaries(_TEXT, _JSON_VALUE, max_size=3)),
        ("reasoning_content", _TEXT),
        ("x_vendor", _JSON_VALUE),
    ):
        if draw(st.booleans()):
            message[key] = draw(strategy)
    return message


_MOSTLY_VALID = st.composite(_mostly_valid)()


def _containers(value: Any) -> list[int]:
    out: list[int] = []
    if isinstance(value, dict | list):
        out.append(id(value))
        for item in value.values() if isinstance(value, dict) else value:
            out.extend(_containers(item))
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_MESSAGE, _MOSTLY_VALID))
def test_arbitrary_input_normalises_or_raises_invalid_message_error(message: dict[str, Any]) -> None:
    snapshot = repr(message)
    try:
        n = norm(message)
    except InvalidMessageError:
        assert repr(message) == snapshot  # the input was not touched
        return
    assert repr(message) == snapshot
    assert n.role in ("system", "developer", "user", "assistant", "tool", "function")
    assert not EXTENSION_KEYS & set(n.payload)
    # Strict JSON round trip, text valid for every backend.
    dumped = json.dumps(n.payload, allow_nan=False)
    assert json.loads(dumped) == n.payload
    json.dumps(n.metadata, allow_nan=False).encode("utf-8")
    n.text.encode("utf-8")
    assert "\x00" not in dumped and "\x00" not in n.text
    # Detached: no dict or list of the result is one of the caller's.
    theirs = set(_containers(message))
    assert not theirs & set(_containers(n.payload)) and not theirs & set(_containers(n.metadata))
    assert n.timestamp.utcoffset() is not None
    n.timestamp.astimezone(UTC)
    assert TokenCounter("gpt-4o").message_tokens(n.payload) >= 3


@settings(max_examples=200, deadline=None)
@given(st.one_of(_JSONISH, st.builds(object), st.binary()))
def test_arbitrary_non_dict_values_raise_invalid_message_error(value: object) -> None:
    if isinstance(value, dict):
        with contextlib.suppress(InvalidMessageError):
            norm(value)
        return
    with pytest.raises(InvalidMessageError):
        norm(value)


# Text checks skip the surrogate search for ASCII text, and a string content is checked once: any
# text, as the whole content, a content part or a metadata value, is still refused exactly when it
# holds a NUL (outside JSON values), a lone surrogate, or (content) nothing but blanks.
@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(["a", " ", "é", "\x00", "\ud800", "\udfff", "字", "\n"]), max_size=12),
    st.sampled_from(["content", "part", "metadata"]),
)
def test_text_is_refused_exactly_for_a_nul_or_a_lone_surrogate(text: str, where: str) -> None:
    nul = "\x00" in text and where != "metadata"
    surrogate = any("\ud800" <= c <= "\udfff" for c in text)
    blank = where != "metadata" and not text.strip()
    if where == "content":
        message: dict[str, Any] = {"role": "user", "content": text}
    elif where == "part":
        message = {"role": "user", "content": [{"type": "text", "text": text}]}
    else:
        message = {"role": "user", "content": "x", "metadata": {"note": text}}
    if not (nul or surrogate or blank):
        assert normalize_message(message, now=datetime.now(UTC)).text == (
            text if where != "metadata" else "x"
        )
        return
    with pytest.raises(InvalidMessageError) as err:
        normalize_message(message, now=datetime.now(UTC))
    found = {"NUL byte": nul, "lone UTF-16 surrogate": surrogate, "must not be empty": blank}
    assert any(problem in str(err.value) for problem, there in found.items() if there)


def _reference_conversation_id_error(value: str) -> str | None:
    """What validate_conversation_id refused, and why, in the order it checks (written out plainly)."""
    if not value.strip() or all(
        c in "\u00ad\u180e\u2060\u2061\u2062\u2063\u2064\ufeff" or "\u200b" <= c <= "\u200f" or c.isspace()
        for c in value
    ):
        return "must not be empty"
    if len(value) > 255:
        return "characters long"
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        return "control characters"
    if "\x00" in value:
        return "NUL byte"
    if any("\ud800" <= c <= "\udfff" for c in value):
        return "lone UTF-16 surrogate"
    return None


@settings(max_examples=400, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(
            ["a", "-", " ", "\t", "\x1f", "\x7f", "\x80", "é", "\u200b", "\ud800", "字"]
        ),
        max_size=8,
    )
)
def test_conversation_ids_are_refused_for_what_they_always_were(value: str) -> None:
    from tiered_history.errors import InvalidConversationIdError
    from tiered_history.models import validate_conversation_id

    why = _reference_conversation_id_error(value)
    if why is None:
        assert validate_conversation_id(value) is value
        return
    with pytest.raises(InvalidConversationIdError, match=why):
        validate_conversation_id(value)
