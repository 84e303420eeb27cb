"""Every exception tiered_history raises on purpose.

Callers catch :class:`TieredHistoryError` (or one of its subclasses); driver
errors never leak out of the store as raw tracebacks.
"""

from __future__ import annotations


class TieredHistoryError(Exception):
    """Base class of all library errors."""


class InvalidMessageError(TieredHistoryError, ValueError):
    """A message was rejected before anything was stored."""

    index: int | None = None
    """For a batch: the position of the message rejected (None when unknown or not a batch)."""


class InvalidConversationIdError(TieredHistoryError, ValueError):
    """A conversation id is empty, too long or contains forbidden characters."""


class ConversationNotFoundError(TieredHistoryError, LookupError):
    """No message was ever stored for this conversation id."""


class BudgetTooSmallError(TieredHistoryError, ValueError):
    """``max_tokens`` cannot hold what must always be sent (pinned messages and the newest message)."""


class ConfigurationError(TieredHistoryError, ValueError):
    """A setting, URL or option is invalid."""


class StoreError(TieredHistoryError):
    """The database failed; the message says what was attempted."""

    integrity: bool = False
    """A constraint refused the write (for instance another writer took the same sequence)."""


class TransientStoreError(StoreError):
    """A database failure that may succeed when retried (connection lost, serialization failure)."""


class SchemaError(StoreError):
    """The database schema is missing or newer than this version of the library understands."""


class SummarizerError(TieredHistoryError):
    """A summariser failed; the engine falls back to the extractive summariser."""


class TranscriptError(TieredHistoryError, ValueError):
    """A transcript file cannot be read or parsed."""
