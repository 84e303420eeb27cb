"""The SQL store: one implementation for SQLite and PostgreSQL.

SQLAlchemy provides the engine, the pool and the migrations. The statements a reply runs are
SQL text written once for both dialects (:class:`Statements`, built once per dialect) and run on
the driver's own cursor: building a SQLAlchemy statement per call costs as much as running it.
Dialect differences (transaction start, ``SKIP LOCKED``, how a list is passed, retries) are
decided once in :mod:`.dialect`.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import threading
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from operator import itemgetter
from types import TracebackType
from typing import Any, TypeVar

import sqlalchemy as sa

from ..core.ranking import Query, occurrences, words
from ..core.state import (
    Committed,
    ConversationState,
    Guard,
    NewMessage,
    NewRef,
    NewSummary,
    Outcome,
    SummaryUpdate,
    Writes,
    search_key,
)
from ..core.units import RESULT_ROLES
from ..errors import StoreError
from ..models import ConversationStats, StoredMessage, Summary
from .base import (
    ContextRequest,
    Hit,
    LeaseLostError,
    Snapshot,
    SummaryWindow,
    WouldWait,
    newest_summaries,
    newest_window,
)
from .dialect import Capabilities, capabilities, create_engine, is_integrity_error, prepare_engine, translate
from .memory import ADDITIVE
from .recall import (
    CACHED_ROW_CHARS,
    CANDIDATES_PER_WORD,
    RECENT_CHARS,
    RECENT_SCAN,
    SMALL_CONVERSATION,
    SMALL_SCAN,
    CandidateCache,
    Candidates,
    Group,
    RecentRow,
    by_word,
    candidates,
    collection,
    rank,
    with_added,
)

T = TypeVar("T")
_FIRST_PAGE = 16
_MAX_PAGE = 256
_NAMED = re.compile(r"(?<![:\w]):(\w+)")

_MESSAGE_COLS = "seq, role, created_at, tokens, full_tokens, pinned, pin_key, content, wire, meta"
_SUMMARY_COLS = (
    "id, kind, ordinal, first_seq, last_seq, content, rendered, tokens, source_tokens, started_at, "
    "ended_at, status, sealed_at, sealed_reason, summarizer, model, prompt_tokens, completion_tokens, "
    "cost, latency_ms, attempts, parent_id, dropped_at, created_at, next_attempt_at, last_error, level"
)
#: Summary fields named differently in the table.
_RENAMED = {"token_count": "tokens"}
_STATE_COLS = (
    "key, id, version, platform, encoding, created_at, updated_at, lease_owner, lease_expires_at, state, meta"
)

#: Idle connections kept for transactions tried without waiting (event loops use them).
NOWAIT_CONNECTIONS = 2
#: psycopg's ``TransactionStatus.IDLE``: no transaction open on the connection.
_PG_IDLE = 0
#: Conversation row keys a SQLite store remembers (all forgotten at once beyond this).
KEYS_KEPT = 65536
#: ``Statements.pg_context_head``'s rows: the part, then the state's columns, then a message's.
_HEAD_ROW = 1 + len(_STATE_COLS.split(","))
#: A one-statement read that cannot answer (see ``SQLStore._context_head``).
_UNSURE = object()


class Statements:
    """Every statement the store runs, as SQL text in the driver's parameter style, built once."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        pg = dialect == "postgresql"
        self.in_list = "= ANY(:seqs)" if pg else "IN (SELECT value FROM json_each(:seqs))"
        s = self.sql
        self.state = s(f"SELECT {_STATE_COLS} FROM conversations WHERE id = :id")
        # SQLite's BEGIN IMMEDIATE has locked the database already; PostgreSQL locks the row.
        self.state_locked = s(
            f"SELECT {_STATE_COLS} FROM conversations WHERE id = :id{' FOR UPDATE' if pg else ''}"
        )
        self.insert_conversation = s(
            "INSERT INTO conversations (id, version, platform, encoding, created_at, updated_at, due_at, "
            "state, meta) VALUES (:id, :version, :platform, :encoding, :created_at, :updated_at, :due_at, "
            ":state, :meta) RETURNING key"
        )
        self.update_conversation = s(
            "UPDATE conversations SET version = :version, platform = :platform, updated_at = :updated_at, "
            "due_at = :due_at, state = :state WHERE id = :id AND version = :expect RETURNING key, lease_owner"
        )
        self.insert_message = s(
            "INSERT INTO messages (conv, seq, role, created_at, tokens, full_tokens, pinned, pin_key, "
            "content, wire, meta) VALUES (:conv, :seq, :role, :created_at, :tokens, :full_tokens, "
            ":pinned, :pin_key, :content, :wire, :meta)"
        )
        self.insert_summary = s(
            "INSERT INTO summaries (conv, kind, level, ordinal, first_seq, last_seq, started_at, ended_at, "
            "status, sealed_at, sealed_reason, content, rendered, tokens, source_tokens, summarizer, model, "
            "prompt_tokens, completion_tokens, cost, latency_ms, attempts, next_attempt_at, last_error, "
            "created_at, parent_id, dropped_at) VALUES (:conv, :kind, :level, :ordinal, :first_seq, "
            ":last_seq, :started_at, :ended_at, :status, :sealed_at, :sealed_reason, :content, :rendered, "
            ":tokens, :source_tokens, :summarizer, :model, :prompt_tokens, :completion_tokens, :cost, "
            ":latency_ms, :attempts, :next_attempt_at, :last_error, :created_at, :parent_id, :dropped_at) "
            "RETURNING id"
        )
        if pg:
            # An append as one statement (one round trip, a transaction by itself): the guarded
            # state update, and the messages inserted only if it matched.
            guarded = (
                "WITH c AS (UPDATE conversations SET version = :version, platform = :platform, "
                "updated_at = :updated_at, due_at = :due_at, state = :state "
                "WHERE id = :id AND version = :expect RETURNING key) "
                "INSERT INTO messages (conv, seq, role, created_at, tokens, full_tokens, pinned, pin_key, "
                "content, wire, meta) SELECT c.key, "
            )
            # One message by plain parameters (the driver dumps arrays slowly), a batch by arrays.
            self.append_one: str | None = s(
                f"{guarded}:seq, :role, :created_at, :tokens, :full_tokens, :pinned, :pin_key, :content, "
                ":wire, :meta FROM c"
            )
            self.append: str | None = s(
                f"{guarded}m.* FROM c, unnest(CAST(:seqs AS integer[]), "
                "CAST(:roles AS text[]), CAST(:ats AS timestamptz[]), CAST(:tokens AS integer[]), "
                "CAST(:fulls AS integer[]), CAST(:pins AS boolean[]), CAST(:pin_keys AS text[]), "
                "CAST(:contents AS text[]), CAST(:wires AS text[]), CAST(:metas AS text[])) AS m"
            )
        else:
            # SQLite has no data-modifying WITH; its statements cost no round trip.
            self.append_one = self.append = None
        # SQLite, the two statements of every message's write, with positional parameters (sqlite3
        # binds a named one by making its name a string and looking it up in the dict, every time).
        # The update of a row whose key is known (RETURNING costs more than the update itself;
        # ``rowcount`` says whether it matched). Naming the id too, a key kept from before the
        # conversation was deleted and made again matches nothing: the caller falls back to
        # ``update_conversation``.
        self.update_conversation_at_row = (
            "UPDATE conversations SET version = ?, platform = ?, updated_at = ?, due_at = ?, state = ? "
            "WHERE key = ? AND id = ? AND version = ?"
        )
        # And ``insert_message``, its columns in order.
        self.insert_message_row = (
            "INSERT INTO messages (conv, seq, role, created_at, tokens, full_tokens, pinned, pin_key, "
            "content, wire, meta) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self.pinned = s(f"SELECT {_MESSAGE_COLS} FROM messages WHERE conv = :conv AND seq {self.in_list}")
        self.window = s(
            f"SELECT {_MESSAGE_COLS} FROM messages WHERE conv = :conv AND seq > :lo AND seq <= :hi "
            "AND pinned = :false ORDER BY seq DESC LIMIT :lim"
        )
        self.range = s(
            f"SELECT {_MESSAGE_COLS} FROM messages WHERE conv = :conv AND seq >= :lo AND seq <= :hi "
            "ORDER BY seq"
        )
        shown = "AND dropped_at IS NULL AND status NOT IN ('pending', 'superseded')"
        base = (
            f"SELECT {_SUMMARY_COLS} FROM summaries WHERE conv = :conv AND kind = :kind AND ordinal > :after"
        )
        newest = "AND ordinal <= :hi ORDER BY ordinal DESC LIMIT :lim"
        self.summaries_live = s(f"{base} AND parent_id IS NULL {shown} {newest}")
        self.summaries_merged = s(f"{base} AND parent_id IS NOT NULL {shown} {newest}")
        self.summaries_dropped = s(
            f"{base} AND dropped_at IS NOT NULL AND ordinal <= :hi ORDER BY ordinal DESC LIMIT :lim"
        )
        self.summaries_all = s(f"{base} ORDER BY ordinal")
        # SQLite would rather scan the conversation's summaries by its index than look the few
        # ids up: ``+conv`` keeps that index out (PostgreSQL needs ``conv =`` to prune partitions).
        self.summaries_by_id = s(
            f"SELECT {_SUMMARY_COLS} FROM summaries WHERE {'conv' if pg else '+conv'} = :conv "
            f"AND id {self.in_list}"
        )
        self.search_literal = s(
            f"SELECT {_MESSAGE_COLS} FROM messages WHERE conv = :conv AND lower(content) LIKE :pattern "
            "ESCAPE '\\' ORDER BY seq DESC LIMIT :lim"
        )
        if pg:
            # ``read_context``'s usual read after a write as one statement (a snapshot by itself
            # on an autocommit connection: one round trip for what was BEGIN, the state, the page
            # and COMMIT): the state row (part 0), the first page of the window (1) and the pinned
            # messages the planner expects (2), each row padded with NULLs to the same columns.
            states, rows = len(_STATE_COLS.split(",")), len(_MESSAGE_COLS.split(","))
            pad_state, pad_row = ", ".join(["NULL"] * states), ", ".join(["NULL"] * rows)
            head = (
                f"WITH st AS (SELECT {_STATE_COLS} FROM conversations WHERE id = :id) "
                f"SELECT 0, st.*, {pad_row} FROM st "
                f"UNION ALL (SELECT 1, {pad_state}, {_MESSAGE_COLS} FROM messages "
                "WHERE conv = (SELECT key FROM st) AND seq > :lo AND seq <= :hi AND pinned = :false "
                "ORDER BY seq DESC LIMIT :lim)"
            )
            self.pg_context_head: str | None = s(head)
            # With pins: a statement of its own, the one without them planned once (a plan with the
            # pinned branch is costed above the ones made for each call's values, so the server
            # plans it again on every call: twice the time of the statement without it).
            self.pg_context_head_pinned: str | None = s(
                f"{head} UNION ALL SELECT 2, {pad_state}, {_MESSAGE_COLS} FROM messages "
                "WHERE conv = (SELECT key FROM st) AND seq = ANY(CAST(:pins AS integer[]))"
            )
            self.pg_rows_messages = s(
                f"SELECT id, {_MESSAGE_COLS} FROM messages WHERE conv = :conv AND id = ANY(:ids)"
            )
            self.pg_rows_summaries = s(
                f"SELECT {_SUMMARY_COLS} FROM summaries WHERE conv = :conv AND id = ANY(:ids)"
            )
            # Rows with their length and the count of each of the query's words they hold (the
            # same statement for any words, so the server plans it once): a small conversation's
            # summaries, and the messages written since kept candidate lists were made.
            n = "coalesce(array_length(v.positions, 1), 1)"
            wanted = "v.lexeme = ANY(:lexemes)"
            counted = (
                f"CROSS JOIN LATERAL (SELECT coalesce(sum({n}), 0) AS dl, array_agg(v.lexeme) FILTER "
                f"(WHERE {wanted}) AS lexemes, array_agg({n}) FILTER (WHERE {wanted}) AS ns "
                "FROM unnest(x.tsv) v) s"
            )
            # Only rows holding one of the words (:any_of, see ``_any_of``) are counted: taking a
            # row's tsvector apart costs 8-25 us, testing it a fraction of that. A test the planner
            # cannot take to the GIN index: the conversation's newest rows are walked by recency.
            holding = "coalesce(x.tsv @@ CAST(:any_of AS tsquery), true)"
            self.pg_summaries = s(
                f"SELECT x.id, x.last_seq, s.dl, s.lexemes, s.ns FROM summaries x {counted} "
                f"WHERE x.conv = :conv AND x.status NOT IN ('pending', 'superseded') AND {holding} "
                "ORDER BY x.last_seq DESC, x.id DESC LIMIT :lim"
            )
            # The summaries written since a kept summary list (see ``_summary_additions``).
            self.pg_added_summaries = s(
                f"SELECT x.id, x.last_seq, s.dl, s.lexemes, s.ns FROM summaries x {counted} "
                "WHERE x.conv = :conv AND x.last_seq > :after AND x.status NOT IN ('pending', 'superseded') "
                "ORDER BY x.last_seq DESC, x.id DESC LIMIT :lim"
            )
            self.pg_new_messages = s(
                f"SELECT x.id, x.seq, s.dl, s.lexemes, s.ns FROM messages x {counted} "
                f"WHERE x.conv = :conv AND x.seq > :after AND x.seq <= :last AND {holding} "
                "ORDER BY x.seq DESC LIMIT :lim"
            )
        else:
            self.pg_context_head = self.pg_context_head_pinned = None
            # FTS5 finds each query word's newest rows of one conversation, newest first, and stops
            # after :lim of them (FTS5 walks its index in rowid order, which is the conversation's
            # order); the store ranks those candidates by BM25 itself (FTS5's bm25() would first
            # count every row of the table holding each word: O(all matching rows) per query).
            # Each row comes with its recency and length in words (FTS5's own count, in its docsize
            # table); summaries with whether they are live (counted among the :lim all the same).
            newest = (
                "SELECT {0}_fts.rowid, x.{1}, d.sz{2} FROM {0}_fts JOIN {0} x ON x.id = {0}_fts.rowid "
                "JOIN {0}_fts_docsize d ON d.id = {0}_fts.rowid WHERE {0}_fts MATCH :q{3} "
                "ORDER BY {0}_fts.rowid DESC LIMIT :lim"
            )
            self.fts_messages = newest.format("messages", "seq", "", "")
            self.fts_summaries = newest.format(
                "summaries", "last_seq", ", x.status NOT IN ('pending', 'superseded')", ""
            )
            # A word's matches among the messages written since a list of them was kept.
            self.fts_messages_after = newest.format("messages", "seq", "", " AND messages_fts.rowid > :after")
            # The same over few rows, most of them the conversation's own: the conversation taken by
            # the join rather than by FTS5's conv column, whose list of every row of the
            # conversation costs about half of such a query (the rows after :after of other
            # conversations are read and left, so this is for when they are few: ``_few_others``).
            self.fts_messages_after_few = (
                "SELECT messages_fts.rowid, x.seq, d.sz FROM messages_fts JOIN messages x "
                "ON x.id = messages_fts.rowid JOIN messages_fts_docsize d ON d.id = messages_fts.rowid "
                "WHERE messages_fts MATCH :q AND messages_fts.rowid > :after AND +x.conv = :conv "
                "ORDER BY messages_fts.rowid DESC LIMIT :lim"
            )
            self.message_id_at = "SELECT id FROM messages WHERE conv = :conv AND seq = :seq"
            self.newest_message_id = "SELECT max(id) FROM messages"
            # A word's newest matches in a conversation that holds most of the rows written since
            # its first (``_dense_from``): the conversation taken by the join, the rows before its
            # first left out by rowid (FTS5 seeks there), rather than by FTS5's conv column, whose
            # list of every row of a large conversation costs two thirds of such a query.
            self.fts_messages_from = newest.format(
                "messages", "seq", "", " AND messages_fts.rowid >= :first AND +x.conv = :conv"
            ).replace("MATCH :q", "MATCH :term")
            self.fts_summaries_from = newest.format(
                "summaries",
                "last_seq",
                ", x.status NOT IN ('pending', 'superseded')",
                " AND summaries_fts.rowid >= :first AND +x.conv = :conv",
            ).replace("MATCH :q", "MATCH :term")
            self.first_message_id = "SELECT id FROM messages WHERE conv = :conv ORDER BY seq LIMIT 1"
            self.first_summary_id = (
                "SELECT min(id) FROM (SELECT id FROM (SELECT id FROM summaries WHERE conv = :conv "
                "AND kind = 'topic' ORDER BY ordinal LIMIT 1) UNION ALL SELECT id FROM (SELECT id "
                "FROM summaries WHERE conv = :conv AND kind = 'bulk' ORDER BY ordinal LIMIT 1))"
            )
            self.newest_summary_id = "SELECT max(id) FROM summaries"
            # The messages written since kept lists were made (a few), newest first, with their
            # length (FTS5's) and text: what each word's list lacks, counted in Python.
            self.fts_new_messages = (
                "SELECT m.id, m.seq, d.sz, m.content FROM messages m JOIN messages_fts_docsize d "
                "ON d.id = m.id WHERE m.conv = :conv AND m.seq > :after AND m.seq <= :last "
                "ORDER BY m.seq DESC"
            )
            # A small conversation's summaries, all of them (newest first, as FTS5 finds them), with
            # their length (FTS5's), text and whether they are live: counted in Python.
            self.fts_few_summaries = (
                "SELECT s.id, s.last_seq, d.sz, s.content, s.status NOT IN ('pending', 'superseded') "
                "FROM summaries s JOIN summaries_fts_docsize d ON d.id = s.id WHERE s.conv = :conv "
                "ORDER BY s.id DESC LIMIT :lim"
            )
            # The live summaries covering messages after :after, with their length (FTS5's) and
            # text: those written since a kept summary list was made (see ``_summary_additions``).
            self.added_summaries = (
                "SELECT s.id, s.last_seq, d.sz, s.content FROM summaries s JOIN summaries_fts_docsize d "
                "ON d.id = s.id WHERE s.conv = :conv AND s.last_seq > :after "
                "AND s.status NOT IN ('pending', 'superseded') ORDER BY s.id DESC LIMIT :lim"
            )
            self.fts_text_messages = (
                "SELECT id, content FROM messages WHERE id IN (SELECT value FROM json_each(:ids)) "
                "AND +conv = :conv"
            )
            self.fts_text_summaries = (
                "SELECT id, content FROM summaries WHERE id IN (SELECT value FROM json_each(:ids)) "
                "AND +conv = :conv"
            )
            self.fts_rows_messages = (
                f"SELECT id, {_MESSAGE_COLS} FROM messages WHERE id IN (SELECT value FROM json_each(:ids)) "
                "AND +conv = :conv"
            )
            self.fts_rows_summaries = (
                f"SELECT {_SUMMARY_COLS} FROM summaries WHERE id IN (SELECT value FROM json_each(:ids)) "
                "AND +conv = :conv"
            )
        self.ids = s("SELECT id FROM conversations ORDER BY id")
        self.listing = s(f"SELECT {_STATE_COLS} FROM conversations WHERE id > :after ORDER BY id LIMIT :lim")
        self.listing_platform = s(
            f"SELECT {_STATE_COLS} FROM conversations WHERE id > :after AND platform = :platform "
            "ORDER BY id LIMIT :lim"
        )
        self.lease_of = s("SELECT version, lease_owner FROM conversations WHERE id = :id")
        self.landed = s("SELECT key, version, state, updated_at FROM conversations WHERE id = :id")
        self.summary_id = s(
            "SELECT id FROM summaries WHERE conv = :conv AND kind = :kind AND ordinal = :ordinal"
        )
        free = "(lease_owner IS NULL OR lease_expires_at < :now)"
        lock = " FOR UPDATE SKIP LOCKED" if pg else ""
        self.claim_due = s(
            f"SELECT id FROM conversations WHERE due_at <= :now AND {free} AND id > :after "
            f"ORDER BY id LIMIT :lim{lock}"
        )
        self.claim_one = s(f"SELECT id FROM conversations WHERE id = :id AND {free}{lock}")
        self.take_lease = s(
            "UPDATE conversations SET lease_owner = :owner, lease_expires_at = :until "
            f"WHERE id = :id AND {free}"
        )
        self.renew = s(
            "UPDATE conversations SET lease_expires_at = :until WHERE id = :id AND lease_owner = :owner"
        )
        self.release = s(
            "UPDATE conversations SET lease_owner = NULL, lease_expires_at = NULL "
            "WHERE id = :id AND lease_owner = :owner"
        )
        self.key_of = s("SELECT key FROM conversations WHERE id = :id")
        self.delete_messages = s("DELETE FROM messages WHERE conv = :conv")
        self.delete_summaries = s("DELETE FROM summaries WHERE conv = :conv")
        self.delete_conversation = s("DELETE FROM conversations WHERE key = :conv")
        self.stats_conversations = s(f"SELECT {_STATE_COLS} FROM conversations ORDER BY id")
        self.stats_one = s(f"SELECT {_STATE_COLS} FROM conversations WHERE id = :id")
        self.stats_messages = s(
            "SELECT count(*), coalesce(sum(full_tokens), 0), "
            "coalesce(sum(CASE WHEN seq > :upto THEN tokens ELSE 0 END), 0) FROM messages WHERE conv = :conv"
        )
        self.stats_summaries = s(
            "SELECT kind, count(*), coalesce(sum(CASE WHEN status = 'pending' THEN 1 ELSE 0 END), 0), "
            "coalesce(sum(CASE WHEN parent_id IS NULL AND dropped_at IS NULL THEN tokens ELSE 0 END), 0), "
            "coalesce(sum(CASE WHEN dropped_at IS NOT NULL THEN 1 ELSE 0 END), 0), "
            "coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0), coalesce(sum(cost), 0), "
            "coalesce(sum(CASE WHEN status = 'provisional' AND parent_id IS NULL THEN 1 ELSE 0 END), 0) "
            "FROM summaries WHERE conv = :conv GROUP BY kind"
        )
        self._updates: dict[tuple[Any, ...], str] = {}
        self._lock = threading.Lock()

    def pg_candidates(
        self, groups: Sequence[tuple[str, ...]], summary: bool, after: Sequence[int | None] | None = None
    ) -> str:
        """PostgreSQL: per query group k, its newest :cap matching rows of the conversation as
        (k, id, recency, tsvector as text: see :func:`_tally` for its length and the group's
        count); with ``after[k]``, only rows after that sequence (a kept list is brought up to
        date). The words are written into the statement (letters and digits only, nothing to
        escape), so that the planner sees each one: a rare word is looked up in the GIN index, a
        common one found by walking the conversation's newest rows backwards until :cap of them
        match."""
        table, order = ("summaries", "x.last_seq") if summary else ("messages", "x.seq")
        live = " AND x.status NOT IN ('pending', 'superseded')" if summary else ""
        branches = []
        for k, g in enumerate(groups):
            # Indexed words carry a "w" prefix (see migration 0002): so do the query's.
            tsq = " <-> ".join(f"''w{w}''" for w in g)
            since = "" if after is None or after[k] is None else f" AND {order} > {int(after[k] or 0)}"
            # The tsvector sent as text and counted by the client: taking it apart on the server
            # (unnest, a row per lexeme) cost more than the search (100,000 messages: 0.85 ms of
            # a common word's 64 rows against 0.45 sent; summaries 1.7 against 1.0).
            branches.append(
                f"(SELECT {k} AS k, x.id, {order} AS r, x.tsv::text FROM {table} x WHERE x.conv = %(conv)s"
                f"{live}{since} AND x.tsv @@ to_tsquery('simple', '{tsq}') "
                f"ORDER BY {order} DESC LIMIT %(cap)s)"
            )
        return " UNION ALL ".join(branches)

    def sql(self, text: str) -> str:
        """``text`` with ``:name`` parameters in the driver's style (psycopg: ``%(name)s``)."""
        if self.dialect == "postgresql":
            return _NAMED.sub(r"%(\1)s", text.replace("%", "%%"))
        return text

    def summary_update(self, u: SummaryUpdate) -> str:
        """``UPDATE summaries`` for this set of columns and guards (built once per shape)."""
        shape = (
            tuple(sorted(_RENAMED.get(k, k) for k in u.values)),
            u.expect_status is not None,
            u.expect_attempts is not None,
            u.expect_unmerged,
            u.expect_not_pending,
            u.expect_undropped,
            u.ordinal is not None,
        )
        with self._lock:
            found = self._updates.get(shape)
            if found is None:
                sets = ", ".join(
                    f"{c} = {c} + :v_{c}" if c in ADDITIVE else f"{c} = :v_{c}" for c in shape[0]
                )
                where = ["kind = 'topic' AND ordinal = :ordinal" if shape[6] else "id = :id", "conv = :conv"]
                if shape[1]:
                    where.append("status = :expect_status")
                if shape[2]:
                    where.append("attempts = :expect_attempts")
                if shape[3]:
                    where.append("parent_id IS NULL")
                if shape[4]:
                    where.append("status <> 'pending'")
                if shape[5]:
                    where.append("dropped_at IS NULL")
                found = self._updates[shape] = self.sql(
                    f"UPDATE summaries SET {sets} WHERE {' AND '.join(where)}"
                )
            return found


#: How long a call waits for a connection another call of this store is using, when the
#: engine's pool has lent all it may (then the pool's own timeout applies).
POOL_WAIT_SECONDS = 30.0


class _NoWait:
    """:meth:`_Held.nowait`'s context. A class: ``contextlib.contextmanager`` costs three times as
    much (a generator and its wrapper), on every write tried from the event loop."""

    __slots__ = ("_before", "_local")

    def __init__(self, local: threading.local) -> None:
        self._local = local
        self._before = False

    def __enter__(self) -> None:
        self._before = bool(getattr(self._local, "nowait", False))
        self._local.nowait = True

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._local.nowait = self._before


class _Held:
    """Connections a store keeps checked out of its own engine and reuses for every transaction.

    Checking a connection out of SQLAlchemy's pool and back costs about as much as a short
    write itself (and PostgreSQL's pre-ping one more round trip). Both drivers run in autocommit
    mode here: the store sends BEGIN and COMMIT itself, and a single statement needs neither.
    ``nowait`` connections (SQLite) have no busy timeout: a transaction that would wait for
    another writer's lock fails at once instead (:class:`~.base.WouldWait`), so that it can be
    tried on an event loop and handed to a thread only when it must wait.
    """

    def __init__(self, engine: sa.Engine, keep: int, keep_nowait: int, sqlite: bool) -> None:
        self.engine = engine
        self.keep = keep
        self.keep_nowait = keep_nowait
        self.sqlite = sqlite
        self._free: list[tuple[Any, Any]] = []
        self._free_nowait: list[tuple[Any, Any]] = []
        self._lock = threading.Lock()
        self._waiting: deque[tuple[list[tuple[Any, Any]], threading.Event]] = deque()
        self._pid = os.getpid()
        self._local = threading.local()
        # How many connections the engine's pool lends at most (None: no limit), and how many this
        # holder has out (in use or kept free). Past the limit a thread waits for one to come
        # back here: asking the pool would wait for a slot that connections kept free here hold,
        # and those only go back to the pool when too many are kept (it timed out after 30 s).
        pool = engine.pool
        overflow = getattr(pool, "_max_overflow", -1)
        self._cap: int | None = (
            pool.size() + overflow if isinstance(pool, sa.pool.QueuePool) and overflow >= 0 else None
        )
        self._out = 0

    def nowait_now(self) -> bool:
        return bool(getattr(self._local, "nowait", False))

    def nowait(self) -> _NoWait:
        """Transactions on this thread fail with :class:`WouldWait` instead of waiting for a lock."""
        return _NoWait(self._local)

    def get(self, nowait: bool) -> tuple[Any, Any]:
        with self._lock:
            if self._pid != os.getpid():
                # A forked child must not use its parent's connections (nor close them).
                self._free, self._free_nowait, self._pid, self._out = [], [], os.getpid(), 0
            free = self._free_nowait if nowait else self._free
            if free:  # (none while calls wait in line: put() hands a connection to the first)
                return free.pop()
            if not nowait and self._cap is not None and self._out >= self._cap:
                if self._free_nowait:  # one kept for the other kind of call: closed for this one
                    self._out -= 1
                    stale = self._free_nowait.pop()[0]
                    with suppress(Exception):
                        stale.invalidate()
                else:
                    # In line for the next connection a call gives back (handed over in order: a
                    # busy thread asking again must not take it first, for ever).
                    turn: list[tuple[Any, Any]] = []
                    ready = threading.Event()
                    self._waiting.append((turn, ready))
                    self._lock.release()
                    try:
                        ready.wait(POOL_WAIT_SECONDS)
                    finally:
                        self._lock.acquire()
                    if turn:
                        return turn[0]
                    with suppress(ValueError):
                        self._waiting.remove((turn, ready))
                    # None came back in time: the pool's own wait decides (and says so).
            self._out += 1
        try:
            conn = self.engine.raw_connection()
        except BaseException:
            self._release_slot()
            raise
        try:
            dbapi: Any = conn.dbapi_connection
            if self.sqlite:
                if nowait:
                    dbapi.execute("PRAGMA busy_timeout=0")
            else:
                dbapi.rollback()  # the pool's pre-ping may have opened a transaction
                dbapi.autocommit = True
            return conn, dbapi.cursor()
        except BaseException:
            self.discard(conn)
            raise

    def put(self, conn: Any, cur: Any, nowait: bool) -> None:
        with self._lock:
            if self._waiting and not nowait:
                turn, ready = self._waiting.popleft()
                turn.append((conn, cur))
                ready.set()
                return
            free = self._free_nowait if nowait else self._free
            if len(free) < (self.keep_nowait if nowait else self.keep):
                free.append((conn, cur))
                return
        self.discard(conn)

    def discard(self, conn: Any) -> None:
        """Close a connection (not back to the pool: its settings are this class's)."""
        with suppress(Exception):  # already broken: nothing more to release
            conn.invalidate()
        self._release_slot()

    def _release_slot(self) -> None:
        with self._lock:
            self._out = max(self._out - 1, 0)
            if self._waiting:  # a slot for the engine's pool: the first in line opens one
                self._waiting.popleft()[1].set()

    def close(self) -> None:
        with self._lock:
            held, self._free, self._free_nowait = self._free + self._free_nowait, [], []
        for conn, _ in held:
            self.discard(conn)


@dataclass(frozen=True, slots=True)
class _Search:
    """What one search reads from the conversation's state row."""

    conv: int
    conversation: str
    """Its kept lists' key: the row key, creation time and life token (a conversation made again,
    or deleted and restored, is another)."""
    kind: str
    body: dict[str, Any]
    last: int
    cap: int
    upto: Any
    """What a list must cover: messages up to this sequence; summaries: the search key."""

    @property
    def summary(self) -> bool:
        return self.kind != "message"

    @property
    def summary_rows(self) -> int:
        """The conversation's topics and archives, as its state counts them."""
        return int(self.body.get("topics", 0)) + int(self.body.get("archives", 0))


class _Rollback(Exception):
    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome


class SQLStore:
    """Store backed by SQLite or PostgreSQL. Every call is one short transaction."""

    blocking = True

    def __init__(self, engine: sa.Engine | str, *, migrate: bool = True) -> None:
        self._owns_engine = isinstance(engine, str)
        self.engine = create_engine(engine) if isinstance(engine, str) else engine
        prepare_engine(self.engine)
        self.caps: Capabilities = capabilities(self.engine)
        self._migrate = migrate
        self.q = Statements(self.caps.name)
        self._sqlite = self.caps.name == "sqlite"
        #: Each recent query word's newest matching rows per conversation (see :mod:`.recall`).
        self._recall = CandidateCache()
        #: SQLite: the row key of conversations written here (see ``_update_state``).
        self._keys: dict[str, int] = {}
        #: In-memory SQLite: one shared connection, so callers must take turns (one thread).
        self.single_connection = self.caps.single_connection
        # An engine made here is used through connections held across transactions; one a caller
        # passed is checked out and returned per transaction, its pool and events as they expect.
        self._held = (
            _Held(self.engine, self.caps.threads, NOWAIT_CONNECTIONS, self._sqlite)
            if self._owns_engine and not self.single_connection
            else None
        )
        self._begin_write = "BEGIN IMMEDIATE" if self._sqlite else "BEGIN"
        self._begin_read = "BEGIN" if self._sqlite else "BEGIN ISOLATION LEVEL REPEATABLE READ"
        #: Run a block's transactions without waiting for locks (:class:`~.base.WouldWait` instead):
        #: None when this store cannot (PostgreSQL always waits on the network).
        self.nowait: Callable[[], AbstractContextManager[None]] | None = (
            self._held.nowait if self._held is not None and self._sqlite else None
        )

    # -- plumbing ------------------------------------------------------------------------------

    def initialize(self) -> None:
        if self._migrate:
            from .migrate import upgrade

            try:
                upgrade(self.engine)
            except sa.exc.SQLAlchemyError as e:
                raise translate(e, "migrating the schema") from None

    def close(self) -> None:
        if self._held is not None:
            self._held.close()
        if self._owns_engine:
            self.engine.dispose()

    def _tx(self, action: str, fn: Callable[[Any], T], *, write: bool, single: bool = False) -> T:
        """Run ``fn(cursor)`` in one transaction; transient failures are retried where the dialect allows.

        ``single``: ``fn`` runs one statement, which is a transaction by itself on a held
        PostgreSQL connection (autocommit): no BEGIN and COMMIT round trips.
        """
        return self._retried(action, fn, write, single, None)

    def _retried(
        self,
        action: str,
        fn: Callable[[Any], T],
        write: bool,
        single: bool,
        landed: Callable[[Any], T | None] | None,
    ) -> T:
        """``fn`` in a transaction, retried on transient failures where the dialect allows.

        A write whose connection dropped may have committed all the same (the COMMIT, or the
        single statement, reached the server; its answer did not): a retry first asks
        ``landed`` whether it did, so a write is never applied twice.
        """
        tries = 0

        def attempt() -> T:
            nonlocal tries
            tries += 1
            run, alone = fn, single
            if tries > 1 and landed is not None:
                check = landed

                def run(cur: Any) -> T:
                    found = check(cur)
                    return fn(cur) if found is None else found

                alone = False
            if self._held is None:
                return self._pooled(action, run, write)
            return self._on_held(action, run, write, alone)

        return self.caps.retry(attempt)

    def _pooled(self, action: str, fn: Callable[[Any], T], write: bool) -> T:
        """A transaction on a connection checked out of (and returned to) a caller's engine."""
        try:
            with self.engine.connect() as conn:
                dbapi = conn.connection.dbapi_connection
                assert dbapi is not None
                cur = dbapi.cursor()
                try:
                    if self._sqlite:
                        cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                    elif not write:
                        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    try:
                        result = fn(cur)
                    except BaseException:
                        dbapi.rollback() if not self._sqlite else cur.execute("ROLLBACK")
                        raise
                    if self._sqlite:
                        cur.execute("COMMIT")
                    else:
                        dbapi.commit()
                    return result
                finally:
                    cur.close()
        except (StoreError, LeaseLostError, _Rollback):
            raise
        except Exception as e:
            if _is_db_error(e):
                raise translate(e, action) from None
            raise

    def _on_held(self, action: str, fn: Callable[[Any], T], write: bool, single: bool) -> T:
        """A transaction on a connection this store holds (see :class:`_Held`): explicit BEGIN
        and COMMIT, both drivers in autocommit mode."""
        held = self._held
        assert held is not None
        nowait = held.nowait_now()
        try:
            conn, cur = held.get(nowait)
        except Exception as e:
            if _is_db_error(e):
                raise translate(e, action) from None
            raise
        ok = False
        try:
            if not single:
                cur.execute(self._begin_write if write else self._begin_read)
            try:
                result = fn(cur)
            except BaseException:
                if not single:
                    _rollback_quietly(cur)
                raise
            if not single:
                cur.execute("COMMIT")
            ok = True
            return result
        except (StoreError, LeaseLostError, _Rollback):
            ok = True  # raised by ``fn`` after a clean rollback: the connection is fine
            raise
        except Exception as e:
            if _is_db_error(e):
                ok = self._usable(conn)
                if not ok and not self._sqlite:
                    held.close()  # the server restarted or dropped us: the idle ones are gone too
                if nowait and self._sqlite and _is_busy(e):
                    raise WouldWait from None
                raise translate(e, action) from None
            raise
        finally:
            if ok:
                held.put(conn, cur, nowait)
            else:
                held.discard(conn)

    def _usable(self, conn: Any) -> bool:
        """Whether a connection a statement failed on can run the next transaction."""
        dbapi = conn.dbapi_connection
        if self._sqlite:
            return not dbapi.in_transaction
        return not dbapi.closed and not dbapi.broken and dbapi.info.transaction_status == _PG_IDLE

    # -- conversions ---------------------------------------------------------------------------

    def _ts(self, value: datetime | None) -> Any:
        if value is None:
            return None
        if self._sqlite:
            return _sqlite_text(value)
        return value.astimezone(UTC)

    @staticmethod
    def _dt(value: Any) -> datetime | None:
        if value is None:
            return None
        moment: datetime = datetime.fromisoformat(value) if isinstance(value, str) else value
        return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)

    def _state(self, row: Sequence[Any]) -> ConversationState:
        return ConversationState.from_row(
            id=row[1],
            version=int(row[2]),
            platform=row[3],
            encoding=row[4],
            created_at=self._dt(row[5]),
            updated_at=self._dt(row[6]),
            lease_owner=row[7],
            lease_expires_at=self._dt(row[8]),
            body=row[9],
        )

    def _message(self, cid: str, r: Sequence[Any]) -> StoredMessage:
        wire: dict[str, Any] = json.loads(r[8]) if r[8] else {}
        name = wire.pop("name", None)
        tool_calls = wire.pop("tool_calls", None)
        tool_call_id = wire.pop("tool_call_id", None)
        return StoredMessage(
            cid,
            r[0],
            r[1],
            r[7],
            self._dt(r[2]),  # type: ignore[arg-type]
            r[3],
            r[4],
            name,
            tool_calls,
            tool_call_id,
            bool(r[5]),
            json.loads(r[9]) if r[9] else {},
            None,
            wire or None,
            r[6],
        )

    def _message_after_id(self, cid: str, r: Sequence[Any]) -> StoredMessage:
        """A message from a row whose first column is its id."""
        return self._message(cid, r[1:])

    def _summary(self, cid: str, r: Sequence[Any]) -> Summary:
        return Summary(
            id=int(r[0]),
            conversation_id=cid,
            tier="topic" if r[1] == "topic" else "bulk",
            sequence=r[2],
            first_sequence=r[3],
            last_sequence=r[4],
            content=r[5],
            rendered=r[6] or "",
            token_count=r[7],
            source_tokens=r[8],
            started_at=self._dt(r[9]),  # type: ignore[arg-type]
            ended_at=self._dt(r[10]),  # type: ignore[arg-type]
            status=r[11],
            sealed_at=self._dt(r[12]),
            sealed_reason=r[13],
            summarizer=r[14],
            model=r[15],
            prompt_tokens=r[16],
            completion_tokens=r[17],
            cost=float(r[18]),
            latency_ms=float(r[19]),
            attempts=r[20],
            merged_into=None if r[21] is None else int(r[21]),
            dropped_at=self._dt(r[22]),
            created_at=self._dt(r[23]),
            next_attempt_at=self._dt(r[24]),
            last_error=r[25],
            level=int(r[26]),
        )

    # -- reads ---------------------------------------------------------------------------------

    def _read_state_row(self, cur: Any, conversation_id: str) -> Sequence[Any] | None:
        cur.execute(self.q.state, {"id": conversation_id})
        row: Sequence[Any] | None = cur.fetchone()
        return row

    def read_state(self, conversation_id: str) -> ConversationState | None:
        def run(cur: Any) -> ConversationState | None:
            row = self._read_state_row(cur, conversation_id)
            return None if row is None else self._state(row)

        return self._tx("reading a conversation", run, write=False)

    def _page(
        self, cur: Any, sql: str, params: dict[str, Any], hi: int, cap: int, tool_units: bool
    ) -> list[Sequence[Any]]:
        """Rows newest first (``... <= :hi``), in pages, until ``cap`` tokens are in hand."""
        out: list[Sequence[Any]] = []
        tokens = 0
        page = _FIRST_PAGE
        while True:
            cur.execute(sql, {**params, "hi": hi, "lim": page})
            rows = cur.fetchall()
            out.extend(rows)
            tokens += sum(r[3] if tool_units else r[7] for r in rows)
            if len(rows) < page:
                break
            # Keep reading past the cap only to complete a tool call with its results.
            if tokens >= cap and not (tool_units and rows[-1][1] in RESULT_ROLES):
                break
            hi = rows[-1][0 if tool_units else 2] - 1
            per_row = max(tokens // len(out), 1)
            want = (max(cap - tokens, 0) // per_row) + 1 + (len(out) // 8)
            page = min(max(want, _FIRST_PAGE), _MAX_PAGE)
        return out

    def read_context(
        self, conversation_id: str, request: ContextRequest, expect_version: int | None = None
    ) -> Snapshot | None:
        q = self.q
        if self._one_statement(request, expect_version):
            found = self._tx(
                "reading the context",
                partial(self._context_head, conversation_id, request, expect_version),
                write=False,
                single=True,
            )
            if found is None or isinstance(found, Snapshot):
                return found

        def run(cur: Any) -> Snapshot | None:
            row = self._read_state_row(cur, conversation_id)
            if row is None:
                return None
            state = self._state(row)
            if expect_version is not None and state.version != expect_version:
                return None
            conv = row[0]
            pinned: list[StoredMessage] = []
            seqs = list(state.pinned_sequences)
            if seqs:
                cur.execute(q.pinned, {"conv": conv, "seqs": seqs if not self._sqlite else json.dumps(seqs)})
                pinned = sorted((self._message(conversation_id, r) for r in cur.fetchall()), key=_seq)
            windows = []
            for w in request.windows:
                rows = self._page(
                    cur, q.window, {"conv": conv, "lo": w.lo, "false": False}, w.hi, w.token_cap, True
                )
                msgs = [self._message(conversation_id, r) for r in reversed(rows)]
                windows.append(newest_window(msgs, w.token_cap))
            summaries = []
            for sw in request.summaries:
                summaries.append(self._summary_window(cur, conv, conversation_id, sw))
            by_id: list[Summary] = []
            if request.summary_ids:
                ids = list(request.summary_ids)
                cur.execute(
                    q.summaries_by_id, {"conv": conv, "seqs": ids if not self._sqlite else json.dumps(ids)}
                )
                by_id = [self._summary(conversation_id, r) for r in cur.fetchall()]
            return Snapshot(state, pinned, windows, summaries, by_id)

        return self._tx("reading the context", run, write=False)

    def _one_statement(self, request: ContextRequest, expect_version: int | None) -> bool:
        """Whether ``read_context`` can be one statement (PostgreSQL, on held connections): a
        version to check, the pinned sequences expected, one window whose first page holds all
        of it (fewer rows than a page: the read after a write extends the window kept), nothing
        else to read."""
        if self.q.pg_context_head is None or self._held is None or expect_version is None:
            return False
        if request.pinned is None or request.summaries or request.summary_ids:
            return False
        if len(request.windows) != 1:
            return False
        w = request.windows[0]
        return w.hi - w.lo < _FIRST_PAGE

    def _context_head(
        self, conversation_id: str, request: ContextRequest, expect_version: int | None, cur: Any
    ) -> object:
        """``read_context`` as one statement (see :meth:`_one_statement`), or :data:`_UNSURE`
        when the state pins other messages than the request expected (then read as usual)."""
        w = request.windows[0]
        pins = list(request.pinned or ())
        params = {"id": conversation_id, "lo": w.lo, "hi": w.hi, "lim": _FIRST_PAGE, "false": False}
        if pins:
            cur.execute(self.q.pg_context_head_pinned, {**params, "pins": pins})
        else:
            cur.execute(self.q.pg_context_head, params)
        head: Sequence[Any] | None = None
        page: list[Sequence[Any]] = []
        pinned_rows: list[Sequence[Any]] = []
        for r in cur.fetchall():
            if r[0] == 0:
                head = r[1:_HEAD_ROW]
            elif r[0] == 1:
                page.append(r[_HEAD_ROW:])
            else:
                pinned_rows.append(r[_HEAD_ROW:])
        if head is None:
            return None
        state = self._state(head)
        if state.version != expect_version:
            return None
        if state.pinned_sequences != tuple(pins):
            return _UNSURE
        pinned = sorted((self._message(conversation_id, r) for r in pinned_rows), key=_seq) if pins else []
        page.sort(key=itemgetter(0))  # oldest first (the union returns its parts in no set order)
        msgs = [self._message(conversation_id, r) for r in page]
        return Snapshot(state, pinned, [newest_window(msgs, w.token_cap)], [], [])

    def _summary_window(self, cur: Any, conv: int, cid: str, sw: SummaryWindow) -> list[Summary]:
        sql = self.q.summaries_live
        if sw.upto is not None:
            sql = self.q.summaries_dropped
        elif sw.merged:
            sql = self.q.summaries_merged
        hi = sw.upto if sw.upto is not None else 2**31 - 1
        rows = self._page(
            cur, sql, {"conv": conv, "kind": sw.kind, "after": sw.after}, hi, sw.token_cap, False
        )
        return newest_summaries([self._summary(cid, r) for r in reversed(rows)], sw.token_cap)

    def _key(self, cur: Any, conversation_id: str) -> int | None:
        cur.execute(self.q.key_of, {"id": conversation_id})
        row = cur.fetchone()
        return None if row is None else int(row[0])

    def read_messages(self, conversation_id: str, first: int, last: int) -> list[StoredMessage]:
        def run(cur: Any) -> list[StoredMessage]:
            conv = self._key(cur, conversation_id)
            if conv is None:
                return []
            cur.execute(self.q.range, {"conv": conv, "lo": first, "hi": last})
            return [self._message(conversation_id, r) for r in cur.fetchall()]

        return self._tx("reading messages", run, write=False)

    def read_summaries(self, conversation_id: str, kind: str, after: int = 0) -> list[Summary]:
        def run(cur: Any) -> list[Summary]:
            conv = self._key(cur, conversation_id)
            if conv is None:
                return []
            cur.execute(self.q.summaries_all, {"conv": conv, "kind": kind, "after": after})
            return [self._summary(conversation_id, r) for r in cur.fetchall()]

        return self._tx("reading summaries", run, write=False)

    def search(self, conversation_id: str, query: Query, limit: int, kind: str = "message") -> list[Hit]:
        return self.search_each(conversation_id, query, {kind: limit})[kind]

    def search_each(
        self, conversation_id: str, query: Query, limits: Mapping[str, int]
    ) -> dict[str, list[Hit]]:
        if query.empty:
            return {kind: [] for kind in limits}
        cid = conversation_id

        def run(cur: Any) -> dict[str, list[Hit]]:
            row = self._read_state_row(cur, cid)
            if row is None:
                return {kind: [] for kind in limits}
            if query.literal is not None:
                return {
                    kind: self._literal(cur, cid, int(row[0]), query.literal, n) for kind, n in limits.items()
                }
            body = json.loads(row[9])  # the state document, read once for every kind
            return {kind: self._ranked(cur, cid, row, body, query, n, kind) for kind, n in limits.items()}

        return self._tx("searching", run, write=False)

    def _literal(self, cur: Any, cid: str, conv: int, literal: str, limit: int) -> list[Hit]:
        """Messages holding ``literal`` (a query without a word), newest first."""
        text = literal.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        cur.execute(self.q.search_literal, {"conv": conv, "pattern": f"%{text}%", "lim": limit})
        return [Hit(1.0, message=self._message(cid, r)) for r in cur.fetchall()]

    def _ranked(
        self,
        cur: Any,
        cid: str,
        row: Sequence[Any],
        body: dict[str, Any],
        query: Query,
        limit: int,
        kind: str,
    ) -> list[Hit]:
        """BM25 over each query word's newest matching rows (see :mod:`.recall`): the lists kept
        from earlier searches, the rest found by the database (SQLite: FTS5, its docsize table
        giving the lengths; PostgreSQL: the tsvectors, giving lengths and counts); on SQLite the
        texts of only those candidates that could still be among the best ``limit`` are read to
        count the words."""
        last = max(int(body["last"]), 1)
        summary = kind != "message"
        at = _Search(
            int(row[0]),
            f"{row[0]}:{row[5]}:{_life(row[10])}",
            kind,
            body,
            last,
            max(CANDIDATES_PER_WORD, limit),
            search_key(body) if summary else last,
        )
        weights = query.group_weights()
        lists, stale = self._lists(at, list(weights))
        fresh = self._summary_additions(cur, at, stale) if summary and stale else {}
        if stale:
            fresh.update(self._fts_lists(cur, at, stale) if self._sqlite else self._pg_lists(cur, at, stale))
        lists.update(fresh)
        for g, c in fresh.items():
            self._recall.put(CandidateCache.key(at.conversation, kind, g), c)
        # Messages: the conversation's own mean length; the candidates' only for summaries.
        n, avg = collection(summary, body, _lengths(lists) if summary else [], last)

        def count(batch: list[int]) -> dict[int, Callable[[Group], int]]:
            q = self.q
            cur.execute(
                q.fts_text_summaries if summary else q.fts_text_messages,
                {"ids": json.dumps(batch), "conv": at.conv},
            )
            return {int(r[0]): occurrences(r[1]) for r in cur.fetchall()}

        # PostgreSQL's lists come with every count.
        best = rank(lists, weights, n, avg, last, limit, count if self._sqlite else None)
        return self._hits(cur, at, cid, best)

    def _lists(
        self, at: _Search, groups: Sequence[Group]
    ) -> tuple[dict[Group, Candidates], dict[Group, Candidates | None]]:
        """The candidate lists kept for ``groups`` that still hold, and the rest: ``None`` to search
        from scratch, or a message list to bring up to date (it covers messages up to its ``upto``)."""
        kept: dict[Group, Candidates] = {}
        stale: dict[Group, Candidates | None] = {}
        for g in groups:
            c = self._recall.get(CandidateCache.key(at.conversation, at.kind, g))
            if c is None or c.cap != at.cap:
                stale[g] = None
            elif c.upto == at.upto:
                kept[g] = c
            elif at.summary or c.upto < at.upto:
                stale[g] = c  # summaries: see ``_summary_additions``
            else:
                stale[g] = None
        return kept, stale

    def _few_summaries(self, at: _Search) -> bool:
        """Whether one read of all the conversation's summaries makes its summary lists (SQLite: at
        most :data:`SMALL_SCAN` of them; PostgreSQL: at most the cap and
        :data:`SMALL_CONVERSATION`) rather than a search per word."""
        return at.summary_rows <= (SMALL_SCAN if self._sqlite else min(at.cap, SMALL_CONVERSATION))

    def _summary_additions(
        self, cur: Any, at: _Search, stale: dict[Group, Candidates | None]
    ) -> dict[Group, Candidates]:
        """Kept summary lists brought up to date, taken out of ``stale``, when the only change to
        the summaries since they were made is that pending topics got their first summaries
        (maintenance's usual step, about one reply in fifteen): the new rows are read once and
        each word counted in Python, rather than every list made again by the index. The rest of
        ``stale`` is left to be made from scratch (``None``).

        The search key says so without reading a row: every event moves its first field by one;
        a pending topic's first summary (and only it, of the events that leave the archive count,
        the merged and the dropped marks alone) also moves ``compressions`` by one, while a
        replacement in place, a reopened topic, a pin or a silence seal move the first field
        alone. The summaries since are then the live ones after the old summarised mark, which
        must be exactly as many as the key moved by. SQLite counts only plain texts (as FTS5
        splits them) and single words; PostgreSQL counts the index's own words."""
        fresh: dict[Group, Candidates] = {}
        olds = {g: c for g, c in stale.items() if c is not None}
        for g in olds:
            stale[g] = None
        if self._few_summaries(at):
            return fresh  # one read of all its summaries makes every word's list anyway
        singles = {g: g[0] for g in olds if len(g) == 1 and g[0].isalnum()}
        now: tuple[int, ...] = at.upto
        for before in {olds[g].upto for g in singles}:
            if not _only_added(before, now):
                continue
            wanted = {g: w for g, w in singles.items() if olds[g].upto == before}
            rows = self._added_rows(cur, at, before[2], now[0] - before[0], set(wanted.values()))
            if rows is None:
                continue
            for g, w in wanted.items():
                found = [(i, rec, dl, n) for i, rec, dl, counts in rows if (n := counts.get(w, 0))]
                extended = with_added(olds[g], found, now, not self._sqlite)
                if extended is not None:
                    del stale[g]
                    fresh[g] = extended
            self._recall.alias(at.conversation, before, now)
        return fresh

    def _added_rows(
        self, cur: Any, at: _Search, after: int, expected: int, wanted: set[str]
    ) -> list[tuple[int, int, int, Mapping[str, int]]] | None:
        """The live summaries covering messages after ``after`` as (id, last sequence, length,
        each ``wanted`` word's count), if there are exactly ``expected`` of them; else ``None``."""
        if self._sqlite:
            cur.execute(self.q.added_summaries, {"conv": at.conv, "after": after, "lim": expected + 1})
            found = cur.fetchall()
            if len(found) != expected or not all(_plain(r[3]) for r in found):
                return None
            return [(int(r[0]), int(r[1]), _first_varint(r[2]), Counter(words(r[3]))) for r in found]
        lexemes = {f"w{w}": w for w in wanted}
        params = {"conv": at.conv, "after": after, "lexemes": list(lexemes), "lim": expected + 1}
        cur.execute(self.q.pg_added_summaries, params)
        found = cur.fetchall()
        if len(found) != expected:
            return None
        return [
            (
                int(r[0]),
                int(r[1]),
                int(r[2]),
                {lexemes[x]: int(n) for x, n in zip(r[3] or (), r[4] or (), strict=True)},
            )
            for r in found
        ]

    def _fts_lists(
        self, cur: Any, at: _Search, stale: dict[Group, Candidates | None]
    ) -> dict[Group, Candidates]:
        """SQLite: the ``stale`` lists from FTS5, each word's newest matches (after the newest
        message a kept list covers), with their recency and length; words not counted yet."""
        q, summary = self.q, at.summary
        order = list(stale)  # the lists' order is the order scores are summed in: kept the same
        fresh = self._fts_few_summaries(cur, at, stale) if summary else self._fts_new_messages(cur, at, stale)
        if not stale:
            return {g: fresh[g] for g in order}
        after = 0
        if not summary:
            cur.execute(q.message_id_at, {"conv": at.conv, "seq": at.last})
            found_id = cur.fetchone()
            after = int(found_id[0]) if found_id else 0
        # The newest message id of all, when a kept list is to be brought up to date.
        top = self._newest_id(cur) if any(old is not None and old.after for old in stale.values()) else 0
        scratch = summary or any(old is None or not old.after for old in stale.values())
        first = self._dense_from(cur, at) if scratch else None
        for g, old in stale.items():
            # Words hold letters and digits only: quoted, nothing in them is FTS5 syntax.
            term = f'content : "{" ".join(g)}"'
            match = f'conv : "{at.conv}" AND {term}'
            if (summary or old is None or not old.after) and first is not None:
                sql = q.fts_summaries_from if summary else q.fts_messages_from
                cur.execute(sql, {"term": term, "first": first, "conv": at.conv, "lim": at.cap})
            elif summary:
                cur.execute(q.fts_summaries, {"q": match, "lim": at.cap})
            elif old is None or not old.after:
                cur.execute(q.fts_messages, {"q": match, "lim": at.cap})
            elif _few_others(at, old, top):
                params = {"q": term, "lim": at.cap, "after": old.after, "conv": at.conv}
                cur.execute(q.fts_messages_after_few, params)
            else:
                cur.execute(q.fts_messages_after, {"q": match, "lim": at.cap, "after": old.after})
            rows = cur.fetchall()
            # Summaries: only live ones are candidates, but every row found counts toward the cap.
            # The length inlined where it is one byte (most texts: a call per row costs more).
            found = [
                (r[0], r[1], b[0] if (b := r[2]) and b[0] < 0x80 else _first_varint(b), 0)
                for r in rows
                if not summary or r[3]
            ]
            fresh[g] = _extended(old, candidates(at.cap, at.upto, found, len(rows), after))
        return {g: fresh[g] for g in order}

    def _dense_from(self, cur: Any, at: _Search) -> int | None:
        """SQLite: the conversation's first row id (messages or summaries, as ``at`` searches), when
        it holds most of the rows written since (of other conversations at most as many as its
        own, and :data:`RECENT_SCAN` more): then a word's newest matches are found from there by
        rowid, each row's conversation read from the join (see ``fts_messages_from``). A
        conversation's rows are written in order (of sequence; of ordinal, per kind of summary),
        each with a greater id than any row then stored, so its first ones have the least ids: two
        index seeks at most, read each time (a conversation deleted and restored elsewhere may
        start lower)."""
        if not self._sqlite:
            return None
        own = at.summary_rows if at.summary else at.last
        if own <= SMALL_SCAN:
            return None
        cur.execute(self.q.first_summary_id if at.summary else self.q.first_message_id, {"conv": at.conv})
        found = cur.fetchone()
        if not found or found[0] is None:
            return None
        first = int(found[0])
        cur.execute(self.q.newest_summary_id if at.summary else self.q.newest_message_id)
        top = cur.fetchone()
        if not top or top[0] is None:
            return None
        return first if int(top[0]) - first < 2 * own + RECENT_SCAN else None

    def _newest_id(self, cur: Any) -> int:
        cur.execute(self.q.newest_message_id)
        found = cur.fetchone()
        return int(found[0]) if found and found[0] is not None else 0

    def _fts_new_messages(
        self, cur: Any, at: _Search, stale: dict[Group, Candidates | None]
    ) -> dict[Group, Candidates]:
        """SQLite: kept single-word message lists brought up to date from the messages written
        since (at most :data:`RECENT_SCAN`), read once and counted in Python, rather than one
        FTS5 query per word (about 70 us each at 100,000 messages, most of it FTS5's own cost
        of a query, however few rows it finds). In a conversation of at most :data:`SMALL_SCAN`
        messages, lists not kept are made the same way, from all of them: a process serving many
        conversations has most of their lists gone (or never made) at each reply. Taken out of
        ``stale``; the rest stays there.

        Exact only where FTS5 and :func:`~..core.ranking.words` split a text alike: texts of
        ASCII and common punctuation (:func:`_plain`); any other text among the new ones leaves
        every list to FTS5."""
        small = at.last <= SMALL_SCAN
        since = {
            g: 0 if old is None else int(old.upto)
            for g, old in stale.items()
            if len(g) == 1
            and g[0].isalnum()
            and (small if old is None else at.last - int(old.upto) <= RECENT_SCAN)
        }
        if not since:
            return {}
        lo = min(since.values())
        new = self._recent_messages(cur, at, lo)
        if any(tally is None for _, _, _, tally, _ in new):
            return {}
        # The newest message's id: where FTS5 would look after, next time (0: there is none).
        after = new[0][0] if new and new[0][1] == at.last else 0
        fresh: dict[Group, Candidates] = {}
        for g, upto in since.items():
            found = []
            word = g[0]
            for i, seq, dl, tally, _ in new:
                if seq <= upto:
                    break
                tf = tally.get(word, 0) if tally is not None else 0
                if tf:
                    found.append((i, seq, dl, tf))
            fresh[g] = _extended(
                stale.pop(g), candidates(at.cap, at.upto, found[: at.cap], len(found), after)
            )
        return fresh

    def _recent_messages(self, cur: Any, at: _Search, lo: int) -> list[RecentRow]:
        """SQLite: the conversation's messages after sequence ``lo`` (up to ``at.last``), newest
        first, each text split once (a plain text splits as FTS5 splits it: a search looks up many
        words in every row, which finding each on its own would cost more). Those split by an
        earlier search (the newest ones, kept: messages never change) are not split again."""
        cur.execute(self.q.fts_new_messages, {"conv": at.conv, "after": lo, "last": at.last})
        rows = cur.fetchall()
        kept = self._recall.recent(at.conversation) or {}
        out: list[RecentRow] = []
        for r in rows:
            found = kept.get(r[1])
            out.append(found if found is not None and found[0] == r[0] else _split_row(r))
        # The newest kept for the next replies (those read now and before): as far back as a list
        # brought up to date this way reaches, within a few dozen KB of text.
        keep: dict[int, RecentRow] = {}
        chars, floor = 0, at.last - RECENT_SCAN
        for row in sorted({**kept, **{row[1]: row for row in out}}.values(), key=_by_seq, reverse=True):
            chars += row[4]
            if row[1] <= floor or chars > RECENT_CHARS:
                break
            keep[row[1]] = row
        self._recall.keep_recent(at.conversation, keep)
        return out

    def _fts_few_summaries(
        self, cur: Any, at: _Search, stale: dict[Group, Candidates | None]
    ) -> dict[Group, Candidates]:
        """SQLite: single-word summary lists of a conversation of at most :data:`SMALL_SCAN`
        summaries, from one read of them all counted in Python (as :meth:`_fts_new_messages`
        does for messages, with the same exactness guard), rather than one FTS5 query per word.
        As FTS5 finds them: each word's newest ``cap`` matching rows count toward the cap, the
        live ones are its candidates. Taken out of ``stale``; phrases stay there."""
        wanted = [g for g in stale if len(g) == 1 and g[0].isalnum()]
        if not wanted or not self._few_summaries(at):
            return {}
        cur.execute(self.q.fts_few_summaries, {"conv": at.conv, "lim": SMALL_SCAN + 1})
        rows = cur.fetchall()
        if len(rows) > SMALL_SCAN or not all(_plain(r[3]) for r in rows):
            return {}
        scanned = [
            (int(r[0]), int(r[1]), _first_varint(r[2]), Counter(words(r[3])), bool(r[4])) for r in rows
        ]
        fresh: dict[Group, Candidates] = {}
        for g in wanted:
            matched = [
                (i, rec, dl, n, live) for i, rec, dl, tally, live in scanned if (n := tally.get(g[0], 0))
            ]
            matched = matched[: at.cap]
            found = [(i, rec, dl, n) for i, rec, dl, n, live in matched if live]
            del stale[g]  # summary lists are kept whole or not at all: nothing to extend
            fresh[g] = candidates(at.cap, at.upto, found, len(matched))
        return fresh

    def _pg_lists(
        self, cur: Any, at: _Search, stale: dict[Group, Candidates | None]
    ) -> dict[Group, Candidates]:
        """PostgreSQL: the ``stale`` lists, with their counts. A small conversation's, and the
        messages written since a kept list, come from one planned statement over the rows
        themselves; the rest from one statement of each word's newest matches."""
        fresh: dict[Group, Candidates] = {}
        if at.summary:
            if self._few_summaries(at):
                fresh.update(self._pg_few_summaries(cur, at, stale))
        else:
            fresh.update(self._pg_new_messages(cur, at, stale))
        if stale:
            groups = list(stale)
            since = [None if old is None else int(old.upto) for old in stale.values()]
            cur.execute(self.q.pg_candidates(groups, at.summary, since), {"conv": at.conv, "cap": at.cap})
            per: dict[int, list[tuple[int, int, int, int]]] = {}
            lexemes = [[f"w{w}" for w in g] for g in groups]
            for k, i, recency, tsv in cur.fetchall():
                per.setdefault(k, []).append((int(i), int(recency), *_tally(tsv, lexemes[k])))
            for k, g in enumerate(groups):
                rows = sorted(per.get(k, []), key=lambda x: (-x[1], -x[0]))
                # Read committed: rows written after the state was read wait for the next call.
                kept = rows if at.summary else [x for x in rows if x[1] <= at.last]
                fresh[g] = _extended(stale[g], candidates(at.cap, at.upto, kept, len(rows)))
        return fresh

    def _pg_new_messages(
        self, cur: Any, at: _Search, stale: dict[Group, Candidates | None]
    ) -> dict[Group, Candidates]:
        """Single-word message lists from one planned statement over the messages themselves, taken
        out of ``stale``: a kept list brought up to date from the messages written since (usually a
        row or two), and in a conversation of at most :data:`SMALL_CONVERSATION` messages, a list
        made from scratch (reading them all costs less than planning a statement per word). What it
        cannot do (a phrase; more messages than it reads) stays in ``stale``."""
        small = at.last <= SMALL_CONVERSATION
        words_of = {g: f"w{g[0]}" for g, old in stale.items() if len(g) == 1 and (old is not None or small)}
        if not words_of:
            return {}
        since: dict[Group, int] = {}
        for group in words_of:
            kept = stale[group]
            since[group] = 0 if kept is None else int(kept.upto)
        lim = max(at.cap, SMALL_CONVERSATION)
        lexemes = list(words_of.values())
        params = {
            "conv": at.conv,
            "after": min(since.values()),
            "last": at.last,
            "lexemes": lexemes,
            "any_of": _any_of(lexemes),
            "lim": lim,
        }
        cur.execute(self.q.pg_new_messages, params)
        rows = cur.fetchall()
        if len(rows) >= lim:
            return {}  # many matches: each word's newest ones are found by the index instead
        fresh: dict[Group, Candidates] = {}
        for g, found in by_word(rows, {w: g for g, w in words_of.items()}).items():
            if since[g]:
                found = [x for x in found if x[1] > since[g]]
            fresh[g] = _extended(stale.pop(g), candidates(at.cap, at.last, found[: at.cap], len(found)))
        return fresh

    def _pg_few_summaries(
        self, cur: Any, at: _Search, stale: dict[Group, Candidates | None]
    ) -> dict[Group, Candidates]:
        """Single-word summary lists of a conversation with at most ``cap`` summaries, from one
        planned statement over those holding the words (taken out of ``stale``; phrases stay there)."""
        words_of = {g: f"w{g[0]}" for g in stale if len(g) == 1}
        if not words_of:
            return {}
        lexemes = list(words_of.values())
        params = {"conv": at.conv, "lexemes": lexemes, "any_of": _any_of(lexemes), "lim": at.cap + 1}
        cur.execute(self.q.pg_summaries, params)
        rows = cur.fetchall()
        if len(rows) > at.cap:
            return {}
        fresh: dict[Group, Candidates] = {}
        for g, found in by_word(rows, {w: g for g, w in words_of.items()}).items():
            del stale[g]
            fresh[g] = candidates(at.cap, at.upto, found, len(found))
        return fresh

    def _hits(self, cur: Any, at: _Search, cid: str, best: list[tuple[float, int, int]]) -> list[Hit]:
        """The rows of the best candidates (score, id, recency), in their order. Rows kept from
        earlier searches are not read again: messages never change, summaries not while the
        search key stays the same. A kept row must also sit where its candidate list says (its
        recency: a message's sequence, a summary's last one): SQLite may give a deleted
        conversation's key and row ids to a restored one with the same creation time, whose rows
        are then other messages."""
        if not best:
            return []
        q, ids = self.q, [i for _, i, _ in best]
        where = {i: r for _, i, r in best}
        if at.summary:
            sql = q.fts_rows_summaries if self._sqlite else q.pg_rows_summaries
            make: Callable[[Sequence[Any]], Any] = partial(self._summary, cid)
            owner = self._recall.lineage(at.conversation, at.upto)
        else:
            sql = q.fts_rows_messages if self._sqlite else q.pg_rows_messages
            make = partial(self._message_after_id, cid)
            owner = at.conversation
        kept = {
            i: row
            for i, row in self._recall.rows(owner, ids).items()
            if where.get(i) == (row.last_sequence if at.summary else row.sequence)
        }
        missing = [i for i in ids if i not in kept]
        if missing:
            for i, r in self._rows(cur, sql, at.conv, missing).items():
                kept[i] = row = make(r)
                # Only rows of a modest size are kept: the cache stays small whatever is stored.
                if sum(len(x) for x in r if isinstance(x, str)) <= CACHED_ROW_CHARS:
                    self._recall.keep_row(owner, i, row)
        if at.summary:
            return [Hit(score, summary=kept[i]) for score, i, _ in best if i in kept]
        return [Hit(score, message=kept[i]) for score, i, _ in best if i in kept]

    def _rows(self, cur: Any, sql: str, conv: int, ids: list[int]) -> dict[int, Sequence[Any]]:
        """Rows of ``conv`` by id (the first column)."""
        cur.execute(sql, {"ids": json.dumps(ids) if self._sqlite else ids, "conv": conv})
        return {int(r[0]): r for r in cur.fetchall()}

    def conversation_ids(self) -> list[str]:
        def run(cur: Any) -> list[str]:
            cur.execute(self.q.ids)
            return [r[0] for r in cur.fetchall()]

        return self._tx("listing conversations", run, write=False)

    def list_conversations(
        self, platform: str | None, after: str | None, limit: int
    ) -> list[ConversationState]:
        def run(cur: Any) -> list[ConversationState]:
            params = {"after": after or "", "lim": limit, "platform": platform}
            cur.execute(self.q.listing if platform is None else self.q.listing_platform, params)
            return [self._state(r) for r in cur.fetchall()]

        return self._tx("listing conversations", run, write=False)

    def stats(self, conversation_id: str | None) -> list[ConversationStats]:
        q = self.q

        def run(cur: Any) -> list[ConversationStats]:
            if conversation_id is None:
                cur.execute(q.stats_conversations)
            else:
                cur.execute(q.stats_one, {"id": conversation_id})
            out = []
            for row in cur.fetchall():
                state = self._state(row)
                cur.execute(q.stats_messages, {"conv": row[0], "upto": state.summarized_upto})
                n, full, current = cur.fetchone()
                cur.execute(q.stats_summaries, {"conv": row[0]})
                agg = {r[0]: r for r in cur.fetchall()}
                top, arc = agg.get("topic"), agg.get("bulk")
                out.append(
                    ConversationStats(
                        conversation_id=state.id,
                        platform=state.platform,
                        messages=int(n),
                        message_tokens=int(full),
                        topics=int(top[1]) if top else 0,
                        topics_pending=int(top[2]) if top else 0,
                        archives=int(arc[1]) if arc else 0,
                        archives_dropped=int(arc[4]) if arc else 0,
                        tier_tokens={
                            "current": int(current),
                            "topic": int(top[3]) if top else 0,
                            "bulk": int(arc[3]) if arc else 0,
                        },
                        compressions=state.compressions,
                        summarizer_prompt_tokens=sum(int(r[5]) for r in (top, arc) if r),
                        summarizer_completion_tokens=sum(int(r[6]) for r in (top, arc) if r),
                        summarizer_cost=float(sum(float(r[7]) for r in (top, arc) if r)),
                        summaries_provisional=sum(int(r[8]) for r in (top, arc) if r),
                    )
                )
            return out

        return self._tx("computing statistics", run, write=False)

    # -- writes --------------------------------------------------------------------------------

    def _state_params(
        self, conversation_id: str, st: ConversationState, body: str | None = None
    ) -> dict[str, Any]:
        return {
            "id": conversation_id,
            "version": st.version,
            "platform": st.platform,
            "encoding": st.encoding,
            "created_at": self._ts(st.created_at),
            "updated_at": self._ts(st.updated_at),
            "due_at": self._ts(st.due_at),
            "state": st.body() if body is None else body,
        }

    def _write(self, cur: Any, conversation_id: str, guard: Guard, writes: Writes) -> Committed:
        """Apply ``writes`` inside the open transaction, or raise :class:`_Rollback`."""
        q = self.q
        st = writes.state
        known = (
            self._keys.get(conversation_id)
            if self._sqlite and guard.lease_owner is None and not writes.create
            else None
        )
        body: str | None = None
        if known is not None:
            # The common write (SQLite): the row whose key is known, updated by position.
            body = st.body()
            ts = _sqlite_text
            due = st.due_at
            cur.execute(
                q.update_conversation_at_row,
                (
                    st.version,
                    st.platform,
                    ts(st.updated_at) if st.updated_at is not None else None,
                    ts(due) if due is not None else None,
                    body,
                    known,
                    conversation_id,
                    guard.version,
                ),
            )
        if known is not None and cur.rowcount == 1:
            conv = known
        elif writes.create:
            if guard.version is not None:
                raise _Rollback(Outcome.VERSION_CONFLICT)
            # A token of this conversation's life: SQLite gives a row key and message ids freed by
            # a deletion to the next rows, so a conversation deleted and restored (the same id
            # and creation time) elsewhere is told apart by it from what this process kept.
            params = self._state_params(conversation_id, st, body)
            cur.execute(q.insert_conversation, {**params, "meta": json.dumps({"life": secrets.token_hex(8)})})
            conv = self._keep_key(conversation_id, int(cur.fetchone()[0]))
        else:
            # The row found by its id: its key is not known here, or names no row of this id (the
            # conversation was deleted and made again).
            params = self._state_params(conversation_id, st, body)
            params["expect"] = guard.version
            cur.execute(q.update_conversation, params)
            row = cur.fetchone()
            if row is None:
                self._classify_miss(cur, conversation_id, guard)
                raise _Rollback(Outcome.VERSION_CONFLICT)
            conv = self._keep_key(conversation_id, int(row[0]))
            if guard.lease_owner is not None and row[1] != guard.lease_owner:
                raise LeaseLostError(conversation_id)
            if writes.release and guard.lease_owner is not None:
                cur.execute(q.release, {"id": conversation_id, "owner": guard.lease_owner})
        ms = writes.messages
        if self._sqlite:
            if len(ms) == 1:
                cur.execute(q.insert_message_row, self._message_row(conv, ms[0]))
            elif ms:
                cur.executemany(q.insert_message_row, [self._message_row(conv, m) for m in ms])
        elif len(ms) == 1:
            cur.execute(q.insert_message, self._message_params(conv, ms[0]))
        elif ms:
            cur.executemany(q.insert_message, [self._message_params(conv, m) for m in ms])
        ids: list[int] = []
        for s in writes.summaries:
            cur.execute(q.insert_summary, self._summary_params(conv, s, ids))
            ids.append(int(cur.fetchone()[0]))
        for u in writes.updates:
            cur.execute(q.summary_update(u), self._update_params(conv, u, ids))
            if cur.rowcount != 1 and u.required:
                raise _Rollback(Outcome.ROW_CONFLICT)
        return Committed(Outcome.COMMITTED, tuple(ids), writes)

    def _keep_key(self, conversation_id: str, key: int) -> int:
        """Remember ``key`` as the row key of ``conversation_id`` (SQLite); returns it."""
        if self._sqlite:
            if len(self._keys) >= KEYS_KEPT:
                self._keys.clear()
            self._keys[conversation_id] = key
        return key

    def _append_alone(self, cur: Any, conversation_id: str, guard: Guard, writes: Writes) -> Committed:
        """``writes`` (a state update and messages, nothing else) as one statement."""
        params = self._state_params(conversation_id, writes.state)
        params["expect"] = guard.version
        if not writes.messages:
            cur.execute(self.q.update_conversation, params)
            done = cur.fetchone() is not None
        elif len(writes.messages) == 1:
            params.update(self._message_params(0, writes.messages[0]))
            assert self.q.append_one is not None
            cur.execute(self.q.append_one, params)
            done = cur.rowcount == 1
        else:
            ms = writes.messages
            ts = self._ts
            params.update(
                seqs=[m.sequence for m in ms],
                roles=[m.role for m in ms],
                ats=[ts(m.timestamp) for m in ms],
                tokens=[m.token_count for m in ms],
                fulls=[m.full_token_count for m in ms],
                pins=[m.pinned for m in ms],
                pin_keys=[m.pin_key for m in ms],
                contents=[m.content for m in ms],
                wires=[_json(m.wire) for m in ms],
                metas=[_json(m.metadata) for m in ms],
            )
            assert self.q.append is not None
            cur.execute(self.q.append, params)
            done = cur.rowcount == len(ms)
        return Committed(Outcome.COMMITTED, (), writes) if done else Committed(Outcome.VERSION_CONFLICT)

    def _landed(self, cur: Any, conversation_id: str, writes: Writes | None) -> Committed | None:
        """Whether ``writes`` are in the database already (an earlier attempt committed them): the
        state row holds exactly their state document, at their version, stamped at their time."""
        if writes is None:
            return None
        cur.execute(self.q.landed, {"id": conversation_id})
        row = cur.fetchone()
        st = writes.state
        if (
            row is None
            or int(row[1]) != st.version
            or self._dt(row[3]) != self._dt(self._ts(st.updated_at))
            or row[2] != st.body()
        ):
            return None
        ids = []
        for x in writes.summaries:
            cur.execute(self.q.summary_id, {"conv": row[0], "kind": x.kind, "ordinal": x.ordinal})
            ids.append(int(cur.fetchone()[0]))
        return Committed(Outcome.COMMITTED, tuple(ids), writes)

    def _saving(
        self,
        conversation_id: str,
        run: Callable[[Any], Committed],
        attempted: Callable[[], Writes | None],
        single: bool = False,
    ) -> Committed:
        """Run a write; on a retry, first check whether the ``attempted`` writes landed."""
        try:
            return self._retried(
                "saving", run, True, single, lambda cur: self._landed(cur, conversation_id, attempted())
            )
        except _Rollback as r:
            return Committed(r.outcome)
        except StoreError as e:
            if is_integrity_error(e):  # a concurrent writer created the row or took the sequence
                return Committed(Outcome.VERSION_CONFLICT)
            raise

    def commit(self, conversation_id: str, guard: Guard, writes: Writes) -> Committed:
        if (
            self.q.append is not None
            and self._held is not None
            and guard.version is not None
            and guard.lease_owner is None
            and not (writes.create or writes.summaries or writes.updates)
        ):
            # The reply path's common write (messages, or a context read's mark) in one round trip.
            return self._saving(
                conversation_id,
                lambda cur: self._append_alone(cur, conversation_id, guard, writes),
                lambda: writes,
                True,
            )
        return self._saving(
            conversation_id, lambda cur: self._write(cur, conversation_id, guard, writes), lambda: writes
        )

    def update(
        self,
        conversation_id: str,
        plan: Callable[[ConversationState | None], Writes | None],
        lease_owner: str | None = None,
    ) -> Committed:
        attempted: list[Writes] = []

        def run(cur: Any) -> Committed:
            cur.execute(self.q.state_locked, {"id": conversation_id})
            row = cur.fetchone()
            state = None if row is None else self._state(row)
            if lease_owner is not None and (state is None or state.lease_owner != lease_owner):
                raise LeaseLostError(conversation_id)
            writes = plan(state)
            if writes is None:
                return Committed(Outcome.COMMITTED)
            attempted[:] = [writes]
            return self._write(
                cur, conversation_id, Guard(None if state is None else state.version, lease_owner), writes
            )

        return self._saving(conversation_id, run, lambda: attempted[0] if attempted else None)

    def _classify_miss(self, cur: Any, conversation_id: str, guard: Guard) -> None:
        """The conditional update matched nothing: a lease lost is an error, a new version a retry."""
        if guard.lease_owner is None:
            return
        cur.execute(self.q.lease_of, {"id": conversation_id})
        row = cur.fetchone()
        if row is None or row[1] != guard.lease_owner:
            raise LeaseLostError(conversation_id)

    def _message_params(self, conv: int, m: NewMessage) -> dict[str, Any]:
        return {
            "conv": conv,
            "seq": m.sequence,
            "role": m.role,
            "created_at": self._ts(m.timestamp),
            "tokens": m.token_count,
            "full_tokens": m.full_token_count,
            "pinned": m.pinned,
            "pin_key": m.pin_key,
            "content": m.content,
            "wire": _json(m.wire),
            "meta": _json(m.metadata),
        }

    @staticmethod
    def _message_row(conv: int, m: NewMessage) -> tuple[Any, ...]:
        """SQLite: ``_message_params`` in the order of ``insert_message_row``."""
        return (
            conv,
            m.sequence,
            m.role,
            _sqlite_text(m.timestamp),
            m.token_count,
            m.full_token_count,
            m.pinned,
            m.pin_key,
            m.content,
            _json(m.wire),
            _json(m.metadata),
        )

    def _summary_params(self, conv: int, s: NewSummary, ids: Sequence[int]) -> dict[str, Any]:
        parent = ids[s.parent.index] if isinstance(s.parent, NewRef) else s.parent
        return {
            "parent_id": parent,
            "dropped_at": self._ts(s.dropped_at),
            "conv": conv,
            "kind": s.kind,
            "level": s.level,
            "ordinal": s.ordinal,
            "first_seq": s.first_sequence,
            "last_seq": s.last_sequence,
            "started_at": self._ts(s.started_at),
            "ended_at": self._ts(s.ended_at),
            "status": s.status,
            "sealed_at": self._ts(s.sealed_at),
            "sealed_reason": s.sealed_reason,
            "content": s.content,
            "rendered": s.rendered,
            "tokens": s.token_count,
            "source_tokens": s.source_tokens,
            "summarizer": s.summarizer,
            "model": s.model,
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.completion_tokens,
            "cost": s.cost,
            "latency_ms": s.latency_ms,
            "attempts": s.attempts,
            "next_attempt_at": self._ts(s.next_attempt_at),
            "last_error": s.last_error,
            "created_at": self._ts(s.created_at),
        }

    def _update_params(self, conv: int, u: SummaryUpdate, ids: Sequence[int]) -> dict[str, Any]:
        params: dict[str, Any] = {"id": u.id, "conv": conv, "ordinal": u.ordinal}
        for key, value in u.values.items():
            if isinstance(value, NewRef):
                value = ids[value.index]
            elif isinstance(value, datetime):
                value = self._ts(value)
            params[f"v_{_RENAMED.get(key, key)}"] = value
        if u.expect_status is not None:
            params["expect_status"] = u.expect_status
        if u.expect_attempts is not None:
            params["expect_attempts"] = u.expect_attempts
        return params

    def delete(self, conversation_id: str) -> bool:
        q = self.q

        def run(cur: Any) -> bool:
            conv = self._key(cur, conversation_id)
            if conv is None:
                return False
            for sql in (q.delete_messages, q.delete_summaries, q.delete_conversation):
                cur.execute(sql, {"conv": conv})
            self._keys.pop(conversation_id, None)
            self._recall.forget(conv)
            return True

        return self._tx("deleting a conversation", run, write=True)

    # -- leases --------------------------------------------------------------------------------

    def claim(
        self,
        owner: str,
        now: datetime,
        lease_seconds: float,
        limit: int,
        after: str | None = None,
        conversation_id: str | None = None,
    ) -> list[str]:
        q = self.q
        at = self._ts(now)
        until = self._ts(now + timedelta(seconds=lease_seconds))

        def run(cur: Any) -> list[str]:
            if conversation_id is not None:
                cur.execute(q.claim_one, {"id": conversation_id, "now": at})
            else:
                cur.execute(q.claim_due, {"now": at, "after": after or "", "lim": limit})
            ids = [r[0] for r in cur.fetchall()]
            taken = []
            for cid in ids:
                cur.execute(q.take_lease, {"owner": owner, "until": until, "id": cid, "now": at})
                if cur.rowcount == 1:
                    taken.append(cid)
            return taken

        return self._tx("claiming maintenance work", run, write=True)

    def renew(self, owner: str, conversation_id: str, until: datetime) -> bool:
        def run(cur: Any) -> bool:
            cur.execute(self.q.renew, {"until": self._ts(until), "id": conversation_id, "owner": owner})
            return bool(cur.rowcount == 1)

        return self._tx("renewing a lease", run, write=True)

    def release(self, owner: str, conversation_id: str) -> None:
        def run(cur: Any) -> None:
            cur.execute(self.q.release, {"id": conversation_id, "owner": owner})

        self._tx("releasing a lease", run, write=True)


def _lengths(lists: Mapping[Group, Candidates]) -> list[int]:
    """Each distinct candidate's length."""
    seen: dict[int, int] = {}
    for c in lists.values():
        seen.update(zip(c.ids, c.dl, strict=True))
    return list(seen.values())


def _tally(tsv: str, lexemes: Sequence[str]) -> tuple[int, int]:
    """PostgreSQL: a row's length in words and the count of the rarest of ``lexemes`` it holds (1
    if none), from its tsvector's text (``'wa':1,4 'wb':2``): each lexeme's positions, one
    where it has none, as ``unnest`` would give them. A lexeme is "w" and letters and digits (see
    migration 0002), so quotes, colons, commas and spaces in the text are only its syntax."""
    if not tsv:
        return 0, 1
    tf = 0
    for lexeme in lexemes:
        at = tsv.find(f"'{lexeme}'")
        if at < 0:
            continue
        at += len(lexeme) + 2
        n = 1
        if at < len(tsv) and tsv[at] == ":":
            end = tsv.find(" ", at)
            n += tsv.count(",", at, len(tsv) if end < 0 else end)
        if not tf or n < tf:
            tf = n
    return tsv.count(",") + tsv.count(" ") + 1, tf or 1


#: PostgreSQL: the longest lexeme a tsquery takes, in bytes (to_tsvector leaves longer words out).
_PG_LEXEME_BYTES = 2047


def _any_of(lexemes: Sequence[str]) -> str | None:
    """PostgreSQL: a tsquery matching rows that hold any of ``lexemes`` (``None`` when none can be
    indexed: then every row is read). A lexeme is "w" and letters and digits: quoted, nothing in
    it is tsquery syntax."""
    quoted = [f"'{x}'" for x in lexemes if len(x.encode()) <= _PG_LEXEME_BYTES]
    return " | ".join(quoted) if quoted else None


def _seq(m: StoredMessage) -> int:
    return m.sequence


#: Characters other than ASCII that FTS5's unicode61 tokenizer and :func:`~..core.ranking.words`
#: both take for separators (punctuation common in replies: dashes, quotes, ellipsis, bullet).
_PLAIN_EXTRA = "\u2013\u2014\u2018\u2019\u201c\u201d\u2022\u2026"
_PLAIN = re.compile(f"[\\x01-\\x7f{_PLAIN_EXTRA}]*")


def _by_seq(row: RecentRow) -> int:
    return row[1]


def _split_row(r: Sequence[Any]) -> RecentRow:
    """A row (id, sequence, docsize, text) as :data:`~.recall.RecentRow`: a plain text split into
    words and counted, another not (only FTS5 may split it)."""
    text = r[3]
    return (
        int(r[0]),
        int(r[1]),
        _first_varint(r[2]),
        Counter(words(text)) if _plain(text) else None,
        len(text),
    )


def _plain(text: str) -> bool:
    """Whether FTS5 (unicode61) and our word split surely see the same words in ``text``: ASCII
    (no NUL) and :data:`_PLAIN_EXTRA`. Beyond them the two may differ (case folding, Unicode
    versions, private-use characters), so such texts are left to FTS5."""
    if text.isascii():
        return "\x00" not in text
    return _PLAIN.fullmatch(text) is not None


def _sqlite_text(value: datetime) -> str:
    """The text SQLAlchemy's DateTime writes on SQLite: naive UTC, always with microseconds. The
    same few times recur on every write (a conversation's creation, its due time, the newest
    message's), so those of aware times (equal ones are the same instant) are remembered."""
    found = _SQLITE_TEXTS.get(value)  # a naive time never equals an aware one: never found
    if found is None:
        found = value.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
        if value.tzinfo is not None:  # a naive time's text depends on the local zone: not kept
            if len(_SQLITE_TEXTS) >= 4096:
                _SQLITE_TEXTS.clear()
            _SQLITE_TEXTS[value] = found
    return found


_SQLITE_TEXTS: dict[datetime, str] = {}


def _few_others(at: _Search, old: Candidates, top: int) -> bool:
    """Whether the messages after a kept list's newest (id ``old.after``) are mostly the
    conversation's own: at most as many of other conversations as of its own, and
    :data:`RECENT_SCAN` more (``top``: the newest message id of all; there are no more such rows
    than ids between)."""
    own = at.last - int(old.upto)
    return top - old.after <= 2 * own + RECENT_SCAN


def _only_added(before: tuple[int, ...], now: tuple[int, ...]) -> bool:
    """Whether the summaries changed from search key ``before`` to ``now`` only by pending topics'
    first summaries (see ``SQLStore._summary_additions``): the archive count and the merged and
    dropped marks the same, the other two fields moved alike (by the number of them)."""
    moved = now[0] - before[0]
    return (
        moved > 0
        and now[5] - before[5] == moved
        and now[1] == before[1]
        and now[3:5] == before[3:5]
        and now[2] >= before[2]
    )


def _extended(old: Candidates | None, new: Candidates) -> Candidates:
    """``new`` (a word's matches after a kept list's ``upto``, or all of them) in front of ``old``."""
    return new if old is None else old.merged(new)


def _first_varint(blob: bytes) -> int:
    """The first SQLite varint of ``blob`` (FTS5's docsize: the first column's length in tokens)."""
    if blob and blob[0] < 0x80:  # most texts: fewer than 128 words, one byte
        return blob[0]
    value = 0
    for k, byte in enumerate(blob[:9]):
        if k == 8:
            return (value << 8) | byte
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            break
    return value


def _json(value: Any) -> str | None:
    return None if not value else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _rollback_quietly(cur: Any) -> None:
    """Roll back after a failure; if even that fails, the connection is judged (and dropped) later."""
    with suppress(Exception):
        cur.execute("ROLLBACK")


def _is_busy(e: BaseException) -> bool:
    """SQLite could not take a lock at once (SQLITE_BUSY or SQLITE_LOCKED)."""
    return (getattr(e, "sqlite_errorcode", 0) & 0xFF) in (5, 6)


def _is_db_error(e: BaseException) -> bool:
    """An error of SQLAlchemy's or of the DB-API drivers, sqlite3 and psycopg (they share no base
    class we can import cheaply): what :func:`~.dialect.translate` turns into our errors."""
    if isinstance(e, sa.exc.SQLAlchemyError):
        return True
    module = type(e).__module__
    return module.startswith(("sqlite3", "psycopg")) or module == "_sqlite3"


def _life(meta: Any) -> str:
    """The life token in a conversation row's ``meta`` ("" for rows from before it was kept)."""
    if not meta:
        return ""
    found = (json.loads(meta) if isinstance(meta, str) else meta).get("life")
    return found if isinstance(found, str) else ""
