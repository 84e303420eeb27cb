"""Summarisers behind one small interface (:class:`Summarizer`)."""

from __future__ import annotations

from ..settings import SummarizerSettings
from ..tokens import TokenCounter
from .base import Spend, Summarizer, SummaryInput, SummaryPiece, SummaryResult, record_spend, spend_ledger
from .extractive import ExtractiveSummarizer

__all__ = [
    "ExtractiveSummarizer",
    "Spend",
    "Summarizer",
    "SummaryInput",
    "SummaryPiece",
    "SummaryResult",
    "build_summarizer",
    "record_spend",
    "spend_ledger",
]


def build_summarizer(settings: SummarizerSettings, counter: TokenCounter) -> Summarizer:
    """The summariser ``settings`` asks for (litellm is imported only when it is first called)."""
    if settings.kind == "litellm":
        from .llm import LiteLLMSummarizer

        return LiteLLMSummarizer.from_settings(settings, counter)
    return ExtractiveSummarizer(counter)
