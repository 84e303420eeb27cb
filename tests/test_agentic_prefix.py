"""The cached-prefix promise under a bot's own ways of reading (found by ``bench/agentic_prefix.py``).

Between two ``get_context`` calls with no maintenance event between them (the same
``maintenance_epoch``), everything the earlier context held before its recall part must be a
prefix of the later one: a provider's prompt cache then keeps serving it. The cached-prefix
replays of ``bench.retention`` read one budget, no explicit query; a bot may pass its own
``query=`` and may read one conversation for two models.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

from bench.agentic_prefix import replay
from tests._agentic import T0, filler, keeps_prefix, prefix_losses
from tiered_history import HistoryCompressor


async def long_chat(h: HistoryCompressor, budget: int) -> datetime:
    """A zebra named early on, then a chat longer than ``budget``, read after every message."""
    await h.add_message("c", {"role": "user", "content": "My zebra is called Stripes.", "timestamp": T0})
    at = T0
    for i in range(2, 40):
        at = T0 + timedelta(minutes=i)
        await h.add_message(
            "c", {"role": "user" if i % 2 else "assistant", "content": filler(i), "timestamp": at}
        )
        await h.get_context("c", budget)
    return at


@pytest.mark.xfail(
    strict=True,
    reason="a read that recalls nothing promises its whole context; the next read's recall part is "
    "placed before the newest user message, so when the bot's query= changes and now recalls, the "
    "previous context's newest user message (and what followed it) leaves the prefix without an event",
)
async def test_explicit_query_that_starts_recalling_keeps_the_previous_prefix(db_url: str) -> None:
    async with HistoryCompressor.from_url(db_url, context_budget=4000) as h:
        at = await long_chat(h, 4000)
        ask = {
            "role": "user",
            "content": "Which depot gets crate 39?",
            "timestamp": at + timedelta(minutes=1),
        }
        await h.add_message("c", ask)
        before = await h.get_context("c", 4000, query="weather forecast")
        assert before.recall_start is None  # nothing matches: the whole context is the promised prefix
        await h.add_message(
            "c", {"role": "assistant", "content": "Depot 3.", "timestamp": at + timedelta(minutes=2)}
        )
        after = await h.get_context("c", 4000, query="zebra name")
        assert after.maintenance_epoch == before.maintenance_epoch  # no event between the two reads
        assert [m.sequence for m in after.recalled] == [1]
        assert keeps_prefix(before, after)


@pytest.mark.xfail(
    strict=True,
    reason="in a tool loop, a read between tool results whose query= now recalls puts its recall part "
    "before the user's message, ahead of the tool call the previous read (which recalled nothing) "
    "already held: the call leaves the prefix without an event",
)
async def test_tool_loop_query_that_starts_recalling_keeps_the_previous_prefix(db_url: str) -> None:
    async with HistoryCompressor.from_url(db_url, context_budget=4000) as h:
        at = await long_chat(h, 4000)
        ask = {"role": "user", "content": "Look up crate 39 for me.", "timestamp": at + timedelta(minutes=1)}
        await h.add_message("c", ask)
        calls = [
            {
                "id": f"call_{j}",
                "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"j": j})},
            }
            for j in range(2)
        ]
        at += timedelta(minutes=2)
        await h.add_message("c", {"role": "assistant", "content": "", "tool_calls": calls, "timestamp": at})
        result = {"role": "tool", "tool_call_id": "call_0", "content": "crate 39: depot 3", "timestamp": at}
        await h.add_message("c", result)
        before = await h.get_context("c", 4000, query="weather forecast")
        assert before.recall_start is None
        await h.add_message("c", {**result, "tool_call_id": "call_1", "content": "crate 39: 12 kg"})
        after = await h.get_context("c", 4000, query="zebra name")
        assert after.maintenance_epoch == before.maintenance_epoch
        assert after.recalled
        assert keeps_prefix(before, after)


async def test_two_budgets_in_turn_keep_each_prefix(db_url: str) -> None:
    async with HistoryCompressor.from_url(db_url, context_budget=4000) as h:
        assert await prefix_losses(h, 40, (4000, 8000)) == []


@pytest.mark.parametrize("pattern", ["tools", "parallel+abandon", "pins", "silence+seal"])
async def test_agentic_replay_keeps_its_promises(pattern: str) -> None:
    """A short replay of each bot pattern at 4,000 tokens, recall on: within budget, tool units whole,
    pins sent, storage unchanged, and no prefix lost without an event beyond the documented ones
    (a newest unit that does not fit beside the window; a call abandoned)."""
    for r in await replay(pattern, "memory", True, 4000, 90):
        assert (r.over_budget, r.broken_units, r.pins_lost, r.storage, r.losses) == (0, 0, 0, 0, 0), (
            r.findings
        )
