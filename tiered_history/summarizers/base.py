"""The one small interface every summariser implements."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
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
    source_tokens: int = 0
    """Tokens of the messages it stands for (0: not known): a roll-up handed some archives' messages
    and the older ones' texts weighs each text by them, not by its own length."""


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
    on failure: the engine then falls back to the extractive summariser. One that sets
    ``reads_sources = True`` is given, for a roll-up, the messages each archive stands for as
    well: ``merge(pieces, target_tokens, sources=...)`` (one list per piece, or ``None``). One that
    sets ``reads_earlier = True`` is given the texts of the summaries and archives the context
    shows before the one asked for: ``summarize(..., earlier=[...])``, ``merge(..., earlier=[...])``
    (what they say need not be said again).
    """

    name: str

    async def summarize(self, messages: Sequence[SummaryInput], target_tokens: int) -> SummaryResult: ...

    async def merge(self, pieces: Sequence[SummaryPiece], target_tokens: int) -> SummaryResult: ...


@dataclass(slots=True)
class Spend:
    """What the model calls made while producing one summary cost, whatever became of them."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    model: str | None = None

    def add(self, model: str | None, prompt_tokens: int, completion_tokens: int, cost: float) -> None:
        self.calls += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        self.cost += cost
        self.model = model or self.model


_LEDGER: ContextVar[Spend | None] = ContextVar("tiered_history_spend", default=None)


def record_spend(model: str | None, prompt_tokens: int, completion_tokens: int, cost: float) -> None:
    """Count one billed model call towards the summary being produced.

    Summarisers call this as soon as a call's usage is known, so the spend is recorded
    even if the answer is then rejected, a later chunk fails, or the whole call times out.
    Outside :func:`spend_ledger` it does nothing.
    """
    ledger = _LEDGER.get()
    if ledger is not None:
        ledger.add(model, prompt_tokens, completion_tokens, cost)


@contextmanager
def spend_ledger() -> Iterator[Spend]:
    """Collect :func:`record_spend` calls made in this context (tasks started in it included)."""
    ledger = Spend()
    token = _LEDGER.set(ledger)
    try:
        yield ledger
    finally:
        _LEDGER.reset(token)
