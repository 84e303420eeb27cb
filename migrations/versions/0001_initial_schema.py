"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conversations",
        sa.Column("id", sa.String(length=255), nullable=False),
        sa.Column("platform", sa.String(length=64), nullable=True),
        sa.Column("encoding", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_sequence", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_message_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("topic_start_seq", sa.Integer(), server_default="1", nullable=False),
        sa.Column("open_topic_tokens", sa.Integer(), server_default="0", nullable=False),
        sa.Column("open_topic_messages", sa.Integer(), server_default="0", nullable=False),
        sa.Column("open_tool_calls", sa.Text(), nullable=True),
        sa.Column("last_clean_seq", sa.Integer(), server_default="0", nullable=False),
        sa.Column("topic_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("bulk_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("summarized_upto", sa.Integer(), server_default="0", nullable=False),
        sa.Column("pinned_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("topics_merged_upto", sa.Integer(), server_default="0", nullable=False),
        sa.Column("archives_dropped_upto", sa.Integer(), server_default="0", nullable=False),
        sa.Column("needs_maintenance", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("next_retry_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_owner", sa.String(length=128), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("compressions", sa.Integer(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("conversations", schema=None) as batch_op:
        batch_op.create_index("ix_conversations_last_message_at", ["last_message_at"], unique=False)
        batch_op.create_index(
            "ix_conversations_maintenance", ["needs_maintenance", "next_retry_at"], unique=False
        )

    op.create_table(
        "conversation_history",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("conversation_id", sa.String(length=255), nullable=False),
        sa.Column("platform", sa.String(length=64), nullable=True),
        sa.Column("tier", sa.String(length=8), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.Column("sequence", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("sealed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("role", sa.String(length=16), nullable=True),
        sa.Column("name", sa.String(length=64), nullable=True),
        sa.Column("tool_calls", sa.Text(), nullable=True),
        sa.Column("tool_call_id", sa.String(length=255), nullable=True),
        sa.Column("pinned", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("meta", sa.Text(), nullable=True),
        sa.Column("full_token_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("context_content", sa.Text(), nullable=True),
        sa.Column("first_sequence", sa.Integer(), nullable=True),
        sa.Column("last_sequence", sa.Integer(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.String(length=12), nullable=True),
        sa.Column("sealed_reason", sa.String(length=32), nullable=True),
        sa.Column("rendered", sa.Text(), nullable=True),
        sa.Column("source_tokens", sa.Integer(), server_default="0", nullable=False),
        sa.Column("summarizer", sa.String(length=64), nullable=True),
        sa.Column("model", sa.String(length=255), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), server_default="0", nullable=False),
        sa.Column("completion_tokens", sa.Integer(), server_default="0", nullable=False),
        sa.Column("cost", sa.Float(), server_default="0", nullable=False),
        sa.Column("latency_ms", sa.Float(), server_default="0", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("merged_into", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("dropped_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("stored_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("tier IN ('message', 'topic', 'bulk')", name="ck_conversation_history_tier"),
        sa.ForeignKeyConstraint(["conversation_id"], ["conversations.id"], ondelete="RESTRICT"),
        sa.ForeignKeyConstraint(
            ["merged_into"],
            ["conversation_history.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("conversation_history", schema=None) as batch_op:
        batch_op.create_index(
            "ix_conversation_history_conv_tier_seq", ["conversation_id", "tier", "sequence"], unique=True
        )
        batch_op.create_index(
            "ix_conversation_history_pinned", ["conversation_id", "pinned", "sequence"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("conversation_history", schema=None) as batch_op:
        batch_op.drop_index("ix_conversation_history_pinned")
        batch_op.drop_index("ix_conversation_history_conv_tier_seq")

    op.drop_table("conversation_history")
    with op.batch_alter_table("conversations", schema=None) as batch_op:
        batch_op.drop_index("ix_conversations_maintenance")
        batch_op.drop_index("ix_conversations_last_message_at")

    op.drop_table("conversations")
