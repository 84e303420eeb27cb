"""The one small interface every summariser implements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class SummaryInput:
    """One message of a sealed topic, as handed to a summariser."""

    sequence: int
    role: str
    content: str
    timestamp: datetime
    name: str | None = None


@dataclass(frozen=True, slots=True)
class SummaryPiece:
    """One topic summary handed to :meth:`Summarizer.merge`."""

    text: str
    first_sequence: int
    last_sequence: int
    started_at: datetime
    ended_at: datetime


@dataclass(frozen=True, slots=True)
class SummaryResult:
    """What a summariser produced, with what it cost."""

    text: str
    summarizer: str
    model: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    latency_ms: float = 0.0
    provisional: bool = False
    """True for a fallback summary that ``maintain()`` should try to replace later."""


@runtime_checkable
class Summarizer(Protocol):
    """Turns a sealed topic into a summary and several summaries into one archive.

    Implementations must not mutate their inputs and should raise (any exception)
    on failure: the engine then falls back to the extractive summariser.
    """

    name: str

    async def summarize(self, messages: Sequence[SummaryInput], target_tokens: int) -> SummaryResult: ...

    async def merge(self, pieces: Sequence[SummaryPiece], target_tokens: int) -> SummaryResult: ...
