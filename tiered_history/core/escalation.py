"""Escalation planning: which summaries merge into an archive, which archives leave the context.

Pure decisions over token counts; the service carries them out. Every step either
shrinks the set it works on or stops, so planning can never loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..models import Summary


@dataclass(frozen=True, slots=True)
class Item:
    id: int
    tokens: int


#: Once a tier overflows, merging goes on until it holds at most this share of its room, so the
#: next merge (which rewrites the start of the context) comes later.
MERGE_DOWN_TO = 0.6


def merge_plan(items_oldest_first: Sequence[Item], share: int, size: int, minimum: int) -> list[list[int]]:
    """The oldest items to merge into one archive, as one group, or [] while the tier fits ``share``.

    Once the items overflow ``share``, the group takes as many of the oldest as it needs for the
    rest to fit ``MERGE_DOWN_TO`` of the share (so the next merge, which rewrites the start of
    the context, comes later), and at least ``minimum`` (``size`` is kept for callers that plan
    fixed groups: it is the least a group holds). The archive goes to the bulk tier.
    """
    total = sum(i.tokens for i in items_oldest_first)
    if total <= share or len(items_oldest_first) < max(minimum, 2):
        return []
    take = 0
    while take < len(items_oldest_first) and (take < max(minimum, size, 2) or total > share * MERGE_DOWN_TO):
        total -= items_oldest_first[take].tokens
        take += 1
    return [[i.id for i in items_oldest_first[:take]]]


def split_merge(group_oldest_first: Sequence[Item], parts: int, size: int) -> list[list[int]]:
    """``group`` as up to ``parts`` consecutive groups of about equal tokens, each of at least
    ``size`` items (one group when it cannot be split so).

    A merge that takes many summaries at once (a backlog maintained in one pass, an import) would
    otherwise become one archive at its target however much room the archive tier has left: the
    room stays empty and a long stretch of the timeline is told in a few hundred tokens. Split,
    each stretch gets an archive of its own while they fit (``parts``: archives at their target
    in the room left); past that, roll-ups take over as usual.
    """
    n = len(group_oldest_first)
    parts = max(1, min(parts, n // max(size, 1)))
    if parts == 1:
        return [[i.id for i in group_oldest_first]]
    total = sum(i.tokens for i in group_oldest_first)
    out: list[list[int]] = []
    current: list[int] = []
    seen = 0
    for k, item in enumerate(group_oldest_first):
        current.append(item.id)
        seen += item.tokens
        left_items = n - k - 1
        groups_left = parts - len(out) - 1
        # Close this group at its share of the tokens, leaving every later group its least size.
        room = groups_left and len(current) >= size and left_items >= groups_left * size
        if room and (seen >= total * (len(out) + 1) / parts or left_items == groups_left * size):
            out.append(current)
            current = []
    out.append(current)
    return out


def beside_window(
    topics_oldest_first: Sequence[Summary], open_tokens: int, window_share: int, start: int | None
) -> list[Summary]:
    """The topic summaries a context shows beside its verbatim window, oldest first.

    With a window start recorded by the last read, those of topics before it; before any read,
    those of the topics a window of ``window_share`` tokens would not hold word for word (it holds
    the open topic's ``open_tokens`` first, then the newest sealed topics whole).
    """
    if start is not None:
        return [t for t in topics_oldest_first if t.last_sequence < start]
    room = window_share - open_tokens
    keep = len(topics_oldest_first)
    while keep > 0 and topics_oldest_first[keep - 1].source_tokens <= room:
        room -= topics_oldest_first[keep - 1].source_tokens
        keep -= 1
    return list(topics_oldest_first[:keep])


def next_merge(active_topics_oldest_first: Sequence[Item], share: int, merge_size: int) -> list[int]:
    """Ids of the oldest ``merge_size`` topic summaries to merge, or [] when they fit their share."""
    plan = merge_plan(active_topics_oldest_first, share, merge_size, merge_size)
    return plan[0] if plan else []


def next_rollup(active_archives_oldest_first: Sequence[Item], share: int) -> list[int]:
    """Ids of the archives to roll up into one coarser archive, or [] when they fit their share.

    All of them: the roll-up is given the whole share, so the tier stays full and the timeline
    stays represented from its first day on, at a coarser resolution the older it is (each
    roll-up re-reads the previous one beside the newer archives).
    """
    total = sum(i.tokens for i in active_archives_oldest_first)
    if total <= share or len(active_archives_oldest_first) < 2:
        return []
    return [i.id for i in active_archives_oldest_first]


def archives_to_drop(active_archives_oldest_first: Sequence[Item], share: int) -> list[int]:
    """Ids of the oldest archives to drop from the context so the rest fit their share."""
    total = sum(i.tokens for i in active_archives_oldest_first)
    drop: list[int] = []
    for item in active_archives_oldest_first:
        if total <= share:
            break
        drop.append(item.id)
        total -= item.tokens
    return drop


def accept_summary(summary_tokens: int, source_tokens: int) -> bool:
    """Inflation guard: a summary must be smaller than what it replaces."""
    return summary_tokens < source_tokens


def retry_delay(attempts: int, base_seconds: float, cap_seconds: float = 6 * 3600) -> float:
    """Exponential backoff before the next LLM attempt on a provisional summary."""
    return float(min(base_seconds * (2 ** max(attempts - 1, 0)), cap_seconds))
