"""The storage contract. Every backend (memory, SQLite, PostgreSQL) passes the same conformance tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from ..core.boundaries import OpenTopic
from ..models import ConversationStats, History, Message, StoredMessage, Summary


@dataclass(frozen=True, slots=True)
class PreparedMessage:
    """A validated message with its token counts, computed once before it is written."""

    message: Message
    token_count: int
    full_token_count: int
    context_content: str | None = None

    def stored(self, conversation_id: str, sequence: int) -> StoredMessage:
        """The record a store returns once this message is written with ``sequence``."""
        m = self.message
        return StoredMessage(
            conversation_id=conversation_id,
            sequence=sequence,
            role=m.role,
            content=m.content,
            timestamp=m.timestamp,
            token_count=self.token_count,
            full_token_count=self.full_token_count,
            name=m.name,
            tool_calls=m.tool_calls,
            tool_call_id=m.tool_call_id,
            pinned=m.pinned,
            metadata=dict(m.metadata),
            truncated_content=self.context_content,
        )


#: Decides, under the conversation's lock, whether the open topic is sealed before a message.
BoundaryPolicy = Callable[[OpenTopic, PreparedMessage], str | None]


@dataclass(frozen=True, slots=True)
class ConversationState:
    id: str
    platform: str | None
    encoding: str
    last_sequence: int
    last_message_at: datetime | None
    topic_start_seq: int
    open_topic_tokens: int
    open_topic_messages: int
    open_tool_calls: list[str]
    summarized_upto: int
    pinned_count: int
    needs_maintenance: bool
    lease_owner: str | None
    lease_expires_at: datetime | None
    next_retry_at: datetime | None

    @property
    def open_topic(self) -> OpenTopic:
        return OpenTopic(
            messages=self.open_topic_messages,
            tokens=self.open_topic_tokens,
            last_timestamp=self.last_message_at,
            tool_call_open=bool(self.open_tool_calls),
        )


@dataclass(frozen=True, slots=True)
class ContextRows:
    """Everything ``get_context`` may return, read in one consistent snapshot."""

    state: ConversationState
    pinned: list[StoredMessage]
    verbatim: list[StoredMessage]
    """Uncovered, unpinned messages oldest first (a newest-first window), plus the newest message."""
    topics: list[Summary]
    archives: list[Summary]
    dropped: list[Summary] = field(default_factory=list)
    """Archives dropped from the budgeted tiers, oldest first: used only to fill room left over."""
    covered: list[StoredMessage] = field(default_factory=list)
    """Unpinned messages already summarised, oldest first (a newest-first window up to the cap):
    the newest summaries are swapped for them when the budget has room."""


#: Given the rows read so far: how many tokens of dropped archives, and of summarised messages,
#: the context could still use.
CoveredBudget = Callable[[ContextRows], tuple[int, int]]


@dataclass(frozen=True, slots=True)
class SummaryWrite:
    """The outcome of summarising one topic or merging several into an archive."""

    content: str
    rendered: str
    token_count: int
    status: str
    summarizer: str
    model: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    latency_ms: float = 0.0
    next_attempt_at: datetime | None = None
    last_error: str | None = None
    extra: dict[str, object] = field(default_factory=dict)


def newest_window(messages_oldest_first: list[StoredMessage], token_cap: int) -> list[StoredMessage]:
    """The newest messages up to ``token_cap`` tokens, extended to complete a tool unit.

    Every backend cuts its read with this, so all of them hand assembly the same rows.
    """
    out: list[StoredMessage] = []
    tokens = 0
    for m in reversed(messages_oldest_first):
        if tokens >= token_cap and (not out or out[-1].role != "tool"):
            break
        out.append(m)
        tokens += m.token_count
    out.reverse()
    return out


def newest_summaries(summaries_oldest_first: list[Summary], token_cap: int) -> list[Summary]:
    """The newest summaries whose tokens reach ``token_cap`` (the last one may cross it)."""
    out: list[Summary] = []
    tokens = 0
    for x in reversed(summaries_oldest_first):
        if tokens >= token_cap:
            break
        out.append(x)
        tokens += x.token_count
    out.reverse()
    return out


def newest_unit(messages_oldest_first: list[StoredMessage]) -> list[StoredMessage]:
    """The newest unpinned message, preceded by its tool call and sibling results if it is a tool result."""
    msgs = [m for m in messages_oldest_first if not m.pinned]
    if not msgs:
        return []
    start = len(msgs) - 1
    while start > 0 and msgs[start].role == "tool":
        start -= 1
    return msgs[start:] if msgs[-1].role == "tool" else msgs[-1:]


class LeaseLostError(Exception):
    """This worker's lease on a conversation expired and another worker took it over."""


class Store(Protocol):
    """Persistence for messages, topics and archives. Async; safe for concurrent callers."""

    async def initialize(self) -> None:
        """Create or upgrade the schema if needed."""

    async def close(self) -> None: ...

    async def append(
        self,
        conversation_id: str,
        platform: str | None,
        prepared: PreparedMessage,
        policy: BoundaryPolicy,
        now: datetime,
    ) -> tuple[StoredMessage, Summary | None]:
        """Store one message with the next sequence; seal the open topic first if ``policy`` says so.

        Atomic: on any error nothing is stored. Returns the message and the topic sealed, if any.
        """
        ...

    async def seal(self, conversation_id: str, reason: str, now: datetime) -> Summary | None:
        """Seal the open topic (up to the last message with no tool call awaiting its result)."""
        ...

    async def state(self, conversation_id: str) -> ConversationState | None: ...

    async def read_context(
        self, conversation_id: str, token_cap: int, covered_budget: CoveredBudget | None = None
    ) -> ContextRows:
        """Rows ``get_context`` may use: reads stop once ``token_cap`` tokens of each kind are in hand.

        ``covered_budget`` is asked, in the same snapshot, how many tokens of dropped archives
        and of already-summarised messages could be used; that many are read into ``dropped``
        and ``covered`` (none when it says 0).
        """
        ...

    async def history(self, conversation_id: str) -> History: ...

    async def search(self, conversation_id: str, text: str, limit: int) -> list[StoredMessage]: ...

    async def claim(
        self,
        owner: str,
        now: datetime,
        lease_seconds: float,
        silence_before: datetime | None,
        conversation_id: str | None,
        limit: int,
        min_tokens: int = 0,
        after: str | None = None,
    ) -> list[ConversationState]:
        """Lease up to ``limit`` conversations that have work (or ``conversation_id`` only).

        Candidates are taken, and returned, in id order (the database's collation), from ids
        greater than ``after`` when it is given: a pass walks every conversation with work once
        by passing the last id it got back.
        """
        ...

    async def renew(self, owner: str, conversation_id: str, until: datetime) -> bool:
        """Extend ``owner``'s lease; False if another worker holds it now."""
        ...

    async def next_retry(self, conversation_id: str, max_attempts: int) -> datetime | None:
        """When the earliest provisional summary is due for another attempt."""
        ...

    async def release(
        self, owner: str, conversation_id: str, needs_maintenance: bool, next_retry_at: datetime | None
    ) -> None: ...

    async def seal_if_silent(
        self, owner: str, conversation_id: str, silence_before: datetime, now: datetime, min_tokens: int = 0
    ) -> Summary | None:
        """Seal the open topic if its newest message is older than ``silence_before`` (under the lease)."""
        ...

    async def topics_to_summarize(
        self, conversation_id: str, now: datetime, max_attempts: int
    ) -> list[Summary]:
        """Pending topics, and provisional ones due for another attempt, oldest first."""
        ...

    async def topic_messages(self, conversation_id: str, first: int, last: int) -> list[StoredMessage]:
        """Unpinned messages in a sequence range, oldest first (what a summariser reads)."""
        ...

    async def save_topic_summary(
        self, owner: str, topic: Summary, write: SummaryWrite, now: datetime
    ) -> bool:
        """Record a topic's summary once; False if another worker already did."""
        ...

    async def active_summaries(self, conversation_id: str, tier: str) -> list[Summary]:
        """Summarised, unmerged topics (tier ``topic``) or undropped archives (``bulk``), oldest first."""
        ...

    async def save_archive(
        self, owner: str, conversation_id: str, topics: Sequence[Summary], write: SummaryWrite, now: datetime
    ) -> Summary | None:
        """Merge ``topics`` into a new archive atomically; None if any was merged meanwhile."""
        ...

    async def drop_archives(
        self, owner: str, conversation_id: str, ids: Sequence[int], now: datetime
    ) -> int: ...

    async def stats(self, conversation_id: str | None) -> list[ConversationStats]: ...

    async def conversation_ids(self) -> list[str]: ...
