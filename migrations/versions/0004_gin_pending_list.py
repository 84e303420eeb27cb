"""PostgreSQL: the full-text indexes keep a small pending list

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27

A GIN index adds new entries to a pending list (``fastupdate``) and moves them into the index
when the list passes ``gin_pending_list_limit`` (4 MB by default) or at a VACUUM. Every search
reads the whole list: with the list the messages written since the last VACUUM leave (20,000
messages in one conversation, 240 pending pages), a word's candidates took 2.2-3.0 ms instead of
1.5 on messages and 4.6-6.4 ms instead of 2.0 on summaries (the planner read every summary
rather than use the index). At 64 kB the list stays a few pages: searches cost what they cost
after a VACUUM, a write costs the same on average (0.115 against 0.118 ms a message insert,
server time), and the insert that moves the list into the index stalls 5 ms rather than 40.
(``fastupdate = off`` reads as fast, but every insert then costs 60 % more.)

Set on each index that holds rows: on the hash-partitioned layout the partitions' indexes (a
partitioned index takes no storage parameters). Partitions attached later by hand keep the
default until set alike. Nothing to do on SQLite.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

#: kB: a few pages of pending entries (a page holds about 15 messages' words).
PENDING_LIST_KB = 64
INDEXES = ("ix_messages_tsv", "ix_summaries_tsv")


def _leaves(index: str) -> list[str]:
    """The partitions' indexes (quoted names) of a partitioned index, else the index itself
    (``pg_partition_tree`` lists nothing for a plain one)."""
    rows = op.get_bind().execute(
        sa.text("SELECT relid::regclass::text FROM pg_partition_tree(CAST(:index AS regclass)) WHERE isleaf"),
        {"index": index},
    )
    return [r[0] for r in rows] or [index]


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for index in INDEXES:
        for leaf in _leaves(index):
            op.execute(f"ALTER INDEX {leaf} SET (gin_pending_list_limit = {PENDING_LIST_KB})")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for index in INDEXES:
        for leaf in _leaves(index):
            op.execute(f"ALTER INDEX {leaf} RESET (gin_pending_list_limit)")
