"""The SQLAlchemy store: one implementation for SQLite and PostgreSQL.

Dialect differences (BEGIN IMMEDIATE, SKIP LOCKED, snapshot reads, retries) are
decided once in :mod:`.dialect`; the queries below are the same everywhere.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import Connection, exc, func

from ..errors import ConversationNotFoundError, InvalidMessageError, TransientStoreError
from ..models import ConversationStats, History, StoredMessage, Summary
from .base import (
    BoundaryPolicy,
    ContextRows,
    ConversationState,
    CoveredBudget,
    LeaseLostError,
    PreparedMessage,
    SummaryWrite,
    newest_summaries,
    newest_unit,
    newest_window,
)
from .dialect import Capabilities, capabilities, create_engine, prepare_engine, translate
from .rows import MESSAGE_COLUMNS, SUMMARY_COLUMNS, message_row, to_message, to_state, to_summary
from .schema import conversation_history as H
from .schema import conversations as C

T = TypeVar("T")
_FIRST_PAGE = 16
_MAX_PAGE = 256
_RETRY_DELAYS = (0.05, 0.2, 0.5, 1.0)
#: Inclusive upper bound meaning "no bound": the largest int4, as every sequence column is.
_NO_BOUND = 2**31 - 1


def _newest_first(query: sa.Select[Any]) -> sa.Select[Any]:
    """``query`` restricted to ``sequence <= :hi``, newest first, ``:lim`` rows."""
    return (
        query.where(H.c.sequence <= sa.bindparam("hi", type_=sa.Integer))
        .order_by(H.c.sequence.desc())
        .limit(sa.bindparam("lim", type_=sa.Integer))
    )


class _ReadStatements:
    """The statements ``read_context`` runs on every reply, built once.

    Building a SQLAlchemy statement costs about 0.1 ms, as much as running it on SQLite;
    prebuilt statements also reuse their compiled form from the engine's cache.
    """

    def __init__(self) -> None:
        cid = sa.bindparam("cid", type_=sa.String)
        lo = sa.bindparam("lo", type_=sa.Integer)
        messages = sa.select(*MESSAGE_COLUMNS).where(H.c.conversation_id == cid, H.c.tier == "message")
        self.state = sa.select(C, C.c.topics_merged_upto, C.c.archives_dropped_upto).where(C.c.id == cid)
        self.pinned = messages.where(H.c.pinned == sa.true()).order_by(H.c.sequence)
        self.unpinned = _newest_first(messages.where(H.c.pinned == sa.false(), H.c.sequence > lo))
        summaries = sa.select(*SUMMARY_COLUMNS).where(H.c.conversation_id == cid)
        self.topics = _newest_first(
            summaries.where(
                H.c.tier == "topic",
                H.c.sequence > lo,
                H.c.merged_into.is_(None),
                H.c.status != "pending",
            )
        )
        self.archives = _newest_first(
            summaries.where(H.c.tier == "bulk", H.c.sequence > lo, H.c.dropped_at.is_(None))
        )
        self.dropped = _newest_first(summaries.where(H.c.tier == "bulk"))


_READ = _ReadStatements()


class SQLStore:
    """Store backed by SQLite or PostgreSQL through SQLAlchemy Core.

    Each operation is one short transaction run on a small thread pool: one hop
    from the event loop per call, and the driver's fast synchronous path inside.
    """

    def __init__(
        self, engine: sa.Engine | str, *, encoding: str = "cl100k_base", migrate: bool = True
    ) -> None:
        self._owns_engine = isinstance(engine, str)
        self.engine = create_engine(engine) if isinstance(engine, str) else engine
        prepare_engine(self.engine)
        self.caps: Capabilities = capabilities(self.engine)
        self._encoding = encoding
        self._migrate = migrate
        workers = 1 if self.caps.single_connection else self.caps.threads
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tiered-history-db")

    # -- plumbing -------------------------------------------------------------------------

    async def initialize(self) -> None:
        if self._migrate:
            from .migrate import upgrade

            def run() -> None:
                try:
                    upgrade(self.engine)
                except exc.SQLAlchemyError as e:
                    raise translate(e, "migrating the schema") from None

            await asyncio.get_running_loop().run_in_executor(self._executor, run)

    async def close(self) -> None:
        self._executor.shutdown(wait=True)
        if self._owns_engine:
            self.engine.dispose()

    async def _tx(self, action: str, fn: Callable[[Connection], T], *, write: bool) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run_tx, action, fn, write)

    def _run_tx(self, action: str, fn: Callable[[Connection], T], write: bool) -> T:
        """Run ``fn`` in one transaction; retry transient failures where the dialect allows."""
        attempts = len(_RETRY_DELAYS) + 1 if self.caps.retry_transient else 1
        options = self.caps.write_options if write else self.caps.read_options
        for attempt in range(attempts):
            try:
                with self.engine.connect() as raw:
                    conn = raw.execution_options(**options) if options else raw
                    with conn.begin():
                        return fn(conn)
            except exc.SQLAlchemyError as e:
                err = translate(e, action)
                if attempt + 1 < attempts and isinstance(err, TransientStoreError):
                    time.sleep(_RETRY_DELAYS[attempt])
                    continue
                raise err from None
        raise AssertionError("unreachable")

    def _locked_state(self, conn: Connection, conversation_id: str) -> ConversationState | None:
        row = (conn.execute(sa.select(C).where(C.c.id == conversation_id).with_for_update())).one_or_none()
        return None if row is None else to_state(row)

    def _fence(self, conn: Connection, owner: str, conversation_id: str) -> ConversationState:
        """Check that ``owner`` still holds the lease, locking the conversation row."""
        state = self._locked_state(conn, conversation_id)
        if state is None or state.lease_owner != owner:
            raise LeaseLostError(conversation_id)
        return state

    # -- writing messages -----------------------------------------------------------------

    async def append(
        self,
        conversation_id: str,
        platform: str | None,
        prepared: PreparedMessage,
        policy: BoundaryPolicy,
        now: datetime,
    ) -> tuple[StoredMessage, Summary | None]:
        m = prepared.message

        def run(conn: Connection) -> tuple[StoredMessage, Summary | None]:
            conn.execute(
                self.caps.insert(C)
                .values(
                    id=conversation_id,
                    platform=platform,
                    encoding=self._encoding,
                    created_at=now,
                    updated_at=now,
                )
                .on_conflict_do_nothing(index_elements=["id"])
            )
            state = self._locked_state(conn, conversation_id)
            assert state is not None
            open_calls = list(state.open_tool_calls)
            if m.role == "tool" and m.tool_call_id not in open_calls:
                raise InvalidMessageError(
                    f"tool result {m.tool_call_id!r} answers no open tool call in this conversation "
                    "(add the assistant message with the matching tool_calls first)"
                )
            sealed: Summary | None = None
            topic_start, open_tokens, open_msgs = (
                state.topic_start_seq,
                state.open_topic_tokens,
                state.open_topic_messages,
            )
            reason = policy(state.open_topic, prepared)
            if reason is not None:
                sealed = self._seal_locked(conn, state, reason, now)
                after = self._locked_state(conn, conversation_id)
                assert after is not None
                topic_start, open_tokens, open_msgs = (
                    after.topic_start_seq,
                    after.open_topic_tokens,
                    after.open_topic_messages,
                )
            seq = state.last_sequence + 1
            row = message_row(conversation_id, platform or state.platform, prepared, seq, now)
            conn.execute(sa.insert(H).values(**row))
            if m.tool_calls:
                open_calls = [str(c["id"]) for c in m.tool_calls]
            elif m.role == "tool":
                open_calls.remove(str(m.tool_call_id))
            elif not m.pinned:
                # A new turn abandons calls that never got results; a pinned instruction is no turn.
                open_calls = []
            # The last sequence a seal may end at: never between a tool call and its results.
            last_clean: int | None = None
            if not open_calls:
                last_clean = seq
            elif m.tool_calls:
                last_clean = seq - 1
            values: dict[str, Any] = {
                "last_sequence": seq,
                "last_message_at": m.timestamp
                if state.last_message_at is None or m.timestamp > state.last_message_at
                else state.last_message_at,
                "topic_start_seq": topic_start,
                "open_topic_tokens": open_tokens + (0 if m.pinned else prepared.token_count),
                "open_topic_messages": open_msgs + 1,
                "open_tool_calls": open_calls or None,
                "pinned_count": state.pinned_count + int(m.pinned),
                "updated_at": now,
            }
            if last_clean is not None:
                values["last_clean_seq"] = last_clean
            if platform and not state.platform:
                values["platform"] = platform
            conn.execute(sa.update(C).where(C.c.id == conversation_id).values(**values))
            stored = prepared.stored(conversation_id, seq)
            return stored, sealed

        return await self._tx("adding a message", run, write=True)

    def _seal_range(
        self, conn: Connection, state: ConversationState, reason: str, now: datetime, upto: int
    ) -> Summary | None:
        """Insert a pending topic covering ``topic_start_seq..upto`` (caller holds the row lock)."""
        first = state.topic_start_seq
        if upto < first:
            return None
        cid = state.id
        agg = (
            conn.execute(
                sa.select(
                    func.min(H.c.created_at),
                    func.max(H.c.created_at),
                    func.coalesce(
                        func.sum(sa.case((H.c.pinned == sa.false(), H.c.full_token_count), else_=0)), 0
                    ),
                ).where(
                    H.c.conversation_id == cid,
                    H.c.tier == "message",
                    H.c.sequence.between(first, upto),
                )
            )
        ).one()
        ordinal = (conn.execute(sa.select(C.c.topic_count).where(C.c.id == cid))).scalar_one() + 1
        values = dict(
            conversation_id=cid,
            platform=state.platform,
            tier="topic",
            content="",
            token_count=0,
            sequence=ordinal,
            created_at=now,
            sealed_at=now,
            status="pending",
            sealed_reason=reason,
            first_sequence=first,
            last_sequence=upto,
            started_at=agg[0],
            ended_at=agg[1],
            source_tokens=int(agg[2]),
            stored_at=now,
        )
        new_id = (conn.execute(sa.insert(H).values(**values).returning(H.c.id))).scalar_one()
        conn.execute(
            sa.update(C)
            .where(C.c.id == cid)
            .values(
                topic_count=ordinal,
                topic_start_seq=upto + 1,
                needs_maintenance=True,
                next_retry_at=None,
                updated_at=now,
            )
        )
        row = (conn.execute(sa.select(*SUMMARY_COLUMNS).where(H.c.id == new_id))).one()
        return to_summary(row)

    def _seal_locked(
        self, conn: Connection, state: ConversationState, reason: str, now: datetime
    ) -> Summary | None:
        """Seal up to the last message with no tool call awaiting its result."""
        last_clean = (conn.execute(sa.select(C.c.last_clean_seq).where(C.c.id == state.id))).scalar_one()
        upto = state.last_sequence if not state.open_tool_calls else last_clean
        sealed = self._seal_range(conn, state, reason, now, upto)
        if sealed is None:
            return None
        rest = (
            conn.execute(
                sa.select(
                    func.count(),
                    func.coalesce(func.sum(sa.case((H.c.pinned == sa.false(), H.c.token_count), else_=0)), 0),
                ).where(H.c.conversation_id == state.id, H.c.tier == "message", H.c.sequence > upto)
            )
        ).one()
        conn.execute(
            sa.update(C)
            .where(C.c.id == state.id)
            .values(open_topic_messages=int(rest[0]), open_topic_tokens=int(rest[1]))
        )
        return sealed

    async def seal(self, conversation_id: str, reason: str, now: datetime) -> Summary | None:
        def run(conn: Connection) -> Summary | None:
            state = self._locked_state(conn, conversation_id)
            if state is None:
                raise ConversationNotFoundError(f"no conversation {conversation_id!r}")
            return self._seal_locked(conn, state, reason, now)

        return await self._tx("sealing a topic", run, write=True)

    # -- reading --------------------------------------------------------------------------

    async def state(self, conversation_id: str) -> ConversationState | None:
        def run(conn: Connection) -> ConversationState | None:
            row = (conn.execute(sa.select(C).where(C.c.id == conversation_id))).one_or_none()
            return None if row is None else to_state(row)

        return await self._tx("reading a conversation", run, write=False)

    def _page_newest(
        self,
        conn: Connection,
        query: sa.Select[Any],
        params: dict[str, Any],
        token_cap: int,
        tool_units: bool,
        *,
        hi: int = _NO_BOUND,
    ) -> list[Any]:
        """Read rows newest-first (``sequence <= hi``) in pages until ``token_cap`` tokens are in hand.

        ``query`` is one of the prebuilt :class:`_ReadStatements`: it takes ``hi`` and ``lim`` binds.
        """
        out: list[Any] = []
        tokens = 0
        page = _FIRST_PAGE
        while True:
            rows = conn.execute(query, {**params, "hi": hi, "lim": page}).all()
            out.extend(rows)
            tokens += sum(r.token_count for r in rows)
            if len(rows) < page:
                break
            # Keep reading past the cap only to complete a tool call with its results.
            if tokens >= token_cap and not (tool_units and rows[-1].role == "tool"):
                break
            hi = rows[-1].sequence - 1
            # Size the next page from the rows seen so far, so the read overshoots the cap little.
            per_row = max(tokens // len(out), 1)
            want = (max(token_cap - tokens, 0) // per_row) + 1 + (len(out) // 8)
            page = min(max(want, _FIRST_PAGE), _MAX_PAGE)
        out.reverse()
        return out

    async def read_context(
        self, conversation_id: str, token_cap: int, covered_budget: CoveredBudget | None = None
    ) -> ContextRows:
        q = _READ
        cid = {"cid": conversation_id}

        def run(conn: Connection) -> ContextRows:
            row = conn.execute(q.state, cid).one_or_none()
            if row is None:
                raise ConversationNotFoundError(f"no conversation {conversation_id!r}")
            state = to_state(row)
            pinned: list[StoredMessage] = []
            if state.pinned_count:
                pinned = [to_message(r) for r in conn.execute(q.pinned, cid).all()]
            above = {**cid, "lo": state.summarized_upto}
            read = self._page_newest(conn, q.unpinned, above, token_cap, tool_units=True)
            verbatim = newest_window([to_message(r) for r in read], token_cap)
            if not verbatim and state.last_sequence > 0:
                # Everything is summarised: still send the newest message, with its tool call if any.
                tail = self._page_newest(conn, q.unpinned, {**cid, "lo": 0}, 1, tool_units=True)
                verbatim = newest_unit([to_message(r) for r in tail])
            topic_rows = self._page_newest(
                conn, q.topics, {**cid, "lo": row.topics_merged_upto}, token_cap, tool_units=False
            )
            archive_rows = self._page_newest(
                conn, q.archives, {**cid, "lo": row.archives_dropped_upto}, token_cap, tool_units=False
            )
            rows = ContextRows(
                state=state,
                pinned=pinned,
                verbatim=verbatim,
                topics=[to_summary(r) for r in topic_rows],
                archives=[to_summary(r) for r in archive_rows],
            )
            # Dropped archives and summarised messages are read only as far as spare room could
            # use them (asked in this same snapshot).
            want_dropped, want_covered = covered_budget(rows) if covered_budget else (0, 0)
            revived = False
            if want_dropped > 0 and row.archives_dropped_upto:
                dropped_rows = self._page_newest(
                    conn, q.dropped, cid, want_dropped, tool_units=False, hi=row.archives_dropped_upto
                )
                rows = replace(
                    rows, dropped=newest_summaries([to_summary(r) for r in dropped_rows], want_dropped)
                )
                revived = bool(rows.dropped)
            if revived and covered_budget:
                _, want_covered = covered_budget(rows)  # revived archives take room first
            if want_covered > 0:
                below = min([state.summarized_upto + 1, *(m.sequence for m in verbatim)])
                read = self._page_newest(
                    conn, q.unpinned, {**cid, "lo": 0}, want_covered, tool_units=True, hi=below - 1
                )
                rows = replace(rows, covered=newest_window([to_message(r) for r in read], want_covered))
            return rows

        return await self._tx("reading the context", run, write=False)

    async def history(self, conversation_id: str) -> History:
        def run(conn: Connection) -> History:
            row = (conn.execute(sa.select(C).where(C.c.id == conversation_id))).one_or_none()
            if row is None:
                raise ConversationNotFoundError(f"no conversation {conversation_id!r}")
            mine = H.c.conversation_id == conversation_id
            messages = conn.execute(
                sa.select(*MESSAGE_COLUMNS).where(mine, H.c.tier == "message").order_by(H.c.sequence)
            ).all()
            summaries = conn.execute(
                sa.select(*SUMMARY_COLUMNS)
                .where(mine, H.c.tier != "message")
                .order_by(H.c.tier, H.c.sequence)
            ).all()
            return History(
                conversation_id=conversation_id,
                platform=row.platform,
                messages=[to_message(r) for r in messages],
                topics=[to_summary(r) for r in summaries if r.tier == "topic"],
                archives=[to_summary(r) for r in summaries if r.tier == "bulk"],
                open_topic_start=row.topic_start_seq,
            )

        return await self._tx("reading the history", run, write=False)

    async def search(self, conversation_id: str, text: str, limit: int) -> list[StoredMessage]:
        def run(conn: Connection) -> list[StoredMessage]:
            q = (
                sa.select(*MESSAGE_COLUMNS)
                .where(
                    H.c.conversation_id == conversation_id,
                    H.c.tier == "message",
                    func.lower(H.c.content).contains(text.lower(), autoescape=True),
                )
                .order_by(H.c.sequence.desc())
                .limit(limit)
            )
            return [to_message(r) for r in (conn.execute(q)).all()]

        return await self._tx("searching messages", run, write=False)

    async def conversation_ids(self) -> list[str]:
        def run(conn: Connection) -> list[str]:
            return list((conn.execute(sa.select(C.c.id).order_by(C.c.id))).scalars())

        return await self._tx("listing conversations", run, write=False)

    # -- background work ------------------------------------------------------------------

    async def claim(
        self,
        owner: str,
        now: datetime,
        lease_seconds: float,
        silence_before: datetime | None,
        conversation_id: str | None,
        limit: int,
        min_tokens: int = 0,
        after: str | None = None,
    ) -> list[ConversationState]:
        def run(conn: Connection) -> list[ConversationState]:
            free = sa.or_(C.c.lease_owner.is_(None), C.c.lease_expires_at < now)
            q = sa.select(C.c.id).where(free)
            if after is not None:
                q = q.where(C.c.id > after)
            if conversation_id is not None:
                q = q.where(C.c.id == conversation_id)
            else:
                due = sa.and_(
                    C.c.needs_maintenance == sa.true(),
                    sa.or_(C.c.next_retry_at.is_(None), C.c.next_retry_at <= now),
                )
                if silence_before is not None:
                    due = sa.or_(
                        due,
                        sa.and_(
                            C.c.open_topic_messages > 0,
                            C.c.open_topic_tokens >= min_tokens,
                            C.c.last_message_at < silence_before,
                        ),
                    )
                q = q.where(due)
            q = q.order_by(C.c.id).limit(limit)
            if self.caps.skip_locked:
                q = q.with_for_update(skip_locked=True)
            ids = list((conn.execute(q)).scalars())
            if not ids:
                return []
            conn.execute(
                sa.update(C)
                .where(C.c.id.in_(ids), free)
                .values(lease_owner=owner, lease_expires_at=now + timedelta(seconds=lease_seconds))
            )
            leased = sa.select(C).where(C.c.id.in_(ids), C.c.lease_owner == owner).order_by(C.c.id)
            rows = conn.execute(leased).all()
            return [to_state(r) for r in rows]

        return await self._tx("claiming maintenance work", run, write=True)

    async def renew(self, owner: str, conversation_id: str, until: datetime) -> bool:
        def run(conn: Connection) -> bool:
            res = conn.execute(
                sa.update(C)
                .where(C.c.id == conversation_id, C.c.lease_owner == owner)
                .values(lease_expires_at=until)
            )
            return bool(res.rowcount)

        return await self._tx("renewing a lease", run, write=True)

    async def release(
        self, owner: str, conversation_id: str, needs_maintenance: bool, next_retry_at: datetime | None
    ) -> None:
        def run(conn: Connection) -> None:
            state = self._locked_state(conn, conversation_id)
            if state is None or state.lease_owner != owner:
                return
            merged_upto = (
                conn.execute(sa.select(C.c.topics_merged_upto).where(C.c.id == conversation_id))
            ).scalar_one()
            # A topic sealed while we worked keeps the flag set, whatever this pass concluded.
            pending = (
                conn.execute(
                    sa.select(func.count()).where(
                        H.c.conversation_id == conversation_id,
                        H.c.tier == "topic",
                        H.c.sequence > merged_upto,
                        H.c.status == "pending",
                    )
                )
            ).scalar_one()
            conn.execute(
                sa.update(C)
                .where(C.c.id == conversation_id)
                .values(
                    lease_owner=None,
                    lease_expires_at=None,
                    needs_maintenance=bool(pending) or needs_maintenance,
                    next_retry_at=None if pending else next_retry_at,
                )
            )

        await self._tx("releasing a lease", run, write=True)

    async def seal_if_silent(
        self, owner: str, conversation_id: str, silence_before: datetime, now: datetime, min_tokens: int = 0
    ) -> Summary | None:
        def run(conn: Connection) -> Summary | None:
            state = self._fence(conn, owner, conversation_id)
            if state.open_topic_messages == 0 or state.last_message_at is None:
                return None
            if state.open_topic_tokens < min_tokens:
                return None
            if state.last_message_at >= silence_before:
                return None
            return self._seal_locked(conn, state, "silence", now)

        return await self._tx("sealing a silent topic", run, write=True)

    async def topics_to_summarize(
        self, conversation_id: str, now: datetime, max_attempts: int
    ) -> list[Summary]:
        def run(conn: Connection) -> list[Summary]:
            merged_upto = (
                conn.execute(sa.select(C.c.topics_merged_upto).where(C.c.id == conversation_id))
            ).scalar_one()
            q = (
                sa.select(*SUMMARY_COLUMNS)
                .where(
                    H.c.conversation_id == conversation_id,
                    H.c.tier == "topic",
                    H.c.sequence > merged_upto,
                    H.c.merged_into.is_(None),
                    sa.or_(
                        H.c.status == "pending",
                        sa.and_(
                            H.c.status == "provisional",
                            H.c.attempts < max_attempts,
                            sa.or_(H.c.next_attempt_at.is_(None), H.c.next_attempt_at <= now),
                        ),
                    ),
                )
                .order_by(H.c.sequence)
            )
            return [to_summary(r) for r in (conn.execute(q)).all()]

        return await self._tx("listing topics to summarise", run, write=False)

    async def next_retry(self, conversation_id: str, max_attempts: int) -> datetime | None:
        def run(conn: Connection) -> datetime | None:
            value: datetime | None = (
                conn.execute(
                    sa.select(func.min(H.c.next_attempt_at)).where(
                        H.c.conversation_id == conversation_id,
                        H.c.tier == "topic",
                        H.c.status == "provisional",
                        H.c.merged_into.is_(None),
                        H.c.attempts < max_attempts,
                    )
                )
            ).scalar_one()
            return value

        return await self._tx("reading retry times", run, write=False)

    async def topic_messages(self, conversation_id: str, first: int, last: int) -> list[StoredMessage]:
        def run(conn: Connection) -> list[StoredMessage]:
            q = (
                sa.select(*MESSAGE_COLUMNS)
                .where(
                    H.c.conversation_id == conversation_id,
                    H.c.tier == "message",
                    H.c.sequence.between(first, last),
                    H.c.pinned == sa.false(),
                )
                .order_by(H.c.sequence)
            )
            return [to_message(r) for r in (conn.execute(q)).all()]

        return await self._tx("reading a topic", run, write=False)

    async def save_topic_summary(
        self, owner: str, topic: Summary, write: SummaryWrite, now: datetime
    ) -> bool:
        def run(conn: Connection) -> bool:
            self._fence(conn, owner, topic.conversation_id)
            res = conn.execute(
                sa.update(H)
                .where(
                    H.c.id == topic.id,
                    H.c.status == topic.status,
                    H.c.attempts == topic.attempts,
                    H.c.merged_into.is_(None),
                )
                .values(
                    content=write.content,
                    rendered=write.rendered,
                    token_count=write.token_count,
                    status=write.status,
                    summarizer=write.summarizer,
                    model=write.model,
                    prompt_tokens=H.c.prompt_tokens + write.prompt_tokens,
                    completion_tokens=H.c.completion_tokens + write.completion_tokens,
                    cost=H.c.cost + write.cost,
                    latency_ms=write.latency_ms,
                    attempts=H.c.attempts + 1,
                    next_attempt_at=write.next_attempt_at,
                    last_error=write.last_error,
                )
            )
            if res.rowcount != 1:
                return False
            values: dict[str, Any] = {
                # Advance only over a contiguous prefix, so no range is ever skipped.
                "summarized_upto": sa.case(
                    (C.c.summarized_upto == topic.first_sequence - 1, topic.last_sequence),
                    else_=C.c.summarized_upto,
                ),
                "updated_at": now,
            }
            if topic.status == "pending":
                values["compressions"] = C.c.compressions + 1
            conn.execute(sa.update(C).where(C.c.id == topic.conversation_id).values(**values))
            return True

        return await self._tx("saving a topic summary", run, write=True)

    async def active_summaries(self, conversation_id: str, tier: str) -> list[Summary]:
        def run(conn: Connection) -> list[Summary]:
            row = (
                conn.execute(
                    sa.select(C.c.topics_merged_upto, C.c.archives_dropped_upto).where(
                        C.c.id == conversation_id
                    )
                )
            ).one()
            if tier == "topic":
                cond = sa.and_(
                    H.c.sequence > row.topics_merged_upto, H.c.merged_into.is_(None), H.c.status != "pending"
                )
            else:
                cond = sa.and_(H.c.sequence > row.archives_dropped_upto, H.c.dropped_at.is_(None))
            q = (
                sa.select(*SUMMARY_COLUMNS)
                .where(H.c.conversation_id == conversation_id, H.c.tier == tier, cond)
                .order_by(H.c.sequence)
            )
            return [to_summary(r) for r in (conn.execute(q)).all()]

        return await self._tx("reading summaries", run, write=False)

    async def save_archive(
        self, owner: str, conversation_id: str, topics: Sequence[Summary], write: SummaryWrite, now: datetime
    ) -> Summary | None:
        class _Conflict(Exception):
            pass

        def run(conn: Connection) -> Summary:
            self._fence(conn, owner, conversation_id)
            counts = (
                conn.execute(sa.select(C.c.bulk_count, C.c.platform).where(C.c.id == conversation_id))
            ).one()
            ordinal = counts.bulk_count + 1
            new_id = (
                conn.execute(
                    sa.insert(H)
                    .values(
                        conversation_id=conversation_id,
                        platform=counts.platform,
                        tier="bulk",
                        content=write.content,
                        rendered=write.rendered,
                        token_count=write.token_count,
                        sequence=ordinal,
                        created_at=now,
                        sealed_at=now,
                        status=write.status,
                        first_sequence=topics[0].first_sequence,
                        last_sequence=topics[-1].last_sequence,
                        started_at=min(t.started_at for t in topics),
                        ended_at=max(t.ended_at for t in topics),
                        source_tokens=sum(t.source_tokens for t in topics),
                        summarizer=write.summarizer,
                        model=write.model,
                        prompt_tokens=write.prompt_tokens,
                        completion_tokens=write.completion_tokens,
                        cost=write.cost,
                        latency_ms=write.latency_ms,
                        attempts=1,
                        stored_at=now,
                    )
                    .returning(H.c.id)
                )
            ).scalar_one()
            res = conn.execute(
                sa.update(H)
                .where(H.c.id.in_([t.id for t in topics]), H.c.merged_into.is_(None), H.c.status != "pending")
                .values(merged_into=new_id)
            )
            if res.rowcount != len(topics):
                raise _Conflict
            conn.execute(
                sa.update(C)
                .where(C.c.id == conversation_id)
                .values(
                    bulk_count=ordinal,
                    topics_merged_upto=max(t.sequence for t in topics),
                    compressions=C.c.compressions + 1,
                    updated_at=now,
                )
            )
            return to_summary((conn.execute(sa.select(*SUMMARY_COLUMNS).where(H.c.id == new_id))).one())

        try:
            return await self._tx("saving an archive", run, write=True)
        except _Conflict:
            return None

    async def drop_archives(self, owner: str, conversation_id: str, ids: Sequence[int], now: datetime) -> int:
        def run(conn: Connection) -> int:
            self._fence(conn, owner, conversation_id)
            res = conn.execute(
                sa.update(H).where(H.c.id.in_(list(ids)), H.c.dropped_at.is_(None)).values(dropped_at=now)
            )
            top = (conn.execute(sa.select(func.max(H.c.sequence)).where(H.c.id.in_(list(ids))))).scalar_one()
            conn.execute(sa.update(C).where(C.c.id == conversation_id).values(archives_dropped_upto=top))
            return int(res.rowcount)

        return await self._tx("dropping archives", run, write=True)

    async def stats(self, conversation_id: str | None) -> list[ConversationStats]:
        def run(conn: Connection) -> list[ConversationStats]:
            cq = sa.select(C)
            if conversation_id is not None:
                cq = cq.where(C.c.id == conversation_id)
            convs = (conn.execute(cq.order_by(C.c.id))).all()
            if conversation_id is not None and not convs:
                raise ConversationNotFoundError(f"no conversation {conversation_id!r}")
            aq = sa.select(
                H.c.conversation_id,
                H.c.tier,
                func.count(),
                func.coalesce(func.sum(H.c.full_token_count), 0),
                func.coalesce(func.sum(sa.case((H.c.status == "pending", 1), else_=0)), 0),
                func.coalesce(
                    func.sum(
                        sa.case(
                            (sa.and_(H.c.merged_into.is_(None), H.c.dropped_at.is_(None)), H.c.token_count),
                            else_=0,
                        )
                    ),
                    0,
                ),
                func.coalesce(func.sum(sa.case((H.c.dropped_at.is_not(None), 1), else_=0)), 0),
                func.coalesce(func.sum(H.c.prompt_tokens), 0),
                func.coalesce(func.sum(H.c.completion_tokens), 0),
                func.coalesce(func.sum(H.c.cost), 0.0),
            ).group_by(H.c.conversation_id, H.c.tier)
            if conversation_id is not None:
                aq = aq.where(H.c.conversation_id == conversation_id)
            agg: dict[tuple[str, str], Any] = {(r[0], r[1]): r for r in (conn.execute(aq)).all()}
            out = []
            for c in convs:
                msg = agg.get((c.id, "message"))
                top = agg.get((c.id, "topic"))
                blk = agg.get((c.id, "bulk"))
                uncovered = (
                    conn.execute(
                        sa.select(func.coalesce(func.sum(H.c.token_count), 0)).where(
                            H.c.conversation_id == c.id,
                            H.c.tier == "message",
                            H.c.sequence > c.summarized_upto,
                        )
                    )
                ).scalar_one()
                out.append(
                    ConversationStats(
                        conversation_id=c.id,
                        platform=c.platform,
                        messages=int(msg[2]) if msg else 0,
                        message_tokens=int(msg[3]) if msg else 0,
                        topics=int(top[2]) if top else 0,
                        topics_pending=int(top[4]) if top else 0,
                        archives=int(blk[2]) if blk else 0,
                        archives_dropped=int(blk[6]) if blk else 0,
                        tier_tokens={
                            "current": int(uncovered),
                            "topic": int(top[5]) if top else 0,
                            "bulk": int(blk[5]) if blk else 0,
                        },
                        compressions=c.compressions,
                        summarizer_prompt_tokens=sum(int(r[7]) for r in (top, blk) if r),
                        summarizer_completion_tokens=sum(int(r[8]) for r in (top, blk) if r),
                        summarizer_cost=float(sum(float(r[9]) for r in (top, blk) if r)),
                    )
                )
            return out

        return await self._tx("computing statistics", run, write=False)
