"""tiered-history: keep long chatbot conversations inside an LLM's context window.

The current topic verbatim, summaries of earlier topics and bulk archives of the
oldest ones, within an exact token budget; nothing stored is ever changed or lost.
"""

from __future__ import annotations

from .compressor import HistoryCompressor
from .core.boundaries import BoundaryDetector, Proposal, Turn
from .core.recollection import Excerpt, Recollection, recall_tool
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
