"""The size rule seals where the verbatim window stops fitting (``WindowMark.seal_at``).

At budgets laid out for the provider's cache, a window kept at an event used to need the whole
size limit's growth free, so a chat sealed by silence every few turns moved its window (a rewrite
of the cached prefix) far more often than "append until full, then drop the oldest half". Now
the window stays while it fits at all, and the open topic is sealed where it would stop fitting:
that seal is the event at which the window moves.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from tiered_history import HistoryCompressor
from tiered_history.core.boundaries import BoundaryRules
from tiered_history.core.state import WindowMark
from tiered_history.core.transitions import new_state, window_size_limit

CID = "seal"
T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def _rules(limit: int = 1000, size: bool = True) -> BoundaryRules:
    return replace(HistoryCompressor("memory://").reply.rules(None, 4000), size_limit=limit, size=size)


def test_the_size_limit_is_lowered_only_by_a_mark_of_the_current_event_and_budget() -> None:
    state = replace(new_state(CID, None, "cl100k_base", T0), epoch=3, budget=4000)
    mark = WindowMark(1, 4000, 3, (), seal_at=600)
    assert window_size_limit(_rules(), replace(state, window=mark)).size_limit == 600
    # Not for a mark chosen before the last event, for another budget, without a seal point, or
    # when the size rule is off; never raised above the size limit.
    assert window_size_limit(_rules(), replace(state, window=replace(mark, epoch=2))).size_limit == 1000
    assert window_size_limit(_rules(), replace(state, window=replace(mark, budget=8000))).size_limit == 1000
    assert window_size_limit(_rules(), replace(state, window=replace(mark, seal_at=None))).size_limit == 1000
    assert window_size_limit(_rules(), replace(state, window=replace(mark, seal_at=5000))).size_limit == 1000
    assert window_size_limit(_rules(), state).size_limit == 1000
    off = window_size_limit(_rules(size=False), replace(state, window=mark))
    assert off.size_limit == 1000 and not off.size


def test_the_lowered_rules_are_one_object_until_the_seal_point_moves() -> None:
    """Every message until the next event gets the same lowered rules, so what is derived from
    rules once (compiled phrases, detector parameters) is not derived again at each message."""
    from tiered_history.core.boundaries import _COMPILED, _compiled

    rules = _rules()
    state = replace(new_state(CID, None, "cl100k_base", T0), epoch=3, budget=4000)
    marked = replace(state, window=WindowMark(1, 4000, 3, (), seal_at=600))
    first = window_size_limit(rules, marked)
    assert window_size_limit(rules, replace(marked, last_sequence=9)) is first
    _compiled(first)
    assert _COMPILED[id(first)][0] is first
    moved = window_size_limit(rules, replace(marked, window=WindowMark(1, 4000, 3, (), seal_at=700)))
    assert moved is not first and moved.size_limit == 700
    assert window_size_limit(_rules(), marked) is not first  # other rules: their own lowered copy
    assert window_size_limit(_rules(), marked) == first


def test_the_window_of_another_budget_read_in_turn_seals_where_it_stops_fitting_first() -> None:
    state = replace(new_state(CID, None, "cl100k_base", T0), epoch=3, budget=8000)
    big = WindowMark(1, 8000, 3, (), seal_at=900)
    small = WindowMark(4, 4000, 3, (), seal_at=450)
    both = replace(state, window=big, other_windows=(small,))
    assert window_size_limit(_rules(), both).size_limit == 450
    # Recorded before the last event: it no longer counts (its budget reads it afresh).
    stale = replace(both, other_windows=(replace(small, epoch=2),))
    assert window_size_limit(_rules(), stale).size_limit == 900


def test_each_budget_keeps_its_own_mark_and_they_read_back() -> None:
    state = replace(new_state(CID, None, "cl100k_base", T0), epoch=3, budget=4000)
    small, big, third = (
        WindowMark(s, b, 3, (s,), seal_at=s * 10) for s, b in ((4, 4000), (1, 8000), (9, 2500))
    )
    window, others = replace(state, window=small).with_mark(big, 8000)
    assert (window, others) == (big, (small,))
    read = replace(state, budget=8000, window=window, other_windows=others)
    assert read.mark_for(4000) == small and read.mark_for(8000) == big and read.mark_for(2000) is None
    # A third budget keeps the two newest others; reading one of them again takes it back out.
    window, others = read.with_mark(third, 2500)
    assert (window, others) == (third, (big, small))
    three = replace(read, budget=2500, window=window, other_windows=others)
    assert three.with_mark(replace(small, start=5), 4000) == (replace(small, start=5), (third, big))
    parsed = type(three).from_row(
        id=CID,
        version=1,
        platform=None,
        encoding="cl100k_base",
        created_at=T0,
        updated_at=T0,
        body=three.body(),
    )
    assert (parsed.window, parsed.other_windows) == (third, (big, small))


def test_a_mark_reads_back_with_its_seal_point_and_an_older_one_without() -> None:
    mark = WindowMark(5, 4000, 2, (7, 9), seal_at=812)
    assert WindowMark.from_json(mark.to_json()) == mark
    assert WindowMark.from_json([5, 4000, 2, [7, 9]]) == replace(mark, seal_at=None)  # written before
    assert WindowMark.from_json(replace(mark, seal_at=None).to_json()) == replace(mark, seal_at=None)


def _text(k: int) -> str:
    return f"message {k} " + " ".join(f"w{j}" for j in range(40))


async def test_a_chat_read_every_turn_seals_where_the_window_stops_fitting() -> None:
    """One long topic (no silence, no phrase, no detector) read after every message at 4,000
    tokens: the window is recorded with a seal point, the open topic is sealed there, well before
    the size limit and never below min_topic_tokens, and the window never moves between two reads
    without an event."""
    budget = 4000
    boundaries = {"cohesion": False, "min_topic_tokens": 120}
    settings = {"context_budget": budget, "recall": {"enabled": False}, "boundaries": boundaries}
    async with HistoryCompressor.from_url("memory://", **settings) as hc:
        rules = hc.reply.rules(None, budget)
        starts: list[tuple[int, int]] = []
        sealed_at: list[int] = []
        for k in range(160):
            role = "user" if k % 2 == 0 else "assistant"
            before = hc.reply.read_state(CID)
            message = {"role": role, "content": _text(k), "timestamp": T0 + timedelta(seconds=k)}
            await hc.add_message(CID, message)
            after = hc.reply.read_state(CID)
            assert after is not None
            if before is not None and after.topic_start_seq != before.topic_start_seq:
                sealed_at.append(before.open.tokens)
            ctx = await hc.get_context(CID, budget)
            assert ctx.total_tokens <= budget
            state = hc.reply.read_state(CID)
            assert state is not None and state.window is not None and state.window.seal_at is not None
            starts.append((state.epoch, ctx.current_topic[0].sequence))
            if k % 10 == 9:
                await hc.maintain(CID, now=T0 + timedelta(seconds=k))
        # Some seals come where the window was full, well before the size limit; none leaves a
        # topic smaller than min_topic_tokens.
        assert sum(n < rules.size_limit - 200 for n in sealed_at) >= 2, (sealed_at, rules.size_limit)
        assert all(n >= rules.min_tokens for n in sealed_at), sealed_at
        for (e0, s0), (e1, s1) in itertools.pairwise(starts):
            assert s0 == s1 or e0 != e1, "the window moved between two reads without an event"


async def test_a_window_kept_at_an_event_leaves_room_for_a_topic_of_the_least_size() -> None:
    """With the seal point, a kept window needs only ``min_topic_tokens`` of room at an event (not
    the size limit's growth): with none, an event while the window is full (a detector's or a
    silence seal) would leave the next topic a message or two before its window seal, and a
    summary (with an LLM, a call) for each. Below the cache layout the size limit's growth stays."""
    least = {"min_topic_tokens": 120}  # the tests' default is 0 (conftest)
    async with HistoryCompressor.from_url("memory://", context_budget=4000, boundaries=least) as hc:
        await hc.add_message(CID, {"role": "user", "content": _text(0), "timestamp": T0})
        state = hc.reply.read_state(CID)
        assert state is not None
        rules = hc.reply.rules(None, 4000)
        assert hc.reply._growth(state, 4000) == rules.min_tokens == 120
        small = hc.reply.rules(None, 1000)
        assert hc.reply._growth(state, 1000) == small.size_limit - state.open.tokens


async def test_below_the_cache_layout_no_seal_point_is_recorded() -> None:
    """At budgets laid out for relevance the window reaches back as far as fits (no room left):
    a seal point there would seal every message. Reads there seal nothing a conversation never
    read would not."""
    epochs = []
    for read in (True, False):
        async with HistoryCompressor.from_url("memory://", context_budget=1000) as hc:
            for k in range(40):
                message = {"role": "user", "content": _text(k), "timestamp": T0 + timedelta(seconds=k)}
                await hc.add_message(CID, message)
                if read:
                    await hc.get_context(CID, 1000)
            state = hc.reply.read_state(CID)
            assert state is not None
            assert state.window is None or state.window.seal_at is None
            epochs.append(state.epoch)
    assert epochs[0] == epochs[1]
