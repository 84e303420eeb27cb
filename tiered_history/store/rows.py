"""Row <-> record conversion shared by the SQL store."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Row

from ..models import StoredMessage, Summary
from .base import ConversationState, PreparedMessage
from .schema import conversation_history as H


def _columns(record: type[Any], renamed: dict[str, str]) -> tuple[sa.Column[Any], ...]:
    """The table columns behind ``record``'s fields, in field order (rows convert positionally)."""
    return tuple(H.c[renamed.get(f.name, f.name)] for f in fields(record))


#: What a message row needs, in :class:`StoredMessage` field order; reading fewer columns
#: and converting by position keeps the reply path fast (named access costs 4x more).
MESSAGE_COLUMNS = _columns(
    StoredMessage, {"timestamp": "created_at", "metadata": "meta", "truncated_content": "context_content"}
)
#: Every summary column, in :class:`Summary` field order.
SUMMARY_COLUMNS = _columns(Summary, {"created_at": "stored_at"})
_PINNED = [c.name for c in MESSAGE_COLUMNS].index("pinned")
_META = [c.name for c in MESSAGE_COLUMNS].index("meta")
_RENDERED = [c.name for c in SUMMARY_COLUMNS].index("rendered")


def message_row(
    conversation_id: str, platform: str | None, prepared: PreparedMessage, sequence: int, now: datetime
) -> dict[str, Any]:
    """The ``conversation_history`` values of one message (what ``append`` inserts)."""
    m = prepared.message
    return {
        "conversation_id": conversation_id,
        "platform": platform,
        "tier": "message",
        "content": m.content,
        "token_count": prepared.token_count,
        "full_token_count": prepared.full_token_count,
        "context_content": prepared.context_content,
        "sequence": sequence,
        "created_at": m.timestamp,
        "role": m.role,
        "name": m.name,
        "tool_calls": m.tool_calls,
        "tool_call_id": m.tool_call_id,
        "pinned": m.pinned,
        "meta": m.metadata or None,
        "stored_at": now,
    }


def to_state(r: Row[Any]) -> ConversationState:
    return ConversationState(
        id=r.id,
        platform=r.platform,
        encoding=r.encoding,
        last_sequence=r.last_sequence,
        last_message_at=r.last_message_at,
        topic_start_seq=r.topic_start_seq,
        open_topic_tokens=r.open_topic_tokens,
        open_topic_messages=r.open_topic_messages,
        open_tool_calls=list(r.open_tool_calls or []),
        summarized_upto=r.summarized_upto,
        pinned_count=r.pinned_count,
        needs_maintenance=bool(r.needs_maintenance),
        lease_owner=r.lease_owner,
        lease_expires_at=r.lease_expires_at,
        next_retry_at=r.next_retry_at,
    )


def to_message(r: Sequence[Any]) -> StoredMessage:
    """A row of ``select(*MESSAGE_COLUMNS)`` as a :class:`StoredMessage`."""
    v = list(r)
    v[_PINNED] = bool(v[_PINNED])
    v[_META] = v[_META] or {}
    return StoredMessage(*v)


def to_summary(r: Sequence[Any]) -> Summary:
    """A row of ``select(*SUMMARY_COLUMNS)`` as a :class:`Summary`."""
    v = list(r)
    v[_RENDERED] = v[_RENDERED] or ""
    return Summary(*v)
