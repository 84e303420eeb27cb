"""Topic-boundary rules: pure functions over the conversation's state and the incoming message."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache

#: Why a topic was sealed.
EXPLICIT = "explicit"
TEMPORAL = "silence"
SIZE = "size"
MANUAL = "manual"

_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'"})


@dataclass(frozen=True, slots=True)
class OpenTopic:
    """What the boundary rules need to know about the open topic."""

    messages: int
    tokens: int
    last_timestamp: datetime | None
    tool_call_open: bool


@dataclass(frozen=True, slots=True)
class BoundaryRules:
    explicit: bool
    temporal: bool
    size: bool
    phrases: tuple[str, ...]
    trigger_roles: tuple[str, ...]
    silence: timedelta
    size_limit: int
    min_tokens: int = 0
    """Phrases and silence do not seal a topic smaller than this: it could not be summarised smaller."""


# Scripts written without spaces between words: a phrase there needs no word boundary.
_UNSPACED = re.compile("[\u0e00-\u0eff\u1000-\u109f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def _bounded(phrase: str) -> str:
    head = "" if _UNSPACED.match(phrase[0]) else r"(?<!\w)"
    tail = "" if _UNSPACED.match(phrase[-1]) else r"(?!\w)"
    return f"{head}{re.escape(phrase)}{tail}"


@lru_cache(maxsize=32)
def phrase_pattern(phrases: tuple[str, ...]) -> re.Pattern[str] | None:
    """One case-insensitive regex matching any phrase on word boundaries (where the script has them)."""
    cleaned = [p.translate(_APOSTROPHES).strip().lower() for p in phrases if p.strip()]
    if not cleaned:
        return None
    alternatives = "|".join(_bounded(p) for p in sorted(set(cleaned), key=len, reverse=True))
    return re.compile(f"(?:{alternatives})", re.IGNORECASE)


def explicit_boundary(content: str, phrases: Sequence[str]) -> bool:
    """True when the message says it changes the subject ("new topic", "let's move on"...)."""
    pattern = phrase_pattern(tuple(phrases))
    return bool(pattern and pattern.search(content.translate(_APOSTROPHES)))


def temporal_boundary(previous: datetime | None, current: datetime, silence: timedelta) -> bool:
    """True when more than ``silence`` passed since the previous message (never for out-of-order ones)."""
    return previous is not None and current - previous > silence


def size_boundary(open_tokens: int, open_messages: int, incoming_tokens: int, limit: int) -> bool:
    """True when adding the message would push a non-empty open topic past ``limit`` tokens."""
    return open_messages > 0 and open_tokens + incoming_tokens > limit


def decide(
    rules: BoundaryRules, topic: OpenTopic, role: str, content: str, timestamp: datetime, tokens: int
) -> str | None:
    """Should the open topic be sealed before this message? Returns the reason, or None.

    The incoming message opens the new topic. Tool results and assistant turns
    never open one while a tool call awaits its result, so a call and its results
    share a topic (a user turn abandons open calls; the store seals before them).
    """
    if topic.messages == 0 or role == "tool" or (topic.tool_call_open and role == "assistant"):
        return None
    big_enough = topic.tokens >= rules.min_tokens
    if (
        big_enough
        and rules.explicit
        and role in rules.trigger_roles
        and explicit_boundary(content, rules.phrases)
    ):
        return EXPLICIT
    if big_enough and rules.temporal and temporal_boundary(topic.last_timestamp, timestamp, rules.silence):
        return TEMPORAL
    if rules.size and size_boundary(topic.tokens, topic.messages, tokens, rules.size_limit):
        return SIZE
    return None


def silence_elapsed(last_timestamp: datetime | None, now: datetime, silence: timedelta) -> bool:
    """True when an open topic has been quiet long enough for ``maintain()`` to seal it."""
    return last_timestamp is not None and now - last_timestamp > silence
