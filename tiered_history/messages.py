"""Every message shape a bot hands us, checked and reduced to one :class:`NormalizedMessage`.

Pure: no I/O. A bot stores each message exactly as its LLM library produced it -- an
OpenAI-format dict (or ``ChatCompletionMessageParam`` TypedDict), any object with
``model_dump()`` (litellm ``Message``, OpenAI ``ChatCompletionMessage``, our own
:class:`tiered_history.models.Message`) -- and later sends the stored ``payload`` back to its
provider. So the payload keeps everything the message carried, provider fields included
(``reasoning_content``, ``thinking_blocks`` with their signatures, ``provider_specific_fields``
such as Gemini thought signatures, ``refusal``, ``audio``, ``annotations``, ``function_call``),
and only our three extension keys are taken out of it: ``pinned``, ``timestamp``, ``metadata``.

Rules (each enforced by :func:`normalize_message`, which raises
:class:`~tiered_history.errors.InvalidMessageError` and nothing else):

* ``None`` values. A top-level key whose value is ``None`` is dropped from the payload, except
  ``content``: OpenAI's schema marks every other message field optional *and* nullable and
  treats absent and null alike (``name``, ``tool_calls``, ``tool_call_id``, ``function_call``,
  ``refusal``, ``audio``, ``annotations``), litellm itself deletes ``audio``, ``annotations``,
  ``reasoning_content``, ``thinking_blocks`` and ``images`` when they are ``None`` because
  OpenAI-compatible servers (Mistral) reject an explicit null, and litellm reads
  ``provider_specific_fields`` with ``or {}``. Unknown keys follow the same rule: absent is what
  strict servers accept. ``content=None`` (an assistant turn that only calls tools) is kept as
  ``None``, and an absent ``content`` stays absent. Values *inside* tool calls, content parts and
  provider fields are kept exactly, ``None`` included.
* ``content`` is a string, ``None`` or a list of parts (``text``, ``image_url``, ``input_audio``,
  ``file``, ``refusal``; parts of unknown types are kept). A message needs something to say:
  non-blank text, a non-text part, tool calls, a legacy ``function_call``, a ``refusal`` or an
  ``audio`` reply (the last two are how OpenAI returns a refusal or a spoken answer, with
  ``content=None``).
* Every string anywhere (payload, metadata, tool ids) must be valid text for every backend: no
  NUL byte (PostgreSQL text cannot hold one) and no lone UTF-16 surrogate (not encodable).
  Numbers must be finite, integers must fit in 64 bits, and nesting is at most
  :data:`MAX_DEPTH` deep, so every payload and metadata value round-trips through strict JSON.
* ``name`` fully matches ``[A-Za-z0-9_-]{1,64}`` (OpenAI's rule; ``"bob\\n"`` is rejected).
* Tool calls: only on assistant messages, a non-empty list of
  ``{"id", "type": "function", "function": {"name", "arguments": str}}`` (or OpenAI's
  ``{"type": "custom", "custom": {"name", "input": str}}``) with unique non-empty ids of at most
  :data:`MAX_TOOL_CALL_ID_LENGTH` characters; extra keys inside a call are kept. Tool results
  (role ``tool``) need ``tool_call_id``, and only they may carry it. Role ``function`` (OpenAI's
  legacy function result) needs ``name``. Tool calls and results cannot be pinned.
* ``timestamp``: an aware ``datetime``, an ISO 8601 string with an offset (``Z`` or ``+hh:mm``)
  or a Unix time in seconds (int or float; pydantic's rule reads values above 2e10 as
  milliseconds); absent or ``None`` means ``now``. Naive values are rejected (we cannot know
  their zone), and so is any instant outside years 1..9999 once converted to UTC (neither
  Python nor the SQL stores can hold it).
* ``metadata``: a JSON object with string keys (absent or ``None`` means ``{}``). One key is
  read: ``reply_to``, the sequence of the earlier message this one replies to (a threaded
  reply, a quote); a reply to the topic sealed just before reopens it (see
  :func:`~tiered_history.core.boundaries.decide`).
* ``pinned``: ``True`` or ``False`` (absent or ``None`` means ``False``).

The payload and metadata are fresh copies made of plain ``dict``/``list``/scalars: changing the
caller's objects afterwards changes nothing here, and vice versa.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, Final, NoReturn

from pydantic import TypeAdapter, ValidationError

from .core.units import RESULT_ROLES
from .errors import InvalidMessageError
from .models import NO_CONTENT

ROLES: Final = ("system", "developer", "user", "assistant", "tool", "function")
#: Our keys, read from the message and never sent to the provider.
EXTENSION_KEYS: Final = frozenset({"pinned", "timestamp", "metadata"})
#: Longest tool call id accepted (the column is VARCHAR(255) on every backend).
MAX_TOOL_CALL_ID_LENGTH: Final = 255
#: Deepest nesting of lists and objects accepted in a payload or metadata (hostile input
#: nested 100,000 deep would otherwise overflow the stack of every JSON reader).
MAX_DEPTH: Final = 64
#: Integers beyond 64 bits are refused: most JSON readers cannot hold them exactly.
_INT_LIMIT: Final = 2**64
_NAME_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SURROGATE_RE: Final = re.compile("[\ud800-\udfff]")
_PLACEHOLDER_TYPE_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,40}")
_CONTROL_RE: Final = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
_DATETIME: Final[TypeAdapter[datetime]] = TypeAdapter(datetime)
_TOOL_CALL_SHAPE: Final = (
    "tool calls must be {'id', 'type': 'function', 'function': {'name', 'arguments'}} "
    "(or OpenAI's {'id', 'type': 'custom', 'custom': {'name', 'input'}})"
)


@dataclass(frozen=True, slots=True)
class NormalizedMessage:
    """One validated message: what to send back to the provider, plus what we index and keep."""

    payload: dict[str, Any]
    """The wire message to send back: exactly what the bot gave (minus our extension keys and
    top-level ``None`` values other than ``content``), as a detached, JSON-safe copy."""
    role: str
    """``system``, ``developer``, ``user``, ``assistant``, ``tool`` or ``function``."""
    text: str
    """Plain text for search, summaries and topic detection: text parts joined with newlines,
    ``[image]`` / ``[audio]`` / ``[file: name]`` where such parts were."""
    name: str | None
    tool_call_ids: tuple[str, ...]
    """Ids of the tool calls this assistant message makes (empty if none)."""
    tool_call_id: str | None
    """For role ``tool``: the call answered."""
    pinned: bool
    timestamp: datetime
    """Aware; its UTC value lies within years 1..9999. The caller's offset is kept."""
    metadata: dict[str, Any]
    """A JSON object with finite numbers only, as a detached copy."""


def _fail(where: str, problem: str) -> NoReturn:
    raise InvalidMessageError(f"invalid message ({where}): {problem}")


def _check_text(value: str, where: str, what: str | None = None, *, nul: bool = False) -> str:
    """``value`` if it is storable text; ``nul``: a NUL is allowed (JSON keeps it as ``\\u0000``)."""
    what = what or where
    if not nul and "\x00" in value:
        _fail(where, f"{what} contains a NUL byte, which PostgreSQL cannot store")
    # str.isascii() reads a flag of the string: ASCII text holds no surrogate, no search needed.
    if not value.isascii() and _SURROGATE_RE.search(value):
        _fail(where, f"{what} contains a lone UTF-16 surrogate, which is not valid Unicode text")
    return value


def _json_copy(value: object, where: str, what: str, depth: int = 0) -> Any:
    """A detached copy of ``value`` made only of JSON types, or :class:`InvalidMessageError`."""
    if depth > MAX_DEPTH:
        _fail(where, f"{what} is nested more than {MAX_DEPTH} levels deep")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        # Inside a structured field (metadata, tool-call arguments...) a NUL survives as JSON's
        # \u0000; the texts kept in columns of their own are checked where they are read.
        return _check_text(value, where, what, nul=depth > 0)
    if isinstance(value, int):
        if not -_INT_LIMIT < value < _INT_LIMIT:
            _fail(where, f"{what} holds an integer beyond 64 bits, which JSON readers cannot hold")
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            _fail(where, f"{what} must be JSON-serialisable: {value!r} is not a JSON number")
        return float(value)
    if isinstance(value, (dict, Mapping)):  # a dict first: the ABC check costs more
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                _fail(where, f"{what} must be JSON-serialisable: key {key!r} is not a string")
            _check_text(key, where, f"{what} key")
            out[key] = _json_copy(item, f"{where}.{key}", what, depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [_json_copy(item, f"{where}[{i}]", what, depth + 1) for i, item in enumerate(value)]
    _fail(where, f"{what} must be JSON-serialisable: {type(value).__name__} is not a JSON value")


def _raw_fields(message: object) -> dict[str, Any]:
    """The message's fields as a fresh top-level dict (values still the caller's objects)."""
    if type(message) is dict or isinstance(message, Mapping):  # the ABC check costs more than a dict
        raw = message
    else:
        dump = getattr(message, "model_dump", None)
        if not callable(dump) or isinstance(message, type):
            _fail(
                "message",
                f"expected a dict in OpenAI chat format or an object with model_dump(), "
                f"not {type(message).__name__}",
            )
        try:
            raw = dump()
        except Exception as exc:  # a third-party model's serialiser: any failure is the input's
            _fail("message", f"{type(message).__name__}.model_dump() failed: {exc}")
        if not isinstance(raw, Mapping):
            _fail("message", f"{type(message).__name__}.model_dump() returned {type(raw).__name__}")
    out: dict[str, Any] = {}
    try:
        for key, value in raw.items():
            if not isinstance(key, str):
                _fail("message", f"field names must be strings, not {type(key).__name__}")
            out[key] = value
    except InvalidMessageError:
        raise
    except Exception as exc:  # a mapping of the caller's own whose reads fail: the input's fault
        _fail("message", f"reading the {type(message).__name__}'s fields failed: {exc!r}")
    return out


def _timestamp(value: object, now: datetime) -> datetime:
    if value is None:
        return now
    if isinstance(value, bool) or not isinstance(value, datetime | str | int | float):
        _fail(
            "timestamp", f"must be a datetime, an ISO 8601 string or a Unix time, not {type(value).__name__}"
        )
    if isinstance(value, datetime):
        ts = value
    else:
        try:
            ts = _DATETIME.validate_python(value)
        except ValidationError as exc:
            _fail("timestamp", f"cannot read {value!r} as a time: {exc.errors()[0].get('msg')}")
        offset = ts.utcoffset()
        if offset is not None:  # pydantic's own tzinfo class: use the standard one
            ts = ts.replace(tzinfo=UTC if offset == timedelta(0) else timezone(offset))
    try:
        offset = ts.utcoffset()
    except Exception as exc:  # a broken tzinfo implementation
        _fail("timestamp", f"its time zone failed: {exc}")
    if offset is None:
        _fail("timestamp", "timestamp must be timezone-aware (for example datetime.now(UTC))")
    try:
        ts.astimezone(UTC)
    except (OverflowError, ValueError):
        _fail("timestamp", f"{ts.isoformat()} is outside years 1..9999 in UTC")
    return ts


def _placeholder_name(raw: object) -> str:
    """A file name fit for a one-line placeholder: no control characters, no brackets, short."""
    text = _CONTROL_RE.sub(" ", str(raw)).replace("[", "(").replace("]", ")").strip()
    return text[:100] if text else ""


def _part_text(part: dict[str, Any], index: int) -> tuple[str, bool]:
    """Check one content part; return (its text for search, whether it is a non-text part)."""

    def fail(problem: str) -> NoReturn:
        _fail("content", f"part {index}: {problem}")

    kind = part.get("type")
    if not isinstance(kind, str) or not kind:
        fail("every content part needs a string 'type'")
    if kind == "text":
        text = part.get("text")
        if not isinstance(text, str):
            fail("a text part needs a string 'text'")
        return text, False
    if kind == "refusal":
        refusal = part.get("refusal")
        if not isinstance(refusal, str):
            fail("a refusal part needs a string 'refusal'")
        return refusal, False
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image  # litellm also takes a bare URL
        if not isinstance(url, str) or not url.strip():
            fail("an image_url part needs image_url.url (an https or data: URL)")
        if isinstance(image, dict) and not isinstance(image.get("detail", "auto"), str):
            fail("image_url.detail must be 'low', 'high' or 'auto'")
        return "[image]", True
    if kind == "input_audio":
        audio = part.get("input_audio")
        if not isinstance(audio, dict) or not isinstance(audio.get("data"), str):
            fail("an input_audio part needs input_audio.data (base64 audio)")
        return "[audio]", True
    if kind == "file":
        file = part.get("file")
        if not isinstance(file, dict) or not any(
            isinstance(file.get(k), str) and file[k] for k in ("file_data", "file_id")
        ):
            fail("a file part needs file.file_data or file.file_id")
        name = _placeholder_name(file.get("filename") or "")
        return (f"[file: {name}]" if name else "[file]"), True
    # A part type we do not know (a provider extension): kept as given, shown by its text if any.
    text = part.get("text")
    if isinstance(text, str):
        return text, not text.strip()
    return (f"[{kind}]" if _PLACEHOLDER_TYPE_RE.fullmatch(kind) else "[content]"), True


def _content(payload: dict[str, Any]) -> tuple[list[str], bool]:
    """Check ``content``; return its text pieces and whether it has a non-text part."""
    content = payload.get("content")
    if content is None or isinstance(content, str):
        return ([content] if content else []), False
    if not isinstance(content, list):
        _fail("content", "content must be a string, a list of content parts or None")
    pieces: list[str] = []
    non_text = False
    for i, part in enumerate(content):
        if not isinstance(part, dict):
            _fail(
                "content", f"part {i}: content parts must be objects with a 'type', not {type(part).__name__}"
            )
        text, is_media = _part_text(part, i)
        non_text = non_text or is_media
        if text:
            pieces.append(text)
    return pieces, non_text


def _tool_calls(payload: dict[str, Any], role: str) -> tuple[str, ...]:
    calls = payload.get("tool_calls")
    if calls is None:
        return ()
    if role != "assistant":
        _fail("tool_calls", "only assistant messages may carry tool_calls")
    if not isinstance(calls, list):
        _fail("tool_calls", "tool_calls must be a list")
    if not calls:
        _fail("tool_calls", "tool_calls must not be an empty list (omit it instead)")
    ids: list[str] = []
    for i, call in enumerate(calls):
        where = f"tool_calls[{i}]"
        if not isinstance(call, dict):
            _fail(where, _TOOL_CALL_SHAPE)
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id.strip():
            _fail(where, "every tool call needs a non-empty string 'id'")
        _check_text(call_id, f"{where}.id", "tool call id")
        if len(call_id) > MAX_TOOL_CALL_ID_LENGTH:
            _fail(where, f"tool call ids must be at most {MAX_TOOL_CALL_ID_LENGTH} characters")
        if call_id in ids:
            _fail(where, f"tool call id {call_id!r} appears twice")
        ids.append(call_id)
        kind = call.get("type", "function")
        body_key, value_key = ("custom", "input") if kind == "custom" else ("function", "arguments")
        body = call.get(body_key)
        if kind not in ("function", "custom") or not isinstance(body, dict):
            _fail(where, _TOOL_CALL_SHAPE)
        # 'arguments' may be absent (as models.Message always allowed); a custom call needs its input.
        value = body.get(value_key, "" if kind != "custom" else None)
        if not isinstance(body.get("name"), str) or not isinstance(value, str):
            _fail(where, f"a tool call's {body_key} needs a string 'name' and string '{value_key}'")
    return tuple(ids)


def normalize_message(message: object, *, now: datetime) -> NormalizedMessage:
    """Check ``message`` and split it into the wire payload and our own fields.

    ``now`` stamps a message that carries no timestamp. Raises
    :class:`~tiered_history.errors.InvalidMessageError` (never another exception) when the
    message cannot be stored and sent back as it is.
    """
    raw = _raw_fields(message)
    if NO_CONTENT in raw:  # the store's own mark of a message without content
        _fail(NO_CONTENT, f"the field name {NO_CONTENT!r} is reserved")
    pinned = raw.pop("pinned", None)
    timestamp = raw.pop("timestamp", None)
    metadata = raw.pop("metadata", None)
    # Detach before checking: the checks then read our copy, which nobody else can change.
    payload: dict[str, Any] = {
        k: _json_copy(v, k, k) for k, v in raw.items() if v is not None or k == "content"
    }

    role = payload.get("role")
    if role is None:
        _fail("role", "Field required")
    if role not in ROLES:
        _fail("role", f"role must be one of {', '.join(ROLES)}, not {role!r}")

    name = payload.get("name")
    if name is not None and (not isinstance(name, str) or not _NAME_RE.fullmatch(name)):
        _fail("name", "name must be 1-64 characters of letters, digits, '_' or '-' (OpenAI's rule)")
    if role == "function" and name is None:
        _fail("name", "function messages need the name of the function they answer")

    call_ids = _tool_calls(payload, role)
    function_call = payload.get("function_call")
    if function_call is not None:
        if role != "assistant":
            _fail("function_call", "only assistant messages may carry function_call")
        if not isinstance(function_call, dict) or not all(
            isinstance(function_call.get(k), str) for k in ("name", "arguments")
        ):
            _fail("function_call", "function_call must be {'name': str, 'arguments': str}")

    tool_call_id = payload.get("tool_call_id")
    if role == "tool":
        if not isinstance(tool_call_id, str) or not tool_call_id.strip():
            _fail("tool_call_id", "tool messages need the tool_call_id of the call they answer")
        if len(tool_call_id) > MAX_TOOL_CALL_ID_LENGTH:
            _fail("tool_call_id", f"tool_call_id must be at most {MAX_TOOL_CALL_ID_LENGTH} characters")
    elif tool_call_id is not None:
        _fail("tool_call_id", "only tool messages may carry tool_call_id")

    pieces, non_text = _content(payload)
    refusal = payload.get("refusal")
    if refusal is not None and not isinstance(refusal, str):
        _fail("refusal", "refusal must be a string")
    if refusal and refusal not in pieces:
        pieces.append(refusal)
    audio = payload.get("audio")
    if isinstance(audio, dict):  # OpenAI's spoken reply: {id, data, transcript, expires_at}
        transcript = audio.get("transcript")
        pieces.append(transcript if isinstance(transcript, str) and transcript.strip() else "[audio]")
        non_text = True
    text = "\n".join(pieces)
    if not (len(pieces) == 1 and text is payload.get("content")):  # a string content is checked already
        _check_text(text, "content")
    acts = bool(call_ids) or function_call is not None
    if not text.strip() and not non_text and not acts:
        what = "missing or None" if payload.get("content") is None else "empty"
        _fail(
            "content",
            f"content must not be empty (it is {what}; only an assistant message with tool_calls "
            "may have no content)",
        )

    if pinned is None:
        pinned = False
    if not isinstance(pinned, bool):
        _fail("pinned", f"pinned must be true or false, not {type(pinned).__name__}")
    if pinned and (role in RESULT_ROLES or acts):
        _fail("pinned", "tool calls and tool results cannot be pinned")

    if metadata is None:
        metadata = {}
    if not isinstance(metadata, (dict, Mapping)):
        _fail("metadata", f"metadata must be a JSON object, not {type(metadata).__name__}")
    meta: dict[str, Any] = _json_copy(metadata, "metadata", "metadata")

    return NormalizedMessage(
        payload=payload,
        role=role,
        text=text,
        name=name,
        tool_call_ids=call_ids,
        tool_call_id=tool_call_id if role == "tool" else None,
        pinned=pinned,
        timestamp=_timestamp(timestamp, now),
        metadata=meta,
    )
