"""Budget arithmetic: how many tokens each tier may use."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BudgetTooSmallError
from .framing import REPLY_PRIMING_TOKENS

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


#: Up to this multiple of ``cache_min`` the archives hold the topic tier's stable room (see
#: :func:`summary_shares`); from it on the topic tier's stable part shows topic summaries.
POOLED_UP_TO = 2


def summary_shares(
    topics: float, bulk: float, recall: float, budget: int, cache_min: int, pooled: bool = True
) -> tuple[float, float, float]:
    """The topic share, the bulk share and the recall part of the topic share that a context of
    ``budget`` tokens is laid out (and maintenance plans) with: its room, not its allocation (a
    context reports the configured shares).

    Without ``pooled`` (``redistribute_unused``), or from ``POOLED_UP_TO`` x ``cache_min`` on, as
    configured. Below ``cache_min`` (the relevance layout, which no provider caches) the archives
    hold the whole topic share as well as their own: topic summaries are merged into archives as
    soon as they leave the window, and the archives, rolled up from the messages of the whole
    timeline, fill that room; recall takes its room from the window, per call (the topic tier's
    share for a question about the past, its recall part for a weak query). From ``cache_min`` to
    ``POOLED_UP_TO`` x ``cache_min`` (the cached layout, whose recall keeps its reserve between
    events) the topic tier keeps its recall part and the archives hold the rest of it. A summary
    each of the last few topics spent most of a small context's summaries' room on the newest
    stretch; one choice across the whole past keeps more of what later turns ask about. In larger
    contexts the topic tier's stable part holds enough topics for their summaries to keep more than
    archives merged from them (docs/architecture.md, "Archives in the topic tier's room").
    """
    if not pooled or budget >= POOLED_UP_TO * cache_min:
        return topics, bulk, recall
    if budget < cache_min:
        return 0.0, bulk + topics, 0.0
    kept = topics * recall
    return kept, bulk + (topics - kept), 1.0 if kept > 0 else 0.0


def topic_size_limit(context_budget: int, current_share: float, threshold: float, cap: int = 0) -> int:
    """Tokens at which an open topic is sealed: ``threshold`` of the current topic's allocation,
    and at most ``cap`` (0: no cap).

    The cap matters in large contexts: a window starts only where a summarised range begins or
    ends, so the topics' size is the grain the window moves by, and room a move leaves unused
    beyond its step is up to a topic's worth (at 8,000 tokens, 2,399 tokens of topic a seal)."""
    limit = int((context_budget - REPLY_PRIMING_TOKENS) * current_share * threshold)
    return min(limit, cap) if cap > 0 else limit


#: What a tier's block costs besides its items (framing, header line, delimiters), about.
BLOCK_OVERHEAD = 32
#: Smallest targets: below these a summary or an archive carries too little to be worth it.
MIN_TOPIC_TARGET = 40
MIN_ARCHIVE_TARGET = 60
#: A topic's summary aims at this share of the topic's own tokens (within the budget's target): a
#: summary that keeps most of a short topic's tokens buys little room for the rest of the timeline.
TOPIC_COMPRESSION = 0.25


@dataclass(frozen=True, slots=True)
class EscalationBudget:
    """What maintenance plans against, for the budget a conversation is read with."""

    topic_share: int
    """Tokens the stable topic summaries may use (the topic tier less its recall reserve)."""
    bulk_share: int
    """Tokens the archives may use."""
    topic_target: int
    bulk_target: int
    window_share: int = 0
    """Tokens of the verbatim window's share (the current topic's)."""
    timeline: bool = True
    """Contexts show the summaries and archives in timeline order, all of those before the window
    (laid out for the cache): a summary need not say again what the ones before it say. Below
    ``cache_min_tokens`` a context shows those that best match the newest message instead."""
    sourced_merge_target: int = 0
    """Target of a merge of topic summaries when the summariser's roll-ups choose again from the
    messages (``reads_sources``, the offline one), if larger than ``bulk_target`` (0: not)."""

    def merge_target(self, reads_sources: bool) -> int:
        """Target of a merge of topic summaries into an archive by a summariser that does or does
        not read the messages at a roll-up."""
        return max(self.sourced_merge_target, self.bulk_target) if reads_sources else self.bulk_target


def escalation_budget(
    budget: int,
    topic_share: float,
    bulk_share: float,
    topic_summary_tokens: int,
    bulk_summary_tokens: int,
    merge_size: int,
    *,
    recall_share: float = 0.0,
    reference_budget: int = 8000,
    current_share: float = 0.5,
) -> EscalationBudget:
    """Summary and archive targets grow with the budget above ``reference_budget``
    (``topic_summary_tokens`` and ``bulk_summary_tokens`` are the targets there), within what
    their tiers can hold: at least ``merge_size`` topic summaries and two archives fit beside each
    other. Below it they are not scaled down: the tiers' room sizes them (a smaller context holds
    fewer summaries, not shorter ones; scaled down, an 8,000-token default read at 2,000 made
    50-token summaries that kept little of their topics). A tier's header and delimiters are
    counted out of its share first."""
    avail = max(budget - REPLY_PRIMING_TOKENS, 0)
    topics = int(avail * topic_share)
    topic_room = max(topics - int(topics * recall_share) - BLOCK_OVERHEAD, 0)
    bulk_room = max(int(avail * bulk_share) - BLOCK_OVERHEAD, 0)
    scale = max(budget / max(reference_budget, 1), 1.0)

    def target(setting: int, floor: int, room: int, parts: int) -> int:
        return max(min(round(setting * scale), room // max(parts, 1)), floor)

    return EscalationBudget(
        topic_share=topic_room,
        bulk_share=bulk_room,
        topic_target=target(topic_summary_tokens, MIN_TOPIC_TARGET, topic_room, merge_size),
        bulk_target=target(bulk_summary_tokens, MIN_ARCHIVE_TARGET, bulk_room, 2),
        window_share=int(avail * current_share),
    )


def topic_target(plan: EscalationBudget, source_tokens: int) -> int:
    """Target of one topic's summary: ``TOPIC_COMPRESSION`` of its tokens, within the plan's target
    and never below ``MIN_TOPIC_TARGET``."""
    return max(min(plan.topic_target, round(source_tokens * TOPIC_COMPRESSION)), MIN_TOPIC_TARGET)
