"""Database schema (SQLAlchemy Core). Migrations in ``migrations/`` create exactly this."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

metadata = sa.MetaData()

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware in Python, UTC in the database (SQLite has no time zones)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = value.astimezone(UTC)
        # SQLite keeps text and compares it as text: store naive UTC there so order holds.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class JSONText(TypeDecorator[Any]):
    """JSON kept as text: portable, and nothing queries inside it."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else json.dumps(value, separators=(",", ":"), ensure_ascii=False)

    def process_result_value(self, value: str | None, dialect: Dialect) -> Any:
        return None if value is None else json.loads(value)


conversations = sa.Table(
    "conversations",
    metadata,
    sa.Column("id", sa.String(255), primary_key=True),
    sa.Column("platform", sa.String(64)),
    sa.Column("encoding", sa.String(32), nullable=False),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
    # Message sequences are assigned from this counter under the row lock: unique and gap-free.
    sa.Column("last_sequence", sa.Integer, nullable=False, server_default="0"),
    sa.Column("last_message_at", UTCDateTime()),
    # The open topic: first sequence, size, and whether a tool call awaits its result.
    sa.Column("topic_start_seq", sa.Integer, nullable=False, server_default="1"),
    sa.Column("open_topic_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("open_topic_messages", sa.Integer, nullable=False, server_default="0"),
    sa.Column("open_tool_calls", JSONText()),
    sa.Column("last_clean_seq", sa.Integer, nullable=False, server_default="0"),
    sa.Column("topic_count", sa.Integer, nullable=False, server_default="0"),
    sa.Column("bulk_count", sa.Integer, nullable=False, server_default="0"),
    # Messages up to here are represented by summaries; later ones are shown verbatim.
    sa.Column("summarized_upto", sa.Integer, nullable=False, server_default="0"),
    sa.Column("pinned_count", sa.Integer, nullable=False, server_default="0"),
    # Merges and drops always take the oldest first, so "active" is a range above these ordinals.
    sa.Column("topics_merged_upto", sa.Integer, nullable=False, server_default="0"),
    sa.Column("archives_dropped_upto", sa.Integer, nullable=False, server_default="0"),
    # Background work: flag, lease (owner + expiry) and the earliest retry time.
    sa.Column("needs_maintenance", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("next_retry_at", UTCDateTime()),
    sa.Column("lease_owner", sa.String(128)),
    sa.Column("lease_expires_at", UTCDateTime()),
    sa.Column("compressions", sa.Integer, nullable=False, server_default="0"),
)

sa.Index("ix_conversations_maintenance", conversations.c.needs_maintenance, conversations.c.next_retry_at)
sa.Index("ix_conversations_last_message_at", conversations.c.last_message_at)

conversation_history = sa.Table(
    "conversation_history",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column(
        "conversation_id",
        sa.String(255),
        sa.ForeignKey("conversations.id", ondelete="RESTRICT"),
        nullable=False,
    ),
    sa.Column("platform", sa.String(64)),
    sa.Column("tier", sa.String(8), nullable=False),
    sa.Column("content", sa.Text, nullable=False),
    sa.Column("token_count", sa.Integer, nullable=False),
    # Per conversation and tier: message sequence, topic ordinal or archive ordinal.
    sa.Column("sequence", sa.Integer, nullable=False),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("sealed_at", UTCDateTime()),
    # Message rows.
    sa.Column("role", sa.String(16)),
    sa.Column("name", sa.String(64)),
    sa.Column("tool_calls", JSONText()),
    sa.Column("tool_call_id", sa.String(255)),
    sa.Column("pinned", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("meta", JSONText()),
    sa.Column("full_token_count", sa.Integer, nullable=False, server_default="0"),
    sa.Column("context_content", sa.Text),
    # Summary rows (topic and bulk).
    sa.Column("first_sequence", sa.Integer),
    sa.Column("last_sequence", sa.Integer),
    sa.Column("started_at", UTCDateTime()),
    sa.Column("ended_at", UTCDateTime()),
    sa.Column("status", sa.String(12)),
    sa.Column("sealed_reason", sa.String(32)),
    sa.Column("rendered", sa.Text),
    sa.Column("source_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("summarizer", sa.String(64)),
    sa.Column("model", sa.String(255)),
    sa.Column("prompt_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("completion_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("cost", sa.Float, nullable=False, server_default="0"),
    sa.Column("latency_ms", sa.Float, nullable=False, server_default="0"),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("next_attempt_at", UTCDateTime()),
    sa.Column("last_error", sa.Text),
    sa.Column("merged_into", BigId, sa.ForeignKey("conversation_history.id")),
    sa.Column("dropped_at", UTCDateTime()),
    sa.Column("stored_at", UTCDateTime(), nullable=False),
    sa.CheckConstraint("tier IN ('message', 'topic', 'bulk')", name="ck_conversation_history_tier"),
)

sa.Index(
    "ix_conversation_history_conv_tier_seq",
    conversation_history.c.conversation_id,
    conversation_history.c.tier,
    conversation_history.c.sequence,
    unique=True,
)
sa.Index(
    "ix_conversation_history_pinned",
    conversation_history.c.conversation_id,
    conversation_history.c.pinned,
    conversation_history.c.sequence,
)
