"""Row <-> record conversion shared by the SQL store."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Row

from ..models import StoredMessage, Summary
from .base import ConversationState
from .schema import conversation_history as H

#: What a message row needs; reading fewer columns keeps the reply path fast.
MESSAGE_COLUMNS = (
    H.c.conversation_id,
    H.c.sequence,
    H.c.role,
    H.c.content,
    H.c.created_at,
    H.c.token_count,
    H.c.full_token_count,
    H.c.name,
    H.c.tool_calls,
    H.c.tool_call_id,
    H.c.pinned,
    H.c.meta,
    H.c.context_content,
)


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


def to_message(r: Any) -> StoredMessage:
    return StoredMessage(
        conversation_id=r.conversation_id,
        sequence=r.sequence,
        role=r.role,
        content=r.content,
        timestamp=r.created_at,
        token_count=r.token_count,
        full_token_count=r.full_token_count,
        name=r.name,
        tool_calls=r.tool_calls,
        tool_call_id=r.tool_call_id,
        pinned=bool(r.pinned),
        metadata=r.meta or {},
        truncated_content=r.context_content,
    )


def to_summary(r: Row[Any]) -> Summary:
    return Summary(
        id=r.id,
        conversation_id=r.conversation_id,
        tier=r.tier,
        sequence=r.sequence,
        first_sequence=r.first_sequence,
        last_sequence=r.last_sequence,
        content=r.content,
        rendered=r.rendered or "",
        token_count=r.token_count,
        source_tokens=r.source_tokens,
        started_at=r.started_at,
        ended_at=r.ended_at,
        status=r.status,
        sealed_at=r.sealed_at,
        sealed_reason=r.sealed_reason,
        summarizer=r.summarizer,
        model=r.model,
        prompt_tokens=r.prompt_tokens,
        completion_tokens=r.completion_tokens,
        cost=r.cost,
        latency_ms=r.latency_ms,
        attempts=r.attempts,
        merged_into=r.merged_into,
        dropped_at=r.dropped_at,
        created_at=r.stored_at,
        next_attempt_at=r.next_attempt_at,
        last_error=r.last_error,
    )
