"""The systems compared, one small class each behind :class:`Replay`, and the registry :data:`SYSTEMS`.

A replay sees a meeting turn by turn (``add``), is told the meeting is over (``end``:
ours runs its last maintenance there), then answers two questions:

- ``context()``: the context it would send now (static, end-of-meeting retention);
- ``ask(query, at)``: the context it would send once ``query`` is stored as the newest
  user message. It must leave the replay as it was, so that the queries of one meeting
  do not see each other (ours works on a copy of its store).

To add a variant (other settings for ours, another peer), write a factory
``(Shared, budget) -> Replay`` and add a :class:`System` to :data:`SYSTEMS`.
"""

from __future__ import annotations

import copy
import json
import os
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from tiered_history import CompressedContext, HistoryCompressor, Settings
from tiered_history.tokens import TokenCounter

from . import api, peers
from .bm25 import BM25, retrieval_context
from .data import Meeting, Turn

#: During a replay ``maintain(now=<turn time>)`` runs after every this many messages (every
#: 50 s of meeting time: the library's background worker runs every 30 s by default), then
#: once when the meeting ends, before the context is read or a query is stored.
MAINTAIN_EVERY = 10  # 0: only when the meeting ends (a backlog maintained in one pass)
CONVERSATION = "meeting"

OURS = "tiered_history, recall off"
OURS_RECALL = "tiered_history, recall on"
RECENCY = "recency truncation"
LANGCHAIN = "langchain trim_messages"
SLIDING = "pydantic-ai SlidingWindow"
RETRIEVAL = "BM25 retrieval (half newest, half BM25)"
RETRIEVAL_FILL = "BM25 retrieval, spare room to newer turns"
SUMMARIZATION = "pydantic-ai Summarization"
FULL = "full history"


class Replay(Protocol):
    async def add(self, turn: Turn) -> None: ...

    async def end(self) -> None: ...

    async def context(self) -> list[dict[str, Any]]: ...

    async def ask(self, query: str, at: datetime) -> list[dict[str, Any]]: ...

    async def close(self) -> None: ...

    @property
    def cost(self) -> peers.Cost | None:
        """Summariser use during the replay (not while answering queries); ``None``: never summarises."""
        ...


@dataclass
class Shared:
    """One meeting's data, built once in the worker and shared by every system and budget."""

    meeting: Meeting
    store: str = "memory"
    """``memory`` (a deep copy per query) or ``sqlite`` (a file copy per query)."""
    tmp: Path = field(default_factory=lambda: Path(tempfile.gettempdir()))
    counter: TokenCounter = field(default_factory=TokenCounter)

    @cached_property
    def framed(self) -> peers.Framed:
        return peers.Framed(self.counter, memo=True)

    @cached_property
    def messages(self) -> list[dict[str, Any]]:
        return [t.openai() for t in self.meeting.turns]

    @cached_property
    def costs(self) -> list[int]:
        return [self.framed.one("user", t.content, t.name) for t in self.meeting.turns]

    @cached_property
    def index(self) -> BM25:
        return BM25([t.content for t in self.meeting.turns])


def query_message(query: str) -> dict[str, Any]:
    """The query as the bot's user would send it: a plain user message, no name."""
    return {"role": "user", "content": query}


# -- tiered_history -----------------------------------------------------------------------------------


class Ours:
    """``HistoryCompressor`` with default settings plus ``overrides``; ``context_budget`` = the budget."""

    def __init__(self, shared: Shared, budget: int, overrides: dict[str, Any]) -> None:
        self.shared, self.budget = shared, budget
        self.summarizer = peers.CountingSummarizer(shared.counter)
        self.path: Path | None = None
        url = "memory://"
        if shared.store == "sqlite":
            self.path = _new_file(shared.tmp)
            url = f"sqlite:///{self.path}"
        settings = {"context_budget": budget, **overrides}
        self.h = HistoryCompressor.from_url(url, summarizer=self.summarizer, **settings)
        self.n = 0
        self.last: datetime | None = None
        self.final: CompressedContext | None = None
        self._cost: peers.Cost | None = None

    async def add(self, turn: Turn) -> None:
        msg = {**turn.openai(), "timestamp": turn.timestamp}
        await self.h.add_message(CONVERSATION, msg)
        self.n += 1
        self.last = turn.timestamp
        if MAINTAIN_EVERY > 0 and self.n % MAINTAIN_EVERY == 0:
            await self.h.maintain(CONVERSATION, now=turn.timestamp)

    async def end(self) -> None:
        await self.h.maintain(CONVERSATION, now=self.last)
        self._cost = copy.copy(self.summarizer.cost)

    @property
    def cost(self) -> peers.Cost | None:
        return self._cost

    async def context(self) -> list[dict[str, Any]]:
        self.final = await self.h.get_context(CONVERSATION, max_tokens=self.budget)
        return self.final.to_messages()

    async def _snapshot(self) -> tuple[HistoryCompressor, Path | None]:
        """A compressor over a copy of this one's store (same settings)."""
        if self.path is None:
            store = copy.deepcopy(self.h.store)
            return HistoryCompressor(store, settings=self.h.settings, summarizer=self.summarizer), None
        path = _new_file(self.shared.tmp)
        src, dst = sqlite3.connect(self.path), sqlite3.connect(path)
        try:
            src.backup(dst)  # a consistent copy even while the source engine holds connections
        finally:
            src.close()
            dst.close()
        h = HistoryCompressor(f"sqlite:///{path}", settings=self.h.settings, summarizer=self.summarizer)
        return h, path

    async def ask(self, query: str, at: datetime) -> list[dict[str, Any]]:
        if self.path is None and hasattr(self.h, "fork"):
            # A branch of the meeting per query (the library's fork), so queries do not see each other.
            self.asked = getattr(self, "asked", 0) + 1
            branch = f"{CONVERSATION}-q{self.asked}"
            await self.h.fork(CONVERSATION, branch)
            try:
                await self.h.add_message(branch, {**query_message(query), "timestamp": at})
                ctx = await self.h.get_context(branch, max_tokens=self.budget)
            finally:
                await self.h.delete_conversation(branch)
            return ctx.to_messages()
        h, path = await self._snapshot()
        try:
            await h.add_message(CONVERSATION, {**query_message(query), "timestamp": at})
            ctx = await h.get_context(CONVERSATION, max_tokens=self.budget)
        finally:
            await h.close()
            if path is not None:
                path.unlink(missing_ok=True)
        return ctx.to_messages()

    async def close(self) -> None:
        await self.h.close()
        if self.path is not None:
            self.path.unlink(missing_ok=True)


class OursEveryTurn(Ours):
    """``Ours`` read the way a bot reads it: ``get_context`` after every message (and maintenance).

    The window start and blocks are then the ones kept between events for the provider's cache
    (a context read once at the end chooses them afresh, as a new budget or a fork does)."""

    async def add(self, turn: Turn) -> None:
        await super().add(turn)
        await self.h.get_context(CONVERSATION, max_tokens=self.budget)


def _new_file(directory: Path) -> Path:
    fd, name = tempfile.mkstemp(suffix=".db", dir=directory)
    os.close(fd)
    Path(name).unlink()  # the store creates it
    return Path(name)


def variant(recall_on: bool, **settings: Any) -> dict[str, Any] | None:
    """Settings overrides of one of our variants; ``None`` when it needs recall and the library has none.

    ``settings`` are more overrides (``recall={"share": 0.4}`` is merged into the recall setting).
    """
    base = api.recall_overrides(recall_on)
    if base is None:
        return None
    out = {**base, **settings}
    if "recall" in base and "recall" in settings:
        out["recall"] = {**base["recall"], **settings["recall"]}
    return out


#: tiered_history's variants (name -> settings overrides; ``None``: the installed library cannot run
#: it). Each runs in the query, static and cached-prefix parts; add one here to compare settings.
OURS_VARIANTS: dict[str, dict[str, Any] | None] = {
    OURS: variant(recall_on=False),
    OURS_RECALL: variant(recall_on=True),
}
# Experiments: TIERED_HISTORY_BENCH_VARIANTS='{"name": {settings...}}' replaces the variants above.
if os.environ.get("TIERED_HISTORY_BENCH_VARIANTS"):
    OURS_VARIANTS = json.loads(os.environ["TIERED_HISTORY_BENCH_VARIANTS"])


def ours(
    overrides: dict[str, Any] | None, every_turn: bool = False
) -> Callable[[Shared, int], Replay] | None:
    if overrides is None:
        return None
    settled = overrides
    kind = OursEveryTurn if every_turn else Ours
    return lambda shared, budget: kind(shared, budget, settled)


#: Static retention of each variant also when read after every message ("read every turn").
EVERY_TURN = ", read every turn"
#: The library's own fallback budget (``context_budget``'s default) kept while the bot reads at
#: ``<budget>``: what a bot that passes ``max_tokens`` and configures nothing else gets.
DEFAULT_BUDGET: int = Settings.model_fields["context_budget"].default
OURS_DEFAULT_BUDGET = f"{OURS_RECALL}, context_budget {DEFAULT_BUDGET:,}{EVERY_TURN}"


# -- peers without a store ----------------------------------------------------------------------------


class _Listing:
    """Keeps the count of turns seen; the meeting's messages and costs are in ``Shared``."""

    def __init__(self, shared: Shared, budget: int) -> None:
        self.shared, self.budget, self.n = shared, budget, 0

    async def add(self, turn: Turn) -> None:
        self.n += 1

    async def end(self) -> None:
        return None

    async def close(self) -> None:
        return None

    @property
    def cost(self) -> peers.Cost | None:
        return None

    async def context(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def ask(self, query: str, at: datetime) -> list[dict[str, Any]]:
        raise NotImplementedError


class Recency(_Listing):
    """The newest messages whose framed cost fits."""

    async def context(self) -> list[dict[str, Any]]:
        start = peers.recency(self.shared.costs[: self.n], self.budget)
        return self.shared.messages[start : self.n]

    async def ask(self, query: str, at: datetime) -> list[dict[str, Any]]:
        messages = [*self.shared.messages[: self.n], query_message(query)]
        costs = [*self.shared.costs[: self.n], self.shared.framed.one("user", query)]
        return messages[peers.recency(costs, self.budget) :]


class LangChain(_Listing):
    """langchain-core ``trim_messages(strategy="last")`` on the whole list."""

    async def context(self) -> list[dict[str, Any]]:
        lc = peers.langchain_messages(self.shared.meeting.turns[: self.n])
        counter = peers.langchain_counter(self.shared.framed)
        return peers.langchain_dicts(peers.langchain_trim(lc, self.budget, counter))


class Sliding(_Listing):
    """summarization-pydantic-ai's ``SlidingWindowProcessor`` on the whole list."""

    async def context(self) -> list[dict[str, Any]]:
        window = peers.sliding_window(self.budget, peers.pydantic_counter(self.shared.framed))
        return peers.pydantic_dicts(
            await window(peers.pydantic_messages(self.shared.meeting.turns[: self.n]))
        )


class Retrieval(_Listing):
    """Half the budget newest turns, half the turns that best match the query (see :mod:`.bm25`)."""

    fill = False

    async def ask(self, query: str, at: datetime) -> list[dict[str, Any]]:
        s = self.shared
        q, cost = query_message(query), s.framed.one("user", query)
        return retrieval_context(
            s.messages[: self.n], s.costs[: self.n], s.index, q, cost, self.budget, self.fill
        )


class RetrievalFill(Retrieval):
    """The same, with room the BM25 half leaves unused given to further newest turns."""

    fill = True


# -- summarization-pydantic-ai ------------------------------------------------------------------------


class Summarization:
    """``SummarizationProcessor`` run after every message on the history it returned last time."""

    def __init__(self, shared: Shared, budget: int) -> None:
        self.shared = shared
        self.model = peers.ExtractiveModel(shared.counter, peers.summary_target(budget))
        self.proc = peers.summarization(budget, peers.pydantic_counter(shared.framed), self.model.model())
        self.state: list[Any] = []
        self._cost: peers.Cost | None = None

    async def add(self, turn: Turn) -> None:
        self.state.append(peers.pydantic_request(turn))
        self.state = (await self.proc.process(self.state)).messages

    async def end(self) -> None:
        self._cost = copy.copy(self.model.cost)

    @property
    def cost(self) -> peers.Cost | None:
        return self._cost

    async def context(self) -> list[dict[str, Any]]:
        return peers.pydantic_dicts(self.state)

    async def ask(self, query: str, at: datetime) -> list[dict[str, Any]]:
        from pydantic_ai.messages import ModelRequest, UserPromptPart

        asked = [*self.state, ModelRequest(parts=[UserPromptPart(content=query, timestamp=at)])]
        return peers.pydantic_dicts((await self.proc.process(asked)).messages)

    async def close(self) -> None:
        return None


# -- registry -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class System:
    name: str
    make: Callable[[Shared, int], Replay] | None
    """``None``: the installed library cannot run it (its rows are n/a)."""
    static: bool
    """Takes part in static (end-of-meeting) retention."""
    query: bool
    """Takes part in query retention."""


SYSTEMS: tuple[System, ...] = (
    *(System(name, ours(o), static=True, query=True) for name, o in OURS_VARIANTS.items()),
    *(
        System(name + EVERY_TURN, ours(o, True), static=True, query=False)
        for name, o in OURS_VARIANTS.items()
    ),
    System(
        OURS_DEFAULT_BUDGET,
        ours(variant(True, context_budget=DEFAULT_BUDGET), True),
        static=True,
        query=False,
    ),
    System(RECENCY, Recency, static=True, query=True),
    System(LANGCHAIN, LangChain, static=True, query=False),
    System(SLIDING, Sliding, static=True, query=False),
    System(RETRIEVAL, Retrieval, static=False, query=True),
    System(RETRIEVAL_FILL, RetrievalFill, static=False, query=True),
    System(SUMMARIZATION, Summarization, static=True, query=True),
)
STATIC_SYSTEMS = tuple(s.name for s in SYSTEMS if s.static)
QUERY_SYSTEMS = tuple(s.name for s in SYSTEMS if s.query)
