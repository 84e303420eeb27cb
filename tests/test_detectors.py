"""Pluggable boundary detectors (issue 14, item 2): asked by maintenance only, combined by
``choose_proposal``, applied as a seal (``detector:<name>``) or a reopening under the lease."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tiered_history import (
    BoundaryDetector,
    ConfigurationError,
    HistoryCompressor,
    Proposal,
    SyncHistoryCompressor,
    Turn,
)
from tiered_history.core import transitions
from tiered_history.core.boundaries import BoundaryRules, proposer
from tiered_history.core.phrases import phrases_for
from tiered_history.models import StoredMessage

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def msg(role: str, content: str, minutes: float, **extra: Any) -> dict[str, Any]:
    return {"role": role, "content": content, "timestamp": at(minutes), **extra}


def call(cid: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": "lookup", "arguments": "{}"}}


Answer = Sequence[Proposal] | Callable[[Sequence[Turn]], Sequence[Proposal]]


class Fake:
    """A detector that answers what it is told (and remembers what it was asked)."""

    def __init__(self, name: str, answer: Answer = (), window: int = 8, *, fail: bool = False) -> None:
        self.name = name
        self.window = window
        self.answer = answer
        self.fail = fail
        self.calls: list[list[Turn]] = []

    async def propose(self, turns: Sequence[Turn]) -> Sequence[Proposal]:
        self.calls.append(list(turns))
        if self.fail:
            raise RuntimeError("detector service down")
        return self.answer(turns) if callable(self.answer) else self.answer


class Hangs(Fake):
    async def propose(self, turns: Sequence[Turn]) -> Sequence[Proposal]:
        self.calls.append(list(turns))
        await asyncio.sleep(3600)
        return []


class Garbage(Fake):
    async def propose(self, turns: Sequence[Turn]) -> Sequence[Proposal]:
        self.calls.append(list(turns))
        return [Proposal(turns[-1].sequence, "high", "split"), "split at 3", None]  # type: ignore[list-item]


def options(**boundaries: Any) -> dict[str, Any]:
    """Only silence (when a test needs it) and the pluggable detectors decide boundaries."""
    return {
        "boundaries": {
            "cohesion": False,
            "explicit": True,
            "size": False,
            "unseal": False,
            "min_topic_tokens": 0,
            "detector_every": 1,
            "detector_timeout_seconds": 0.3,
            **boundaries,
        }
    }


CHAT = [
    ("user", "How do I water tomato seedlings on a balcony?"),
    ("assistant", "Deeply, in the morning, and give them afternoon shade."),
    ("user", "Should I add fertiliser already?"),
    ("assistant", "Wait until the first true leaves appear."),
    ("user", "How do I renew my passport, by the way?"),
    ("assistant", "Fill in the online form and book an appointment."),
    ("user", "Which photo size do they want?"),
    ("assistant", "35 by 45 millimetres, biometric."),
]


async def add_chat(hc: HistoryCompressor, cid: str = "c", start: float = 0) -> None:
    for i, (role, text) in enumerate(CHAT):
        await hc.add_message(cid, msg(role, text, start + i))


def rows(messages: Sequence[StoredMessage]) -> list[tuple[Any, ...]]:
    return [(m.sequence, m.role, m.content, m.timestamp, m.token_count, m.tool_calls) for m in messages]


# -- a split ------------------------------------------------------------------------------------


async def test_a_split_seals_the_open_topic_at_the_proposed_message(db_url: str) -> None:
    det = Fake("fake", [Proposal(5, 0.9, note="passport")])
    async with HistoryCompressor(db_url, detectors=[det], **options()) as hc:
        await add_chat(hc)
        before = rows(await hc.get_messages("c"))
        report = await hc.maintain(now=at(10))  # due because of the new messages: no id needed
        assert not report.errors
        assert (report.detector_splits, report.sealed, report.summarized) == (1, 1, 1)
        h = await hc.get_history("c")
        [t] = h.topics
        assert (t.first_sequence, t.last_sequence, t.sealed_reason) == (1, 4, "detector:fake")
        assert h.open_topic_start == 5
        assert rows(await hc.get_messages("c")) == before  # nothing stored changed
        assert [turn.sequence for turn in det.calls[0]] == list(range(1, 9))
        # Nothing new: the detector is not asked about the same messages again.
        assert (await hc.maintain("c", now=at(11))).detector_splits == 0
        assert len(det.calls) == 1
        # The next message is not enough for a proposal at an already sealed message.
        await hc.add_message("c", msg("user", "And the fee?", 12))
        await hc.maintain("c", now=at(13))
        assert len(det.calls) == 2 and [x.sequence for x in det.calls[1]] == [5, 6, 7, 8, 9]
        assert len((await hc.get_history("c")).topics) == 1


async def test_detectors_are_asked_every_n_new_messages(db_url: str) -> None:
    det = Fake("fake")
    async with HistoryCompressor(db_url, detectors=[det], **options(detector_every=3)) as hc:
        for i in range(2):
            await hc.add_message("c", msg("user", f"message {i}", i))
        await hc.maintain(now=at(5))
        assert det.calls == []  # two new messages only: the conversation is not even due
        await hc.add_message("c", msg("user", "message 2", 2))
        await hc.maintain(now=at(5))
        assert len(det.calls) == 1
        for i in range(3, 5):
            await hc.add_message("c", msg("user", f"message {i}", i))
        await hc.maintain("c", now=at(6))  # asked for explicitly, still only 2 unseen
        assert len(det.calls) == 1


async def test_the_cut_never_separates_a_tool_call_from_its_results(db_url: str) -> None:
    det = Fake("fake")
    async with HistoryCompressor(db_url, detectors=[det], **options()) as hc:
        await hc.add_message("c", msg("user", "Look up order 17", 0))
        await hc.add_message("c", msg("assistant", "", 1, tool_calls=[call("a"), call("b")]))
        await hc.add_message("c", msg("tool", "order 17: shipped", 2, tool_call_id="a"))
        await hc.add_message("c", msg("tool", "carrier: DHL", 3, tool_call_id="b"))
        await hc.add_message("c", msg("assistant", "It shipped with DHL.", 4))
        det.answer = [Proposal(3, 0.99), Proposal(4, 0.99)]  # at tool results: never applied
        report = await hc.maintain("c", now=at(5))
        assert report.detector_splits == 0 and (await hc.get_history("c")).topics == []
        # A call its conversation moved on from: a cut right after it moves before it.
        await hc.add_message("c", msg("assistant", "", 6, tool_calls=[call("c")]))
        await hc.add_message("c", msg("user", "Never mind, thanks!", 7))
        await hc.add_message("c", msg("assistant", "You're welcome.", 8))
        det.answer = [Proposal(7, 0.9)]
        report = await hc.maintain("c", now=at(9))
        assert report.detector_splits == 1
        h = await hc.get_history("c")
        [t] = h.topics
        assert (t.first_sequence, t.last_sequence, t.sealed_reason) == (1, 5, "detector:fake")
        assert h.open_topic_start == 6  # the call opens the new topic
        # The open topic's bookkeeping matches its rows: the next seal covers exactly 6..8.
        await hc.seal_current_topic("c")
        last = (await hc.get_history("c")).topics[-1]
        assert (last.first_sequence, last.last_sequence) == (6, 8)
        messages = {m.sequence: m for m in await hc.get_messages("c")}
        assert last.source_tokens == sum(messages[s].full_token_count for s in (6, 7, 8))


async def test_a_split_while_a_call_awaits_its_result(db_url: str) -> None:
    det = Fake("fake", [Proposal(3, 0.9)])
    async with HistoryCompressor(db_url, detectors=[det], **options()) as hc:
        await hc.add_message("c", msg("user", "Plants", 0))
        await hc.add_message("c", msg("assistant", "Water them.", 1))
        await hc.add_message("c", msg("user", "Now the weather please", 2))
        await hc.add_message("c", msg("assistant", "", 3, tool_calls=[call("w")]))
        assert (await hc.maintain("c", now=at(4))).detector_splits == 1
        await hc.add_message("c", msg("tool", "sunny", 5, tool_call_id="w"))
        await hc.add_message("c", msg("assistant", "Sunny.", 6))
        await hc.seal_current_topic("c")
        topics = (await hc.get_history("c")).topics
        assert [(t.first_sequence, t.last_sequence) for t in topics] == [(1, 2), (3, 6)]


async def test_a_low_confidence_proposal_is_ignored(db_url: str) -> None:
    det = Fake("weak", [Proposal(5, 0.3)])
    async with HistoryCompressor(db_url, detectors=[det], **options()) as hc:
        await add_chat(hc)
        report = await hc.maintain(now=at(10))
        assert report.detector_splits == 0 and report.sealed == 0 and not report.errors
        assert (await hc.get_history("c")).topics == []
        assert len(det.calls) == 1
        await hc.maintain("c", now=at(11))
        assert len(det.calls) == 1  # its verdict on these messages stands


# -- failures -----------------------------------------------------------------------------------


async def test_failing_and_hanging_detectors_are_ignored(db_url: str) -> None:
    good = Fake("good", [Proposal(5, 0.8)])
    bad = Fake("bad", [Proposal(3, 1.0)], fail=True)
    slow = Hangs("slow")
    junk = Garbage("junk")
    async with HistoryCompressor(db_url, detectors=[bad, slow, junk, good], **options()) as hc:
        await add_chat(hc)
        started = time.monotonic()
        report = await hc.maintain(now=at(10))
        assert time.monotonic() - started < 5  # the hanging one was given 0.3 s
        assert not report.errors and report.detector_splits == 1
        [t] = (await hc.get_history("c")).topics
        assert (t.first_sequence, t.last_sequence, t.sealed_reason) == (1, 4, "detector:good")
        assert all(len(d.calls) == 1 for d in (good, bad, slow, junk))
        # Not asked again about the same messages: a broken detector cannot make a pass loop.
        await hc.maintain(now=at(11))
        assert all(len(d.calls) == 1 for d in (good, bad, slow, junk))
        assert len(await hc.get_messages("c")) == len(CHAT)


async def test_only_failing_detectors_leave_everything_as_it_was(db_url: str) -> None:
    async with HistoryCompressor(
        db_url, detectors=[Fake("bad", fail=True), Hangs("slow")], **options()
    ) as hc:
        await add_chat(hc)
        report = await hc.maintain(now=at(10))
        assert not report.errors and report.sealed == 0
        h = await hc.get_history("c")
        assert h.topics == [] and h.open_topic_start == 1 and len(h.messages) == len(CHAT)


async def test_the_reply_path_never_asks_a_detector(db_url: str) -> None:
    det = Fake("fake", [Proposal(2, 0.9)])
    async with HistoryCompressor(db_url, detectors=[det], summarize_inline=True, **options()) as hc:
        await add_chat(hc)
        await hc.get_context("c", 4000)
        await hc.add_messages("c", [msg("user", "One more", 20), msg("assistant", "Sure", 21)])
        # A seal on the reply path runs maintenance inline (summarize_inline): still no detector.
        await hc.add_message("c", msg("user", "New topic: the weather", 22))
        assert (await hc.get_history("c")).topics[0].sealed_reason == "explicit"
        await hc.seal_current_topic("c")
        await hc.get_context("c", 4000, query="passport")
        assert det.calls == []
        await hc.add_message("c", msg("user", "Is it sunny?", 23))
        await hc.add_message("c", msg("assistant", "Yes.", 24))
        await hc.maintain(now=at(25))
        assert len(det.calls) == 1


# -- a merge ------------------------------------------------------------------------------------


async def test_a_merge_reopens_a_topic_sealed_for_silence(db_url: str) -> None:
    det = Fake("fake", lambda turns: [Proposal(turns[-1].sequence, 0.8, "merge")])
    async with HistoryCompressor(db_url, detectors=[det], **options()) as hc:
        await hc.add_message("c", msg("user", "How do I water tomato seedlings?", 0))
        await hc.add_message("c", msg("assistant", "Deeply, in the morning.", 1))
        await hc.add_message("c", msg("user", "And how often?", 90))  # an hour and a half later
        await hc.add_message("c", msg("assistant", "Every other day.", 91))
        [t] = (await hc.get_history("c")).topics
        assert t.sealed_reason == "silence"
        report = await hc.maintain(now=at(92))
        assert report.detector_merges == 1 and not report.errors
        h = await hc.get_history("c")
        assert h.open_topic_start == 1
        assert [x.status for x in h.topics] == ["superseded"]  # the row stays: nothing is lost
        ctx = await hc.get_context("c", 4000)
        assert [m.sequence for m in ctx.current_topic] == [1, 2, 3, 4]


async def test_a_merge_never_undoes_a_seal_the_user_asked_for(db_url: str) -> None:
    det = Fake("fake", lambda turns: [Proposal(turns[-1].sequence, 0.99, "merge")])
    async with HistoryCompressor(db_url, detectors=[det], **options()) as hc:
        await hc.add_message("c", msg("user", "How do I water tomato seedlings?", 0))
        await hc.add_message("c", msg("assistant", "Deeply, in the morning.", 1))
        await hc.add_message("c", msg("user", "New topic: passports", 2))
        await hc.add_message("c", msg("assistant", "Sure.", 3))
        report = await hc.maintain(now=at(4))
        assert report.detector_merges == 0 and len(det.calls) == 1
        h = await hc.get_history("c")
        assert h.open_topic_start == 3 and [x.sealed_reason for x in h.topics] == ["explicit"]


# -- several detectors --------------------------------------------------------------------------


async def test_two_detectors_combine_as_choose_proposal_says(db_url: str) -> None:
    a = Fake("a", [Proposal(5, 0.4), Proposal(7, 0.45)])
    b = Fake("b", [Proposal(5, 0.45)], window=4)
    async with HistoryCompressor(db_url, detectors=[a, b], **options()) as hc:
        await add_chat(hc)
        report = await hc.maintain(now=at(10))
        assert report.detector_splits == 1
        [t] = (await hc.get_history("c")).topics
        # Alone neither reaches 0.5; together 1 - 0.6 * 0.55 = 0.67 at message 5. The seal is
        # recorded for the more confident of the two.
        assert (t.first_sequence, t.last_sequence, t.sealed_reason) == (1, 4, "detector:b")
        assert [x.sequence for x in a.calls[0]] == list(range(1, 9))
        assert [x.sequence for x in b.calls[0]] == [5, 6, 7, 8]  # its own window


async def test_one_of_two_weak_detectors_alone_changes_nothing(db_url: str) -> None:
    a = Fake("a", [Proposal(5, 0.4), Proposal(7, 0.45)])
    async with HistoryCompressor(db_url, detectors=[a], **options()) as hc:
        await add_chat(hc)
        assert (await hc.maintain(now=at(10))).detector_splits == 0


def test_proposer_names_the_most_confident() -> None:
    votes = [("a", Proposal(5, 0.4)), ("b", Proposal(5, 0.45)), ("c", Proposal(5, 0.9, "merge"))]
    assert proposer(votes, Proposal(5, 0.67)) == "b"
    assert proposer(votes, Proposal(5, 0.9, "merge")) == "c"
    assert proposer([("a", Proposal(5, 0.5)), ("b", Proposal(5, 0.5))], Proposal(5, 0.75)) == "a"


# -- the blocking twin, construction --------------------------------------------------------------


def test_the_blocking_twin_passes_detectors_through(tmp_path: Any) -> None:
    det = Fake("fake", [Proposal(5, 0.9)])
    url = f"sqlite:///{tmp_path / 'h.db'}"
    with SyncHistoryCompressor.from_url(url, detectors=[det], **options()) as hc:
        for i, (role, text) in enumerate(CHAT):
            hc.add_message("c", msg(role, text, i))
        assert det.calls == []
        report = hc.maintain(now=at(10))
        assert report.detector_splits == 1
        [t] = hc.get_history("c").topics
        assert (t.last_sequence, t.sealed_reason) == (4, "detector:fake")


async def test_from_url_passes_detectors_through() -> None:
    det = Fake("fake", [Proposal(5, 0.9)])
    async with HistoryCompressor.from_url("memory://", detectors=[det], **options()) as hc:
        await add_chat(hc)
        assert (await hc.maintain(now=at(10))).detector_splits == 1


def test_a_fake_is_a_boundary_detector() -> None:
    assert isinstance(Fake("x"), BoundaryDetector)


class NoWindow:
    name = "x"

    async def propose(self, turns: Sequence[Turn]) -> Sequence[Proposal]:
        return []


@pytest.mark.parametrize(
    "detectors",
    [
        [NoWindow()],
        [object()],
        Fake("alone"),
        [Fake("")],
        [Fake("x" * 24)],
        [Fake("x", window=0)],
        [Fake("x", window=True)],  # type: ignore[arg-type]
    ],
)
def test_bad_detectors_are_refused(detectors: Any) -> None:
    with pytest.raises(ConfigurationError):
        HistoryCompressor("memory://", detectors=detectors)


def test_the_longest_name_fits_the_reason_column() -> None:
    HistoryCompressor("memory://", detectors=[Fake("x" * 23)])


# -- the pure transition --------------------------------------------------------------------------


RULES = BoundaryRules(
    explicit=False,
    temporal=False,
    size=False,
    cohesion=False,
    unseal=False,
    phrases=phrases_for(),
    trigger_roles=("user",),
    silence=timedelta(minutes=30),
    size_limit=100_000,
)


def _stored(seq: int, role: str = "user") -> StoredMessage:
    return StoredMessage(
        conversation_id="c",
        sequence=seq,
        role=role,
        content=f"message {seq}",
        timestamp=at(seq),
        token_count=10,
        full_token_count=10,
    )


def _state(n: int) -> tuple[transitions.ConversationState, list[StoredMessage]]:
    state = None
    for i in range(1, n + 1):
        m = transitions.Incoming("user", f"message {i}", None, at(i), 10, 10)
        state = transitions.append(state, "c", m, RULES, platform=None, encoding="x", now=at(i)).writes.state
    assert state is not None
    return state, [_stored(i) for i in range(1, n + 1)]


def test_seal_at_needs_the_whole_open_topic() -> None:
    state, messages = _state(6)
    assert transitions.seal_at(state, messages[1:], 4, "detector:x", RULES, at(7)) is None
    assert transitions.seal_at(state, messages[:-1], 4, "detector:x", RULES, at(7)) is None
    assert transitions.seal_at(state, messages, 1, "detector:x", RULES, at(7)) is None  # nothing before it
    assert transitions.seal_at(state, messages, 7, "detector:x", RULES, at(7)) is None  # nothing after it
    assert transitions.seal_at(state, messages, 4, "x", replace(RULES, min_tokens=31), at(7)) is None
    done = transitions.seal_at(state, messages, 4, "detector:x", RULES, at(7))
    assert done is not None
    after, topic = done
    assert (topic.first_sequence, topic.last_sequence, topic.source_tokens) == (1, 3, 30)
    assert (after.topic_start_seq, after.open.messages, after.open.tokens) == (4, 3, 30)
    assert after.open.first_at == at(4) and after.open.last_at == at(6)
    assert after.last_seal is not None and after.last_seal.reason == "detector:x"


def test_a_proposal_for_a_topic_sealed_meanwhile_is_dropped() -> None:
    state, messages = _state(6)
    done = transitions.apply_proposal(
        state, Proposal(4, 0.9), "detector:x", messages, RULES, at(7), start=2, upto=6
    )
    assert done.outcome == "none" and done.writes.summaries == ()
    assert done.writes.state.detected_upto == 6 and done.writes.state.topic_start_seq == 1
