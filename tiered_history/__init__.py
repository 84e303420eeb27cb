"""tiered-history: keep long chatbot conversations inside an LLM's context window.

The current topic verbatim, summaries of earlier topics and bulk archives of the
oldest ones, within an exact token budget; nothing stored is ever changed or lost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import (
    BudgetTooSmallError,
    ConfigurationError,
    ConversationNotFoundError,
    InvalidConversationIdError,
    InvalidMessageError,
    SchemaError,
    StoreError,
    SummarizerError,
    TieredHistoryError,
    TranscriptError,
    TransientStoreError,
)

if TYPE_CHECKING:
    from .compressor import HistoryCompressor
    from .core.boundaries import BoundaryDetector, Proposal, Turn
    from .core.recollection import Excerpt, Recollection, recall_tool
    from .maintenance import MaintenanceReport
    from .models import (
        CompressedContext,
        ConversationInfo,
        ConversationStats,
        History,
        Message,
        SearchHit,
        StoredMessage,
        Summary,
    )
    from .settings import Settings
    from .summarizers import (
        ExtractiveSummarizer,
        Summarizer,
        SummaryInput,
        SummaryPiece,
        SummaryResult,
        record_spend,
    )
    from .sync import SyncHistoryCompressor
    from .tokens import TokenCounter

#: Where each lazily loaded public name lives. ``import tiered_history`` loads none of them (the
#: exceptions aside): a process that only needs the CLI, the migrations or one submodule does not
#: pay for pydantic, asyncio and the engine; ``from tiered_history import X`` loads X's module.
_LAZY: dict[str, str] = {
    "HistoryCompressor": "compressor",
    "BoundaryDetector": "core.boundaries",
    "Proposal": "core.boundaries",
    "Turn": "core.boundaries",
    "Excerpt": "core.recollection",
    "Recollection": "core.recollection",
    "recall_tool": "core.recollection",
    "MaintenanceReport": "maintenance",
    "CompressedContext": "models",
    "ConversationInfo": "models",
    "ConversationStats": "models",
    "History": "models",
    "Message": "models",
    "SearchHit": "models",
    "StoredMessage": "models",
    "Summary": "models",
    "Settings": "settings",
    "ExtractiveSummarizer": "summarizers",
    "Summarizer": "summarizers",
    "SummaryInput": "summarizers",
    "SummaryPiece": "summarizers",
    "SummaryResult": "summarizers",
    "record_spend": "summarizers",
    "SyncHistoryCompressor": "sync",
    "TokenCounter": "tokens",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__version__ = "0.1.0"

__all__ = [
    "BoundaryDetector",
    "BudgetTooSmallError",
    "CompressedContext",
    "ConfigurationError",
    "ConversationInfo",
    "ConversationNotFoundError",
    "ConversationStats",
    "Excerpt",
    "ExtractiveSummarizer",
    "History",
    "HistoryCompressor",
    "InvalidConversationIdError",
    "InvalidMessageError",
    "MaintenanceReport",
    "Message",
    "Proposal",
    "Recollection",
    "SchemaError",
    "SearchHit",
    "Settings",
    "StoreError",
    "StoredMessage",
    "Summarizer",
    "SummarizerError",
    "Summary",
    "SummaryInput",
    "SummaryPiece",
    "SummaryResult",
    "SyncHistoryCompressor",
    "TieredHistoryError",
    "TokenCounter",
    "TranscriptError",
    "TransientStoreError",
    "Turn",
    "__version__",
    "recall_tool",
    "record_spend",
]
