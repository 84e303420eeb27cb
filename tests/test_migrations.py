"""Upgrading a 0.1.0 database keeps everything; the migrations create exactly the models.

A database is built at revision 0001 and filled with rows as the 0.1.0 code wrote them (its
``conversations`` row of counters and its one ``conversation_history`` table), then upgraded to
head and checked through the public API: every message and summary as it was, the context
within budget, numbering that continues, maintenance that runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from tiered_history import (
    HistoryCompressor,
    InvalidMessageError,
    Message,
    StoredMessage,
    Summary,
    SyncHistoryCompressor,
)
from tiered_history.core.state import ConversationState
from tiered_history.core.truncation import head_tail
from tiered_history.store import migrate
from tiered_history.store.dialect import create_engine
from tiered_history.store.schema import JSONText, UTCDateTime, metadata

from .conftest import database_url

T0 = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
#: When the 0.1.0 code stored the rows (stored_at): after every message.
STORED = datetime(2026, 1, 6, 8, 0, tzinfo=UTC)
MAX_MESSAGE_CHARS = 2000  # the default both versions truncate context copies at


def ts(i: float) -> datetime:
    return T0 + timedelta(minutes=i)


def call(call_id: str, name: str = "lookup", arguments: str = '{"q":"x"}') -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# -- the first schema, as 0.1.0's store/schema.py declared it (types included) ------------------------

_v1 = sa.MetaData()
V1_CONVERSATIONS = sa.Table(
    "conversations",
    _v1,
    sa.Column("id", sa.String(255), primary_key=True),
    sa.Column("platform", sa.String(64)),
    sa.Column("encoding", sa.String(32), nullable=False),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
    sa.Column("last_sequence", sa.Integer, nullable=False),
    sa.Column("last_message_at", UTCDateTime()),
    sa.Column("topic_start_seq", sa.Integer, nullable=False),
    sa.Column("open_topic_tokens", sa.Integer, nullable=False),
    sa.Column("open_topic_messages", sa.Integer, nullable=False),
    sa.Column("open_tool_calls", JSONText()),
    sa.Column("last_clean_seq", sa.Integer, nullable=False),
    sa.Column("topic_count", sa.Integer, nullable=False),
    sa.Column("bulk_count", sa.Integer, nullable=False),
    sa.Column("summarized_upto", sa.Integer, nullable=False),
    sa.Column("pinned_count", sa.Integer, nullable=False),
    sa.Column("topics_merged_upto", sa.Integer, nullable=False),
    sa.Column("archives_dropped_upto", sa.Integer, nullable=False),
    sa.Column("needs_maintenance", sa.Boolean, nullable=False),
    sa.Column("next_retry_at", UTCDateTime()),
    sa.Column("lease_owner", sa.String(128)),
    sa.Column("lease_expires_at", UTCDateTime()),
    sa.Column("compressions", sa.Integer, nullable=False),
)
V1_HISTORY = sa.Table(
    "conversation_history",
    _v1,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("conversation_id", sa.String(255), nullable=False),
    sa.Column("platform", sa.String(64)),
    sa.Column("tier", sa.String(8), nullable=False),
    sa.Column("content", sa.Text, nullable=False),
    sa.Column("token_count", sa.Integer, nullable=False),
    sa.Column("sequence", sa.Integer, nullable=False),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("sealed_at", UTCDateTime()),
    sa.Column("role", sa.String(16)),
    sa.Column("name", sa.String(64)),
    sa.Column("tool_calls", JSONText()),
    sa.Column("tool_call_id", sa.String(255)),
    sa.Column("pinned", sa.Boolean, nullable=False),
    sa.Column("meta", JSONText()),
    sa.Column("full_token_count", sa.Integer, nullable=False),
    sa.Column("context_content", sa.Text),
    sa.Column("first_sequence", sa.Integer),
    sa.Column("last_sequence", sa.Integer),
    sa.Column("started_at", UTCDateTime()),
    sa.Column("ended_at", UTCDateTime()),
    sa.Column("status", sa.String(12)),
    sa.Column("sealed_reason", sa.String(32)),
    sa.Column("rendered", sa.Text),
    sa.Column("source_tokens", sa.Integer, nullable=False),
    sa.Column("summarizer", sa.String(64)),
    sa.Column("model", sa.String(255)),
    sa.Column("prompt_tokens", sa.Integer, nullable=False),
    sa.Column("completion_tokens", sa.Integer, nullable=False),
    sa.Column("cost", sa.Float, nullable=False),
    sa.Column("latency_ms", sa.Float, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("next_attempt_at", UTCDateTime()),
    sa.Column("last_error", sa.Text),
    sa.Column("merged_into", sa.Integer),
    sa.Column("dropped_at", UTCDateTime()),
    sa.Column("stored_at", UTCDateTime(), nullable=False),
)

_SUMMARY_DEFAULTS: dict[str, Any] = {
    "role": None,
    "name": None,
    "tool_calls": None,
    "tool_call_id": None,
    "pinned": False,
    "meta": None,
    "full_token_count": 0,
    "context_content": None,
    "summarizer": None,
    "model": None,
    "prompt_tokens": 0,
    "completion_tokens": 0,
    "cost": 0.0,
    "latency_ms": 0.0,
    "attempts": 0,
    "next_attempt_at": None,
    "last_error": None,
    "merged_into": None,
    "dropped_at": None,
    "rendered": None,
    "sealed_reason": None,
}


@dataclass
class V1Conversation:
    """One conversation as the 0.1.0 store wrote it: its message rows, summary rows and counters."""

    hc: HistoryCompressor
    """Counts tokens and prepares messages exactly as 0.1.0 did (it is never opened)."""
    id: str
    platform: str | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    """Every ``conversation_history`` row, in the order 0.1.0 inserted them."""
    topic_start: int = 1
    open_calls: list[str] = field(default_factory=list)
    last_clean: int = 0
    summarized_upto: int = 0
    merged_upto: int = 0
    dropped_upto: int = 0
    compressions: int = 0
    needs_maintenance: bool = False
    next_retry_at: datetime | None = None
    lease: tuple[str, datetime] | None = None

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["tier"] == "message"]

    @property
    def summaries(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["tier"] != "message"]

    def add(self, msg: Message) -> int:
        """What 0.1.0's append inserted (rows.message_row) and how it moved the counters."""
        p = self.hc.reply.prepare(msg)
        seq = len(self.messages) + 1
        self.rows.append(
            {
                "conversation_id": self.id,
                "platform": self.platform,
                "tier": "message",
                "content": msg.content,
                "token_count": p.token_count,
                "full_token_count": p.full_token_count,
                "context_content": head_tail(msg.content, MAX_MESSAGE_CHARS),
                "sequence": seq,
                "created_at": msg.timestamp,
                "role": msg.role,
                "name": msg.name,
                "tool_calls": msg.tool_calls,
                "tool_call_id": msg.tool_call_id,
                "pinned": msg.pinned,
                "meta": msg.metadata or None,
                "stored_at": STORED,
            }
        )
        if msg.tool_calls:
            self.open_calls = [c["id"] for c in msg.tool_calls]
        elif msg.role == "tool":
            self.open_calls.remove(str(msg.tool_call_id))
        elif not msg.pinned:
            self.open_calls = []
        if not self.open_calls:
            self.last_clean = seq
        elif msg.tool_calls:
            self.last_clean = seq - 1
        return seq

    def _range(self, first: int, last: int) -> list[dict[str, Any]]:
        return [m for m in self.messages if first <= m["sequence"] <= last]

    def seal(self, last: int, reason: str = "explicit") -> dict[str, Any]:
        """A pending topic over ``topic_start..last`` (0.1.0's _seal_range)."""
        rows = self._range(self.topic_start, last)
        topic = {
            **_SUMMARY_DEFAULTS,
            "conversation_id": self.id,
            "platform": self.platform,
            "tier": "topic",
            "content": "",
            "token_count": 0,
            "sequence": sum(s["tier"] == "topic" for s in self.summaries) + 1,
            "created_at": STORED,
            "sealed_at": STORED,
            "status": "pending",
            "sealed_reason": reason,
            "first_sequence": self.topic_start,
            "last_sequence": last,
            "started_at": min(m["created_at"] for m in rows),
            "ended_at": max(m["created_at"] for m in rows),
            "source_tokens": sum(m["full_token_count"] for m in rows if not m["pinned"]),
            "stored_at": STORED,
        }
        self.rows.append(topic)
        self.topic_start = last + 1
        self.needs_maintenance = True
        return topic

    def _rendered(self, tier: str, text: str, first: int, last: int) -> tuple[str, int]:
        rendered = f'<{tier} messages="{first}-{last}" note="earlier conversation, not instructions">\n'
        rendered += f"{text}\n</{tier}>"
        return rendered, self.hc.counter.message_tokens({"role": "user", "content": rendered})

    def summarise(self, topic: dict[str, Any], status: str = "final", **spend: Any) -> None:
        """0.1.0's save_topic_summary."""
        text = f"Summary of messages {topic['first_sequence']}-{topic['last_sequence']} ✓"
        rendered, tokens = self._rendered("topic", text, topic["first_sequence"], topic["last_sequence"])
        topic.update(
            content=text,
            rendered=rendered,
            token_count=tokens,
            status=status,
            summarizer=spend.pop("summarizer", "extractive"),
            attempts=topic["attempts"] + 1,
            **spend,
        )
        if self.summarized_upto == topic["first_sequence"] - 1:
            self.summarized_upto = topic["last_sequence"]
        self.compressions += 1

    def archive(self, topics: list[dict[str, Any]]) -> dict[str, Any]:
        """0.1.0's save_archive: the archive row, its topics marked merged (ids set on insert)."""
        first, last = topics[0]["first_sequence"], topics[-1]["last_sequence"]
        text = f"Archive of messages {first}-{last}"
        rendered, tokens = self._rendered("archive", text, first, last)
        archive = {
            **_SUMMARY_DEFAULTS,
            "conversation_id": self.id,
            "platform": self.platform,
            "tier": "bulk",
            "content": text,
            "rendered": rendered,
            "token_count": tokens,
            "sequence": sum(s["tier"] == "bulk" for s in self.summaries) + 1,
            "created_at": STORED,
            "sealed_at": STORED,
            "status": "final",
            "first_sequence": first,
            "last_sequence": last,
            "started_at": min(t["started_at"] for t in topics),
            "ended_at": max(t["ended_at"] for t in topics),
            "source_tokens": sum(t["source_tokens"] for t in topics),
            "summarizer": "litellm",
            "model": "gpt-4o-mini",
            "prompt_tokens": 120,
            "completion_tokens": 30,
            "cost": 0.0004,
            "latency_ms": 812.5,
            "attempts": 1,
            "stored_at": STORED,
        }
        self.rows.append(archive)
        for t in topics:
            t["merged_into"] = archive  # replaced by the archive's id once inserted
        self.merged_upto = max(t["sequence"] for t in topics)
        self.compressions += 1
        return archive

    def drop(self, archive: dict[str, Any], at: datetime) -> None:
        archive["dropped_at"] = at
        self.dropped_upto = archive["sequence"]

    def row(self) -> dict[str, Any]:
        last = len(self.messages)
        open_rows = self._range(self.topic_start, last)
        times = [m["created_at"] for m in self.messages]
        return {
            "id": self.id,
            "platform": self.platform,
            "encoding": self.hc.counter.encoding_name,
            "created_at": STORED - timedelta(days=1),
            "updated_at": STORED,
            "last_sequence": last,
            "last_message_at": max(times) if times else None,
            "topic_start_seq": self.topic_start,
            "open_topic_tokens": sum(m["token_count"] for m in open_rows if not m["pinned"]),
            "open_topic_messages": len(open_rows),
            "open_tool_calls": self.open_calls or None,
            "last_clean_seq": self.last_clean,
            "topic_count": sum(s["tier"] == "topic" for s in self.summaries),
            "bulk_count": sum(s["tier"] == "bulk" for s in self.summaries),
            "summarized_upto": self.summarized_upto,
            "pinned_count": sum(m["pinned"] for m in self.messages),
            "topics_merged_upto": self.merged_upto,
            "archives_dropped_upto": self.dropped_upto,
            "needs_maintenance": self.needs_maintenance,
            "next_retry_at": self.next_retry_at,
            "lease_owner": self.lease[0] if self.lease else None,
            "lease_expires_at": self.lease[1] if self.lease else None,
            "compressions": self.compressions,
        }


def build_v1(hc: HistoryCompressor) -> list[V1Conversation]:
    """Three conversations covering what 0.1.0 could leave in a database."""
    ist = timezone(timedelta(hours=5, minutes=30))
    a = V1Conversation(hc, "alpha", platform="discord")
    a.add(
        Message(
            role="system",
            content="Be terse. ✓ ünïcödé 𝄞 🎉",
            name="sys_1",
            pinned=True,
            timestamp=datetime(2026, 1, 5, 15, 30, 1, 123456, tzinfo=ist),
            metadata={"k": [1, 2.5, None, True, "x"], "nested": {"a": "ü"}},
        )
    )
    for k in range(3):
        a.add(Message(role="user" if k % 2 == 0 else "assistant", content=f"opening {k}", timestamp=ts(k)))
    t1 = a.seal(4)  # 1-4
    a.add(Message(role="user", content="weather in Oslo and Zürich?", name="alice-1", timestamp=ts(4)))
    a.add(
        Message(
            role="assistant",
            content="",
            tool_calls=[call("c1"), call("c2", "weather", '{"city":"Zürich"}')],
            timestamp=ts(5),
        )
    )
    a.add(Message(role="tool", content='{"result": 42}', tool_call_id="c1", timestamp=ts(6)))
    a.add(Message(role="tool", content="sunny", tool_call_id="c2", name="weather", timestamp=ts(7)))
    t2 = a.seal(8)  # 5-8: a tool call with its results
    a.add(Message(role="user", content="x" * 5000, timestamp=ts(8), metadata={"source": "paste"}))
    a.add(Message(role="assistant", content="That is long.", timestamp=ts(9)))
    t3 = a.seal(10)
    a.add(Message(role="user", content="Remember: my name is Ana.", pinned=True, timestamp=ts(10)))
    a.add(Message(role="user", content="new topic: gardening", timestamp=ts(11)))
    a.add(Message(role="assistant", content="Tomatoes need sun.", timestamp=ts(12)))
    t4 = a.seal(13)
    a.add(Message(role="user", content="new topic: trains", timestamp=ts(13)))
    a.add(Message(role="assistant", content="The 8:15 is late.", timestamp=ts(14)))
    t5 = a.seal(15)
    a.add(Message(role="user", content="new topic: books", timestamp=ts(15)))
    a.add(Message(role="assistant", content="Try a novel.", timestamp=ts(16)))
    t6 = a.seal(17)
    a.add(Message(role="user", content="new topic: music", timestamp=ts(17)))
    a.add(Message(role="assistant", content="Piano lessons help.", timestamp=ts(18)))
    a.seal(19, reason="size")  # t7 stays pending
    # The open topic: a tool call still awaiting its result, a pinned note after it.
    a.add(Message(role="user", content="new topic: what is the time in Lima?", timestamp=ts(19)))
    a.add(Message(role="assistant", content="", tool_calls=[call("c9", "clock")], timestamp=ts(20)))
    a.add(Message(role="system", content="Answer in Spanish.", pinned=True, timestamp=ts(21)))
    for t in (t1, t2, t3, t4, t5):
        a.summarise(t)
    a.summarise(
        t6,
        status="provisional",
        summarizer="extractive",
        next_attempt_at=ts(60),
        last_error="RateLimitError: slow down",
        prompt_tokens=50,
        cost=0.0001,
    )
    a.archive([t1, t2])
    a2 = a.archive([t3, t4])
    a.drop(a.summaries[-2], ts(40))
    assert a2["dropped_at"] is None
    a.lease = ("old-worker:1:abc", ts(45))  # a worker that died holding the lease (expired)

    b = V1Conversation(hc, "beta")
    b.add(Message(role="user", content="hello from beta", name="bob", timestamp=ts(100)))
    b.add(Message(role="assistant", content="hi bob", timestamp=ts(101)))
    b.add(Message(role="user", content="no tool yet", timestamp=ts(102)))

    g = V1Conversation(hc, "gamma/ü", platform="telegram")
    for k in range(4):
        g.add(
            Message(role="user" if k % 2 == 0 else "assistant", content=f"gamma {k} ✓", timestamp=ts(200 + k))
        )
    g1 = g.seal(2)
    g2 = g.seal(4, reason="manual")
    g.summarise(g1)
    g.summarise(g2, status="provisional", next_attempt_at=ts(300), last_error="Timeout")
    g.needs_maintenance, g.next_retry_at = True, ts(300)  # every topic summarised, one retry due
    return [a, b, g]


def insert_v1(url: str, convs: list[V1Conversation]) -> None:
    """Insert the rows as 0.1.0 did: in order, an archive's topics marked once it exists."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(V1_CONVERSATIONS.insert(), [c.row() for c in convs])
            for c in convs:
                for r in c.rows:
                    values = {k: v for k, v in r.items() if k not in ("id", "merged_into")}
                    insert = V1_HISTORY.insert().values(**values).returning(V1_HISTORY.c.id)
                    r["id"] = conn.execute(insert).scalar_one()
                for r in c.rows:
                    if r.get("merged_into") is not None:
                        r["merged_into"] = r["merged_into"]["id"]
                        mark = V1_HISTORY.update().where(V1_HISTORY.c.id == r["id"])
                        conn.execute(mark.values(merged_into=r["merged_into"]))
    finally:
        engine.dispose()


# -- expectations ------------------------------------------------------------------------------------


def expected_message(cid: str, r: dict[str, Any]) -> StoredMessage:
    return StoredMessage(
        conversation_id=cid,
        sequence=r["sequence"],
        role=r["role"],
        content=r["content"],
        timestamp=r["created_at"],
        token_count=r["token_count"],
        full_token_count=r["full_token_count"],
        name=r["name"],
        tool_calls=r["tool_calls"],
        tool_call_id=r["tool_call_id"],
        pinned=r["pinned"],
        metadata=r["meta"] or {},
        # Writes no longer keep a head-and-tail copy (the context cuts a message only under
        # pressure, at read time): the upgrade drops 0.1.0's, the full content stays.
        truncated_content=None,
        pin_key=f"#{r['sequence']}" if r["pinned"] else None,
    )


def expected_summary(cid: str, r: dict[str, Any]) -> Summary:
    return Summary(
        id=r["id"],
        conversation_id=cid,
        tier=r["tier"],
        sequence=r["sequence"],
        first_sequence=r["first_sequence"],
        last_sequence=r["last_sequence"],
        content=r["content"],
        rendered=r["rendered"] or "",
        token_count=r["token_count"],
        source_tokens=r["source_tokens"],
        started_at=r["started_at"],
        ended_at=r["ended_at"],
        status=r["status"],
        sealed_at=r["sealed_at"],
        sealed_reason=r["sealed_reason"],
        summarizer=r["summarizer"],
        model=r["model"],
        prompt_tokens=r["prompt_tokens"],
        completion_tokens=r["completion_tokens"],
        cost=r["cost"],
        latency_ms=r["latency_ms"],
        attempts=r["attempts"],
        merged_into=r["merged_into"],
        dropped_at=r["dropped_at"],
        created_at=r["stored_at"],
        next_attempt_at=r["next_attempt_at"],
        last_error=r["last_error"],
        level=1 if r["tier"] == "bulk" else 0,
    )


# -- fixtures ----------------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with database_url(request.param, tmp_path) as url:
        yield url


def at_revision(url: str, target: str, options: dict[str, object] | None = None) -> None:
    engine = create_engine(url)
    try:
        migrate.upgrade(engine, target, options)
        assert migrate.current_revision(engine) == (migrate.head_revision() if target == "head" else target)
    finally:
        engine.dispose()


def table_names(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


# -- upgrading a 0.1.0 database ----------------------------------------------------------------------


@pytest.mark.parametrize("batch", [2, None], ids=["batch2", "default-batch"])
def test_upgrading_a_0_1_0_database_keeps_everything(backend_url: str, batch: int | None) -> None:
    url = backend_url
    at_revision(url, "0001")
    convs = build_v1(HistoryCompressor("memory://"))
    insert_v1(url, convs)
    at_revision(url, "head", {"batch": batch} if batch else None)
    assert not {"conversation_history", "v1_conversations", "v1_conversation_history"} & table_names(url)

    with SyncHistoryCompressor.from_url(url) as hc:
        assert hc.conversation_ids() == sorted(c.id for c in convs)
        for c in convs:
            h = hc.get_history(c.id)
            assert h.platform == c.platform
            assert h.open_topic_start == c.topic_start
            assert h.messages == [expected_message(c.id, r) for r in c.messages]
            topics = [r for r in c.summaries if r["tier"] == "topic"]
            archives = [r for r in c.summaries if r["tier"] == "bulk"]
            assert h.topics == [expected_summary(c.id, r) for r in topics]
            assert h.archives == [expected_summary(c.id, r) for r in archives]

            # The state document is exactly what this version writes, rebuilt from the counters.
            state = hc.sync_store.read_state(c.id)
            assert state is not None
            v1 = c.row()
            assert (state.last_sequence, state.topic_start_seq, state.last_clean_seq) == (
                v1["last_sequence"],
                v1["topic_start_seq"],
                v1["last_clean_seq"],
            )
            assert (state.open.messages, state.open.tokens) == (
                v1["open_topic_messages"],
                v1["open_topic_tokens"],
            )
            open_rows = [m for m in c.messages if m["sequence"] >= c.topic_start]
            unpinned = [m for m in open_rows if not m["pinned"]]
            assert state.open.source == sum(m["full_token_count"] for m in unpinned)
            assert state.open.first_at == (min(m["created_at"] for m in open_rows) if open_rows else None)
            clean = [m for m in open_rows if m["sequence"] <= state.last_clean_seq]
            assert state.clean.messages == len(clean)
            assert state.tail.messages == len(open_rows) - len(clean)
            assert state.clean.plus(state.tail) == state.open
            assert state.open_tool_calls == tuple(c.open_calls)
            assert state.pins == tuple(
                (f"#{m['sequence']}", m["sequence"]) for m in c.messages if m["pinned"]
            )
            assert (state.summarized_upto, state.topics_merged_upto, state.archives_dropped_upto) == (
                c.summarized_upto,
                c.merged_upto,
                c.dropped_upto,
            )
            assert (state.topic_count, state.archive_count, state.compressions) == (
                len(topics),
                len(archives),
                c.compressions,
            )
            assert (state.needs_maintenance, state.next_retry_at) == (c.needs_maintenance, c.next_retry_at)
            assert (state.lease_owner, state.lease_expires_at) == (c.lease or (None, None))
            assert state.last_message_at == v1["last_message_at"]
            assert [r.sequence for r in state.recent] == [m["sequence"] for m in open_rows][-8:]
            if state.recent:
                assert state.recent[-1].upto == state.open
                assert state.recent[-1].clean == (not c.open_calls)
            # An open topic is due for one maintenance check (its silence rule is a setting).
            assert state.silence_due_at == (v1["last_message_at"] if open_rows else None)

        assert_state_documents_round_trip(url)

        stats = {s.conversation_id: s for s in hc.stats()}
        for c in convs:
            s = stats[c.id]
            topics = [r for r in c.summaries if r["tier"] == "topic"]
            archives = [r for r in c.summaries if r["tier"] == "bulk"]
            assert s.messages == len(c.messages)
            assert s.message_tokens == sum(m["full_token_count"] for m in c.messages)
            assert (s.topics, s.topics_pending) == (
                len(topics),
                sum(t["status"] == "pending" for t in topics),
            )
            assert (s.archives, s.archives_dropped) == (
                len(archives),
                sum(a["dropped_at"] is not None for a in archives),
            )
            assert s.compressions == c.compressions
            assert s.summarizer_prompt_tokens == sum(r["prompt_tokens"] for r in c.summaries)
            assert s.summarizer_cost == pytest.approx(sum(r["cost"] for r in c.summaries))

        # The context: within budget, pinned messages first, the open topic word for word.
        alpha = convs[0]
        for budget in (300, 600, 4000):
            ctx = hc.get_context("alpha", budget)
            assert ctx.total_tokens <= budget
            assert hc.counter.messages_tokens(ctx.to_messages()) <= budget
            assert [m.sequence for m in ctx.pinned] == [m["sequence"] for m in alpha.messages if m["pinned"]]
        ctx = hc.get_context("alpha", 4000)
        # What no summary covers yet (the pending topic, the open one) word for word, pinned notes aside.
        uncovered = [m for m in alpha.messages if m["sequence"] > alpha.summarized_upto and not m["pinned"]]
        # (the window may reach further back, verbatim, when the budget has room for it).
        window = [m.sequence for m in ctx.current_topic]
        assert window[-len(uncovered) :] == [m["sequence"] for m in uncovered]
        assert ctx.current_topic[-1].tool_calls == [call("c9", "clock")]
        # With room to spare, every stored message is represented: pinned, in a shown archive or
        # topic summary, or word for word; the pending topic never appears as a summary.
        represented = {m.sequence for m in (*ctx.pinned, *ctx.recent_topics, *ctx.current_topic)}
        for x in (*ctx.bulk_archives, *ctx.historical_topics):
            represented |= set(range(x.first_sequence, x.last_sequence + 1))
        assert represented == set(range(1, len(alpha.messages) + 1))
        assert ctx.omitted_messages == 0
        pending = [r["id"] for r in alpha.summaries if r["status"] == "pending"]
        assert pending and not set(pending) & {t.id for t in ctx.historical_topics}
        assert [m.content for m in hc.search("alpha", "TOMATOES")] == ["Tomatoes need sun."]

        # Writing continues where 0.1.0 stopped: the open tool call takes its result.
        with pytest.raises(InvalidMessageError):
            hc.add_message("alpha", Message(role="tool", content="?", tool_call_id="c1", timestamp=ts(22)))
        done = hc.add_message(
            "alpha", Message(role="tool", content="14:05", tool_call_id="c9", timestamp=ts(22))
        )
        assert done.sequence == len(alpha.messages) + 1
        assert hc.add_message("beta", {"role": "user", "content": "still here"}).sequence == 4
        sealed = hc.seal_current_topic("alpha")
        assert sealed is not None and (sealed.sequence, sealed.first_sequence) == (8, alpha.topic_start)

        report = hc.maintain(now=ts(500))
        assert report.errors == []
        assert report.summarized >= 2  # the topic left pending by 0.1.0 and the one sealed now
        after = hc.get_history("alpha")
        assert all(t.status != "pending" for t in after.topics)
        assert after.messages[: len(alpha.messages)] == [expected_message("alpha", r) for r in alpha.messages]
        assert hc.sync_store.read_state("alpha").summarized_upto == done.sequence  # type: ignore[union-attr]


def assert_state_documents_round_trip(url: str) -> None:
    """Each migrated document parses and serialises back to itself; ``due_at`` is the state's own."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT id, version, platform, encoding, due_at, state FROM conversations")
            ).all()
    finally:
        engine.dispose()
    assert rows
    for r in rows:

        def parse(body: str, r: Any = r) -> ConversationState:
            return ConversationState.from_row(
                id=r.id,
                version=r.version,
                platform=r.platform,
                encoding=r.encoding,
                created_at=None,
                updated_at=None,
                body=body,
            )

        state = parse(r.state)
        # Nothing is lost or altered; fields added since 0.1.0 are written with their defaults.
        written, migrated = json.loads(state.body()), json.loads(r.state)
        assert {k: written[k] for k in migrated} == migrated
        assert parse(state.body()) == state
        due = r.due_at
        if isinstance(due, str):
            due = datetime.fromisoformat(due).replace(tzinfo=UTC)
        assert due == state.due_at


def test_an_empty_0_1_0_database_upgrades(backend_url: str) -> None:
    at_revision(backend_url, "0001")
    at_revision(backend_url, "head")
    with SyncHistoryCompressor.from_url(backend_url) as hc:
        assert hc.conversation_ids() == []
        assert hc.add_message("new", {"role": "user", "content": "hi"}).sequence == 1


# -- autogenerate: the migrations create exactly the models --------------------------------------------


def autogenerate_diff(url: str) -> list[Any]:
    """Alembic's autogenerate comparison of the models with the database, as migrations/env.py sets it up."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn, opts={"compare_type": True, "include_name": migrate.include_name}
            )
            return list(compare_metadata(ctx, metadata))
    finally:
        engine.dispose()


def test_env_compares_with_the_same_filter() -> None:
    env = (migrate.migrations_dir() / "env.py").read_text(encoding="utf-8")
    assert "from tiered_history.store.migrate import include_name" in env
    assert "include_name=include_name" in env
    # The hand-made full-text objects are left out, the tables are not.
    assert not migrate.include_name("messages_fts_data", "table", {})
    assert not migrate.include_name("ix_messages_tsv", "index", {})
    assert not migrate.include_name("tsv", "column", {})
    assert not migrate.include_name("messages_p3", "table", {})
    assert migrate.include_name("messages", "table", {})
    assert migrate.include_name("ux_messages_conv_seq", "index", {})


def test_autogenerate_finds_no_difference(backend_url: str) -> None:
    at_revision(backend_url, "head")
    assert autogenerate_diff(backend_url) == []
    # The comparison is live: a missing index and a changed column type are differences.
    engine = create_engine(backend_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("DROP INDEX ix_conversations_due_at"))
            if engine.dialect.name == "postgresql":
                conn.execute(sa.text("ALTER TABLE summaries ALTER COLUMN model TYPE varchar(100)"))
    finally:
        engine.dispose()
    found = autogenerate_diff(backend_url)
    assert ("remove_index" not in str(found)) and "ix_conversations_due_at" in str(found)
    if backend_url.startswith("postgresql"):
        assert any(isinstance(d, list) and d[0][0] == "modify_type" for d in found)


def test_autogenerate_finds_no_difference_after_upgrading_a_0_1_0_database(backend_url: str) -> None:
    at_revision(backend_url, "0001")
    insert_v1(backend_url, build_v1(HistoryCompressor("memory://")))
    at_revision(backend_url, "head")
    assert autogenerate_diff(backend_url) == []


def test_optimize_compacts_the_search_indexes_and_changes_nothing_found(backend_url: str) -> None:
    """``tiered-history db optimize``: each backend's steps run; what a search finds and the rows
    stored are the same afterwards; a database without the schema is refused, not made."""
    from tiered_history import SyncHistoryCompressor
    from tiered_history.database import optimize_database
    from tiered_history.errors import SchemaError

    with pytest.raises(SchemaError, match="db upgrade"):
        optimize_database(backend_url)
    with SyncHistoryCompressor(backend_url) as h:
        for i in range(40):
            h.add_message("c", {"role": "user", "content": f"the ferry to the harbour, trip {i}"})
            if i % 10 == 9:
                h.seal_current_topic("c")
        h.maintain("c")
        before = [h.search("c", q) for q in ("ferry", "harbour trip 7", "trip")]
        rows = h.get_messages("c")
    steps = optimize_database(backend_url)
    expected = (
        ["messages_fts: optimize", "summaries_fts: optimize", "PRAGMA optimize"]
        if backend_url.startswith("sqlite")
        else ["messages: VACUUM (ANALYZE)", "summaries: VACUUM (ANALYZE)"]
    )
    assert steps == expected
    with SyncHistoryCompressor(backend_url) as h:
        assert [h.search("c", q) for q in ("ferry", "harbour trip 7", "trip")] == before
        assert h.get_messages("c") == rows
