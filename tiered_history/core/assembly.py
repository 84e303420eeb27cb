"""Context assembly: choose what fits in ``max_tokens`` from rows already read. No I/O.

Order of precedence: reply priming, pinned messages, the newest message (with its
tool call or results), then each tier newest-first within its share, then the
unused shares to the current topic, the topic summaries and the archives, in that
order. Each tier takes a contiguous run of its newest items, so nothing in the
middle of a tier goes missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from ..errors import BudgetTooSmallError
from ..models import CompressedContext, StoredMessage, Summary
from ..tokens import REPLY_PRIMING_TOKENS, TokenCounter
from .budget import allocate, check_max_tokens
from .truncation import MARKER, truncate_to_tokens


@dataclass(frozen=True, slots=True)
class Shares:
    current: float
    topics: float
    bulk: float
    redistribute: bool = True


def group_units(messages_oldest_first: Sequence[StoredMessage]) -> list[list[StoredMessage]]:
    """Group messages into units that must be kept or dropped together.

    An assistant message with tool calls and the tool results that answer it form
    one unit; every other message is a unit of its own. Sent without all of its
    parts, a unit is a 400 from the provider, so incomplete units are left out:
    tool results whose call was cut off by paging, and calls abandoned without
    results. Only the newest unit may still await results (the bot is running
    the tools right now).
    """
    units: list[list[StoredMessage]] = []
    complete: list[bool] = []
    pending: set[str] = set()
    for m in messages_oldest_first:
        if m.role == "tool":
            if units and m.tool_call_id in pending:
                units[-1].append(m)
                pending.discard(str(m.tool_call_id))
                complete[-1] = not pending
            continue
        units.append([m])
        pending = {str(c.get("id")) for c in m.tool_calls} if m.tool_calls else set()
        complete.append(not pending)
    return [u for i, u in enumerate(units) if complete[i] or i == len(units) - 1]


# A plain message that ends a list, so group_units treats every unit before it as closed.
_SENTINEL = StoredMessage(
    conversation_id="",
    sequence=-1,
    role="user",
    content="",
    timestamp=datetime(1970, 1, 1, tzinfo=UTC),
    token_count=0,
    full_token_count=0,
)


def _cost(unit: Sequence[StoredMessage]) -> int:
    return sum(m.token_count for m in unit)


def _fit_unit(counter: TokenCounter, unit: list[StoredMessage], limit: int) -> list[StoredMessage]:
    """Truncate the contents of ``unit`` head + tail until its framed cost is at most ``limit``."""
    fixed = [counter.message_tokens(m.to_openai(content="")) for m in unit]
    lengths = [max(m.token_count - f, 0) for m, f in zip(unit, fixed, strict=True)]
    content_budget = limit - sum(fixed)
    marker_cost = counter.count(MARKER.format(n=10**9)) + 2
    if content_budget < marker_cost * len(unit):
        raise BudgetTooSmallError(
            f"max_tokens leaves {limit} tokens for the newest message, which needs at least "
            f"{sum(fixed) + marker_cost * len(unit)} even when truncated"
        )
    total = sum(lengths) or 1
    for _ in range(8):  # re-tokenising may shift counts by a token or two; shrink until it fits
        out = []
        for m, n in zip(unit, lengths, strict=True):
            share = max(int(content_budget * n / total), marker_cost)
            text = truncate_to_tokens(counter, m.context_content, share)
            tokens = counter.message_tokens(m.to_openai(content=text))
            out.append(replace(m, truncated_content=text, token_count=tokens))
        if _cost(out) <= limit:
            return out
        content_budget -= _cost(out) - limit
    raise BudgetTooSmallError(f"could not fit the newest message into {limit} tokens")


def assemble(
    *,
    conversation_id: str,
    max_tokens: int,
    shares: Shares,
    counter: TokenCounter,
    pinned: Sequence[StoredMessage],
    verbatim: Sequence[StoredMessage],
    topics: Sequence[Summary],
    archives: Sequence[Summary],
    newest_sequence: int | None,
    uncovered_total: int = 0,
    dropped: Sequence[Summary] = (),
    covered: Sequence[StoredMessage] = (),
) -> CompressedContext:
    """Build the context from candidate rows.

    ``verbatim`` (oldest first, pinned excluded) are messages not yet covered by a
    summary, plus the newest message; ``topics`` and ``archives`` are active
    summaries, oldest first. ``dropped`` archives (oldest first) only fill room
    that every other tier left unused, newest first. ``covered`` (oldest first,
    unpinned) are already-summarised messages: when room is left, the newest topic
    summaries are swapped back for their own messages, newest topic first.
    ``uncovered_total`` counts every uncovered message, for reporting how many were omitted.
    """
    check_max_tokens(max_tokens)
    used = REPLY_PRIMING_TOKENS
    pinned_cost = sum(m.token_count for m in pinned)
    if used + pinned_cost > max_tokens:
        raise BudgetTooSmallError(
            f"pinned messages need {pinned_cost + used} tokens but max_tokens is {max_tokens}; "
            "pinned messages are always sent verbatim, so raise max_tokens or unpin some"
        )
    used += pinned_cost
    alloc = allocate(max_tokens - used, shares.current, shares.topics, shares.bulk)

    units = group_units(verbatim)
    chosen_units: list[list[StoredMessage]] = []
    truncated = False
    cur_used = 0
    idx = len(units) - 1
    # The newest message (with its tool unit) is always sent, cut to fit if need be.
    if units and newest_sequence is not None and units[-1][-1].sequence == newest_sequence:
        unit = units[-1]
        if used + _cost(unit) > max_tokens:
            unit = _fit_unit(counter, unit, max_tokens - used)
            truncated = True
        chosen_units.append(unit)
        cur_used = _cost(unit)
        idx -= 1

    remaining = max_tokens - used - cur_used

    def take(costs: Sequence[int], start: int, limit: int) -> tuple[int, int]:
        """Take items newest-first from ``start`` down while they fit ``limit``; return (next, spent)."""
        spent = 0
        i = start
        while i >= 0 and spent + costs[i] <= limit:
            spent += costs[i]
            i -= 1
        return i, spent

    revived: list[Summary] = []
    unit_costs = [_cost(u) for u in units]
    topic_costs = [s.token_count for s in topics]
    bulk_costs = [s.token_count for s in archives]

    u_next, spent = take(unit_costs, idx, min(max(alloc.current - cur_used, 0), remaining))
    remaining -= spent
    cur_used += spent
    t_next, t_used = take(topic_costs, len(topics) - 1, min(alloc.topics, remaining))
    remaining -= t_used
    b_next, b_used = take(bulk_costs, len(archives) - 1, min(alloc.bulk, remaining))
    remaining -= b_used
    if shares.redistribute:
        # Unused shares go to the newest content first: current topic, summaries, archives.
        u_next2, spent = take(unit_costs, u_next, remaining)
        remaining -= spent
        cur_used += spent
        u_next = u_next2
        t_next2, spent = take(topic_costs, t_next, remaining)
        remaining -= spent
        t_used += spent
        t_next = t_next2
        b_next2, spent = take(bulk_costs, b_next, remaining)
        remaining -= spent
        b_used += spent
        b_next = b_next2
        if b_next < 0:  # every active archive is in: older, dropped ones may use what is left
            d_next, spent = take([d.token_count for d in dropped], len(dropped) - 1, remaining)
            remaining -= spent
            b_used += spent
            revived = list(dropped[d_next + 1 :])

    current: list[StoredMessage] = [m for u in units[u_next + 1 : idx + 1] for m in u]
    for unit in chosen_units:
        current.extend(unit)
    chosen_topics = list(topics[t_next + 1 :])
    chosen_archives = revived + list(archives[b_next + 1 :])

    recent: list[StoredMessage] = []
    r_used = 0
    if shares.redistribute and u_next < 0 and covered:
        shown = {m.sequence for m in current}
        keep = len(chosen_topics)
        # Swap summaries for their messages, newest topic first, while the messages fit.
        while keep > 0:
            topic = chosen_topics[keep - 1]
            if covered[0].sequence > topic.first_sequence:
                break  # the read window does not reach back to this topic's start
            msgs = [
                m
                for m in covered
                if topic.first_sequence <= m.sequence <= topic.last_sequence and m.sequence not in shown
            ]
            # The sentinel closes the list, so a call that never got its results is left out too.
            topic_units = group_units([*msgs, _SENTINEL])[:-1]
            cost = sum(_cost(u) for u in topic_units)
            if cost - topic.token_count > remaining:
                break
            remaining -= cost - topic.token_count
            t_used -= topic.token_count
            r_used += cost
            recent = [m for u in topic_units for m in u] + recent
            keep -= 1
        chosen_topics = chosen_topics[:keep]

    total = max_tokens - remaining
    represented = (
        REPLY_PRIMING_TOKENS
        + sum(m.full_token_count for m in pinned)
        + sum(m.full_token_count for m in current)
        + sum(m.full_token_count for m in recent)
        + sum(s.source_tokens for s in chosen_topics)
        + sum(s.source_tokens for s in chosen_archives)
    )
    return CompressedContext(
        conversation_id=conversation_id,
        max_tokens=max_tokens,
        pinned=list(pinned),
        bulk_archives=chosen_archives,
        historical_topics=chosen_topics,
        recent_topics=recent,
        current_topic=current,
        total_tokens=total,
        compression_ratio=round(represented / total, 4) if total else 1.0,
        tier_tokens={
            "framing": REPLY_PRIMING_TOKENS,
            "pinned": pinned_cost,
            "bulk": b_used,
            "topic": t_used,
            "recent": r_used,
            "current": cur_used,
        },
        allocation=alloc.as_dict(),
        omitted_messages=max(uncovered_total - len(current), 0),
        truncated_newest=truncated,
    )
