"""Escalation planning: which summaries merge into an archive, which archives leave the context.

Pure decisions over token counts; the service carries them out. Every step either
shrinks the set it works on or stops, so planning can never loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Item:
    id: int
    tokens: int


def next_merge(active_topics_oldest_first: Sequence[Item], share: int, merge_size: int) -> list[int]:
    """Ids of the oldest ``merge_size`` topic summaries to merge, or [] when they fit their share."""
    total = sum(i.tokens for i in active_topics_oldest_first)
    if total <= share or len(active_topics_oldest_first) < merge_size:
        return []
    return [i.id for i in active_topics_oldest_first[:merge_size]]


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
