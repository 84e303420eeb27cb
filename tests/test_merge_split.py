"""A merge of many topic summaries at once (a backlog maintained in one pass, an import) becomes as
many archives as the archives' room holds at their target, not one archive for the whole stretch."""

from __future__ import annotations

from datetime import timedelta
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from tiered_history import HistoryCompressor
from tiered_history.core.escalation import Item, split_merge

from .test_finer_archives import T0, _conversation


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    tokens=st.lists(st.integers(1, 500), min_size=1, max_size=60),
    parts=st.integers(-2, 12),
    size=st.integers(1, 5),
)
def test_a_split_keeps_order_and_every_item_in_groups_of_at_least_size(
    tokens: list[int], parts: int, size: int
) -> None:
    items = [Item(i, t) for i, t in enumerate(tokens)]
    groups = split_merge(items, parts, size)
    assert [i for g in groups for i in g] == list(range(len(items)))  # consecutive, in order, all
    assert 1 <= len(groups) <= max(parts, 1)
    if len(groups) > 1:
        assert all(len(g) >= size for g in groups)


def test_a_split_balances_tokens() -> None:
    groups = split_merge([Item(i, 10) for i in range(24)], 3, 3)
    assert [len(g) for g in groups] == [8, 8, 8]
    assert split_merge([Item(i, 10) for i in range(5)], 3, 3) == [[0, 1, 2, 3, 4]]  # too few to split


async def test_a_backlog_maintained_in_one_pass_becomes_several_archives_within_their_room() -> None:
    budget = 3000
    async with HistoryCompressor.from_url(
        "memory://", context_budget=budget, recall={"enabled": False}
    ) as hc:
        await _conversation(hc, 60, maintain=False)
        await hc.get_context("c", budget)  # the budget the conversation is read with
        report = await hc.maintain("c", now=T0 + timedelta(hours=6))
        history = await hc.get_history("c")
        state = await hc.store.state("c")
        assert state is not None
        plan = hc.reply.plan_for(state)
        ctx = await hc.get_context("c", budget)
    live = sorted((a for a in history.archives if a.merged_into is None), key=lambda a: a.first_sequence)
    assert report.merged >= 2 and len(live) >= 2
    assert all(a.last_sequence < b.first_sequence for a, b in pairwise(live))
    assert live[0].first_sequence == 1
    assert sum(a.token_count for a in live) <= plan.bulk_share
    # Every topic summary merged went into exactly one of them.
    merged = [t for t in history.topics if t.merged_into is not None]
    assert merged and all(t.merged_into in {a.id for a in live} for t in merged)
    assert ctx.total_tokens <= budget
