"""Export one conversation to JSONL and read such a file back, losslessly. Pure: no I/O.

The file is one JSON object per line:

1. a header: ``{"format": "tiered-history/conversation", "version": 1, "conversation_id", "platform",
   "channel", "users", "created_at", "pins": [{"key", "sequence"}]}``;
2. one line per message, oldest first: ``{"type": "message", "sequence", "timestamp", "pinned",
   "pin_key", "metadata", "message"}`` where ``message`` is the message exactly as it is sent to
   the model (every provider field it carried);
3. optionally, one line per topic summary and archive: ``{"type": "summary", "tier": "topic" |
   "bulk", "sequence", ...}``, with ``merged_into`` naming the archive (by its sequence) that
   took it in. A file without them is imported as messages only, and its topics are found and
   summarised again by the boundary rules and ``maintain()``.

What a store can compute again is not written: token counts (counted by the importing side's
tokenizer, so a file cannot understate them), rendered summaries, row ids. Times are UTC
(the SQL stores keep UTC; an offset a bot gave is not kept by them either). :func:`read_export`
checks the whole file before anything is stored and raises
:class:`~tiered_history.errors.TranscriptError` naming the line at fault.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, NoReturn

from .core.render import item_line, render_summary
from .core.state import MAX_USERS, ConversationState
from .core.transitions import Incoming
from .errors import InvalidConversationIdError, TranscriptError
from .models import StoredMessage, Summary, validate_conversation_id

FORMAT: Final = "tiered-history/conversation"
VERSION: Final = 1
_STATUSES: Final = ("pending", "provisional", "final", "superseded")
#: Integer columns are 32-bit on every backend.
_INT_MAX: Final = 2**31 - 1
_SUMMARY_KEYS: Final = frozenset(
    {
        "type",
        "tier",
        "sequence",
        "level",
        "first_sequence",
        "last_sequence",
        "started_at",
        "ended_at",
        "status",
        "content",
        "sealed_at",
        "sealed_reason",
        "summarizer",
        "model",
        "prompt_tokens",
        "completion_tokens",
        "cost",
        "latency_ms",
        "attempts",
        "created_at",
        "next_attempt_at",
        "last_error",
        "merged_into",
        "dropped_at",
    }
)
_MESSAGE_KEYS: Final = frozenset(
    {"type", "sequence", "timestamp", "pinned", "pin_key", "metadata", "message"}
)
_HEADER_KEYS: Final = frozenset(
    {"format", "version", "conversation_id", "platform", "channel", "users", "created_at", "pins"}
)


@dataclass(frozen=True, slots=True)
class ExportedMessage:
    sequence: int
    message: dict[str, Any]
    """The message as sent to the model (validated again when imported)."""
    timestamp: datetime
    pinned: bool
    pin_key: str | None
    metadata: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ExportedSummary:
    tier: str
    sequence: int
    level: int
    first_sequence: int
    last_sequence: int
    started_at: datetime
    ended_at: datetime
    status: str
    content: str
    sealed_at: datetime | None
    sealed_reason: str | None
    summarizer: str | None
    model: str | None
    prompt_tokens: int
    completion_tokens: int
    cost: float
    latency_ms: float
    attempts: int
    created_at: datetime | None
    next_attempt_at: datetime | None
    last_error: str | None
    merged_into: int | None
    """Sequence of the archive that merged it (archives are numbered apart from topics)."""
    dropped_at: datetime | None


@dataclass(frozen=True, slots=True)
class Exported:
    """A whole exported conversation, checked for consistency (not yet the messages' own rules)."""

    conversation_id: str
    platform: str | None
    channel: str | None
    users: tuple[str, ...]
    created_at: datetime | None
    pins: tuple[tuple[str, int], ...]
    messages: list[ExportedMessage]
    summaries: list[ExportedSummary]


# -- writing -------------------------------------------------------------------------------------


def _ts(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def _line(record: Mapping[str, Any]) -> str:
    # allow_nan=False: a non-finite number would make a file no strict JSON reader accepts.
    return json.dumps(record, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n"


def header_line(state: ConversationState) -> str:
    return _line(
        {
            "format": FORMAT,
            "version": VERSION,
            "conversation_id": state.id,
            "platform": state.platform,
            "channel": state.channel,
            "users": list(state.users),
            "created_at": _ts(state.created_at),
            "pins": [{"key": k, "sequence": s} for k, s in state.pins],
        }
    )


def message_line(m: StoredMessage) -> str:
    # The stored row, not the view get_history gives: a pin replaced later keeps pinned=True
    # here, and the header's pins say which are active.
    return _line(
        {
            "type": "message",
            "sequence": m.sequence,
            "timestamp": _ts(m.timestamp),
            "pinned": m.pinned,
            "pin_key": m.pin_key,
            "metadata": m.metadata,
            "message": m.to_openai(),
        }
    )


def summary_lines(summaries: Sequence[Summary]) -> Iterator[str]:
    """Topics then archives, each by sequence; ``merged_into`` as the archive's sequence."""
    archive_of = {s.id: s.sequence for s in summaries if s.tier == "bulk"}
    for s in sorted(summaries, key=lambda x: (x.tier != "topic", x.sequence)):
        yield _line(
            {
                "type": "summary",
                "tier": s.tier,
                "sequence": s.sequence,
                "level": s.level,
                "first_sequence": s.first_sequence,
                "last_sequence": s.last_sequence,
                "started_at": _ts(s.started_at),
                "ended_at": _ts(s.ended_at),
                "status": s.status,
                "content": s.content,
                "sealed_at": _ts(s.sealed_at),
                "sealed_reason": s.sealed_reason,
                "summarizer": s.summarizer,
                "model": s.model,
                "prompt_tokens": s.prompt_tokens,
                "completion_tokens": s.completion_tokens,
                "cost": s.cost,
                "latency_ms": s.latency_ms,
                "attempts": s.attempts,
                "created_at": _ts(s.created_at),
                "next_attempt_at": _ts(s.next_attempt_at),
                "last_error": s.last_error,
                "merged_into": None if s.merged_into is None else archive_of.get(s.merged_into),
                "dropped_at": _ts(s.dropped_at),
            }
        )


def export_lines(
    state: ConversationState, messages: Iterable[StoredMessage], summaries: Sequence[Summary] = ()
) -> Iterator[str]:
    """The JSONL lines (each ending in a newline) of a conversation: header, messages, summaries."""
    yield header_line(state)
    for m in messages:
        yield message_line(m)
    yield from summary_lines(summaries)


def is_export(first_line: str) -> bool:
    """True when ``first_line`` is the header of an exported conversation (not a transcript)."""
    try:
        head = json.loads(first_line)
    except ValueError:
        return False
    return isinstance(head, dict) and head.get("format") == FORMAT


# -- reading -------------------------------------------------------------------------------------


class _Line:
    """Typed reads of one record, failing with the line number."""

    def __init__(self, number: int, record: Mapping[str, Any], allowed: frozenset[str]) -> None:
        self.number = number
        self.record = record
        unknown = sorted(set(record) - allowed)
        if unknown:
            self.fail(f"unknown field {unknown[0]!r}")

    def fail(self, problem: str) -> NoReturn:
        raise TranscriptError(f"line {self.number}: {problem}")

    def _get(self, key: str, required: bool) -> Any:
        if key not in self.record and required:
            self.fail(f"{key!r} is missing")
        return self.record.get(key)

    def integer(self, key: str, low: int = 0, high: int = _INT_MAX, required: bool = True) -> int:
        v = self._get(key, required)
        if v is None and not required:
            return low
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            self.fail(f"{key!r} must be an integer from {low} to {high}, not {v!r}")
        return v

    def number_(self, key: str) -> float:
        v = self._get(key, False)
        if v is None:
            return 0.0
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            self.fail(f"{key!r} must be a finite number >= 0, not {v!r}")
        return float(v)

    def text(self, key: str, max_length: int | None = None, *, required: bool = False) -> str | None:
        v = self._get(key, required)
        if v is None and not required:
            return None
        if not isinstance(v, str):
            self.fail(f"{key!r} must be a string, not {type(v).__name__}")
        if "\x00" in v or any(0xD800 <= ord(c) <= 0xDFFF for c in v):
            self.fail(f"{key!r} contains a NUL byte or a lone surrogate, which cannot be stored")
        if max_length is not None and len(v) > max_length:
            self.fail(f"{key!r} must be at most {max_length} characters")
        return v

    def time(self, key: str, *, required: bool = False) -> datetime | None:
        v = self._get(key, required)
        if v is None and not required:
            return None
        if not isinstance(v, str):
            self.fail(f"{key!r} must be an ISO 8601 time, not {type(v).__name__}")
        try:
            ts = datetime.fromisoformat(v)
        except ValueError:
            self.fail(f"{key!r} is not an ISO 8601 time: {v!r}")
        if ts.utcoffset() is None:
            self.fail(f"{key!r} must carry a UTC offset: {v!r}")
        try:
            return ts.astimezone(UTC)
        except OverflowError:
            self.fail(f"{key!r} is outside years 1..9999 in UTC: {v!r}")

    def flag(self, key: str) -> bool:
        v = self._get(key, False)
        if v is None:
            return False
        if not isinstance(v, bool):
            self.fail(f"{key!r} must be true or false, not {v!r}")
        return v


def _records(lines: Iterable[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except ValueError as exc:
            raise TranscriptError(f"line {number}: not JSON ({exc})") from None
        except RecursionError:
            raise TranscriptError(f"line {number}: nested too deeply") from None
        if not isinstance(record, dict):
            raise TranscriptError(f"line {number}: expected a JSON object, not {type(record).__name__}")
        yield number, record


def _header(number: int, record: dict[str, Any]) -> tuple[_Line, dict[str, Any]]:
    if record.get("format") != FORMAT:
        raise TranscriptError(f'line {number}: not an exported conversation (no "format": {FORMAT!r} header)')
    line = _Line(number, record, _HEADER_KEYS)
    if record.get("version") != VERSION:
        line.fail(f"version {record.get('version')!r} is not supported (this library reads {VERSION})")
    try:
        cid = validate_conversation_id(record.get("conversation_id"))
    except InvalidConversationIdError as exc:
        line.fail(str(exc))
    users = record.get("users") or []
    if not isinstance(users, list) or len(users) > MAX_USERS:
        line.fail(f"'users' must be a list of at most {MAX_USERS} user ids")
    for u in users:
        if not isinstance(u, str) or not u.strip() or len(u) > 255 or "\x00" in u:
            line.fail(f"user id {u!r} must be a non-empty string of at most 255 characters")
    if len(set(users)) != len(users):
        line.fail("'users' lists a user twice")
    pins = record.get("pins") or []
    if not isinstance(pins, list):
        line.fail('\'pins\' must be a list of {"key", "sequence"}')
    parsed: list[tuple[str, int]] = []
    for p in pins:
        if not isinstance(p, dict) or set(p) != {"key", "sequence"}:
            line.fail('each pin must be {"key": str, "sequence": int}')
        pin = _Line(number, p, frozenset({"key", "sequence"}))
        key = pin.text("key", 255, required=True)
        assert key is not None
        parsed.append((key, pin.integer("sequence", 1)))
    if len({k for k, _ in parsed}) != len(parsed):
        line.fail("two pins share a key")
    return line, {
        "conversation_id": cid,
        "platform": line.text("platform", 64),
        "channel": line.text("channel", 255),
        "users": tuple(users),
        "created_at": line.time("created_at"),
        "pins": tuple(parsed),
    }


def _message(number: int, record: dict[str, Any]) -> ExportedMessage:
    line = _Line(number, record, _MESSAGE_KEYS)
    message = record.get("message")
    if not isinstance(message, dict):
        line.fail("'message' must be a JSON object (the message as sent to the model)")
    metadata = record.get("metadata") or {}
    if not isinstance(metadata, dict):
        line.fail("'metadata' must be a JSON object")
    pinned = line.flag("pinned")
    pin_key = line.text("pin_key", 255)
    if pin_key is not None and not pinned:
        line.fail("only a pinned message has a 'pin_key'")
    timestamp = line.time("timestamp", required=True)
    assert timestamp is not None
    return ExportedMessage(line.integer("sequence", 1), message, timestamp, pinned, pin_key, metadata)


def pin_key(m: ExportedMessage) -> str | None:
    """The key a pinned message is pinned under (one pinned without a key: ``#<sequence>``)."""
    return (m.pin_key or f"#{m.sequence}") if m.pinned else None


def check_tool_units(messages: Sequence[Incoming]) -> None:
    """Every tool result answers a call still open before it, as ``add_message`` requires."""
    open_calls: set[str] = set()
    for i, m in enumerate(messages, 1):
        if m.tool_call_ids:
            open_calls = set(m.tool_call_ids)
        elif m.role == "tool":
            if m.tool_call_id not in open_calls:
                raise TranscriptError(
                    f"message {i}: tool result {m.tool_call_id!r} answers no open tool call"
                )
            open_calls.discard(str(m.tool_call_id))
        elif not m.pinned:
            open_calls = set()


def _summary(number: int, record: dict[str, Any]) -> ExportedSummary:
    line = _Line(number, record, _SUMMARY_KEYS)
    tier = record.get("tier")
    if tier not in ("topic", "bulk"):
        line.fail(f"'tier' must be 'topic' or 'bulk', not {tier!r}")
    status = record.get("status")
    if status not in _STATUSES:
        line.fail(f"'status' must be one of {', '.join(_STATUSES)}, not {status!r}")
    first, last = line.integer("first_sequence", 1), line.integer("last_sequence", 1)
    if first > last:
        line.fail("'first_sequence' is after 'last_sequence'")
    level = line.integer("level", 0, 32767)
    if (tier == "topic") != (level == 0):
        line.fail("topics have level 0 and archives a level of 1 or more")
    content = line.text("content") or ""
    if status == "pending" and content:
        line.fail("a pending summary has no content yet")
    if tier == "bulk" and status in ("pending", "superseded"):
        line.fail(f"an archive cannot be {status}")
    started, ended = line.time("started_at", required=True), line.time("ended_at", required=True)
    assert started is not None and ended is not None
    if started > ended:
        line.fail("'started_at' is after 'ended_at'")
    merged = record.get("merged_into")
    if merged is not None:
        merged = line.integer("merged_into", 1)
    return ExportedSummary(
        tier=str(tier),
        sequence=line.integer("sequence", 1),
        level=level,
        first_sequence=first,
        last_sequence=last,
        started_at=started,
        ended_at=ended,
        status=str(status),
        content=content,
        sealed_at=line.time("sealed_at"),
        sealed_reason=line.text("sealed_reason", 32),
        summarizer=line.text("summarizer", 64),
        model=line.text("model", 255),
        prompt_tokens=line.integer("prompt_tokens", required=False),
        completion_tokens=line.integer("completion_tokens", required=False),
        cost=line.number_("cost"),
        latency_ms=line.number_("latency_ms"),
        attempts=line.integer("attempts", required=False),
        created_at=line.time("created_at"),
        next_attempt_at=line.time("next_attempt_at"),
        last_error=line.text("last_error"),
        merged_into=merged,
        dropped_at=line.time("dropped_at"),
    )


def _check_summaries(summaries: Sequence[ExportedSummary], messages: int) -> None:
    """The structure a conversation's summaries always have, or :class:`TranscriptError`."""

    def fail(s: ExportedSummary, problem: str) -> NoReturn:
        raise TranscriptError(f"{'topic' if s.tier == 'topic' else 'archive'} {s.sequence}: {problem}")

    by_tier: dict[str, list[ExportedSummary]] = {"topic": [], "bulk": []}
    for s in summaries:
        by_tier[s.tier].append(s)
    for tier, rows in by_tier.items():
        if [s.sequence for s in rows] != list(range(1, len(rows) + 1)):
            raise TranscriptError(f"{tier} sequences must run 1, 2, 3... in order")
    archives = {a.sequence: a for a in by_tier["bulk"]}
    for s in summaries:
        if s.last_sequence > messages:
            fail(s, f"covers message {s.last_sequence}, but the file has {messages}")
        if s.merged_into is not None:
            parent = archives.get(s.merged_into)
            if parent is None:
                fail(s, f"merged into archive {s.merged_into}, which the file does not have")
            if parent.level <= s.level or not (
                parent.first_sequence <= s.first_sequence and s.last_sequence <= parent.last_sequence
            ):
                fail(s, f"archive {s.merged_into} does not cover it at a higher level")
            if s.status == "pending":
                fail(s, "a pending topic cannot be merged")
    # Live topics (not reopened) cut messages 1..n into consecutive ranges, in order.
    end = 0
    for t in by_tier["topic"]:
        if t.status == "superseded":
            continue
        if t.first_sequence != end + 1:
            fail(t, f"starts at message {t.first_sequence}; the topic before it ended at {end}")
        end = t.last_sequence
    for t in by_tier["topic"]:
        if t.status == "superseded" and t.last_sequence > end:
            fail(t, "a reopened topic must lie within the topics sealed after it")


def read_export(lines: Iterable[str]) -> Exported:
    """Parse and check an exported conversation (``lines``: the file's lines, or its whole text).

    Checks everything but each message's own rules (the importer applies those as
    ``add_message`` would) and raises :class:`~tiered_history.errors.TranscriptError`.
    """
    if isinstance(lines, str):
        lines = lines.splitlines()
    records = _records(lines)
    first = next(records, None)
    if first is None:
        raise TranscriptError("the file is empty")
    _, head = _header(*first)
    messages: list[ExportedMessage] = []
    summaries: list[ExportedSummary] = []
    for number, record in records:
        kind = record.get("type")
        if kind == "message":
            if summaries:
                raise TranscriptError(f"line {number}: messages must come before summaries")
            m = _message(number, record)
            if m.sequence != len(messages) + 1:
                raise TranscriptError(
                    f"line {number}: message {m.sequence} where {len(messages) + 1} was due"
                )
            messages.append(m)
        elif kind == "summary":
            summaries.append(_summary(number, record))
        else:
            raise TranscriptError(f"line {number}: 'type' must be 'message' or 'summary', not {kind!r}")
    if not messages:
        raise TranscriptError("the file holds no message")
    _check_summaries(summaries, len(messages))
    for key, seq in head["pins"]:
        if seq > len(messages) or pin_key(messages[seq - 1]) != key:
            raise TranscriptError(f"pin {key!r} names message {seq}, which is not pinned under that key")
    return Exported(messages=messages, summaries=summaries, **head)


def summaries_of(
    exported: Exported, conversation_id: str, messages: Sequence[StoredMessage], count: Callable[[str], int]
) -> list[Summary]:
    """The file's summaries as rows to store, with what is computed rather than read: the rendered
    text, its tokens (``count``: tokens of a text), the source tokens, and ids (topics first) that
    ``merged_into`` points at."""
    topics = [s for s in exported.summaries if s.tier == "topic"]
    archive_id = {a.sequence: len(topics) + a.sequence for a in exported.summaries if a.tier == "bulk"}
    source: dict[tuple[str, int], int] = {}
    for t in topics:
        covered = messages[t.first_sequence - 1 : t.last_sequence]
        source[("topic", t.sequence)] = sum(m.full_token_count for m in covered if not m.pinned)
    # An archive represents what it merged (lower levels first, so roll-ups add up archives).
    for a in sorted((s for s in exported.summaries if s.tier == "bulk"), key=lambda x: x.level):
        source[("bulk", a.sequence)] = sum(
            source[(c.tier, c.sequence)] for c in exported.summaries if c.merged_into == a.sequence
        )
    out: list[Summary] = []
    for i, s in enumerate(exported.summaries, 1):
        text = s.content
        rendered = (
            render_summary(s.tier, text, s.first_sequence, s.last_sequence, s.started_at, s.ended_at)
            if text.strip()
            else ""
        )
        out.append(
            Summary(
                id=i if s.tier == "topic" else archive_id[s.sequence],
                conversation_id=conversation_id,
                tier="topic" if s.tier == "topic" else "bulk",
                sequence=s.sequence,
                first_sequence=s.first_sequence,
                last_sequence=s.last_sequence,
                content=text,
                rendered=rendered,
                token_count=count(item_line(text, s.started_at, s.ended_at)) + 1 if rendered else 0,
                source_tokens=source[(s.tier, s.sequence)],
                started_at=s.started_at,
                ended_at=s.ended_at,
                status=s.status,  # type: ignore[arg-type]
                sealed_at=s.sealed_at,
                sealed_reason=s.sealed_reason,
                summarizer=s.summarizer,
                model=s.model,
                prompt_tokens=s.prompt_tokens,
                completion_tokens=s.completion_tokens,
                cost=s.cost,
                latency_ms=s.latency_ms,
                attempts=s.attempts,
                merged_into=None if s.merged_into is None else archive_id[s.merged_into],
                dropped_at=s.dropped_at,
                created_at=s.created_at,
                next_attempt_at=s.next_attempt_at,
                last_error=s.last_error,
                level=s.level,
            )
        )
    return out
