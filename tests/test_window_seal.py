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


def test_a_mark_reads_back_with_its_seal_point_and_an_older_one_without() -> None:
    mark = WindowMark(5, 4000, 2, (7, 9), seal_at=812)
    assert WindowMark.from_json(mark.to_json()) == mark
    assert WindowMark.from_json([5, 4000, 2, [7, 9]]) == replace(mark, seal_at=None)  # written before
    assert WindowMark.from_json(replace(mark, seal_at=None).to_json()) == replace(mark, seal_at=None)


def _text(k: int) -> str:
    return f"message {k} " + " ".join(f"w{k}x{j}" for j in range(40))


async def test_a_chat_read_every_turn_seals_where_the_window_stops_fitting() -> None:
    """One long topic (no silence, no phrase) read after every message at 4,000 tokens: the window
    is recorded with a seal point, the open topic is sealed there (before the size limit), and
    the window never moves between two reads without an event."""
    budget = 4000
    async with HistoryCompressor.from_url(
        "memory://", context_budget=budget, recall={"enabled": False}
    ) as hc:
        limit = hc.reply.rules(None, budget).size_limit
        starts: list[tuple[int, int]] = []
        seals_below_limit = 0
        for k in range(160):
            role = "user" if k % 2 == 0 else "assistant"
            before = hc.reply.read_state(CID)
            await hc.add_message(
                CID, {"role": role, "content": _text(k), "timestamp": T0 + timedelta(seconds=k)}
            )
            after = hc.reply.read_state(CID)
            assert after is not None
            if before is not None and after.epoch != before.epoch and before.open.tokens < limit - 200:
                seals_below_limit += 1
            ctx = await hc.get_context(CID, budget)
            assert ctx.total_tokens <= budget
            state = hc.reply.read_state(CID)
            assert state is not None and state.window is not None and state.window.seal_at is not None
            starts.append((state.epoch, ctx.current_topic[0].sequence))
            if k % 10 == 9:
                await hc.maintain(CID, now=T0 + timedelta(seconds=k))
        assert seals_below_limit >= 2  # sealed where the window was full, well before the size limit
        for (e0, s0), (e1, s1) in itertools.pairwise(starts):
            assert s0 == s1 or e0 != e1, "the window moved between two reads without an event"


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
