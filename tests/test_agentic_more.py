"""Promises under the bot patterns ``bench/agentic_more.py`` replays: copies, deletions, previews,
odd message shapes, pins near the budget's limit, background maintenance, two processes."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from bench.agentic_more import replay, replay_processes, unit_problems
from tests._agentic import T0, filler, keeps_prefix, prefix_losses
from tiered_history import CompressedContext, HistoryCompressor, SyncHistoryCompressor


def orphans(msgs: list[dict[str, Any]]) -> list[str]:
    return unit_problems(msgs, newest_open=False)


async def test_recall_keeps_a_legacy_function_result_with_its_call(db_url: str) -> None:
    async with HistoryCompressor.from_url(db_url, context_budget=4000) as h:
        at = T0
        await h.add_message(
            "c", {"role": "user", "content": "What is the weather at the zebra aquarium?", "timestamp": at}
        )
        call = {"name": "get_weather", "arguments": json.dumps({"place": "zebra aquarium"})}
        await h.add_message(
            "c", {"role": "assistant", "content": None, "function_call": call, "timestamp": at}
        )
        forecast = "Zebra aquarium forecast: sunny, 24 degrees, light wind from the harbour. " * 3
        await h.add_message(
            "c", {"role": "function", "name": "get_weather", "content": forecast, "timestamp": at}
        )
        await h.add_message("c", {"role": "assistant", "content": "Sunny there.", "timestamp": at})
        for i in range(5, 60):
            at = T0 + timedelta(minutes=i)
            role = "user" if i % 2 else "assistant"
            await h.add_message("c", {"role": role, "content": filler(i), "timestamp": at})
            await h.get_context("c", 4000)
        ask = {"role": "user", "content": "What was the zebra aquarium forecast again?", "timestamp": at}
        await h.add_message("c", ask)
        ctx = await h.get_context("c", 4000)
        assert 3 in [m.sequence for m in ctx.recalled]  # the forecast is recalled
        assert orphans(ctx.to_messages()) == []


async def test_window_never_starts_at_a_legacy_function_result(db_url: str) -> None:
    async with HistoryCompressor.from_url(db_url, context_budget=4000) as h:
        at = T0
        for i in range(1, 40):
            at = T0 + timedelta(minutes=i)
            await h.add_message(
                "c", {"role": "user" if i % 2 else "assistant", "content": filler(i), "timestamp": at}
            )
        await h.add_message("c", {"role": "user", "content": "Weather in Oslo?", "timestamp": at})
        call = {"name": "get_weather", "arguments": json.dumps({"city": "Oslo"})}
        await h.add_message(
            "c", {"role": "assistant", "content": None, "function_call": call, "timestamp": at}
        )
        at += timedelta(hours=2)  # the function answered late: the silence rule seals before its result
        result = (
            "Oslo: snow. " + filler(99) * 12
        )  # about 1,700 tokens: the window cannot hold the topic before
        await h.add_message(
            "c", {"role": "function", "name": "get_weather", "content": result, "timestamp": at}
        )
        await h.add_message("c", {"role": "assistant", "content": "Snow in Oslo.", "timestamp": at})
        await h.maintain("c", now=at)
        ctx = await h.get_context("c", 4000)
        # The silence fell inside the call's unit: the cut moved before the call, which the window keeps.
        assert ctx.current_topic[0].sequence <= 41
        assert orphans(ctx.to_messages()) == []


async def test_a_fork_keeps_an_open_legacy_function_call_open(db_url: str) -> None:
    """A fork replays the stored messages into the branch's state: a legacy function_call still
    awaiting its result stays open there, so the branch's silence seal does not split it."""
    async with HistoryCompressor.from_url(db_url, context_budget=4000) as h:
        at = T0
        for i in range(1, 12):
            at = T0 + timedelta(minutes=i)
            role = "user" if i % 2 else "assistant"
            await h.add_message("c", {"role": role, "content": filler(i), "timestamp": at})
        call = {"name": "get_weather", "arguments": json.dumps({"city": "Oslo"})}
        await h.add_message(
            "c", {"role": "assistant", "content": None, "function_call": call, "timestamp": at}
        )
        await h.fork("c", "d")
        at += timedelta(hours=2)
        result = {"role": "function", "name": "get_weather", "content": "Oslo: snow.", "timestamp": at}
        await h.add_message("d", result)
        await h.add_message("d", {"role": "assistant", "content": "Snow in Oslo.", "timestamp": at})
        await h.maintain("d", now=at)
        history = await h.get_history("d")
        assert [m.role for m in history.messages[-3:]] == ["assistant", "function", "assistant"]
        assert 12 not in [t.last_sequence for t in history.topics]  # no topic ends at the call
        assert orphans((await h.get_context("d", 4000)).to_messages()) == []


async def test_a_small_read_does_not_evict_a_cached_budgets_window(db_url: str) -> None:
    async with HistoryCompressor.from_url(db_url, context_budget=4000) as h:
        # A cheap model's read at 1,500 (below cache_min_tokens) between the cached budgets'.
        assert await prefix_losses(h, 60, (4000, 1500, 8000, 6000)) == []


@pytest.mark.parametrize(
    ("pattern", "store"),
    [
        ("fork+import", "sqlite"),
        ("delete+recreate", "sqlite"),
        ("previews+small", "memory"),
        ("long messages", "memory"),
        ("pins near limit", "memory"),
        ("background", "sqlite"),
        ("shapes", "sqlite"),
    ],
)
async def test_agentic_more_replay_keeps_its_promises(pattern: str, store: str) -> None:
    """A short replay of each pattern at 4,000 tokens, recall on: within budget (as counted and as
    re-counted), units whole, pins sent, every message shown and stored exactly as given, no
    overlapping live summaries, no read failing, no prefix lost without an event (but the
    documented exceptions)."""
    r = await replay(pattern, store, True, 4000, 15)
    assert r.reads > 0
    found = (
        r.over_budget,
        r.broken_units,
        r.pins_lost,
        r.changed_in_context,
        r.storage,
        r.duplicate_summaries,
        r.errors,
        r.losses,
    )
    assert found == (0,) * 8, r.findings


@pytest.mark.slow
async def test_two_processes_on_one_sqlite_file_keep_their_promises() -> None:
    """Two spawned processes, each with background maintenance, reply into one shared conversation
    and one of their own, reading after every message: nothing lost or repeated, no duplicate
    summary, every read within budget with whole units, no prefix lost without an event."""
    r = await replay_processes("sqlite", 4000, 8)
    assert r.reads > 0
    found = (r.over_budget, r.broken_units, r.storage, r.duplicate_summaries, r.errors, r.losses)
    assert found == (0,) * 6, r.findings


async def test_a_read_whose_record_another_writer_beat_keeps_the_next_reads_prefix(sql_url: str) -> None:
    """Background maintenance (a lease, a release) or another worker's reply may move the state's
    version between a read's snapshot and the guarded write that records its window mark: the mark
    must still be recorded when no event came between, or the next read at the same epoch takes
    the previous mark for one from before the event and may move the window (found by the
    ``background`` replay of bench/agentic_more.py: a loss without an event)."""
    async with HistoryCompressor.from_url(sql_url, context_budget=4000) as h:
        other = SyncHistoryCompressor.from_url(sql_url, context_budget=4000)
        real = h.reply.assemble
        at = T0
        armed = False

        def assemble(cid: str, max_tokens: int, snap: Any, query: str | None = None) -> CompressedContext:
            nonlocal armed, at
            ctx = real(cid, max_tokens, snap, query)
            if armed:  # another worker replies while this read is assembled
                armed = False
                at += timedelta(seconds=5)
                other.add_message("c", {"role": "assistant", "content": filler(900)[:600], "timestamp": at})
            return ctx

        h.reply.assemble = assemble  # type: ignore[method-assign]
        previous: CompressedContext | None = None
        lost: list[int] = []
        try:
            for i in range(1, 80):
                at += timedelta(minutes=1)
                role = "user" if i % 2 else "assistant"
                await h.add_message("c", {"role": role, "content": filler(i), "timestamp": at})
                if i % 6 == 0:
                    await h.maintain("c", now=at)  # an event; the next read's record is beaten
                    armed = True
                ctx = await h.get_context("c", 4000)
                if previous is not None and ctx.maintenance_epoch == previous.maintenance_epoch:
                    kept = keeps_prefix(previous, ctx)
                    lost += [] if kept else [i]
                previous = ctx
        finally:
            other.close()
        assert lost == []
