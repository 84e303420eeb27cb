"""What the agentic prefix tests share: a chat's filler, the part of a context a provider caches,
and the reads that lost it without an event."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from tiered_history import CompressedContext, HistoryCompressor

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def filler(i: int) -> str:
    """About 120 tokens of one unchanging subject (no content shift seals it)."""
    return f"Line {i}: " + " ".join(f"the crate {i} goes to depot {j} by van" for j in range(12))


def stable_part(ctx: CompressedContext) -> list[dict[str, Any]]:
    """What the context holds before its recall part (all of it when nothing is recalled)."""
    msgs = ctx.to_messages()
    return msgs[: ctx.recall_start] if ctx.recall_start is not None else msgs


def keeps_prefix(before: CompressedContext, after: CompressedContext) -> bool:
    """Whether ``after`` begins with all that ``before`` held before its recall part."""
    stable = stable_part(before)
    return after.to_messages()[: len(stable)] == stable


async def prefix_losses(h: HistoryCompressor, messages: int, budgets: Sequence[int]) -> list[int]:
    """Add ``messages`` filler messages to conversation "c", reading it at each of ``budgets`` in
    turn after every one: the messages after which the read at ``budgets[0]`` lost the previous
    one's prefix with no event between them."""
    previous: CompressedContext | None = None
    lost: list[int] = []
    for i in range(1, messages + 1):
        role = "user" if i % 2 else "assistant"
        await h.add_message("c", {"role": role, "content": filler(i), "timestamp": T0 + timedelta(minutes=i)})
        ctx = await h.get_context("c", budgets[0])
        for budget in budgets[1:]:
            await h.get_context("c", budget)
        if previous is not None and ctx.maintenance_epoch == previous.maintenance_epoch:
            lost += [] if keeps_prefix(previous, ctx) else [i]
        previous = ctx
    return lost
