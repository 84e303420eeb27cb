"""Calling a (synchronous) store from the event loop without blocking it.

A store that may wait (``blocking = True``: disk, network, locks) is called on a thread pool;
one that never waits (the in-memory store) is called directly, which costs nothing. A store that
can *try* without waiting (``nowait``: a SQLite file, where a transaction only ever waits for
another writer's lock) runs short reply-path calls on the loop and hands a call to the pool only
when it would have waited (:meth:`AsyncStore.call`): the thread hop costs more than the write.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

from ..core.state import Committed, ConversationState, Guard, Writes
from ..models import ConversationStats, StoredMessage, Summary
from .base import ContextRequest, Snapshot, Store, WouldWait

P = ParamSpec("P")
T = TypeVar("T")

#: After a write tried on the event loop met another writer's lock, this long of writes go
#: straight to the thread pool.
CONTENDED_SECONDS = 0.1


class AsyncStore:
    """Async access to ``store``: the same methods, awaited."""

    def __init__(self, store: Store, threads: int) -> None:
        self.sync = store
        self._executor: ThreadPoolExecutor | None = (
            ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tiered-history-db")
            if store.blocking
            else None
        )
        self._nowait: Callable[[], AbstractContextManager[None]] | None = (
            getattr(store, "nowait", None) if self._executor is not None else None
        )
        self._contended_until = 0.0

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)``, on the thread pool when the store may block."""
        if self._executor is None:
            return fn(*args, **kwargs)
        call = functools.partial(fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` for a short call of the reply path: on the event loop when the
        store can run it without waiting for a lock, else (or if it would wait) on the thread pool.

        Only for calls that write nothing before a transaction that may wait fails (the reply
        path's: they plan, then commit once), so that running one again from the start is safe.
        """
        nowait = self._nowait
        if nowait is not None and time.monotonic() >= self._contended_until:
            # Let the loop's other tasks run first: a call that never suspends would let one task
            # that writes in a loop starve every other (and cancelling here writes nothing).
            await asyncio.sleep(0)
            try:
                with nowait():
                    return fn(*args, **kwargs)
            except WouldWait:
                # Another writer holds the lock: wait for it on a thread. While writers contend,
                # the next calls go straight there (a refused try costs its planning again).
                self._contended_until = time.monotonic() + CONTENDED_SECONDS
        return await self.run(fn, *args, **kwargs)

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    async def initialize(self) -> None:
        await self.run(self.sync.initialize)

    async def close(self) -> None:
        await self.run(self.sync.close)

    async def state(self, conversation_id: str) -> ConversationState | None:
        return await self.run(self.sync.read_state, conversation_id)

    async def read_context(
        self, conversation_id: str, request: ContextRequest, expect_version: int | None = None
    ) -> Snapshot | None:
        return await self.run(self.sync.read_context, conversation_id, request, expect_version)

    async def read_messages(self, conversation_id: str, first: int, last: int) -> list[StoredMessage]:
        return await self.run(self.sync.read_messages, conversation_id, first, last)

    async def read_summaries(self, conversation_id: str, kind: str, after: int = 0) -> list[Summary]:
        return await self.run(self.sync.read_summaries, conversation_id, kind, after)

    async def commit(self, conversation_id: str, guard: Guard, writes: Writes) -> Committed:
        return await self.run(self.sync.commit, conversation_id, guard, writes)

    async def update(
        self,
        conversation_id: str,
        plan: Callable[[ConversationState | None], Writes | None],
        lease_owner: str | None = None,
    ) -> Committed:
        return await self.run(self.sync.update, conversation_id, plan, lease_owner)

    async def stats(self, conversation_id: str | None) -> list[ConversationStats]:
        return await self.run(self.sync.stats, conversation_id)

    async def claim(
        self,
        owner: str,
        now: datetime,
        lease_seconds: float,
        limit: int,
        after: str | None = None,
        conversation_id: str | None = None,
    ) -> list[str]:
        return await self.run(self.sync.claim, owner, now, lease_seconds, limit, after, conversation_id)

    async def renew(self, owner: str, conversation_id: str, until: datetime) -> bool:
        return await self.run(self.sync.renew, owner, conversation_id, until)

    async def release(self, owner: str, conversation_id: str) -> None:
        await self.run(self.sync.release, owner, conversation_id)

    def __getattr__(self, name: str) -> Any:
        # Anything else of the store's (a backend's own extras) is reached through ``.sync``.
        raise AttributeError(f"{type(self).__name__} has no {name!r}; use .sync.{name} for the store itself")
