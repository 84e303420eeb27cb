"""an index of each conversation's summaries by recency

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25

Search looks for each query word's newest matching summaries of one conversation. Without an
index on ``(conv, last_seq)`` PostgreSQL found a common word's summaries by scanning every
summary row and testing its ``tsvector`` (about 8 ms per word at 3,300 summaries); with it, it
walks the conversation's newest summaries backwards and stops after the cap (0.3 ms). SQLite
finds them through FTS5 and does not need it, but the schema stays the same on both.
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_summaries_conv_last_seq", "summaries", ["conv", "last_seq"])


def downgrade() -> None:
    op.drop_index("ix_summaries_conv_last_seq", table_name="summaries")
