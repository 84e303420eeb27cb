"""Cached-prefix share: how much of each turn's context a provider's prompt cache could reuse.

One conversation of ``turns`` turns is replayed with ``get_context`` after every turn: QMSum
turns (the split's meetings in name order, back to back, timestamps
:data:`~.data.TURN_SECONDS` apart), or a two-party chat (:func:`chat_turns`: TIAGE dialogues
as sessions hours or days apart, so that silence ends each one, as in a bot's long chat).
A context is tokenised as a provider sees it: per message a start marker, ``role`` and
``name``, a separator, the ``content`` (and any ``tool_calls`` / ``tool_call_id`` as JSON),
an end marker; cl100k_base for the text, markers that match no text token. Per turn (from the second):

- **prefix share**: the longest common token prefix with the previous turn's context,
  over this context's tokens (what a prompt cache can serve);
- **rewrite**: the common prefix is less than half of the previous context's tokens;
- **event**: a maintenance event happened between the two ``get_context`` calls: a topic
  sealed, a summary written, a merge, a drop or roll-up. Taken from
  ``CompressedContext.maintenance_epoch`` when the library has it, else from ``stats()``
  counters (topics, pending topics, archives, dropped archives, compressions).

Ours: ``maintain(now=<turn time>)`` after every ``maintain_every`` turns (before that turn's
``get_context``), ``context_budget`` = ``max_tokens`` = the budget. Baseline "halve": append
every turn; when the framed total exceeds the budget, drop the oldest turns until it is at
most half the budget (each halving is its event). pydantic-ai's summarisation processor, as in
the static part (the same extractive summariser behind its model): each of its summaries is its
event.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from tiered_history import HistoryCompressor
from tiered_history.tokens import REPLY_PRIMING_TOKENS, TokenCounter

from . import api
from .data import START, TURN_SECONDS, Meeting, Turn, load_meeting, meeting_paths
from .systems import OURS, OURS_VARIANTS, SUMMARIZATION, Shared, Summarization

TURNS = 1500
BUDGET = 4000
MAINTAIN_EVERY = 10
CONVERSATION = "replay"

HALVE = "append until full, then drop the oldest half"

# Chat-format markers (``<|im_start|>``, separator, ``<|im_end|>``): negative, so no text token equals them.
_START, _SEP, _END = -1, -2, -3


def conversation_turns(data_dir: Path, split: str, turns: int) -> list[Turn]:
    """The first ``turns`` stored turns of the split's meetings, in name order, on one clock."""
    out: list[Turn] = []
    for path in meeting_paths(data_dir, split, None):
        for t in load_meeting(path).turns:
            i = len(out)
            ts = START + timedelta(seconds=TURN_SECONDS * i)
            out.append(Turn(t.index, i + 1, t.speaker, t.name, t.content, ts))
            if len(out) == turns:
                return out
    return out


#: TIAGE file of :func:`chat_turns` (its test dialogues: the boundary benchmark tunes on the others).
CHAT_FILE = "anno_test.json"
#: Hours between two sessions of the chat replay (uniform, fixed seed), and seconds between turns.
SESSION_GAP_HOURS = (6, 60)
CHAT_TURN_SECONDS = (10, 90)


def chat_turns(data_dir: Path, turns: int, seed: int = 7) -> list[Turn]:
    """A long two-party chat: TIAGE's test dialogues in file order, each a session of alternating
    ``user`` / ``assistant`` turns, sessions :data:`SESSION_GAP_HOURS` apart (so each starts after a
    silence), turns :data:`CHAT_TURN_SECONDS` apart; the first ``turns`` turns."""
    dialogues = json.loads((data_dir / "tiage" / CHAT_FILE).read_text(encoding="utf-8"))
    rng = random.Random(seed)
    at = START
    out: list[Turn] = []
    for dialogue in dialogues.values():
        at += timedelta(hours=rng.randint(*SESSION_GAP_HOURS))
        for i, (text, _label) in enumerate(dialogue):
            at += timedelta(seconds=rng.randint(*CHAT_TURN_SECONDS))
            role = "user" if i % 2 == 0 else "assistant"
            out.append(Turn(i, len(out) + 1, role, "", str(text), at, role))
            if len(out) == turns:
                return out
    return out


def sessions_in(turns: Sequence[Turn]) -> int:
    """Sessions (dialogues) a :func:`chat_turns` list spans."""
    return sum(1 for t in turns if t.index == 0)


def meetings_in(turns: Sequence[Turn]) -> int:
    """Meetings a :func:`conversation_turns` list spans (a meeting's turn ids only grow)."""
    return sum(1 for i, t in enumerate(turns) if i == 0 or t.index <= turns[i - 1].index)


class Wire:
    """Messages as the token sequences a provider caches (memoised per message)."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.memo: dict[str, tuple[int, ...]] = {}

    def message(self, m: Mapping[str, Any]) -> tuple[int, ...]:
        key = json.dumps(m, sort_keys=True, default=str)
        toks = self.memo.get(key)
        if toks is None:
            head = str(m.get("role", "")) + (f" {m['name']}" if m.get("name") else "")
            body = str(m.get("content") or "")
            extra = {k: m[k] for k in ("tool_calls", "tool_call_id") if m.get(k) is not None}
            if extra:
                body += json.dumps(extra, separators=(",", ":"))
            enc = self.counter.encode
            toks = self.memo[key] = (_START, *enc(head), _SEP, *enc(body), _END)
        return toks

    def context(self, messages: Sequence[Mapping[str, Any]]) -> list[tuple[int, ...]]:
        return [self.message(m) for m in messages]


def common_prefix(a: Sequence[tuple[int, ...]], b: Sequence[tuple[int, ...]]) -> int:
    """Tokens of the longest common prefix of two tokenised contexts."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x == y:
            n += len(x)
            continue
        for p, q in zip(x, y, strict=False):
            if p != q:
                break
            n += 1
        break
    return n


@dataclass
class PrefixResult:
    system: str
    budget: int
    maintain_every: int
    tokens: list[int] = field(default_factory=list)
    """Tokens of each turn's context (wire tokens, see :class:`Wire`)."""
    stable: list[int] = field(default_factory=list)
    """Tokens of each turn's context before its recall part (all of it when there is none or the
    library does not say where it starts, see :func:`~.api.recall_start`)."""
    common: list[int] = field(default_factory=list)
    """From the second turn: tokens of the common prefix with the previous turn's context."""
    event: list[bool] = field(default_factory=list)
    """From the second turn: a maintenance event happened since the previous turn."""
    event_source: str = ""
    seconds: float = 0.0
    over_budget: int = 0

    @property
    def turns(self) -> int:
        return len(self.tokens)

    def shares(self) -> list[float]:
        return [c / t if t else 1.0 for c, t in zip(self.common, self.tokens[1:], strict=True)]

    def kept(self) -> list[float]:
        """Share of the previous context kept as a prefix."""
        return [c / t if t else 1.0 for c, t in zip(self.common, self.tokens[:-1], strict=True)]

    def rewrites(self, with_event: bool) -> int:
        return sum(1 for k, e in zip(self.kept(), self.event, strict=True) if k < 0.5 and e == with_event)

    def losses_without_event(self) -> int:
        """Turns without an event that lost any token the previous context held before its recall part."""
        stable = self.stable[:-1] if self.stable else self.tokens[:-1]
        return sum(1 for c, t, e in zip(self.common, stable, self.event, strict=True) if c < t and not e)

    def uncached(self) -> list[int]:
        return [t - c for c, t in zip(self.common, self.tokens[1:], strict=True)]


def _record(
    res: PrefixResult,
    wire: Wire,
    msgs: Sequence[Mapping[str, Any]],
    prev: list[tuple[int, ...]] | None,
    event: bool,
    recall_start: int | None = None,
) -> list[tuple[int, ...]]:
    ctx = wire.context(msgs)
    res.tokens.append(sum(len(x) for x in ctx))
    res.stable.append(sum(len(x) for x in ctx[:recall_start]))
    if prev is not None:
        res.common.append(common_prefix(prev, ctx))
        res.event.append(event)
    return ctx


async def run_ours(
    turns: Sequence[Turn], budget: int, maintain_every: int, variant: str = OURS
) -> PrefixResult | None:
    """One of :data:`~.systems.OURS_VARIANTS` (``None`` if the installed library cannot run it)."""
    overrides = OURS_VARIANTS[variant]
    if overrides is None:
        return None
    started = time.perf_counter()
    counter = TokenCounter()
    wire = Wire(counter)
    res = PrefixResult(variant, budget, maintain_every)
    h = HistoryCompressor.from_url("memory://", **{"context_budget": budget, **overrides})
    await h.initialize()
    prev: list[tuple[int, ...]] | None = None
    prev_sig: object = None
    try:
        for n, turn in enumerate(turns, 1):
            msg = {**turn.openai(), "timestamp": turn.timestamp}
            await h.add_message(CONVERSATION, msg)
            if n % maintain_every == 0:
                await h.maintain(CONVERSATION, now=turn.timestamp)
            ctx = await h.get_context(CONVERSATION, max_tokens=budget)
            epoch = api.maintenance_epoch(ctx)
            if epoch is not None:
                sig: object = epoch
                res.event_source = "maintenance_epoch"
            else:
                st = (await h.stats(CONVERSATION))[0]
                sig = (st.topics, st.topics_pending, st.archives, st.archives_dropped, st.compressions)
                res.event_source = "stats() counters"
            msgs = ctx.to_messages()
            res.over_budget += counter.messages_tokens(msgs) > budget
            prev = _record(res, wire, msgs, prev, sig != prev_sig, api.recall_start(ctx))
            prev_sig = sig
    finally:
        await h.close()
    res.seconds = time.perf_counter() - started
    return res


def run_halve(turns: Sequence[Turn], budget: int) -> PrefixResult:
    started = time.perf_counter()
    counter = TokenCounter()
    wire = Wire(counter)
    res = PrefixResult(HALVE, budget, 0, event_source="its own halvings")
    kept: list[tuple[dict[str, Any], int]] = []
    total = REPLY_PRIMING_TOKENS
    prev: list[tuple[int, ...]] | None = None
    for turn in turns:
        m = turn.openai()
        cost = counter.message_tokens(m)
        kept.append((m, cost))
        total += cost
        halved = total > budget
        if halved:
            while kept and total > budget // 2:
                total -= kept.pop(0)[1]
        prev = _record(res, wire, [m for m, _ in kept], prev, halved)
    res.seconds = time.perf_counter() - started
    return res


async def run_summarization(turns: Sequence[Turn], budget: int) -> PrefixResult:
    """pydantic-ai's ``SummarizationProcessor``, the static part's replay of it, read after every turn."""
    started = time.perf_counter()
    shared = Shared(Meeting(CONVERSATION, "", tuple(turns), (), 0, 0))
    wire = Wire(shared.counter)
    res = PrefixResult(SUMMARIZATION, budget, 0, event_source="its own summaries")
    replay = Summarization(shared, budget)
    prev: list[tuple[int, ...]] | None = None
    calls = 0
    for turn in turns:
        await replay.add(turn)
        msgs = await replay.context()
        res.over_budget += shared.counter.messages_tokens(msgs) > budget
        prev = _record(res, wire, msgs, prev, replay.model.cost.calls != calls)
        calls = replay.model.cost.calls
    res.seconds = time.perf_counter() - started
    return res


#: The baselines of this part (the cap on rewrites is the first one's), and all its systems.
BASELINES = (HALVE, SUMMARIZATION)
SYSTEMS = (*OURS_VARIANTS, *BASELINES)


def run_prefix(args: tuple[str, tuple[Turn, ...], int, int]) -> PrefixResult | None:
    """Process-pool entry point: ``(system, turns, budget, maintain_every)``."""
    system, turns, budget, every = args
    if system == HALVE:
        return run_halve(turns, budget)
    if system == SUMMARIZATION:
        return asyncio.run(run_summarization(turns, budget))
    return asyncio.run(run_ours(turns, budget, every, system))
