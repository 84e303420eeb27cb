"""The storage contract: what a backend implements. It persists and reads; it decides nothing.

A store keeps three kinds of rows per conversation (the conversation's state, its messages,
its summaries) and applies :class:`~tiered_history.core.state.Writes` atomically under a
:class:`~tiered_history.core.state.Guard`. Every rule (when to seal, what to merge, what to
send) lives in :mod:`tiered_history.core`; ``tiered_history.testing`` holds the conformance
suite a backend must pass.

The contract is synchronous: :class:`~tiered_history.HistoryCompressor` runs calls that may
wait (on a lock, a disk or a network) on a thread pool, and calls of a store that never waits
(``blocking = False``) directly on the event loop.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import accumulate
from typing import Protocol, runtime_checkable

from ..core.ranking import Query
from ..core.state import Committed, ConversationState, Guard, Writes
from ..core.units import RESULT_ROLES
from ..models import ConversationStats, StoredMessage, Summary


class LeaseLostError(Exception):
    """This worker's lease on a conversation expired and another worker took it over."""


class WouldWait(Exception):
    """A transaction run in a store's ``nowait()`` block needed a lock another writer holds.

    Nothing was written. Raised only inside ``nowait()``, which only
    :meth:`~tiered_history.store.aio.AsyncStore.call` uses: it runs the call again on its
    thread pool, where waiting for the lock blocks no event loop.
    """


@dataclass(frozen=True, slots=True)
class Window:
    """Unpinned messages with ``lo < sequence <= hi``, newest first, until ``token_cap`` tokens.

    A store may return more rows than the cap needs (it reads in pages); it returns whole
    tool units at the oldest end when it can (the rows are cut again by the caller).
    """

    lo: int
    hi: int
    token_cap: int


@dataclass(frozen=True, slots=True)
class SummaryWindow:
    """Summaries of ``kind`` with ordinal > ``after``, newest first, until ``token_cap`` tokens.

    By default only live rows: not merged into an archive, not dropped, not pending or superseded.
    ``merged``: instead, only rows merged into an archive (not dropped, not pending or superseded):
    what the newest archives were made of, which a context with room to spare shows in their place.
    ``upto``: instead, only archives dropped from the context, with ordinal <= ``upto``.
    """

    kind: str
    after: int
    token_cap: int
    merged: bool = False
    upto: int | None = None


@dataclass(frozen=True, slots=True)
class ContextRequest:
    """What one ``read_context`` call returns, besides the state and the pinned messages."""

    windows: tuple[Window, ...] = ()
    summaries: tuple[SummaryWindow, ...] = ()
    summary_ids: tuple[int, ...] = ()
    """Summaries (of any kind or state) to read by id, into ``Snapshot.by_id``."""
    pinned: tuple[int, ...] | None = None
    """The pinned sequences of the state the request was planned from, when known: a store may
    read those messages with the state (one round trip) after checking the state still pins them."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The rows a context is built from, read in one consistent snapshot."""

    state: ConversationState
    pinned: list[StoredMessage]
    """The active pinned messages (``state.pins``), oldest first."""
    windows: list[list[StoredMessage]] = field(default_factory=list)
    """One list per requested window, oldest first."""
    summaries: list[list[Summary]] = field(default_factory=list)
    """One list per requested summary window, oldest first."""
    by_id: list[Summary] = field(default_factory=list)
    """The summaries named in ``ContextRequest.summary_ids`` that exist."""


@dataclass(frozen=True, slots=True)
class Hit:
    """A search result: a message or a summary, and its score (higher is better)."""

    score: float
    message: StoredMessage | None = None
    summary: Summary | None = None


@runtime_checkable
class Store(Protocol):
    """Persistence for conversations, messages and summaries. Safe for concurrent callers."""

    blocking: bool
    """True when calls may wait (disk, network, locks): async callers then run them on a thread pool."""

    def initialize(self) -> None:
        """Create or upgrade the schema if needed."""
        ...

    def close(self) -> None: ...

    # -- reads ---------------------------------------------------------------------------------

    def read_state(self, conversation_id: str) -> ConversationState | None: ...

    def read_context(
        self, conversation_id: str, request: ContextRequest, expect_version: int | None = None
    ) -> Snapshot | None:
        """The state, the active pinned messages and the requested windows, in one snapshot.

        None when the conversation does not exist, or when ``expect_version`` is given and the
        state has another version (the caller planned the request from an older state).
        """
        ...

    def read_messages(self, conversation_id: str, first: int, last: int) -> list[StoredMessage]:
        """Messages with ``first <= sequence <= last`` (pinned ones included), oldest first."""
        ...

    def read_summaries(self, conversation_id: str, kind: str, after: int = 0) -> list[Summary]:
        """Every summary of ``kind`` (``topic`` or ``archive``) with ordinal > ``after``, oldest first."""
        ...

    def search(self, conversation_id: str, query: Query, limit: int, kind: str = "message") -> list[Hit]:
        """Messages (``kind="message"``) or summaries (``kind="summary"``: topic summaries and
        archives that have text) matching ``query``, best first: BM25 over words and phrases
        (:mod:`tiered_history.core.ranking`), newest first on equal scores. A literal query matches
        messages containing its text (case-insensitive), newest first."""
        ...

    def search_each(
        self, conversation_id: str, query: Query, limits: Mapping[str, int]
    ) -> dict[str, list[Hit]]:
        """:meth:`search` for each kind ``limits`` names, with its limit, in one snapshot (a
        read recalls messages and summaries together; one transaction costs fewer round trips)."""
        ...

    def conversation_ids(self) -> list[str]:
        """Every stored conversation id, in the store's id order."""
        ...

    def list_conversations(
        self, platform: str | None, after: str | None, limit: int
    ) -> list[ConversationState]:
        """Up to ``limit`` conversations (of ``platform``) with ids above ``after``, in id order."""
        ...

    def stats(self, conversation_id: str | None) -> list[ConversationStats]: ...

    # -- writes --------------------------------------------------------------------------------

    def commit(self, conversation_id: str, guard: Guard, writes: Writes) -> Committed:
        """Apply ``writes`` atomically if ``guard`` still holds; otherwise write nothing.

        Raises :class:`LeaseLostError` when ``guard.lease_owner`` no longer holds the lease.
        """
        ...

    def update(
        self,
        conversation_id: str,
        plan: Callable[[ConversationState | None], Writes | None],
        lease_owner: str | None = None,
    ) -> Committed:
        """Lock the conversation, read its state, and apply ``plan(state)`` atomically.

        ``plan`` is a pure function (the core's): it runs while the conversation is locked, so
        it cannot lose a race. Returns what was written (``Committed.writes``; None when the plan
        had nothing to do). Raises what ``plan`` raises (nothing is written then), and
        :class:`LeaseLostError` when ``lease_owner`` is given and does not hold the lease.
        """
        ...

    def delete(self, conversation_id: str) -> bool:
        """Remove every row of the conversation (state, messages, summaries, index entries)."""
        ...

    # -- maintenance leases --------------------------------------------------------------------

    def claim(
        self,
        owner: str,
        now: datetime,
        lease_seconds: float,
        limit: int,
        after: str | None = None,
        conversation_id: str | None = None,
    ) -> list[str]:
        """Lease up to ``limit`` conversations whose ``due_at`` has come (or ``conversation_id``).

        Candidates are taken, and returned, in id order (the database's collation), from ids
        greater than ``after`` when it is given, so a pass walks every due conversation once.
        A conversation leased by another worker is skipped until its lease expires.
        """
        ...

    def renew(self, owner: str, conversation_id: str, until: datetime) -> bool:
        """Extend ``owner``'s lease; False if another worker holds it now."""
        ...

    def release(self, owner: str, conversation_id: str) -> None:
        """Give the lease back (no-op if ``owner`` does not hold it)."""
        ...


def newest_window(messages_oldest_first: Sequence[StoredMessage], token_cap: int) -> list[StoredMessage]:
    """The newest messages up to ``token_cap`` tokens, extended to complete a tool unit."""
    # The newest k messages where k is the first count whose tokens reach the cap (running sums
    # in C: the window is read on every call), then those a tool unit needs.
    if token_cap <= 0:
        return []
    newest = list(reversed(messages_oldest_first))
    k = bisect_left(list(accumulate([m.token_count for m in newest])), token_cap) + 1
    while k < len(newest) and newest[k - 1].role in RESULT_ROLES:  # a result: its call too
        k += 1
    out = newest[:k]
    out.reverse()
    return out


def newest_summaries(summaries_oldest_first: Sequence[Summary], token_cap: int) -> list[Summary]:
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
