"""Public data types: what users pass in and what they get back."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import InvalidConversationIdError, InvalidMessageError

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]
#: Marks, in ``StoredMessage.extra``, a message that had no ``content`` key at all.
NO_CONTENT = "~no-content"
Tier = Literal["message", "topic", "bulk"]

#: Longest conversation id accepted (it is a primary key on every backend).
MAX_CONVERSATION_ID_LENGTH = 255
#: Longest tool call id accepted (the column is VARCHAR(255)).
MAX_TOOL_CALL_ID_LENGTH = 255
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
#: Whitespace and zero-width characters: an id made only of these looks empty in every log and UI.
_BLANK_RE = re.compile(r"[\s\u00ad\u180e\u200b-\u200f\u2060-\u2064\ufeff]*")
#: Control characters an id must not hold (ASCII's: below 32, and DEL).
_CONTROL_RE = re.compile("[\x00-\x1f\x7f]")


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text on every backend, else None."""
    if "\x00" in value:
        return "contains a NUL byte, which PostgreSQL cannot store"
    if not value.isascii() and _SURROGATE_RE.search(value):
        return "contains a lone UTF-16 surrogate, which is not valid Unicode text"
    return None


def storable(value: str) -> str:
    """``value`` made storable (NUL bytes dropped, lone surrogates as U+FFFD): for what others wrote
    that we only keep for reference, such as a provider's error message or model name."""
    if text_problem(value) is None:
        return value
    return _SURROGATE_RE.sub("\ufffd", value.replace("\x00", ""))


def _check_text(value: str, what: str) -> str:
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(f"{what} {problem}")
    return value


def validate_text_argument(value: object, what: str, max_length: int | None = None) -> str:
    """Check a free-text argument (search text, platform) before it reaches the database."""
    if not isinstance(value, str):
        raise InvalidMessageError(f"{what} must be a string, not {type(value).__name__}")
    if not value.strip():
        raise InvalidMessageError(f"{what} must not be empty")
    if max_length is not None and len(value) > max_length:
        raise InvalidMessageError(f"{what} must be at most {max_length} characters")
    try:
        return _check_text(value, what)
    except ValueError as exc:
        raise InvalidMessageError(str(exc)) from None


def validate_conversation_id(conversation_id: object) -> str:
    """Return the id unchanged if it is usable, else raise :class:`InvalidConversationIdError`."""
    if type(conversation_id) is str and conversation_id in _VALID_IDS:
        return conversation_id  # checked already (every call checks the id: two regex scans)
    if not isinstance(conversation_id, str):
        raise InvalidConversationIdError(
            f"conversation id must be a string, not {type(conversation_id).__name__}"
        )
    if _BLANK_RE.fullmatch(conversation_id):
        raise InvalidConversationIdError("conversation id must not be empty, whitespace or invisible")
    if len(conversation_id) > MAX_CONVERSATION_ID_LENGTH:
        raise InvalidConversationIdError(
            f"conversation id is {len(conversation_id)} characters long; "
            f"the maximum is {MAX_CONVERSATION_ID_LENGTH}"
        )
    if _CONTROL_RE.search(conversation_id):
        raise InvalidConversationIdError("conversation id must not contain control characters")
    if not conversation_id.isascii():  # a flag of the string: no surrogate, and no NUL (a control)
        try:
            _check_text(conversation_id, "conversation id")
        except ValueError as exc:
            raise InvalidConversationIdError(str(exc)) from None
    if type(conversation_id) is str:  # a subclass may hash or compare as it likes: not remembered
        if len(_VALID_IDS) >= 4096:
            _VALID_IDS.clear()
        _VALID_IDS[conversation_id] = None
    return conversation_id


#: Ids found valid lately (an id is valid or not whatever the call).
_VALID_IDS: dict[str, None] = {}


class Message(BaseModel):
    """One chat message, in OpenAI's shape plus ``pinned``, ``timestamp`` and ``metadata``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Role
    content: str = ""
    name: str | None = None
    timestamp: datetime = Field(default_factory=lambda: datetime.now(UTC))
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    pinned: bool = False
    metadata: dict[str, Any] = Field(default_factory=lambda: {})  # a lambda: see Settings.platforms

    @field_validator("content")
    @classmethod
    def _content_text(cls, v: str) -> str:
        return _check_text(v, "content")

    @field_validator("name")
    @classmethod
    def _name_shape(cls, v: str | None) -> str | None:
        if v is not None and not _NAME_RE.match(v):
            raise ValueError("name must be 1-64 characters of letters, digits, '_' or '-' (OpenAI's rule)")
        return v

    @field_validator("timestamp")
    @classmethod
    def _aware(cls, v: datetime) -> datetime:
        if v.tzinfo is None or v.tzinfo.utcoffset(v) is None:
            raise ValueError("timestamp must be timezone-aware (for example datetime.now(UTC))")
        return v

    @field_validator("metadata")
    @classmethod
    def _json_metadata(cls, v: dict[str, Any]) -> dict[str, Any]:
        try:
            _check_text(json.dumps(v, ensure_ascii=False), "metadata")
        except (TypeError, ValueError) as exc:
            raise ValueError(f"metadata must be JSON-serialisable text: {exc}") from None
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Message:
        if self.tool_calls is not None:
            if self.role != "assistant":
                raise ValueError("only assistant messages may carry tool_calls")
            if not self.tool_calls:
                raise ValueError("tool_calls must not be an empty list (omit it instead)")
            seen: set[str] = set()
            for call in self.tool_calls:
                cid = call.get("id")
                fn = call.get("function")
                if not isinstance(cid, str) or not cid:
                    raise ValueError("every tool call needs a non-empty string 'id'")
                if cid in seen:
                    raise ValueError(f"tool call id {cid!r} appears twice")
                seen.add(cid)
                if call.get("type", "function") != "function" or not isinstance(fn, Mapping):
                    raise ValueError("tool calls must be {'id', 'type': 'function', 'function': {...}}")
                if not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments", ""), str):
                    raise ValueError("a tool call's function needs a string 'name' and string 'arguments'")
                _check_text(json.dumps(call, ensure_ascii=False), "tool call")
                if len(cid) > MAX_TOOL_CALL_ID_LENGTH:
                    raise ValueError(f"tool call ids must be at most {MAX_TOOL_CALL_ID_LENGTH} characters")
        if self.role == "tool":
            if not self.tool_call_id:
                raise ValueError("tool messages need the tool_call_id of the call they answer")
            _check_text(self.tool_call_id, "tool_call_id")
            if len(self.tool_call_id) > MAX_TOOL_CALL_ID_LENGTH:
                raise ValueError(f"tool_call_id must be at most {MAX_TOOL_CALL_ID_LENGTH} characters")
        elif self.tool_call_id is not None:
            raise ValueError("only tool messages may carry tool_call_id")
        if self.pinned and (self.role == "tool" or self.tool_calls):
            raise ValueError("tool calls and tool results cannot be pinned")
        if not self.content.strip() and not self.tool_calls:
            raise ValueError("content must not be empty")
        return self

    @classmethod
    def parse(cls, data: Message | Mapping[str, Any]) -> Message:
        """Build a message from a dict (OpenAI format), raising :class:`InvalidMessageError`."""
        if isinstance(data, Message):
            return data
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "message"
            raise InvalidMessageError(f"invalid message ({where}): {first.get('msg')}") from None

    def to_openai(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls is not None:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message as stored: never changed after it is written."""

    conversation_id: str
    sequence: int
    role: Role
    content: str
    """Its text: the string content, or the text of its content parts."""
    timestamp: datetime
    token_count: int
    """Framed tokens of the message as it appears in a context (head + tail if it is large)."""
    full_token_count: int
    """Framed tokens of the full original message."""
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    pinned: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    truncated_content: str | None = None
    """What the context shows instead of ``content``: its head and tail when the message exceeds
    ``max_message_chars`` (or the newest message alone exceeds the budget), or, for a recalled
    message too long to fit whole, its sentences that match the query (``[…]`` where some were
    left out). A message of content parts that must be cut, or whose images do not fit, is sent
    as its text, each other part named (``[image]``). ``content`` is always the stored text."""
    extra: dict[str, Any] | None = None
    """Every other field the message carried, sent back unchanged (a non-string ``content`` too)."""
    pin_key: str | None = None

    @property
    def context_content(self) -> str:
        return self.truncated_content if self.truncated_content is not None else self.content

    def to_openai(self, content: str | None = None) -> dict[str, Any]:
        """The message as sent to the model: every field it was given, exactly (its content cut
        to ``content`` or to its head + tail form when given or needed)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.extra:
            # Copies of the nested parts: the caller may change what it is given (a prompt-cache
            # recipe adds ``cache_control`` to a content part) without changing the rows kept
            # here for the next contexts.
            out.update({k: _owned(v) for k, v in self.extra.items()})
            if NO_CONTENT in out:
                del out[NO_CONTENT], out["content"]
        if content is not None or self.truncated_content is not None:
            out["content"] = self.context_content if content is None else content
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls is not None:
            out["tool_calls"] = _owned(self.tool_calls)
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


SummaryStatus = Literal["pending", "provisional", "final", "superseded"]


@dataclass(frozen=True, slots=True)
class Summary:
    """A topic summary (tier ``topic``) or an archive (tier ``archive``: merged summaries or archives)."""

    id: int
    conversation_id: str
    tier: Literal["topic", "bulk"]
    sequence: int
    """Ordinal of the topic or archive within its conversation and tier (1, 2, ...)."""
    first_sequence: int
    last_sequence: int
    """The range of message sequences this row covers (inclusive)."""
    content: str
    """The summary text (empty while pending)."""
    rendered: str
    """The message content sent to the model: a delimited, dated block of earlier-conversation data."""
    token_count: int
    """Framed tokens of the rendered message."""
    source_tokens: int
    """Framed tokens of the original messages this row represents."""
    started_at: datetime
    ended_at: datetime
    status: SummaryStatus
    sealed_at: datetime | None = None
    sealed_reason: str | None = None
    summarizer: str | None = None
    model: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    """Summariser spend on this row (USD, litellm's prices), every attempt included: an answer
    that was rejected, a chunked call that failed part-way and each failed retry are paid for too."""
    latency_ms: float = 0.0
    attempts: int = 0
    merged_into: int | None = None
    dropped_at: datetime | None = None
    created_at: datetime | None = None
    next_attempt_at: datetime | None = None
    """When ``maintain()`` will next try to replace a provisional summary."""
    last_error: str | None = None
    """Why the last summariser attempt failed, if it did."""
    level: int = 0
    """0 for a topic summary; an archive is one more than the highest level it merges."""

    def to_openai(self) -> dict[str, Any]:
        # Earlier-conversation data goes in as a user turn, never as a system instruction.
        return {"role": "user", "content": self.rendered}


@dataclass(frozen=True, slots=True)
class CompressedContext:
    """What to send to the model, within ``max_tokens``: :meth:`to_messages`.

    Laid out stable-first, so a provider's prompt cache keeps hitting: pinned messages, the
    archives block, the topic summaries block, the current topic verbatim, with the messages
    recalled for the newest message (after a note saying they are earlier conversation) just
    before the newest user message.
    """

    conversation_id: str
    max_tokens: int
    pinned: list[StoredMessage]
    bulk_archives: list[Summary]
    """Archives shown (one block), oldest first."""
    historical_topics: list[Summary]
    """Topic summaries shown (one block), oldest first."""
    current_topic: list[StoredMessage]
    """The messages sent verbatim, oldest first (the newest one last)."""
    total_tokens: int
    compression_ratio: float
    tier_tokens: dict[str, int]
    """Framed tokens used by each part: framing, pinned, bulk, topic, recall, current."""
    allocation: dict[str, int]
    """Tokens each tier was allotted (current, topic, bulk) from what pinned messages leave."""
    omitted_messages: int = 0
    """Messages not yet summarised that are not sent (they are stored, and recalled when relevant)."""
    truncated_newest: bool = False
    recent_topics: list[StoredMessage] = field(default_factory=list)
    """Kept for compatibility: always empty (the current topic reaches back as far as room allows)."""
    blocks: dict[str, str] = field(default_factory=dict)
    """The message content of the archives (``bulk``) and topic summaries (``topic``) blocks."""
    recalled: list[StoredMessage] = field(default_factory=list)
    """Messages recalled for the newest message (whole tool units), oldest first; a long plain
    message that did not fit whole as its matching sentences (see ``truncated_content``)."""
    recalled_summaries: list[Summary] = field(default_factory=list)
    """Summaries recalled for the newest message (shown in the recall note)."""
    recall_note: str = ""
    recall_at: int = 0
    """Where in ``current_topic`` the recalled messages go (before the newest user message)."""
    recall_query: str = ""
    """The text the recall matched (empty when nothing was recalled)."""
    encoding: str = ""
    """The tiktoken encoding the counts were made with (the ``model`` setting's, or cl100k_base)."""
    exact_tokens: bool = True
    """False when ``encoding`` only estimates the model's tokenizer (Claude, Llama, Gemini...):
    the context then fills at most ``max_tokens`` less a safety margin (see :mod:`tiered_history.tokens`)."""
    maintenance_epoch: int = 0
    """The conversation's count of events that may rewrite the start of the context (seals,
    summaries, merges, roll-ups, pins): between two contexts with the same epoch, everything
    before the recalled part of the earlier one is a prefix of the later one, unless the later
    one's newest message (or tool call with its results) did not fit beside the window, which
    then moved past it (or ``truncated_newest``: it is sent alone, cut)."""

    @property
    def topic_summaries(self) -> list[Summary]:
        """The topic summaries shown (the same as ``historical_topics``)."""
        return self.historical_topics

    @property
    def archives(self) -> list[Summary]:
        """The archives shown (the same as ``bulk_archives``)."""
        return self.bulk_archives

    def _stable(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [m.to_openai() for m in self.pinned]
        for tier in ("bulk", "topic"):
            if self.blocks.get(tier):
                out.append({"role": "user", "content": self.blocks[tier]})
        return out

    @property
    def recall_start(self) -> int | None:
        """Index in :meth:`to_messages` where the recalled part starts (None: nothing recalled)."""
        if not self.recall_note:
            return None
        return len(self._stable()) + self.recall_at

    def to_messages(self) -> list[dict[str, Any]]:
        """OpenAI chat-format dicts, ready for litellm or openai (see the class docstring)."""
        out = self._stable()
        out.extend(m.to_openai() for m in self.current_topic[: self.recall_at])
        if self.recall_note:
            out.append({"role": "user", "content": self.recall_note})
            out.extend(m.to_openai() for m in self.recalled)
        out.extend(m.to_openai() for m in self.current_topic[self.recall_at :])
        return out


@dataclass(frozen=True, slots=True)
class History:
    """Every tier of a conversation, for inspection: nothing is hidden, dropped archives included."""

    conversation_id: str
    platform: str | None
    messages: list[StoredMessage]
    topics: list[Summary]
    archives: list[Summary]
    open_topic_start: int
    """Sequence where the open (unsealed) topic starts."""


@dataclass(frozen=True, slots=True)
class SearchHit:
    """A stored message that matched a search, with where it sits in the conversation."""

    message: StoredMessage
    score: float
    """BM25 (higher is better; 1.0 for a literal match)."""
    topic: Summary | None = None
    """The sealed topic the message belongs to (None while its topic is still open)."""
    summary: Summary | None = None
    """What represents it in the context now: its topic's summary, or the archive that merged it."""

    @property
    def sequence(self) -> int:
        return self.message.sequence

    @property
    def content(self) -> str:
        return self.message.content

    @property
    def role(self) -> str:
        return self.message.role

    @property
    def timestamp(self) -> datetime:
        return self.message.timestamp


@dataclass(frozen=True, slots=True)
class ConversationInfo:
    """One conversation as a multi-platform bot lists them."""

    conversation_id: str
    platform: str | None
    channel: str | None
    users: tuple[str, ...]
    """Platform user ids that wrote in it (as given to ``add_message(user_id=...)``), first seen first."""
    created_at: datetime | None
    last_active_at: datetime | None
    """Timestamp of its newest message."""
    messages: int
    topics: int
    archives: int
    pinned: int


@dataclass(frozen=True, slots=True)
class ConversationStats:
    conversation_id: str
    platform: str | None
    messages: int
    message_tokens: int
    topics: int
    topics_pending: int
    archives: int
    archives_dropped: int
    tier_tokens: dict[str, int]
    compressions: int
    summarizer_prompt_tokens: int
    summarizer_completion_tokens: int
    summarizer_cost: float
    summaries_provisional: int = 0
    """Topic summaries written by the fallback summariser while the configured one failed, waiting
    to be summarised again (a count that keeps growing: the summariser keeps failing)."""


def _owned(value: Any) -> Any:
    """A copy of a JSON value's lists and objects (strings and numbers are shared: immutable).
    Runs for every structured message of every ``to_messages()``: the scalars that make up most
    of a value are passed over without a call."""
    kind = type(value)
    if kind is dict:
        return {k: v if type(v) in _SCALARS else _owned(v) for k, v in value.items()}
    if kind is list:
        return [v if type(v) in _SCALARS else _owned(v) for v in value]
    return value


_SCALARS = frozenset({str, int, float, bool, type(None)})


def has_media(content: object) -> bool:
    """Whether an OpenAI message ``content`` is parts with one other than text (an image, audio,
    a file)."""
    return type(content) is list and any(type(p) is dict and p.get("type") != "text" for p in content)
