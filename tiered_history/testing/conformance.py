"""The storage contract's conformance suite.

Subclass :class:`StoreConformance` in a test module and provide a ``store`` fixture returning a
fresh, initialised store of your backend (closed after the test)::

    import pytest
    from tiered_history.testing import StoreConformance

    class TestMyStore(StoreConformance):
        @pytest.fixture
        def store(self, tmp_path):
            s = MyStore(tmp_path / "db")
            s.initialize()
            yield s
            s.close()

Writes are produced by the library's own core (:mod:`tiered_history.core.transitions`), exactly
as the engine produces them, so the suite checks what a backend must do with real writes:
apply them atomically under their guard, read back exactly what was written, lease fairly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ..core.boundaries import BoundaryRules
from ..core.ranking import parse_query
from ..core.state import ConversationState, Guard, NewMessage, Outcome, SummaryUpdate, Writes
from ..core.transitions import (
    MANUAL,
    Appended,
    Incoming,
    SummaryWrite,
    append,
    drop_archives,
    due_topics,
    record_archive,
    record_summary,
    seal_now,
)
from ..store.base import ContextRequest, LeaseLostError, Store, SummaryWindow, Window

T0 = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
ENCODING = "cl100k_base"
#: No automatic boundary: the tests seal where they want.
RULES = BoundaryRules(
    explicit=False,
    temporal=False,
    size=False,
    phrases=(),
    trigger_roles=("user",),
    silence=timedelta(minutes=30),
    size_limit=10**9,
    min_tokens=0,
)


#: Text that is query syntax somewhere (FTS5, tsquery, LIKE, SQL): searched as plain words.
HOSTILE_QUERIES = [
    '"',
    '""',
    "'",
    "NEAR(a b)",
    'NEAR("end" "star", 3)',
    "a*",
    "*",
    "-a",
    "a OR b",
    "AND",
    "NOT near",
    "(",
    ")",
    "{conv}:1",
    'conv : "1"',
    "content : near",
    "^near",
    "a:b",
    "\\",
    "%",
    "_",
    "a & b | !c",
    "<->",
    ":*",
    "near:*",
    "'; DROP TABLE messages; --",
    "a' OR '1'='1",
    "🎉",
    "𝄞",
    "\u200b",
    "\u202eright-to-left\u202c",
    "東京",
    "x" * 300,
    " ".join(f"w{i}" for i in range(100)),
]


def ts(i: float) -> datetime:
    return T0 + timedelta(minutes=i)


def state_of(store: Store, cid: str) -> ConversationState:
    state = store.read_state(cid)
    assert state is not None, f"no conversation {cid!r}"
    return state


def call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "lookup", "arguments": '{"q":1}'}}


def incoming(
    text: str,
    role: str = "user",
    *,
    at: datetime | None = None,
    tokens: int | None = None,
    wire: dict[str, Any] | None = None,
    **kw: Any,
) -> Incoming:
    n = tokens if tokens is not None else 3 + len(text.split())
    return Incoming(
        role=role,
        content=text,
        wire=wire,
        timestamp=at or T0,
        token_count=n,
        full_token_count=kw.pop("full_tokens", n),
        **kw,
    )


class StoreConformance:
    """Behaviour every store must share. Provide a ``store`` fixture in a subclass."""

    @pytest.fixture
    def store(self) -> Store:
        raise NotImplementedError("subclass StoreConformance and provide a `store` fixture")

    # -- helpers -------------------------------------------------------------------------------

    @staticmethod
    def add(store: Store, cid: str, message: Incoming, platform: str | None = None) -> Appended:
        state = store.read_state(cid)
        done = append(state, cid, message, RULES, platform=platform, encoding=ENCODING, now=message.timestamp)
        result = store.commit(cid, Guard(None if state is None else state.version), done.writes)
        assert result.outcome is Outcome.COMMITTED, result
        return done

    def chat(self, store: Store, cid: str, n: int, start: int = 0) -> None:
        for k in range(start, start + n):
            role = "user" if k % 2 == 0 else "assistant"
            self.add(store, cid, incoming(f"{cid} message {k}", role, at=ts(k)))

    @staticmethod
    def seal(store: Store, cid: str, at: datetime = T0) -> int:
        """Seal the open topic; returns the new topic's ordinal."""
        state = store.read_state(cid)
        assert state is not None
        sealed = seal_now(state, RULES, MANUAL, at)
        assert sealed is not None
        writes, topic = sealed
        assert store.commit(cid, Guard(state.version), writes).ok
        return topic.ordinal

    @staticmethod
    def lease(store: Store, cid: str, owner: str, at: datetime = T0) -> None:
        assert store.claim(owner, at, 300, 1, conversation_id=cid) == [cid]

    # -- conversations and versions ------------------------------------------------------------

    def test_a_new_conversation_is_created_once(self, store: Store) -> None:
        assert store.read_state("c") is None
        done = self.add(store, "c", incoming("hello"), platform="web")
        state = store.read_state("c")
        assert state is not None
        assert state == done.writes.state
        assert (state.version, state.last_sequence, state.platform, state.encoding) == (1, 1, "web", ENCODING)
        # A second creation (another writer's) conflicts and changes nothing.
        again = append(None, "c", incoming("other"), RULES, platform=None, encoding=ENCODING, now=T0)
        assert store.commit("c", Guard(None), again.writes).outcome is Outcome.VERSION_CONFLICT
        assert store.read_state("c") == state
        assert [m.content for m in store.read_messages("c", 1, 10)] == ["hello"]

    def test_state_round_trips_exactly(self, store: Store) -> None:
        self.add(store, "c", incoming("ask", at=ts(0)))
        self.add(
            store,
            "c",
            incoming(
                "",
                "assistant",
                at=ts(1),
                tool_call_ids=("a", "b"),
                wire={"tool_calls": [call("a"), call("b")]},
            ),
        )
        self.add(
            store, "c", incoming("result a", "tool", at=ts(2), tool_call_id="a", wire={"tool_call_id": "a"})
        )
        self.add(store, "c", incoming("rule", "system", at=ts(3), pinned=True, pin_key="sys"))
        state = store.read_state("c")
        assert state is not None
        assert state.open_tool_calls == ("b",)
        assert state.pins == (("sys", 4),)
        assert state.last_clean_seq == 1 and state.open.messages == 4
        assert state.due_at is None
        assert state.lease_owner is None and state.lease_expires_at is None
        assert state.last_message_at == ts(3)
        ordinal = self.seal(store, "c", ts(4))
        after = store.read_state("c")
        assert after is not None
        assert (ordinal, after.topic_start_seq, after.needs_maintenance) == (1, 2, True)
        assert after.due_at is not None and after.due_at <= T0

    def test_a_stale_version_writes_nothing(self, store: Store) -> None:
        self.add(store, "c", incoming("one"))
        stale = store.read_state("c")
        assert stale is not None
        self.add(store, "c", incoming("two"))
        current = store.read_state("c")
        late = append(stale, "c", incoming("late"), RULES, platform=None, encoding=ENCODING, now=T0)
        assert store.commit("c", Guard(stale.version), late.writes).outcome is Outcome.VERSION_CONFLICT
        assert store.read_state("c") == current
        assert [m.content for m in store.read_messages("c", 1, 10)] == ["one", "two"]

    def test_a_failed_commit_writes_nothing(self, store: Store) -> None:
        # A first write that fails leaves no conversation behind.
        first = append(None, "z", incoming("hello"), RULES, platform="web", encoding=ENCODING, now=T0)
        bad = replace(first.writes, updates=(SummaryUpdate(10**9, {"status": "final"}),))
        assert store.commit("z", Guard(None), bad).outcome is Outcome.ROW_CONFLICT
        assert store.read_state("z") is None
        assert store.conversation_ids() == []
        # A later write that fails part-way (a required update finds no row) leaves the state as it was.
        self.add(store, "c", incoming("one"))
        before = store.read_state("c")
        assert before is not None
        nxt = append(before, "c", incoming("two"), RULES, platform=None, encoding=ENCODING, now=T0)
        bad = replace(nxt.writes, updates=(SummaryUpdate(10**9, {"status": "final"}),))
        assert store.commit("c", Guard(before.version), bad).outcome is Outcome.ROW_CONFLICT
        assert store.read_state("c") == before
        assert [m.sequence for m in store.read_messages("c", 1, 10)] == [1]
        # A write that breaks a constraint part-way (a sequence taken twice) leaves nothing either.
        dup = NewMessage(1, "user", "again", None, T0, 4, 4)
        clash = replace(nxt.writes, messages=(*nxt.writes.messages, dup))
        assert store.commit("c", Guard(before.version), clash).outcome is not Outcome.COMMITTED
        assert store.read_state("c") == before
        assert [m.content for m in store.read_messages("c", 1, 10)] == ["one"]

    def test_update_plans_under_the_lock_and_writes_nothing_when_the_plan_fails(self, store: Store) -> None:
        def add(text: str) -> Callable[[ConversationState | None], Writes]:
            def plan(state: ConversationState | None) -> Writes:
                return append(
                    state, "c", incoming(text), RULES, platform=None, encoding=ENCODING, now=T0
                ).writes

            return plan

        done = store.update("c", add("created under the lock"))
        assert done.outcome is Outcome.COMMITTED and done.writes is not None
        assert state_of(store, "c") == done.writes.state
        # A stale state cannot matter: the plan always sees the state as it is now.
        for k in range(3):
            assert store.update("c", add(f"next {k}")).ok
        assert [m.sequence for m in store.read_messages("c", 1, 10)] == [1, 2, 3, 4]
        before = state_of(store, "c")

        def boom(state: ConversationState | None) -> Writes:
            raise RuntimeError("the plan failed")

        with pytest.raises(RuntimeError):
            store.update("c", boom)
        with pytest.raises(RuntimeError):
            store.update("new", boom)
        assert state_of(store, "c") == before and store.read_state("new") is None
        assert store.update("c", lambda state: None).writes is None  # nothing to do: nothing written
        assert state_of(store, "c") == before
        # Under a lease: only its holder may apply a plan.
        self.lease(store, "c", "w1")
        with pytest.raises(LeaseLostError):
            store.update("c", add("not mine"), lease_owner="w2")
        assert store.update("c", add("mine"), lease_owner="w1").ok
        assert len(store.read_messages("c", 1, 10)) == 5

    # -- messages ------------------------------------------------------------------------------

    def test_messages_round_trip_exactly(self, store: Store) -> None:
        ist = datetime(2026, 1, 5, 15, 30, 1, 123456).astimezone()
        given = [
            incoming("Be terse. ✓ ünïcödé 𝄞 🎉", "system", at=ist, pinned=True, wire={"name": "sys_1"}),
            incoming("q", at=ts(1), metadata={"k": [1, 2.5, None, {"x": "ü"}]}, wire={"name": "ann"}),
            incoming(
                "",
                "assistant",
                at=ts(2),
                tool_call_ids=("t1",),
                wire={"content": None, "tool_calls": [call("t1")], "reasoning_content": "think"},
            ),
            incoming("42", "tool", at=ts(3), tool_call_id="t1", wire={"tool_call_id": "t1"}),
            incoming(
                "see [image]",
                at=ts(4),
                wire={
                    "content": [
                        {"type": "text", "text": "see"},
                        {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                    ]
                },
                tokens=90,
                full_tokens=99,
            ),
        ]
        for m in given:
            self.add(store, "c", m)
        stored = store.read_messages("c", 1, 5)
        assert [m.sequence for m in stored] == [1, 2, 3, 4, 5]
        for m, s in zip(given, stored, strict=True):
            assert (s.role, s.content, s.timestamp, s.pinned) == (m.role, m.content, m.timestamp, m.pinned)
            assert s.timestamp.utcoffset() == timedelta(0)
            assert (s.token_count, s.full_token_count) == (m.token_count, m.full_token_count)
            assert s.metadata == (m.metadata or {})
            wire = {"role": m.role, "content": m.content, **(m.wire or {})}
            assert s.to_openai() == wire
        assert stored[0].name == "sys_1" and stored[0].pin_key == "#1"
        assert stored[2].tool_calls == [call("t1")] and stored[2].to_openai()["content"] is None
        assert stored[3].tool_call_id == "t1"
        # Reading returns copies: changing them changes nothing stored.
        stored[1].metadata["k"].append("mutated")
        assert store.read_messages("c", 2, 2)[0].metadata == {"k": [1, 2.5, None, {"x": "ü"}]}

    def test_read_messages_by_range_includes_pinned(self, store: Store) -> None:
        self.chat(store, "c", 3)
        self.add(store, "c", incoming("pinned", "system", pinned=True))
        self.chat(store, "c", 2, start=3)
        assert [m.sequence for m in store.read_messages("c", 2, 5)] == [2, 3, 4, 5]
        assert [m.sequence for m in store.read_messages("c", 0, 100)] == [1, 2, 3, 4, 5, 6]
        assert store.read_messages("c", 7, 9) == [] and store.read_messages("missing", 1, 9) == []

    def test_context_windows_are_newest_first_within_their_cap(self, store: Store) -> None:
        self.add(store, "c", incoming("rule", "system", pinned=True, pin_key="sys"))
        for k in range(40):
            self.add(
                store, "c", incoming(f"w{k}", "user" if k % 2 == 0 else "assistant", at=ts(k), tokens=10)
            )
        ids = ("a", "b", "c")
        self.add(
            store,
            "c",
            incoming(
                "", "assistant", tool_call_ids=ids, wire={"tool_calls": [call(i) for i in ids]}, tokens=10
            ),
        )
        for i in ids:
            self.add(
                store, "c", incoming(f"r{i}", "tool", tool_call_id=i, wire={"tool_call_id": i}, tokens=10)
            )
        state = store.read_state("c")
        assert state is not None
        request = ContextRequest((Window(0, state.last_sequence, 25), Window(10, 20, 1000), Window(0, 5, 11)))
        snap = store.read_context("c", request, state.version)
        assert snap is not None and snap.state == state
        assert [m.content for m in snap.pinned] == ["rule"]
        # The cap falls inside a tool unit: the window reaches back to the call.
        assert [m.sequence for m in snap.windows[0]] == [42, 43, 44, 45]
        assert [m.sequence for m in snap.windows[1]] == list(range(11, 21))
        assert [m.sequence for m in snap.windows[2]] == [4, 5]  # pinned #1 is never in a window
        assert store.read_context("c", request, state.version + 1) is None
        assert store.read_context("missing", request) is None

    def test_pinned_messages_follow_the_state(self, store: Store) -> None:
        self.add(store, "c", incoming("v1", "system", pinned=True, pin_key="sys"))
        self.add(store, "c", incoming("fact", pinned=True))
        self.add(store, "c", incoming("v2", "system", pinned=True, pin_key="sys"))
        snap = store.read_context("c", ContextRequest())
        assert snap is not None
        assert [(m.content, m.pin_key) for m in snap.pinned] == [("fact", "#2"), ("v2", "sys")]
        # Replaced pins stay in history, as they were.
        assert [m.pinned for m in store.read_messages("c", 1, 3)] == [True, True, True]

    # -- summaries -----------------------------------------------------------------------------

    def test_a_summary_is_saved_once_and_other_workers_are_fenced(self, store: Store) -> None:
        self.chat(store, "c", 4)
        self.seal(store, "c")
        now = ts(10)
        assert store.claim("w1", now, 300, 1, conversation_id="c") == ["c"]
        assert store.claim("w2", now, 300, 1, conversation_id="c") == []  # leased
        [topic] = due_topics(store.read_summaries("c", "topic"), now, 5)
        assert (topic.status, topic.first_sequence, topic.last_sequence) == ("pending", 1, 4)
        write = SummaryWrite(content="x", rendered="R", token_count=5, status="final", summarizer="test")
        state = store.read_state("c")
        assert state is not None
        planned = record_summary(state, topic, write, now)
        with pytest.raises(LeaseLostError):
            store.commit("c", Guard(state.version, "w2"), planned)
        assert store.commit("c", Guard(state.version, "w1"), planned).ok
        state = store.read_state("c")
        assert state is not None
        # The same write again finds the row changed: nothing more is written.
        again = record_summary(state, topic, write, now)
        assert store.commit("c", Guard(state.version, "w1"), again).outcome is Outcome.ROW_CONFLICT
        assert due_topics(store.read_summaries("c", "topic"), now, 5) == []
        store.release("w1", "c")
        [saved] = store.read_summaries("c", "topic")
        assert (saved.content, saved.rendered, saved.token_count, saved.status, saved.attempts) == (
            "x",
            "R",
            5,
            "final",
            1,
        )
        assert store.stats("c")[0].compressions == 1
        assert state_of(store, "c").summarized_upto == 4

    def test_stats_count_the_summaries_a_fallback_wrote(self, store: Store) -> None:
        # What an operator watches when the configured summariser keeps failing: its topics are
        # not pending (a fallback summary was written) but provisional, to be summarised again.
        for cid, status in (("fell-back", "provisional"), ("fine", "final")):
            self.chat(store, cid, 4)
            self.seal(store, cid)
            [topic] = store.read_summaries(cid, "topic")
            state = store.read_state(cid)
            assert state is not None
            write = SummaryWrite(content="x", rendered="R", token_count=5, status=status, summarizer="test")
            assert store.commit(cid, Guard(state.version), record_summary(state, topic, write, ts(10))).ok
        [fell_back], [fine] = store.stats("fell-back"), store.stats("fine")
        assert (fell_back.topics_pending, fell_back.summaries_provisional) == (0, 1)
        assert (fine.topics_pending, fine.summaries_provisional) == (0, 0)
        # Merged into an archive before its retry, it is not retried: no longer waiting, not counted.
        state = state_of(store, "fell-back")
        topics = store.read_summaries("fell-back", "topic")
        archive = record_archive(state, topics, SummaryWrite("a", "RA", 3, "final", "test"), ts(20))
        done = store.commit("fell-back", Guard(state.version), archive)
        assert done.ok, done.outcome
        assert store.stats("fell-back")[0].summaries_provisional == 0

    def test_archives_link_what_they_merge_and_spend_accumulates(self, store: Store) -> None:
        for k in range(3):
            self.chat(store, "c", 2, start=2 * k)
            self.seal(store, "c")
        self.lease(store, "c", "w")
        now = ts(30)
        for topic in store.read_summaries("c", "topic"):
            state = store.read_state("c")
            assert state is not None
            write = SummaryWrite(
                f"s{topic.sequence}", f"R{topic.sequence}", 7, "final", "test", prompt_tokens=10, cost=0.5
            )
            assert store.commit("c", Guard(state.version, "w"), record_summary(state, topic, write, now)).ok
        # A retry adds its spend to what the row already holds.
        state = state_of(store, "c")
        first = store.read_summaries("c", "topic")[0]
        retry = SummaryWrite(
            "s1b", "R1b", 6, "final", "test", prompt_tokens=5, completion_tokens=2, cost=0.25
        )
        assert store.commit("c", Guard(state.version, "w"), record_summary(state, first, retry, now)).ok
        topics = store.read_summaries("c", "topic")
        assert (topics[0].prompt_tokens, topics[0].completion_tokens, topics[0].cost, topics[0].attempts) == (
            15,
            2,
            0.75,
            2,
        )
        state = store.read_state("c")
        assert state is not None
        merged = record_archive(state, topics[:2], SummaryWrite("arch", "RA", 9, "final", "test"), now)
        done = store.commit("c", Guard(state.version, "w"), merged)
        assert done.ok and len(done.summary_ids) == 1
        [archive] = store.read_summaries("c", "bulk")
        assert archive.id == done.summary_ids[0]
        assert (archive.first_sequence, archive.last_sequence, archive.level, archive.content) == (
            1,
            4,
            1,
            "arch",
        )
        assert [t.merged_into for t in store.read_summaries("c", "topic")] == [archive.id, archive.id, None]
        # Merging a topic already merged is refused, and nothing of that attempt is written.
        state = store.read_state("c")
        assert state is not None
        twice = record_archive(state, topics[1:], SummaryWrite("no", "RN", 9, "final", "test"), now)
        assert store.commit("c", Guard(state.version, "w"), twice).outcome is Outcome.ROW_CONFLICT
        assert len(store.read_summaries("c", "bulk")) == 1
        live = store.read_context(
            "c", ContextRequest(summaries=(SummaryWindow("topic", 0, 10**6), SummaryWindow("bulk", 0, 10**6)))
        )
        assert live is not None
        assert [t.sequence for t in live.summaries[0]] == [3]
        assert [a.id for a in live.summaries[1]] == [archive.id]
        # What the archive was made of: the merged rows only, newest first up to the token cap.
        made = store.read_context(
            "c",
            ContextRequest(
                summaries=(
                    SummaryWindow("topic", 0, 10**6, merged=True),
                    SummaryWindow("bulk", 0, 10**6, merged=True),
                    SummaryWindow("topic", 0, 1, merged=True),
                )
            ),
        )
        assert made is not None
        assert [t.sequence for t in made.summaries[0]] == [1, 2]
        assert all(t.merged_into == archive.id for t in made.summaries[0])
        assert made.summaries[1] == []
        assert [t.sequence for t in made.summaries[2]] == [2]

    def test_dropped_archives_are_marked_and_kept(self, store: Store) -> None:
        for k in range(2):
            self.chat(store, "c", 2, start=2 * k)
            self.seal(store, "c")
        self.lease(store, "c", "w")
        for topic in store.read_summaries("c", "topic"):
            state = state_of(store, "c")
            write = SummaryWrite(f"s{topic.sequence}", "R", 5, "final", "test")
            assert store.commit("c", Guard(state.version, "w"), record_summary(state, topic, write, T0)).ok
        state = state_of(store, "c")
        topics = store.read_summaries("c", "topic")
        merged = record_archive(state, topics, SummaryWrite("a", "RA", 5, "final", "t"), T0)
        assert store.commit("c", Guard(state.version, "w"), merged).ok
        state = state_of(store, "c")
        dropped = drop_archives(state, store.read_summaries("c", "bulk"), ts(5))
        assert store.commit("c", Guard(state.version, "w"), dropped).ok
        [archive] = store.read_summaries("c", "bulk")
        assert archive.dropped_at == ts(5) and archive.content == "a"
        assert state_of(store, "c").archives_dropped_upto == 1
        request = ContextRequest(
            summaries=(SummaryWindow("bulk", 0, 100), SummaryWindow("bulk", 0, 100, upto=1))
        )
        snap = store.read_context("c", request)
        assert snap is not None
        assert snap.summaries[0] == [] and [a.id for a in snap.summaries[1]] == [archive.id]

    # -- leases --------------------------------------------------------------------------------

    def test_claim_takes_due_conversations_in_id_order_behind_a_cursor(self, store: Store) -> None:
        for cid in ("b", "a", "d", "c", "e"):
            self.chat(store, cid, 2)
        for cid in ("a", "c", "d", "e"):
            self.seal(store, cid)
        now = ts(60)
        assert store.claim("w", now, 300, 2) == ["a", "c"]
        assert store.claim("w", now, 300, 2, after="c") == ["d", "e"]
        assert store.claim("w2", now, 300, 10) == []  # all leased
        # An explicit id is claimed whether due or not; one leased by another is not.
        assert store.claim("w2", now, 300, 1, conversation_id="b") == ["b"]
        assert store.claim("w3", now, 300, 1, conversation_id="a") == []
        # Expired leases are taken over.
        later = now + timedelta(seconds=301)
        assert store.claim("w3", later, 300, 10) == ["a", "c", "d", "e"]

    def test_renew_and_release_only_by_the_owner(self, store: Store) -> None:
        self.chat(store, "c", 2)
        self.seal(store, "c")
        self.lease(store, "c", "w1", ts(60))
        assert store.renew("w2", "c", ts(100)) is False
        assert store.renew("w1", "c", ts(100)) is True
        assert state_of(store, "c").lease_expires_at == ts(100)
        store.release("w2", "c")
        assert state_of(store, "c").lease_owner == "w1"
        store.release("w1", "c")
        state = store.read_state("c")
        assert state is not None and state.lease_owner is None and state.lease_expires_at is None
        # Leases are not part of the version: a reply's write neither waits for nor clears them.
        self.lease(store, "c", "w1", ts(61))
        self.add(store, "c", incoming("during maintenance"))
        assert state_of(store, "c").lease_owner == "w1"

    # -- search, listing, deletion ---------------------------------------------------------------

    @staticmethod
    def found(store: Store, cid: str, text: str, limit: int = 10) -> list[int]:
        return [h.message.sequence for h in store.search(cid, parse_query(text), limit) if h.message]

    def test_search_matches_words_case_insensitively_keeping_diacritics(self, store: Store) -> None:
        for text in ("Trip to ZÜRICH", "zürich again", "Paris", "50% off_sale", "ZüRiCh", "zurich plain"):
            self.add(store, "c", incoming(text))
        assert sorted(self.found(store, "c", "zürich")) == [1, 2, 5]
        assert self.found(store, "c", "zurich") == [6]
        assert self.found(store, "c", "ZÜRICH", 1) == [5]  # the shortest: "ZüRiCh" alone
        # Text without any word is matched literally (LIKE wildcards are text).
        assert self.found(store, "c", "%") == [4]
        assert self.found(store, "c", "_") == [4]
        assert self.found(store, "c", "%%") == []
        assert self.found(store, "missing", "zürich") == []

    def test_search_ranks_by_bm25_then_recency(self, store: Store) -> None:
        texts = [
            "the cat sat on the mat with a long tail of unrelated words after it",  # 1: cat, long
            "a dog barked",  # 2: dog only
            "cat and dog",  # 3: both words
            "the cat sat",  # 4: cat, short
            "cat and dog",  # 5: both, same as 3 but newer
        ]
        for t in texts:
            self.add(store, "c", incoming(t))
        ranked = self.found(store, "c", "cat dog")
        assert ranked[:2] == [5, 3]  # both words; equal scores: newest first
        assert ranked.index(4) < ranked.index(1)  # same words, shorter message first
        assert set(ranked) == {1, 2, 3, 4, 5}
        assert self.found(store, "c", "cat dog", 2) == [5, 3]

    def test_search_reads_a_piece_with_several_words_as_a_phrase(self, store: Store) -> None:
        for t in ("My code is Needle-4711", "4711 needle reversed", "needle 4711 spaced", "a_b mode", "a b"):
            self.add(store, "c", incoming(t))
        assert sorted(self.found(store, "c", "NEEDLE-4711")) == [1, 3]
        assert sorted(self.found(store, "c", "a_b")) == [4, 5]

    def test_search_treats_hostile_text_as_words(self, store: Store) -> None:
        self.add(store, "c", incoming("near the end of AND, OR and NOT: a star * and a dash - here"))
        self.add(store, "other", incoming("secret words near the end"))
        for text in HOSTILE_QUERIES:
            hits = store.search("c", parse_query(text), 5)
            assert all(h.message is not None and h.message.conversation_id == "c" for h in hits), text
        assert self.found(store, "c", 'NEAR("end" "star", 3)') == [1]
        assert self.found(store, "c", '"near"') == [1]
        assert self.found(store, "c", "secret") == []  # never another conversation's messages
        # The conversation's own storage key is no word of its messages.
        for key in range(1, 6):
            assert self.found(store, "c", str(key)) == [], key

    def test_search_summaries_ranks_those_with_text(self, store: Store) -> None:
        for k in range(3):
            self.chat(store, "c", 2, start=2 * k)
            self.seal(store, "c")
        self.lease(store, "c", "w")
        texts = ["talked about the harbour trip", "budget for the harbour", "python traceback"]
        for topic, text in zip(store.read_summaries("c", "topic")[:2], texts, strict=False):
            state = state_of(store, "c")
            write = SummaryWrite(text, f"R {text}", 9, "final", "test")
            assert store.commit("c", Guard(state.version, "w"), record_summary(state, topic, write, T0)).ok
        hits = store.search("c", parse_query("harbour"), 10, kind="summary")
        assert [h.summary.content for h in hits if h.summary] == [
            "budget for the harbour",
            "talked about the harbour trip",
        ]
        assert store.search("c", parse_query("python"), 10, kind="summary") == []  # still pending: no text

    def test_search_each_answers_what_each_search_answers(self, store: Store) -> None:
        self.chat(store, "c", 6)
        self.seal(store, "c")
        self.lease(store, "c", "w")
        topic = store.read_summaries("c", "topic")[0]
        state = state_of(store, "c")
        write = SummaryWrite("the harbour trip and its message", "R", 9, "final", "test")
        assert store.commit("c", Guard(state.version, "w"), record_summary(state, topic, write, T0)).ok
        self.chat(store, "c", 3, start=6)
        for text in ("message harbour", "message", "harbour", '"message 1"', ""):
            q = parse_query(text)
            limits = {"message": 4, "summary": 2}
            assert store.search_each("c", q, limits) == {
                kind: store.search("c", q, n, kind) for kind, n in limits.items()
            }, text
        assert store.search_each("c", parse_query("harbour"), {"summary": 3})["summary"]
        assert store.search_each("gone", parse_query("message"), {"message": 5, "summary": 5}) == {
            "message": [],
            "summary": [],
        }

    def test_delete_removes_every_row_of_one_conversation(self, store: Store) -> None:
        for cid in ("keep", "gone"):
            self.chat(store, cid, 4)
            self.seal(store, cid)
        assert store.delete("gone") is True
        assert store.delete("gone") is False
        assert store.read_state("gone") is None
        assert store.read_messages("gone", 1, 100) == [] and store.read_summaries("gone", "topic") == []
        assert store.search("gone", parse_query("message"), 10) == []
        assert store.conversation_ids() == ["keep"]
        assert (
            len(store.read_messages("keep", 1, 100)) == 4 and len(store.read_summaries("keep", "topic")) == 1
        )
        # The id can be used again, from scratch.
        self.add(store, "gone", incoming("fresh start"))
        assert [m.sequence for m in store.read_messages("gone", 1, 10)] == [1]

    def test_conversation_ids_are_exact_strings(self, store: Store) -> None:
        ids = ["a", "A", "a ", "ünï", "discord:123", "x" * 255]
        for cid in ids:
            self.add(store, cid, incoming("hi"))
        assert sorted(store.conversation_ids()) == sorted(ids)
        for cid in ids:
            assert state_of(store, cid).id == cid

    def test_stats_sum_what_is_stored(self, store: Store) -> None:
        self.add(store, "c", incoming("rule", "system", pinned=True, tokens=7))
        self.add(store, "c", incoming("a", tokens=10, full_tokens=12))
        self.add(store, "c", incoming("b", tokens=20))
        self.seal(store, "c")
        self.add(store, "c", incoming("d", tokens=30))
        [s] = store.stats("c")
        assert (s.conversation_id, s.messages, s.message_tokens, s.topics, s.topics_pending) == (
            "c",
            4,
            69,
            1,
            1,
        )
        assert s.tier_tokens["current"] == 67  # nothing summarised yet: every message is verbatim
        assert store.stats("missing") == []
        assert [x.conversation_id for x in store.stats(None)] == ["c"]

    # -- concurrency ---------------------------------------------------------------------------

    def test_concurrent_writers_never_lose_or_duplicate_a_message(self, store: Store) -> None:
        self.add(store, "c", incoming("start"))
        errors: list[BaseException] = []

        def writer(w: int) -> None:
            try:
                for k in range(15):
                    for _ in range(1000):
                        state = store.read_state("c")
                        assert state is not None
                        done = append(
                            state, "c", incoming(f"w{w}-{k}"), RULES, platform=None, encoding=ENCODING, now=T0
                        )
                        if store.commit("c", Guard(state.version), done.writes).ok:
                            break
                    else:
                        raise AssertionError("a writer never got its turn")
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        messages = store.read_messages("c", 1, 1000)
        assert [m.sequence for m in messages] == list(range(1, 62))
        assert sorted(m.content for m in messages[1:]) == sorted(
            f"w{w}-{k}" for w in range(4) for k in range(15)
        )
        state = store.read_state("c")
        assert state is not None and (state.version, state.last_sequence) == (61, 61)
