"""messages, summaries and a JSON conversation state; full-text indexes

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23

The first schema kept messages, topic summaries and archives in one table with a tier column,
and the conversation's state in a row of columns. This revision keeps the conversations' state
as one JSON document (the core's), moves messages and summaries to tables of their own, and
adds the full-text indexes search and recall use (SQLite FTS5, PostgreSQL tsvector + GIN).
Rows of the first schema are copied over (see ``_copy_v1``); nothing is dropped before that.

Options (``alembic -x name=value``, ``tiered_history.store.migrate.upgrade(options=...)`` or the
environment), read only when this revision runs:

* ``partitions=N`` / ``TIERED_HISTORY_PG_PARTITIONS=N`` (PostgreSQL): create ``messages`` and
  ``summaries`` hash-partitioned by ``conv`` into N partitions (``<table>_p0`` ...), the layout
  that also suits Citus. Their primary keys become ``(conv, id)``. Ignored on SQLite.
* ``batch=N``: rows per statement when copying the first schema's rows (default 20,000; a
  tenth as many conversations per batch, each bringing its open topic's rows).
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import context, op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
#: PostgreSQL tsvectors are limited to 1 MB: only this many characters of a text are indexed.
PG_INDEXED_CHARS = 200_000
#: Rows copied per statement from the first schema (bounded memory on both backends).
BATCH = 20_000
PARTITIONS_ENV = "TIERED_HISTORY_PG_PARTITIONS"

log = logging.getLogger("tiered_history.migrations")


def option(name: str, env: str | None = None) -> str | None:
    """A migration option: ``upgrade(options=...)``, then ``alembic -x name=value``, then ``env``."""
    given: Mapping[str, Any] = context.config.attributes.get("tiered_history_options") or {}
    if given.get(name) is not None:
        return str(given[name])
    x = context.get_x_argument(as_dictionary=True)
    if x.get(name):
        return x[name]
    return (os.environ.get(env) or None) if env else None


def _int_option(name: str, env: str | None, default: int, minimum: int) -> int:
    raw = option(name, env)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"migration option {name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"migration option {name}={value} must be at least {minimum}")
    return value


def upgrade() -> None:
    bind = op.get_bind()
    dialect = bind.dialect.name
    partitions = _int_option("partitions", PARTITIONS_ENV, 0, 0) if dialect == "postgresql" else 0
    # The first schema's tables make way under other names (their indexes keep theirs, which
    # the new tables do not use); their rows are copied below.
    op.rename_table("conversations", "v1_conversations")
    op.rename_table("conversation_history", "v1_conversation_history")
    if dialect == "postgresql":
        # Renaming a table keeps its primary key's name: free it, or PostgreSQL would name the
        # new table's key "conversations_pkey1".
        op.execute(
            "ALTER TABLE v1_conversations RENAME CONSTRAINT conversations_pkey TO v1_conversations_pkey"
        )
        op.execute(
            "ALTER TABLE v1_conversation_history RENAME CONSTRAINT conversation_history_pkey "
            "TO v1_conversation_history_pkey"
        )
    # Hash-partitioned by conversation: the partition key must be part of the primary key.
    row_key = ("conv", "id") if partitions else ("id",)
    part: dict[str, Any] = {"postgresql_partition_by": "HASH (conv)"} if partitions else {}
    op.create_table(
        "conversations",
        sa.Column("key", BigId, autoincrement=True, nullable=False),
        sa.Column("id", sa.String(length=255), nullable=False),
        sa.Column("version", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("platform", sa.String(length=64), nullable=True),
        sa.Column("encoding", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_owner", sa.String(length=128), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("meta", sa.Text(), nullable=True),
        sa.Column("state", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    op.create_index("ux_conversations_id", "conversations", ["id"], unique=True)
    op.create_index("ix_conversations_due_at", "conversations", ["due_at"], unique=False)
    op.create_index("ix_conversations_updated_at", "conversations", ["updated_at"], unique=False)

    op.create_table(
        "messages",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("conv", sa.BigInteger(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("full_tokens", sa.Integer(), nullable=False),
        sa.Column("pinned", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("pin_key", sa.String(length=255), nullable=True),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("wire", sa.Text(), nullable=True),
        sa.Column("meta", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["conv"], ["conversations.key"]),
        sa.PrimaryKeyConstraint(*row_key),
        **part,
    )
    op.create_index("ux_messages_conv_seq", "messages", ["conv", "seq"], unique=True)

    op.create_table(
        "summaries",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("conv", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("level", sa.SmallInteger(), server_default="0", nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("first_seq", sa.Integer(), nullable=False),
        sa.Column("last_seq", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(length=12), nullable=False),
        sa.Column("sealed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("sealed_reason", sa.String(length=32), nullable=True),
        sa.Column("content", sa.Text(), server_default="", nullable=False),
        sa.Column("rendered", sa.Text(), server_default="", nullable=False),
        sa.Column("tokens", sa.Integer(), server_default="0", nullable=False),
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
        sa.Column("parent_id", sa.BigInteger(), nullable=True),
        sa.Column("dropped_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("kind IN ('topic', 'bulk')", name="ck_summaries_kind"),
        sa.ForeignKeyConstraint(["conv"], ["conversations.key"]),
        sa.PrimaryKeyConstraint(*row_key),
        **part,
    )
    op.create_index("ux_summaries_conv_kind_ordinal", "summaries", ["conv", "kind", "ordinal"], unique=True)
    for table in ("messages", "summaries"):
        for k in range(partitions):
            op.execute(
                f"CREATE TABLE {table}_p{k} PARTITION OF {table} "
                f"FOR VALUES WITH (MODULUS {partitions}, REMAINDER {k})"
            )
    create_full_text(dialect)
    _copy_v1(bind, _int_option("batch", None, BATCH, 1))


def create_full_text(dialect: str) -> None:
    """Full-text indexes over messages and summaries, kept in step with their rows."""
    if dialect == "sqlite":
        for table in ("messages", "summaries"):
            # External content: the index stores no second copy of the text. ``conv`` is
            # indexed too, so a match is restricted to one conversation inside FTS5 itself.
            op.execute(
                f"CREATE VIRTUAL TABLE {table}_fts USING fts5(content, conv, content='{table}', "
                "content_rowid='id', tokenize='unicode61 remove_diacritics 0')"
            )
            op.execute(
                f"CREATE TRIGGER {table}_fts_insert AFTER INSERT ON {table} BEGIN "
                f"INSERT INTO {table}_fts(rowid, content, conv) VALUES (new.id, new.content, new.conv); END"
            )
            op.execute(
                f"CREATE TRIGGER {table}_fts_delete AFTER DELETE ON {table} BEGIN "
                f"INSERT INTO {table}_fts({table}_fts, rowid, content, conv) "
                "VALUES ('delete', old.id, old.content, old.conv); END"
            )
        op.execute(
            "CREATE TRIGGER summaries_fts_update AFTER UPDATE OF content ON summaries BEGIN "
            "INSERT INTO summaries_fts(summaries_fts, rowid, content, conv) "
            "VALUES ('delete', old.id, old.content, old.conv); "
            "INSERT INTO summaries_fts(rowid, content, conv) VALUES (new.id, new.content, new.conv); END"
        )
    elif dialect == "postgresql":
        for table in ("messages", "summaries"):
            # Words as tiered_history.core.ranking and FTS5 see them: runs of letters and digits.
            # Each is prefixed with "w" so the parser keeps it whole (it would read "3e5a1" as the
            # number 3e5 and the word a1); queries prefix their words the same way.
            op.execute(
                f"ALTER TABLE {table} ADD COLUMN tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple', "
                f"regexp_replace(regexp_replace(left(content, {PG_INDEXED_CHARS}), "
                "'[^[:alnum:]]+', ' ', 'g'), '([[:alnum:]]+)', 'w\\1', 'g'))) STORED"
            )
            op.execute(f"CREATE INDEX ix_{table}_tsv ON {table} USING gin (tsv)")


# -- copying the first schema's rows -----------------------------------------------------------------
#
# Everything is copied inside the migration's transaction, in batches: messages and summaries by
# INSERT ... SELECT over ranges of the old ids (the rows never pass through Python), conversations
# a batch at a time, their state documents rebuilt here from the old columns and the open topic's
# messages. The state document is written in this revision's format, kept here on purpose: a later
# change to the library's format comes with a migration of its own.

#: What the state remembers of the newest messages (core.state.RECENT when this revision was written).
_RECENT = 8
_DUE_NOW = datetime(1970, 1, 1, tzinfo=UTC)


def _aware(value: Any) -> datetime | None:
    """A timestamp read from either backend (SQLite: naive UTC text) as an aware UTC datetime."""
    if value is None:
        return None
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


class _Span:
    """core.state.Span: messages, unpinned tokens and source tokens, time span."""

    __slots__ = ("first", "last", "messages", "source", "tokens")

    def __init__(self) -> None:
        self.messages = self.tokens = self.source = 0
        self.first: datetime | None = None
        self.last: datetime | None = None

    def add(self, other: _Span) -> _Span:
        out = _Span()
        out.messages = self.messages + other.messages
        out.tokens = self.tokens + other.tokens
        out.source = self.source + other.source
        firsts = [t for t in (self.first, other.first) if t is not None]
        lasts = [t for t in (self.last, other.last) if t is not None]
        out.first = min(firsts) if firsts else None
        out.last = max(lasts) if lasts else None
        return out

    @classmethod
    def one(cls, tokens: int, source: int, pinned: bool, at: datetime) -> _Span:
        out = cls()
        out.messages = 1
        out.tokens, out.source = (0, 0) if pinned else (tokens, source)
        out.first = out.last = at
        return out

    def doc(self) -> list[Any]:
        return [self.messages, self.tokens, self.source, _iso(self.first), _iso(self.last)]


class _OpenTopic:
    """Replays the open topic's messages the way core.transitions.append counts them."""

    def __init__(self, last_clean: int) -> None:
        self.last_clean = last_clean
        self.open = _Span()
        self.clean = _Span()
        self.tail = _Span()
        self.calls: list[str] = []
        self.recent: deque[list[Any]] = deque(maxlen=_RECENT)

    def add(self, row: Sequence[Any]) -> None:
        _, seq, role, tool_calls, tool_call_id, pinned, tokens, full, at = row
        own = _Span.one(int(tokens), int(full), bool(pinned), _aware(at))  # type: ignore[arg-type]
        self.open = self.open.add(own)
        if tool_calls:
            self.calls = [str(c["id"]) for c in json.loads(tool_calls)]
        elif role == "tool":
            if tool_call_id in self.calls:
                self.calls.remove(tool_call_id)
        elif not pinned:
            self.calls = []  # a new turn abandons calls that never got results
        if seq <= self.last_clean:
            self.clean = self.clean.add(own)
        else:
            self.tail = self.tail.add(own)
        self.recent.append([int(seq), own.doc(), self.open.doc(), not self.calls])


def _state_doc(c: Mapping[str, Any], topic: _OpenTopic, pins: list[int]) -> tuple[str, datetime | None]:
    """The conversation's state document (core.state.ConversationState.body) and its due_at."""
    last_at = _aware(c["last_message_at"])
    retry_at = _aware(c["next_retry_at"])
    maint = bool(c["needs_maintenance"])
    # The silence deadline depends on settings the migration cannot know: make the open topic due
    # now, so the first maintenance pass checks it with the real rules (the first schema checked
    # silence on every pass) and records the real deadline.
    silence_at = last_at if topic.open.messages else None
    times = [t for t in ((retry_at or _DUE_NOW) if maint else None, silence_at) if t is not None]
    doc = {
        "last": int(c["last_sequence"]),
        "last_at": _iso(last_at),
        "start": int(c["topic_start_seq"]),
        "open": topic.open.doc(),
        "calls": list(json.loads(c["open_tool_calls"]) if c["open_tool_calls"] else []),
        "clean_seq": topic.last_clean,
        "clean": topic.clean.doc(),
        "tail": topic.tail.doc(),
        "recent": list(topic.recent),
        "detector": None,
        "topics": int(c["topic_count"]),
        "archives": int(c["bulk_count"]),
        "summarized": int(c["summarized_upto"]),
        "merged": int(c["topics_merged_upto"]),
        "dropped": int(c["archives_dropped_upto"]),
        "compressions": int(c["compressions"]),
        "pins": [[f"#{seq}", seq] for seq in pins],
        "budget": None,
        "maint": maint,
        "retry_at": _iso(retry_at),
        "silence_at": _iso(silence_at),
    }
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False), min(times) if times else None


def _copy_conversations(bind: sa.Connection, batch: int) -> int:
    sqlite = bind.dialect.name == "sqlite"
    page = sa.text("SELECT * FROM v1_conversations WHERE id > :after ORDER BY id LIMIT :n")
    # Only what the replay needs, not the text: the open topic is small (a topic's worth of messages).
    open_rows = sa.text(
        "SELECT h.conversation_id, h.sequence, h.role, h.tool_calls, h.tool_call_id, h.pinned, "
        "h.token_count, h.full_token_count, h.created_at FROM v1_conversations c "
        "JOIN v1_conversation_history h ON h.conversation_id = c.id AND h.tier = 'message' "
        "AND h.sequence >= c.topic_start_seq WHERE c.id > :after AND c.id <= :upto "
        "ORDER BY h.conversation_id, h.sequence"
    )
    pinned = sa.text(
        "SELECT conversation_id, sequence FROM v1_conversation_history WHERE tier = 'message' "
        "AND pinned = :true AND conversation_id > :after AND conversation_id <= :upto "
        "ORDER BY conversation_id, sequence"
    )
    insert = sa.text(
        "INSERT INTO conversations (id, version, platform, encoding, created_at, updated_at, due_at, "
        "lease_owner, lease_expires_at, state) VALUES (:id, 1, :platform, :encoding, :created_at, "
        ":updated_at, :due_at, :lease_owner, :lease_expires_at, :state)"
    )
    after, copied = "", 0
    per_batch = max(1, batch // 10)  # each brings its open topic's rows along
    while True:
        convs = [dict(r._mapping) for r in bind.execute(page, {"after": after, "n": per_batch})]
        if not convs:
            return copied
        bounds = {"after": after, "upto": convs[-1]["id"]}
        topics: dict[str, _OpenTopic] = {}
        for c in convs:
            start, last = int(c["topic_start_seq"]), int(c["last_sequence"])
            # A seal may end at the last clean message; never before the open topic or after the last.
            topics[c["id"]] = _OpenTopic(min(max(int(c["last_clean_seq"]), start - 1), last))
        for r in bind.execute(open_rows.execution_options(yield_per=2000), bounds):
            topics[r[0]].add(r)
        pins: dict[str, list[int]] = {}
        for cid, seq in bind.execute(pinned, {**bounds, "true": True}):
            pins.setdefault(cid, []).append(int(seq))
        params = []
        for c in convs:
            state, due = _state_doc(c, topics[c["id"]], pins.get(c["id"], []))
            if due is not None and sqlite:  # the text the store writes and compares on SQLite
                due_at: Any = due.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
            else:
                due_at = due
            params.append(
                {
                    "id": c["id"],
                    "platform": c["platform"],
                    "encoding": c["encoding"],
                    "created_at": c["created_at"],
                    "updated_at": c["updated_at"],
                    "due_at": due_at,
                    "lease_owner": c["lease_owner"],
                    "lease_expires_at": c["lease_expires_at"],
                    "state": state,
                }
            )
        bind.execute(insert, params)
        copied += len(convs)
        after = convs[-1]["id"]


def _wire_sql(dialect: str) -> str:
    """The ``wire`` JSON the store writes: name, tool_calls, tool_call_id when set, else NULL."""
    if dialect == "sqlite":
        # json_patch drops the members whose value is null; keys keep this order, as the store's.
        return (
            "NULLIF(json_patch('{}', json_object('name', h.name, 'tool_calls', json(h.tool_calls), "
            "'tool_call_id', h.tool_call_id)), '{}')"
        )
    parts = (
        "CASE WHEN h.name IS NOT NULL THEN '\"name\":' || to_json(h.name)::text END",
        "CASE WHEN h.tool_calls IS NOT NULL THEN '\"tool_calls\":' || h.tool_calls END",
        "CASE WHEN h.tool_call_id IS NOT NULL THEN '\"tool_call_id\":' || to_json(h.tool_call_id)::text END",
    )
    return f"NULLIF('{{' || concat_ws(',', {', '.join(parts)}) || '}}', '{{}}')"


def _copy_rows(bind: sa.Connection, batch: int) -> tuple[int, int]:
    dialect = bind.dialect.name
    source = (
        "FROM v1_conversation_history h JOIN conversations c ON c.id = h.conversation_id "
        "WHERE h.id >= :lo AND h.id < :hi AND h.tier {} ORDER BY h.id"
    )
    messages = sa.text(
        "INSERT INTO messages (conv, seq, role, created_at, tokens, full_tokens, pinned, pin_key, content, "
        "wire, meta) SELECT c.key, h.sequence, h.role, h.created_at, h.token_count, h.full_token_count, "
        f"h.pinned, CASE WHEN h.pinned THEN '#' || h.sequence END, h.content, {_wire_sql(dialect)}, h.meta "
        + source.format("= 'message'")
    )
    # Summaries keep their ids (users may have kept them), so merged_into is parent_id as it is.
    summaries = sa.text(
        "INSERT INTO summaries (id, conv, kind, level, ordinal, first_seq, last_seq, started_at, ended_at, "
        "status, sealed_at, sealed_reason, content, rendered, tokens, source_tokens, summarizer, model, "
        "prompt_tokens, completion_tokens, cost, latency_ms, attempts, next_attempt_at, last_error, "
        "parent_id, dropped_at, created_at) SELECT h.id, c.key, h.tier, "
        "CASE WHEN h.tier = 'bulk' THEN 1 ELSE 0 END, h.sequence, h.first_sequence, h.last_sequence, "
        "h.started_at, h.ended_at, h.status, h.sealed_at, h.sealed_reason, h.content, "
        "coalesce(h.rendered, ''), h.token_count, h.source_tokens, h.summarizer, h.model, h.prompt_tokens, "
        "h.completion_tokens, h.cost, h.latency_ms, h.attempts, h.next_attempt_at, h.last_error, "
        "h.merged_into, h.dropped_at, h.stored_at " + source.format("IN ('topic', 'bulk')")
    )
    lo, hi = bind.execute(sa.text("SELECT min(id), max(id) FROM v1_conversation_history")).one()
    counts = [0, 0]
    if lo is None:
        return 0, 0
    for start in range(int(lo), int(hi) + 1, batch):
        bounds = {"lo": start, "hi": start + batch}
        for k, stmt in enumerate((messages, summaries)):
            counts[k] += bind.execute(stmt, bounds).rowcount
    if dialect == "postgresql" and counts[1]:
        top = "(SELECT max(id) FROM summaries)"
        bind.execute(sa.text(f"SELECT setval(pg_get_serial_sequence('summaries', 'id'), {top})"))
    return counts[0], counts[1]


def _copy_v1(bind: sa.Connection, batch: int = BATCH) -> None:
    """Copy every row of the first schema into the new tables, then drop the old tables."""
    conversations = _copy_conversations(bind, batch)
    messages, summaries = _copy_rows(bind, batch)
    left = bind.execute(
        sa.text(
            "SELECT count(*) FROM v1_conversation_history h WHERE NOT EXISTS "
            "(SELECT 1 FROM conversations c WHERE c.id = h.conversation_id)"
        )
    ).scalar_one()
    if left:  # cannot happen (a foreign key): refuse rather than drop rows
        raise RuntimeError(f"{left} rows of conversation_history belong to no conversation")
    if conversations:
        log.info(
            "copied %d conversations, %d messages and %d summaries from the first schema",
            conversations,
            messages,
            summaries,
        )
    if bind.dialect.name == "sqlite":
        # With foreign keys on, SQLite's DROP TABLE deletes row by row and looks for rows whose
        # merged_into refers to each one: without this index that is quadratic in the table size.
        op.execute("CREATE INDEX v1_merged_into ON v1_conversation_history (merged_into)")
    op.drop_table("v1_conversation_history")
    op.drop_table("v1_conversations")


def downgrade() -> None:
    raise NotImplementedError("downgrading below revision 0002 is not supported")
