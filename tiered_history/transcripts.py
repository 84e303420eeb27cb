"""Transcripts: read JSON / JSONL chat logs and import them into a compressor, idempotently.

Three formats are read:

* a JSON list of OpenAI-style messages (the conversation id is given separately);
* a JSON object ``{"conversation_id": "...", "messages": [...]}``;
* JSONL: one message object per line, each with a ``conversation_id`` field.

Each imported message gets ``metadata.import_key``: a hash of its position within its
conversation in the file and of its role, content, name and tool fields. Messages whose key
is already stored in that conversation are skipped, so importing a file again adds nothing,
and importing a file that grew at the end adds only the new messages.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConversationNotFoundError, InvalidMessageError, TranscriptError
from .models import Message

if TYPE_CHECKING:
    from .sync import SyncHistoryCompressor

#: Metadata key holding an imported message's key.
IMPORT_KEY = "import_key"
_MESSAGE_FIELDS = ("role", "content", "name", "timestamp", "tool_calls", "tool_call_id", "pinned", "metadata")


@dataclass
class TranscriptEntry:
    conversation_id: str
    message: Message
    key: str
    where: str = ""
    """Where in the file it comes from (``path line 4``), for error messages."""


def _timestamp(value: Any, where: str) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise TranscriptError(f"{where}: timestamp must be an ISO 8601 string or epoch seconds")
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC)
    if isinstance(value, str):
        try:
            ts = datetime.fromisoformat(value.strip())
        except ValueError:
            raise TranscriptError(f"{where}: timestamp {value!r} is not ISO 8601") from None
        return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)
    raise TranscriptError(f"{where}: timestamp must be an ISO 8601 string or epoch seconds")


def _content(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):  # OpenAI content parts: keep the text parts
        return "\n".join(
            str(p.get("text", "")) if isinstance(p, Mapping) else str(p)
            for p in value
            if not isinstance(p, Mapping) or p.get("type", "text") == "text"
        )
    return value if isinstance(value, str) else str(value)


def import_key(position: int, raw: Mapping[str, Any]) -> str:
    """Identity of a message in a transcript: its position in its conversation plus its content."""
    ident = {
        "position": position,
        "role": raw.get("role"),
        "content": _content(raw.get("content")),
        "name": raw.get("name"),
        "tool_calls": raw.get("tool_calls"),
        "tool_call_id": raw.get("tool_call_id"),
    }
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode("utf-8"))
    return digest.hexdigest()[:24]


def _to_message(raw: Any, where: str, key: str) -> Message:
    if not isinstance(raw, Mapping):
        raise TranscriptError(f"{where}: a message must be a JSON object, not {type(raw).__name__}")
    data: dict[str, Any] = {k: raw[k] for k in _MESSAGE_FIELDS if raw.get(k) is not None}
    data["content"] = _content(raw.get("content"))
    ts = _timestamp(raw.get("timestamp"), where)
    if ts is not None:
        data["timestamp"] = ts
    meta = data.get("metadata", {})
    if not isinstance(meta, Mapping):
        raise TranscriptError(f"{where}: metadata must be a JSON object")
    data["metadata"] = {**meta, IMPORT_KEY: key}
    try:
        return Message.parse(data)
    except InvalidMessageError as exc:
        raise InvalidMessageError(f"{where}: {exc}") from None


def read_transcript(path: Path, conversation_id: str | None = None) -> list[TranscriptEntry]:
    """Parse a transcript file (see ``import``) into validated messages, in file order."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TranscriptError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TranscriptError(f"{path}: cannot read ({exc})") from None
    if not text.strip():
        raise TranscriptError(f"{path}: the file is empty")
    raw: list[tuple[str, str | None, Any]] = []  # (where, conversation id, message)
    try:
        whole: Any = json.loads(text)
    except json.JSONDecodeError:
        whole = None
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TranscriptError(f"{path} line {n}: not valid JSON ({exc.msg})") from None
            cid = item.get("conversation_id") if isinstance(item, Mapping) else None
            raw.append((f"{path} line {n}", cid, item))
    if whole is not None:
        if isinstance(whole, list):
            raw = [(f"{path} message {i}", None, m) for i, m in enumerate(whole, 1)]
        elif isinstance(whole, Mapping) and isinstance(whole.get("messages"), list):
            cid = whole.get("conversation_id")
            raw = [(f"{path} message {i}", cid, m) for i, m in enumerate(whole["messages"], 1)]
        elif isinstance(whole, Mapping) and "role" in whole:  # a JSONL file of one line
            raw = [(f"{path} line 1", whole.get("conversation_id"), whole)]
        else:
            raise TranscriptError(
                f"{path}: expected a JSON list of messages, an object with 'messages', or JSON lines"
            )
    if not raw:
        raise TranscriptError(f"{path}: the file is empty (it holds no messages)")
    entries: list[TranscriptEntry] = []
    positions: dict[str, int] = {}
    for where, cid, item in raw:
        target = conversation_id or cid
        if not target:
            raise TranscriptError(f"{where}: no conversation_id (pass --conversation ID)")
        if not isinstance(target, str):
            raise TranscriptError(f"{where}: conversation_id must be a string")
        positions[target] = positions.get(target, 0) + 1
        key = import_key(positions[target], item) if isinstance(item, Mapping) else ""
        entries.append(TranscriptEntry(target, _to_message(item, where, key), key, where))
    return entries


@dataclass
class ImportResult:
    imported: int = 0
    skipped: int = 0
    conversations: dict[str, int] = field(default_factory=dict)


def import_entries(
    compressor: SyncHistoryCompressor,
    entries: Sequence[TranscriptEntry],
    platform: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ImportResult:
    """Add entries whose import key is not yet stored in their conversation (so re-runs are no-ops).

    Every conversation's new messages are checked against what is stored (tool results need their
    calls...) before any is stored, then each conversation's are stored in one transaction: an
    invalid entry anywhere stores nothing. ``progress(done, total)`` is called after each
    conversation stored.
    """
    result = ImportResult()
    seen: dict[str, set[str]] = {}
    for cid in dict.fromkeys(e.conversation_id for e in entries):
        try:
            history = compressor.get_history(cid)
        except ConversationNotFoundError:
            seen[cid] = set()
            continue
        seen[cid] = {str(m.metadata.get(IMPORT_KEY)) for m in history.messages if IMPORT_KEY in m.metadata}
    todo = [e for e in entries if e.key not in seen[e.conversation_id]]
    result.skipped = len(entries) - len(todo)
    groups: dict[str, list[TranscriptEntry]] = {}
    for e in todo:
        groups.setdefault(e.conversation_id, []).append(e)
    reply = compressor._ready()
    for cid, group in groups.items():
        try:
            reply.check_messages(cid, [e.message for e in group], platform=platform)
        except InvalidMessageError as exc:
            if exc.index is None:
                raise
            detail = str(exc).removeprefix(f"message {exc.index} of the batch: ")
            raise InvalidMessageError(f"{group[exc.index].where or cid}: {detail}") from None
    for cid, group in groups.items():
        compressor.add_messages(cid, [e.message for e in group], platform=platform)
        result.imported += len(group)
        result.conversations[cid] = len(group)
        if progress is not None:
            progress(result.imported, len(todo))
    return result
