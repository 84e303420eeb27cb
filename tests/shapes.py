"""Every message shape a real bot produces, as reusable cases: the input object and what must come back.

Each :class:`Shape` builds its input with the real library (litellm's ``Message`` from
``litellm.completion(mock_response=...)``, the OpenAI SDK's ``ChatCompletionMessage`` and its
``model_dump()``, TypedDict params, our own ``Message``) and states the exact payload that must
be sent back to the provider, the plain text we index, and our own fields. :data:`SHAPES` is in
replay order: adding them one after another to one conversation is valid (every tool result
follows the call it answers), so the service tests can push the whole list through
``add_message`` / ``get_context`` on every backend and compare ``to_messages()`` with
``[s.payload for s in SHAPES]``.

No network: litellm's cost map is read from its bundled copy and ``mock_response`` answers locally.
"""

from __future__ import annotations

import base64
import io
import os
import struct
import wave
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@dataclass(frozen=True)
class Shape:
    name: str
    build: Callable[[], tuple[object, dict[str, Any]]]
    """Returns a fresh (input object, expected payload) pair on every call."""
    text: str
    """Expected ``NormalizedMessage.text``."""
    role: str
    tool_call_ids: tuple[str, ...] = ()
    tool_call_id: str | None = None
    pinned: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    timestamp: datetime | None = None
    """Expected timestamp, or None when the message carries none (then ``now`` is used)."""


# -- real media, built without any imaging library ------------------------------------------


def png_bytes(width: int, height: int) -> bytes:
    """A valid RGB PNG of the given size (all black; compresses to a few kilobytes)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" + b"\x00\x00\x00" * width
    pixels = zlib.compress(row * height, 9)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def png_data_url(width: int, height: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(width, height)).decode()


def wav_base64(seconds: float = 0.5, rate: int = 8000) -> str:
    """Base64 of a silent mono 16-bit WAV file."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\x00\x00" * int(seconds * rate))
    return base64.b64encode(out.getvalue()).decode()


PDF_DATA_URL = "data:application/pdf;base64," + base64.b64encode(b"%PDF-1.4\n%%EOF\n").decode()
IMAGE_1024 = png_data_url(1024, 1024)
HTTPS_IMAGE = "https://example.com/cat.jpg"
SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds" + "x" * 200


def weather_call(call_id: str, city: str = "Paris") -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": f'{{"city": "{city}"}}'},
    }


def _litellm() -> Any:
    import litellm

    return litellm


def _openai_message(**fields: Any) -> Any:
    from openai.types.chat import ChatCompletionMessage

    return ChatCompletionMessage(role="assistant", **fields)


# -- the cases -------------------------------------------------------------------------------


def _pinned_system() -> tuple[object, dict[str, Any]]:
    return (
        {"role": "system", "content": "You are a terse assistant.", "pinned": True},
        {"role": "system", "content": "You are a terse assistant."},
    )


def _user_text() -> tuple[object, dict[str, Any]]:
    msg = {"role": "user", "content": "What's the weather in Paris?", "name": "alice_01"}
    return msg, dict(msg)


def _litellm_completion_text() -> tuple[object, dict[str, Any]]:
    litellm = _litellm()
    response = litellm.completion(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], mock_response="Let me check."
    )
    # model_dump() carries tool_calls=None, function_call=None, provider_specific_fields=None.
    return response.choices[0].message, {"content": "Let me check.", "role": "assistant"}


def _litellm_completion_tool_calls() -> tuple[object, dict[str, Any]]:
    litellm = _litellm()
    from litellm.types.utils import Choices, ModelResponse

    calls = [weather_call("call_litellm_1"), weather_call("call_litellm_2", "Lyon")]
    mock = ModelResponse(
        choices=[
            Choices(
                message=litellm.Message(content=None, role="assistant", tool_calls=calls),
                finish_reason="tool_calls",
            )
        ],
        model="gpt-4o-mini",
    )
    response = litellm.completion(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "weather?"}], mock_response=mock
    )
    return response.choices[0].message, {"content": None, "role": "assistant", "tool_calls": calls}


def _tool_result(call_id: str, content: str) -> Callable[[], tuple[object, dict[str, Any]]]:
    def build() -> tuple[object, dict[str, Any]]:
        msg = {"role": "tool", "tool_call_id": call_id, "content": content}
        return msg, dict(msg)

    return build


def _openai_sdk_text() -> tuple[object, dict[str, Any]]:
    # refusal=None, annotations=None, audio=None, function_call=None, tool_calls=None are dropped.
    return _openai_message(content="It is 18°C and sunny in Paris."), {
        "content": "It is 18°C and sunny in Paris.",
        "role": "assistant",
    }


def _openai_sdk_dump() -> tuple[object, dict[str, Any]]:
    dump = _openai_message(content="Anything else?").model_dump()
    assert set(dump) >= {"refusal", "annotations", "audio", "function_call", "tool_calls"}
    return dump, {"content": "Anything else?", "role": "assistant"}


def _openai_sdk_tool_call() -> tuple[object, dict[str, Any]]:
    call = weather_call("call_sdk_1", "Nice")
    return _openai_message(content=None, tool_calls=[call]), {
        "content": None,
        "role": "assistant",
        "tool_calls": [call],
    }


def _openai_sdk_custom_tool_call() -> tuple[object, dict[str, Any]]:
    call = {"id": "call_custom_1", "type": "custom", "custom": {"name": "sql", "input": "SELECT 1"}}
    return _openai_message(content=None, tool_calls=[call]), {
        "content": None,
        "role": "assistant",
        "tool_calls": [call],
    }


def _openai_sdk_refusal() -> tuple[object, dict[str, Any]]:
    return _openai_message(content=None, refusal="I can't help with that."), {
        "content": None,
        "refusal": "I can't help with that.",
        "role": "assistant",
    }


def _openai_sdk_text_and_refusal() -> tuple[object, dict[str, Any]]:
    # A string content beside a refusal: the content comes back as it was, the refusal beside it.
    return _openai_message(content="Here is part of it.", refusal="I can't do the rest."), {
        "content": "Here is part of it.",
        "refusal": "I can't do the rest.",
        "role": "assistant",
    }


def _openai_sdk_text_and_audio() -> tuple[object, dict[str, Any]]:
    audio = {"id": "audio_def456", "data": wav_base64(0.1), "expires_at": 1_900_000_000, "transcript": "Hi!"}
    expected = {"content": "Hi!", "role": "assistant", "audio": audio}
    return _openai_message(content="Hi!", audio=audio), expected


def _openai_sdk_annotations() -> tuple[object, dict[str, Any]]:
    annotation = {
        "type": "url_citation",
        "url_citation": {"end_index": 5, "start_index": 0, "title": "Météo", "url": "https://example.com/m"},
    }
    return _openai_message(content="Sunny.", annotations=[annotation]), {
        "content": "Sunny.",
        "role": "assistant",
        "annotations": [annotation],
    }


def _openai_sdk_audio() -> tuple[object, dict[str, Any]]:
    audio = {"id": "audio_abc123", "data": wav_base64(0.1), "expires_at": 1_900_000_000, "transcript": "Hi!"}
    return _openai_message(content=None, audio=audio), {"content": None, "role": "assistant", "audio": audio}


def _reasoning_content() -> tuple[object, dict[str, Any]]:
    litellm = _litellm()
    message = litellm.Message(content="42.", role="assistant", reasoning_content="6 times 7 is 42.")
    return message, {"content": "42.", "role": "assistant", "reasoning_content": "6 times 7 is 42."}


def _thinking_tool_use() -> tuple[object, dict[str, Any]]:
    # Anthropic rejects a tool-use turn sent back without its signed thinking blocks.
    litellm = _litellm()
    blocks = [
        {
            "type": "thinking",
            "thinking": "The user wants the weather; call the tool.",
            "signature": SIGNATURE,
        },
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
    ]
    call = weather_call("toolu_01A09q90qw90lq917835lq9")
    message = litellm.Message(
        content="Checking.",
        role="assistant",
        tool_calls=[call],
        thinking_blocks=blocks,
        reasoning_content="The user wants the weather; call the tool.",
    )
    return message, {
        "content": "Checking.",
        "role": "assistant",
        "tool_calls": [call],
        "thinking_blocks": blocks,
        "reasoning_content": "The user wants the weather; call the tool.",
    }


def _provider_specific_fields() -> tuple[object, dict[str, Any]]:
    litellm = _litellm()
    fields = {"thought_signatures": ["CiQB0e2Kb7Qm"], "citations": None}
    message = litellm.Message(content="Done.", role="assistant", provider_specific_fields=fields)
    return message, {"content": "Done.", "role": "assistant", "provider_specific_fields": fields}


def _image_data_url() -> tuple[object, dict[str, Any]]:
    content = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": IMAGE_1024, "detail": "high"}},
    ]
    return {"role": "user", "content": content}, {"role": "user", "content": content}


def _image_https() -> tuple[object, dict[str, Any]]:
    content = [
        {"type": "image_url", "image_url": {"url": HTTPS_IMAGE, "detail": "low"}},
        {"type": "text", "text": "And this one?"},
    ]
    return {"role": "user", "content": content}, {"role": "user", "content": content}


def _input_audio() -> tuple[object, dict[str, Any]]:
    content = [
        {"type": "text", "text": "Transcribe this."},
        {"type": "input_audio", "input_audio": {"data": wav_base64(), "format": "wav"}},
    ]
    return {"role": "user", "content": content}, {"role": "user", "content": content}


def _file_part() -> tuple[object, dict[str, Any]]:
    from openai.types.chat import ChatCompletionUserMessageParam

    content: Any = [
        {"type": "file", "file": {"filename": "report.pdf", "file_data": PDF_DATA_URL}},
        {"type": "text", "text": "Summarise the report."},
    ]
    param = ChatCompletionUserMessageParam(role="user", content=content)  # a TypedDict: a dict
    return param, {"role": "user", "content": content}


def _unknown_part_and_field() -> tuple[object, dict[str, Any]]:
    content = [
        {"type": "text", "text": "Cache this prefix.", "cache_control": {"type": "ephemeral"}},
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "notes"}},
    ]
    msg = {"role": "user", "content": content, "x_vendor_hint": {"priority": 2}}
    return msg, {"role": "user", "content": content, "x_vendor_hint": {"priority": 2}}


def _developer() -> tuple[object, dict[str, Any]]:
    msg = {"role": "developer", "content": "Answer in French."}
    return msg, dict(msg)


def _with_extensions() -> tuple[object, dict[str, Any]]:
    msg = {
        "role": "user",
        "content": "Merci !",
        "timestamp": "2026-03-01T12:00:00+09:00",
        "metadata": {"platform": "discord", "user_ids": [123456789012345678], "score": 0.5},
    }
    return msg, {"role": "user", "content": "Merci !"}


def _legacy_function_call() -> tuple[object, dict[str, Any]]:
    msg = {"role": "assistant", "content": None, "function_call": {"name": "get_time", "arguments": "{}"}}
    return msg, {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "get_time", "arguments": "{}"},
    }


def _legacy_function_result() -> tuple[object, dict[str, Any]]:
    msg = {"role": "function", "name": "get_time", "content": "12:00"}
    return msg, dict(msg)


def _our_message() -> tuple[object, dict[str, Any]]:
    from tiered_history import Message

    ts = datetime(2026, 3, 1, 13, 0, tzinfo=timezone(timedelta(hours=1)))
    return (
        Message(role="user", content="Thanks!", name="alice_01", timestamp=ts, metadata={"k": "v"}),
        {"role": "user", "content": "Thanks!", "name": "alice_01"},
    )


SHAPES: list[Shape] = [
    Shape("pinned-system", _pinned_system, "You are a terse assistant.", "system", pinned=True),
    Shape("developer", _developer, "Answer in French.", "developer"),
    Shape("user-text-named", _user_text, "What's the weather in Paris?", "user"),
    Shape("litellm-completion-text", _litellm_completion_text, "Let me check.", "assistant"),
    Shape(
        "litellm-completion-tool-calls",
        _litellm_completion_tool_calls,
        "",
        "assistant",
        tool_call_ids=("call_litellm_1", "call_litellm_2"),
    ),
    Shape(
        "tool-result-1",
        _tool_result("call_litellm_1", "18C, sunny"),
        "18C, sunny",
        "tool",
        tool_call_id="call_litellm_1",
    ),
    Shape(
        "tool-result-2",
        _tool_result("call_litellm_2", "20C, cloudy"),
        "20C, cloudy",
        "tool",
        tool_call_id="call_litellm_2",
    ),
    Shape("openai-sdk-text", _openai_sdk_text, "It is 18°C and sunny in Paris.", "assistant"),
    Shape("openai-sdk-model-dump", _openai_sdk_dump, "Anything else?", "assistant"),
    Shape("image-data-url", _image_data_url, "What is in this picture?\n[image]", "user"),
    Shape("openai-sdk-tool-call", _openai_sdk_tool_call, "", "assistant", tool_call_ids=("call_sdk_1",)),
    Shape("tool-result-sdk", _tool_result("call_sdk_1", "22C"), "22C", "tool", tool_call_id="call_sdk_1"),
    Shape("image-https", _image_https, "[image]\nAnd this one?", "user"),
    Shape(
        "openai-sdk-custom-tool-call",
        _openai_sdk_custom_tool_call,
        "",
        "assistant",
        tool_call_ids=("call_custom_1",),
    ),
    Shape(
        "tool-result-custom", _tool_result("call_custom_1", "1"), "1", "tool", tool_call_id="call_custom_1"
    ),
    Shape("openai-sdk-refusal", _openai_sdk_refusal, "I can't help with that.", "assistant"),
    Shape("input-audio", _input_audio, "Transcribe this.\n[audio]", "user"),
    Shape("openai-sdk-audio-reply", _openai_sdk_audio, "Hi!", "assistant"),
    Shape(
        "openai-sdk-text-and-refusal",
        _openai_sdk_text_and_refusal,
        "Here is part of it.\nI can't do the rest.",
        "assistant",
    ),
    Shape("openai-sdk-text-and-audio", _openai_sdk_text_and_audio, "Hi!\nHi!", "assistant"),
    Shape("file-part-typeddict", _file_part, "[file: report.pdf]\nSummarise the report.", "user"),
    Shape("openai-sdk-annotations", _openai_sdk_annotations, "Sunny.", "assistant"),
    Shape("unknown-part-and-field", _unknown_part_and_field, "Cache this prefix.\n[document]", "user"),
    Shape("reasoning-content", _reasoning_content, "42.", "assistant"),
    Shape(
        "thinking-blocks-tool-use",
        _thinking_tool_use,
        "Checking.",
        "assistant",
        tool_call_ids=("toolu_01A09q90qw90lq917835lq9",),
    ),
    Shape(
        "tool-result-thinking",
        _tool_result("toolu_01A09q90qw90lq917835lq9", "15C"),
        "15C",
        "tool",
        tool_call_id="toolu_01A09q90qw90lq917835lq9",
    ),
    Shape("provider-specific-fields", _provider_specific_fields, "Done.", "assistant"),
    Shape("legacy-function-call", _legacy_function_call, "", "assistant"),
    Shape("legacy-function-result", _legacy_function_result, "12:00", "function"),
    Shape(
        "extensions",
        _with_extensions,
        "Merci !",
        "user",
        metadata={"platform": "discord", "user_ids": [123456789012345678], "score": 0.5},
        timestamp=datetime(2026, 3, 1, 3, 0, tzinfo=UTC),
    ),
    Shape(
        "our-message-object",
        _our_message,
        "Thanks!",
        "user",
        metadata={"k": "v"},
        timestamp=datetime(2026, 3, 1, 12, 0, tzinfo=UTC),
    ),
]

SHAPES_BY_NAME: dict[str, Shape] = {s.name: s for s in SHAPES}
