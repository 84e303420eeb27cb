"""A summariser for tests: answers from a script and records every request."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..summarizers.base import SummaryInput, SummaryPiece, SummaryResult


@dataclass(frozen=True, slots=True)
class Request:
    """One call the summariser received."""

    kind: str
    """``summarize`` or ``merge``."""
    messages: tuple[SummaryInput, ...] = ()
    pieces: tuple[SummaryPiece, ...] = ()
    target_tokens: int = 0


@dataclass
class ScriptedSummarizer:
    """Returns ``summaries`` (then ``archives`` for merges) in order; raises what you put in them.

    When a script runs out, it answers with ``default`` (``None``: the first words of the input).
    Every call is appended to :attr:`requests`, so a test can assert what the engine sent.
    """

    summaries: list[str | BaseException] = field(default_factory=list)
    archives: list[str | BaseException] = field(default_factory=list)
    default: str | None = None
    name: str = "scripted"
    requests: list[Request] = field(default_factory=list)

    @classmethod
    def answering(cls, *texts: str | BaseException) -> ScriptedSummarizer:
        return cls(summaries=list(texts))

    def _next(self, script: list[str | BaseException], fallback: Iterable[str]) -> str:
        if script:
            item = script.pop(0)
            if isinstance(item, BaseException):
                raise item
            return item
        if self.default is not None:
            return self.default
        words = " ".join(fallback).split()
        return " ".join(words[:12]) or "(empty)"

    async def summarize(self, messages: Sequence[SummaryInput], target_tokens: int) -> SummaryResult:
        self.requests.append(Request("summarize", messages=tuple(messages), target_tokens=target_tokens))
        text = self._next(self.summaries, (m.content for m in messages))
        return SummaryResult(text=text, summarizer=self.name)

    async def merge(self, pieces: Sequence[SummaryPiece], target_tokens: int) -> SummaryResult:
        self.requests.append(Request("merge", pieces=tuple(pieces), target_tokens=target_tokens))
        text = self._next(self.archives, (p.text for p in pieces))
        return SummaryResult(text=text, summarizer=self.name)
