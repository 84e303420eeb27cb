"""an index of each conversation's summaries by recency; no index on conversations.updated_at

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25

Search looks for each query word's newest matching summaries of one conversation. Without an
index on ``(conv, last_seq)`` PostgreSQL found a common word's summaries by scanning every
summary row and testing its ``tsvector`` (about 8 ms per word at 3,300 summaries); with it, it
walks the conversation's newest summaries backwards and stops after the cap (0.3 ms). SQLite
finds them through FTS5 and does not need it, but the schema stays the same on both.

``ix_conversations_updated_at`` served no query, and every message moved its entry (each write
updates the conversation's ``updated_at``): about 3 % of ``add_message``'s CPU time on SQLite.
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_summaries_conv_last_seq", "summaries", ["conv", "last_seq"])
    op.drop_index("ix_conversations_updated_at", table_name="conversations")


def downgrade() -> None:
    op.create_index("ix_conversations_updated_at", "conversations", ["updated_at"])
    op.drop_index("ix_summaries_conv_last_seq", table_name="summaries")
