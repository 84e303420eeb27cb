"""Summarisers behind one small interface (:class:`Summarizer`)."""

from __future__ import annotations

from ..settings import SummarizerSettings
from ..tokens import TokenCounter
from .base import Summarizer, SummaryInput, SummaryPiece, SummaryResult
from .extractive import ExtractiveSummarizer

__all__ = [
    "ExtractiveSummarizer",
    "Summarizer",
    "SummaryInput",
    "SummaryPiece",
    "SummaryResult",
    "build_summarizer",
]


def build_summarizer(settings: SummarizerSettings, counter: TokenCounter) -> Summarizer:
    """The summariser ``settings`` asks for (litellm is imported only when it is first called)."""
    if settings.kind == "litellm":
        from .llm import LiteLLMSummarizer

        return LiteLLMSummarizer.from_settings(settings, counter)
    return ExtractiveSummarizer(counter)
