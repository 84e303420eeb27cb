"""Budget arithmetic: how many tokens each tier may use."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BudgetTooSmallError
from ..tokens import REPLY_PRIMING_TOKENS

#: Smallest ``max_tokens`` accepted: reply priming, one framed message and a truncation marker.
MIN_MAX_TOKENS = 32


@dataclass(frozen=True, slots=True)
class Allocation:
    current: int
    topics: int
    bulk: int

    def as_dict(self) -> dict[str, int]:
        return {"current": self.current, "topic": self.topics, "bulk": self.bulk}


def check_max_tokens(max_tokens: int) -> None:
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise BudgetTooSmallError(f"max_tokens must be an integer, not {type(max_tokens).__name__}")
    if max_tokens < MIN_MAX_TOKENS:
        raise BudgetTooSmallError(
            f"max_tokens={max_tokens} is below the minimum of {MIN_MAX_TOKENS} "
            "(room for the reply priming, one message and a truncation marker)"
        )


def allocate(available: int, current: float, topics: float, bulk: float) -> Allocation:
    """Split ``available`` tokens by the tier shares, rounding down (the remainder stays unused)."""
    available = max(available, 0)
    return Allocation(int(available * current), int(available * topics), int(available * bulk))


def topic_size_limit(context_budget: int, current_share: float, threshold: float) -> int:
    """Tokens at which an open topic is sealed: ``threshold`` of the current topic's allocation."""
    return int((context_budget - REPLY_PRIMING_TOKENS) * current_share * threshold)


@dataclass(frozen=True, slots=True)
class EscalationBudget:
    """Shares and summary sizes that ``maintain()`` plans against (from ``context_budget``)."""

    topic_share: int
    bulk_share: int
    topic_target: int
    bulk_target: int


def escalation_budget(
    context_budget: int,
    topic_share: float,
    bulk_share: float,
    topic_summary_tokens: int,
    bulk_summary_tokens: int,
    merge_size: int,
) -> EscalationBudget:
    """Summary targets shrink with small budgets so the tiers still work there.

    ``merge_size`` topic summaries must fit the topic share before they merge, and at
    least two archives must fit the archive share before the oldest is dropped;
    otherwise a 1,000-token budget would drop every archive as soon as it is written.
    """
    avail = max(context_budget - REPLY_PRIMING_TOKENS, 0)
    topics = int(avail * topic_share)
    bulk = int(avail * bulk_share)
    floor = 24  # below this a summary carries too little to be worth its delimiters
    return EscalationBudget(
        topic_share=topics,
        bulk_share=bulk,
        topic_target=max(min(topic_summary_tokens, topics // merge_size), floor),
        bulk_target=max(min(bulk_summary_tokens, bulk // 2), floor),
    )
