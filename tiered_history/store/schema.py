"""Database schema (SQLAlchemy Core). The migrations in ``migrations/`` create exactly this.

Three tables. ``conversations`` holds each conversation's state as one JSON document (what
the core decides with) next to the columns the store itself queries: the surrogate ``key``
the other tables refer to, the ``version`` every write checks, ``due_at`` and the lease for
background work. ``messages`` and ``summaries`` hold the rows, never changed except a
summary's text and status (filled in once summarised) and its merge/drop marks.

Full-text indexes are created by the migrations outside this metadata (SQLite FTS5 tables
with triggers, a PostgreSQL ``tsvector`` column with a GIN index): see :data:`FULL_TEXT`.
"""

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
    sa.Column("key", BigId, primary_key=True, autoincrement=True),
    sa.Column("id", sa.String(255), nullable=False),
    # Every write sets version = version + 1 where version is still the one it read.
    sa.Column("version", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("platform", sa.String(64)),
    sa.Column("encoding", sa.String(32), nullable=False),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
    # When background maintenance has work here (NULL: none): now, a retry time, a silence deadline.
    sa.Column("due_at", UTCDateTime()),
    sa.Column("lease_owner", sa.String(128)),
    sa.Column("lease_expires_at", UTCDateTime()),
    sa.Column("meta", JSONText()),
    sa.Column("state", sa.Text, nullable=False),
)
sa.Index("ux_conversations_id", conversations.c.id, unique=True)
sa.Index("ix_conversations_due_at", conversations.c.due_at)

messages = sa.Table(
    "messages",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("conv", sa.BigInteger, sa.ForeignKey("conversations.key"), nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("tokens", sa.Integer, nullable=False),
    sa.Column("full_tokens", sa.Integer, nullable=False),
    sa.Column("pinned", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("pin_key", sa.String(255)),
    # The text (a string content, or the text of its content parts): searched and summarised.
    sa.Column("content", sa.Text, nullable=False),
    # Every other field of the message as given (name, tool calls, a non-string content, ...).
    sa.Column("wire", JSONText()),
    sa.Column("meta", JSONText()),
)
sa.Index("ux_messages_conv_seq", messages.c.conv, messages.c.seq, unique=True)

summaries = sa.Table(
    "summaries",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("conv", sa.BigInteger, sa.ForeignKey("conversations.key"), nullable=False),
    sa.Column("kind", sa.String(8), nullable=False),
    sa.Column("level", sa.SmallInteger, nullable=False, server_default="0"),
    sa.Column("ordinal", sa.Integer, nullable=False),
    sa.Column("first_seq", sa.Integer, nullable=False),
    sa.Column("last_seq", sa.Integer, nullable=False),
    sa.Column("started_at", UTCDateTime(), nullable=False),
    sa.Column("ended_at", UTCDateTime(), nullable=False),
    sa.Column("status", sa.String(12), nullable=False),
    sa.Column("sealed_at", UTCDateTime()),
    sa.Column("sealed_reason", sa.String(32)),
    sa.Column("content", sa.Text, nullable=False, server_default=""),
    sa.Column("rendered", sa.Text, nullable=False, server_default=""),
    sa.Column("tokens", sa.Integer, nullable=False, server_default="0"),
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
    sa.Column("parent_id", sa.BigInteger),
    sa.Column("dropped_at", UTCDateTime()),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.CheckConstraint("kind IN ('topic', 'bulk')", name="ck_summaries_kind"),
)
sa.Index(
    "ux_summaries_conv_kind_ordinal", summaries.c.conv, summaries.c.kind, summaries.c.ordinal, unique=True
)
# Search walks a conversation's newest summaries backwards (migration 0003).
sa.Index("ix_summaries_conv_last_seq", summaries.c.conv, summaries.c.last_seq)

#: Objects the migrations create by hand, per dialect, and autogenerate must not compare.
FULL_TEXT = {
    "sqlite": ("messages_fts", "summaries_fts"),
    "postgresql": ("tsv", "ix_messages_tsv", "ix_summaries_tsv"),
}
