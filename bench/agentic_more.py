"""More agentic replays: copies, deletions, previews, odd message shapes, background maintenance
and several processes on one database (the patterns ``bench.agentic_prefix`` does not replay).

Patterns (deterministic and seeded, TIAGE chat lines and QMSum text, like ``bench.agentic_prefix``):

* ``fork+import``: a tool-using chat; at a third and two thirds of it the conversation is forked
  (``fork``) and copied (``import_conversation(export_conversation(...))``), and from then on the
  original and every copy are each replied to and read;
* ``delete+recreate``: a chat, ``delete_conversation``, the same id started again, and so on;
* ``previews+small``: a tool loop read at 4,000 tokens, with ``record=False`` previews at the same
  budget and reads at 1,500 (below ``cache_min_tokens``) in between;
* ``long messages``: messages of 6,000-40,000 characters (beyond ``max_message_chars``), tool
  results larger than the budget, and newest user messages larger than the budget;
* ``shapes``: image content parts, ``name`` fields, legacy ``function_call`` with ``role:
  "function"`` results, assistant messages with ``refusal``, ``audio``, ``content: None`` plus
  ``tool_calls``;
* ``pins near limit``: pinned messages taking most of the budget (``pin``/``unpin``, keys
  replaced), and attempts to pin a tool call or a tool result (refused: counted, not stored);
* ``background`` (SQLite file): ``start_background(0.05)`` runs maintenance in the bot's loop
  while it replies and reads;
* ``processes`` (SQLite file or PostgreSQL): two spawned processes, each with background
  maintenance, reply into one shared conversation and one of their own, reading after every
  message; the parent then checks every stored message and summary.

Per read the checks of ``bench.agentic_prefix`` (budget as the library counts and as
``TokenCounter`` re-counts ``to_messages()``; tool units, legacy function calls included; pins
first and verbatim; the cached prefix between reads of one budget with the same
``maintenance_epoch``, excused as there), and also: every message in the context (but one shown
cut) is exactly the message given at its sequence (``to_openai()`` against what the bot sent),
and the prefix is compared on the whole wire message (every field), not role/content/tools only.
At the end every message of every conversation comes back unchanged from ``get_messages``, and no
two live summaries of a conversation cover the same messages.

    PYTHONPATH=. python -m bench.agentic_more [--pattern shapes] [--store sqlite] [--budget 4000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

from tiered_history import CompressedContext, HistoryCompressor
from tiered_history.errors import BudgetTooSmallError, InvalidMessageError
from tiered_history.tokens import TokenCounter

from .agentic_prefix import START, Text, _awaiting_tail, _calls, _first_difference, _result_chars
from .agentic_prefix import unit_problems as tool_unit_problems
from .retention import api
from .retention.prefix import common_prefix

CACHE_MIN = 2048
EXTENSION = ("timestamp", "pinned", "metadata")

# -- what the bot sent, as the provider must get it back ------------------------------------------


def wire_of(msg: Mapping[str, Any]) -> dict[str, Any]:
    """The message as it must be sent back: without our extension keys and top-level ``None``
    values (but ``content``), as :mod:`tiered_history.messages` documents."""
    return {k: v for k, v in msg.items() if k not in EXTENSION and (v is not None or k == "content")}


class FullWire:
    """Each message as the token sequence of its whole JSON (every field counts for the prefix)."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.memo: dict[str, tuple[int, ...]] = {}

    def context(self, messages: Sequence[Mapping[str, Any]]) -> list[tuple[int, ...]]:
        out = []
        for m in messages:
            key = json.dumps(m, sort_keys=True, default=str)
            toks = self.memo.get(key)
            if toks is None:
                toks = self.memo[key] = tuple(self.counter.encode(key))
            out.append(toks)
        return out


def unit_problems(msgs: Sequence[Mapping[str, Any]], newest_open: bool) -> list[str]:
    """``bench.agentic_prefix.unit_problems`` with legacy function calls: a ``role: "function"``
    result must follow the assistant ``function_call`` naming it, and such a call (not the newest
    message) must be followed by its result."""
    out = tool_unit_problems(msgs, newest_open)
    n = len(msgs)
    for i, m in enumerate(msgs):
        if m.get("role") == "function":
            prev = msgs[i - 1] if i else {}
            fc = prev.get("function_call") or {}
            if fc.get("name") != m.get("name"):
                out.append(f"function result {m.get('name')} at {i} without its function_call before it")
        if m.get("function_call"):
            nxt = msgs[i + 1] if i + 1 < n else None
            if nxt is None:
                if not newest_open:
                    out.append(f"function_call at {i} is the last message (no result)")
            elif nxt.get("role") != "function":
                out.append(f"function_call at {i} not followed by its result")
    return out


@dataclass
class Finding:
    turn: int
    where: str
    kind: str
    detail: str


@dataclass
class Result:
    pattern: str
    store: str
    recall: bool
    budget: int
    reads: int = 0
    previews: int = 0
    small_reads: int = 0
    shares: list[float] = field(default_factory=list)
    losses: int = 0
    excused: int = 0
    over_budget: int = 0
    broken_units: int = 0
    pins_lost: int = 0
    changed_in_context: int = 0
    storage: int = 0
    duplicate_summaries: int = 0
    errors: int = 0
    refused_pins: int = 0
    events: int = 0
    """Reads whose ``maintenance_epoch`` differed from the previous read's at that budget."""
    too_small: int = 0
    """Reads refused with ``BudgetTooSmallError`` (documented: pins leave too little)."""
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0

    def mean_share(self) -> float:
        return sum(self.shares) / len(self.shares) if self.shares else 1.0

    def add(self, turn: int, where: str, kind: str, detail: str) -> None:
        self.findings.append(Finding(turn, where, kind, detail))


@dataclass
class Prev:
    wire: list[tuple[int, ...]]
    stable: list[dict[str, Any]]
    stable_tokens: int
    epoch: int
    unrecalled: int
    added_since: int = 0


class Checker:
    """The per-read checks, kept per conversation and budget (previews have chains of their own)."""

    def __init__(self, res: Result) -> None:
        self.res = res
        self.counter = TokenCounter()
        self.wire = FullWire(self.counter)
        self.prev: dict[tuple[str, int, bool], Prev] = {}
        self.given: dict[str, list[dict[str, Any]]] = {}
        self.pins: dict[str, dict[str, dict[str, Any]]] = {}
        self.turn = 0

    def reset(self, cid: str) -> None:
        self.given[cid] = []
        self.pins[cid] = {}
        for k in [k for k in self.prev if k[0] == cid]:
            del self.prev[k]

    def copy(self, cid: str, new: str) -> None:
        self.given[new] = list(self.given.get(cid, []))
        self.pins[new] = dict(self.pins.get(cid, {}))

    def added(self, cid: str, msg: Mapping[str, Any], tokens: int, key: str | None = None) -> None:
        self.given.setdefault(cid, []).append(dict(msg))
        self.turn += 1
        if key is not None or msg.get("pinned"):
            self.pins.setdefault(cid, {})[key or f"#{len(self.given[cid])}"] = dict(msg)
        for (c, _b, _r), p in self.prev.items():
            if c == cid:
                p.added_since += tokens

    def check(self, cid: str, ctx: CompressedContext, b: int, record: bool = True) -> None:
        res = self.res
        where = f"{cid}@{b}{'' if record else ' preview'}"
        if not record:
            res.previews += 1
        elif b < CACHE_MIN:
            res.small_reads += 1
        else:
            res.reads += 1
        msgs = ctx.to_messages()
        counted = self.counter.messages_tokens(msgs)
        if counted > b or ctx.total_tokens > b:
            res.over_budget += 1
            res.add(self.turn, where, "over budget", f"{counted} / {ctx.total_tokens} > {b}")
        newest = ctx.current_topic[-1] if ctx.current_topic else None
        newest_open = newest is not None and (
            newest.role == "tool"
            or bool(newest.tool_calls)
            or bool((newest.extra or {}).get("function_call"))
        )
        probs = unit_problems(msgs, newest_open)
        if probs:
            res.broken_units += 1
            res.add(self.turn, where, "broken unit", "; ".join(probs))
        pins = self.pins.get(cid, {})
        head = msgs[: len(pins)]
        for pin in pins.values():
            if wire_of(pin) not in head:
                res.pins_lost += 1
                res.add(self.turn, where, "pin lost", str(wire_of(pin))[:80])
        given = self.given.get(cid, [])
        for m in [*ctx.pinned, *ctx.current_topic, *ctx.recalled]:
            if m.truncated_content is not None:
                continue
            if not 1 <= m.sequence <= len(given) or m.to_openai() != wire_of(given[m.sequence - 1]):
                res.changed_in_context += 1
                got = json.dumps(m.to_openai(), default=str)[:100]
                res.add(self.turn, where, "message changed in context", f"#{m.sequence}: {got}")
        tokens = self.wire.context(msgs)
        start = api.recall_start(ctx)
        stable = msgs[:start] if start is not None else msgs
        epoch = api.maintenance_epoch(ctx) or 0
        unrecalled = ctx.total_tokens - ctx.tier_tokens.get("recall", 0)
        key = (cid, b, record)
        p = self.prev.get(key)
        if p is not None and epoch != p.epoch and record:
            res.events += 1
        if p is not None and b >= CACHE_MIN:
            common = common_prefix(p.wire, tokens)
            total = sum(len(x) for x in tokens)
            if record:
                res.shares.append(common / total if total else 1.0)
            if common < p.stable_tokens and epoch == p.epoch:
                tail = _awaiting_tail(p.stable)
                kept = sum(len(x) for x in self.wire.context(p.stable[: len(p.stable) - tail]))
                why = ""
                if tail and common >= kept:
                    why = "abandoned call left the context"
                elif p.unrecalled + p.added_since > b:
                    why = f"newest unit did not fit ({p.unrecalled}+{p.added_since} > {b})"
                elif ctx.truncated_newest:
                    why = "newest unit truncated"
                if why:
                    res.excused += 1
                else:
                    res.losses += 1
                    lost_at = _first_difference(p.stable, msgs)
                    res.add(
                        self.turn, where, "loss without event", f"kept {common}/{p.stable_tokens}; {lost_at}"
                    )
        self.prev[key] = Prev(tokens, stable, sum(len(x) for x in tokens[: len(stable)]), epoch, unrecalled)

    async def final(self, h: HistoryCompressor, cids: Sequence[str]) -> None:
        for cid in cids:
            given = self.given.get(cid, [])
            stored = await h.get_messages(cid)
            self.res.storage += storage_problems(stored, given, self.res, cid)
            self.res.duplicate_summaries += await duplicate_summaries(h, cid, self.res)


def storage_problems(stored: Sequence[Any], given: Sequence[Mapping[str, Any]], res: Result, cid: str) -> int:
    bad = 0
    if len(stored) != len(given):
        res.add(0, cid, "storage", f"{len(stored)} stored, {len(given)} given")
        return abs(len(stored) - len(given))
    for s, g in zip(stored, given, strict=True):
        if s.to_openai() != wire_of(g):
            bad += 1
            res.add(0, cid, "storage", f"#{s.sequence}: {json.dumps(s.to_openai(), default=str)[:120]}")
        want_ts = g.get("timestamp")
        if isinstance(want_ts, datetime) and s.timestamp != want_ts:
            bad += 1
            res.add(0, cid, "storage", f"#{s.sequence}: timestamp {s.timestamp} != {want_ts}")
    return bad


async def duplicate_summaries(h: HistoryCompressor, cid: str, res: Result) -> int:
    """Live summaries of one tier covering overlapping messages (at most one live row per range)."""
    hist = await h.get_history(cid)
    bad = 0
    for tier, rows in (("topic", hist.topics), ("bulk", hist.archives)):
        live = sorted(
            (s for s in rows if s.status != "superseded" and s.merged_into is None and s.dropped_at is None),
            key=lambda s: (s.first_sequence, s.last_sequence),
        )
        for a, b in pairwise(live):
            if b.first_sequence <= a.last_sequence:
                bad += 1
                res.add(
                    0,
                    cid,
                    "duplicate summary",
                    f"{tier} {a.id} {a.first_sequence}-{a.last_sequence} "
                    f"and {b.id} {b.first_sequence}-{b.last_sequence}",
                )
        ordinals = [s.sequence for s in rows if s.status != "superseded"]
        if len(ordinals) != len(set(ordinals)):
            bad += 1
            res.add(0, cid, "duplicate summary", f"{tier} ordinals repeat: {sorted(ordinals)}")
    return bad


# -- the bot -----------------------------------------------------------------------------------------


class Bot:
    """A compressor, the checks, a deterministic text source and clock."""

    def __init__(self, h: HistoryCompressor, checker: Checker, seed: int, real_time: bool = False) -> None:
        self.h = h
        self.c = checker
        self.rng = random.Random(seed)
        self.text = Text(seed)
        self.now = START
        self.real_time = real_time

    def tick(self, seconds: float) -> datetime:
        if self.real_time:
            return datetime.now(UTC)
        self.now += timedelta(seconds=seconds)
        return self.now

    async def add(self, cid: str, msg: dict[str, Any]) -> None:
        msg = {**msg, "timestamp": msg.get("timestamp") or self.tick(self.rng.randint(5, 60))}
        stored = await self.h.add_message(cid, msg)
        self.c.added(cid, msg, stored.token_count)

    async def pin(self, cid: str, msg: dict[str, Any], key: str) -> None:
        msg = {**msg, "timestamp": self.tick(1)}
        stored = await self.h.pin(cid, msg, key=key)
        self.c.added(cid, msg, stored.token_count, key=key)

    async def unpin(self, cid: str, key: str) -> None:
        await self.h.unpin(cid, key)
        self.c.pins.get(cid, {}).pop(key, None)

    async def read(
        self, cid: str, b: int, query: str | None = None, record: bool = True
    ) -> CompressedContext | None:
        try:
            ctx = await self.h.get_context(cid, b, query=query, record=record)
        except BudgetTooSmallError as exc:
            # Documented: the pinned messages leave too little for the newest unit even cut.
            self.c.res.too_small += 1
            self.c.res.add(self.c.turn, f"{cid}@{b}", "budget too small (documented)", str(exc)[:200])
            return None
        except Exception as exc:  # a read must not fail where the promises say it answers
            self.c.res.errors += 1
            self.c.res.add(self.c.turn, f"{cid}@{b}", "read failed", f"{type(exc).__name__}: {exc}"[:200])
            raise
        self.c.check(cid, ctx, b, record)
        return ctx

    async def exchange(self, cid: str, reads: Sequence[tuple[int, bool]], tools: float = 0.3) -> None:
        """A user line, perhaps a tool round (call, results), the answer; reads after each message.
        ``reads``: (budget, record) read in that order after every message."""

        async def after() -> None:
            for b, rec in reads:
                await self.read(cid, b, record=rec)

        await self.add(cid, {"role": "user", "content": self.text.line()})
        await after()
        if self.rng.random() < tools:
            calls = _calls(self.rng, self.rng.randint(1, 2), self.c.turn)
            calls = [{**c, "id": f"{cid[:8]}_{c['id']}"} for c in calls]
            await self.add(cid, {"role": "assistant", "content": None, "tool_calls": calls})
            await after()
            for c in calls:
                await self.add(
                    cid,
                    {
                        "role": "tool",
                        "tool_call_id": c["id"],
                        "content": self.text.doc(_result_chars(self.rng)),
                    },
                )
                await after()
        await self.add(cid, {"role": "assistant", "content": self.text.line()})
        await after()


def _maintain_every(bot: Bot, n: int) -> Any:
    async def maybe(cid: str, i: int) -> None:
        if n and i % n == 0:
            await bot.h.maintain(cid, now=bot.now)

    return maybe


# -- the patterns ------------------------------------------------------------------------------------


async def p_fork_import(bot: Bot, b: int, turns: int) -> list[str]:
    cids = ["orig"]
    maintain = _maintain_every(bot, 4)
    for i in range(turns):
        if i == turns // 3 or i == 2 * turns // 3:
            k = len(cids)
            await bot.h.fork("orig", f"fork{k}")
            bot.c.copy("orig", f"fork{k}")
            text = await bot.h.export_conversation("orig")
            await bot.h.import_conversation(text, conversation_id=f"copy{k}")
            bot.c.copy("orig", f"copy{k}")
            cids += [f"fork{k}", f"copy{k}"]
            for cid in cids[-2:]:
                await bot.read(cid, b)
        for cid in cids:
            await bot.exchange(cid, [(b, True)], tools=0.3)
            await maintain(cid, i)
    return cids


async def p_delete_recreate(bot: Bot, b: int, turns: int) -> list[str]:
    maintain = _maintain_every(bot, 5)
    cid = "again"
    for i in range(turns):
        if i and i % max(turns // 3, 1) == 0:
            await bot.h.delete_conversation(cid)
            bot.c.reset(cid)
            # The same id, started again: nothing of its first life may show.
            await bot.add(cid, {"role": "user", "content": f"Fresh start {i}: " + bot.text.line()})
            await bot.read(cid, b)
        await bot.exchange(cid, [(b, True)], tools=0.3)
        await maintain(cid, i)
    return [cid]


async def p_previews_small(bot: Bot, b: int, turns: int) -> list[str]:
    maintain = _maintain_every(bot, 4)
    cid = "preview"
    for i in range(turns):
        reads = [(b, True), (b, False)] if i % 2 else [(b, True), (1500, True), (b, False), (1500, False)]
        await bot.exchange(cid, reads, tools=0.5)
        await maintain(cid, i)
    return [cid]


async def p_long_messages(bot: Bot, b: int, turns: int) -> list[str]:
    maintain = _maintain_every(bot, 3)
    cid = "long"
    for i in range(turns):
        kind = i % 5
        if kind == 1:
            await bot.add(cid, {"role": "user", "content": bot.text.doc(bot.rng.choice((6000, 12000)))})
            await bot.read(cid, b)
            await bot.add(cid, {"role": "assistant", "content": bot.text.line()})
            await bot.read(cid, b)
        elif kind == 3:
            calls = _calls(bot.rng, 1, i)
            await bot.add(cid, {"role": "user", "content": bot.text.line()})
            await bot.read(cid, b)
            await bot.add(cid, {"role": "assistant", "content": None, "tool_calls": calls})
            await bot.read(cid, b)
            await bot.add(
                cid, {"role": "tool", "tool_call_id": calls[0]["id"], "content": bot.text.doc(b * 6)}
            )
            await bot.read(cid, b)
            await bot.add(cid, {"role": "assistant", "content": bot.text.line()})
            await bot.read(cid, b)
        elif kind == 4:
            # A newest user message larger than the whole budget: sent cut, head and tail (as text
            # parts with an image every other time).
            content: Any = bot.text.doc(b * 8)
            if i % 2:
                content = [
                    {"type": "text", "text": content},
                    {"type": "image_url", "image_url": {"url": PNG, "detail": "high"}},
                ]
            await bot.add(cid, {"role": "user", "content": content})
            await bot.read(cid, b)
            await bot.add(cid, {"role": "assistant", "content": bot.text.line()})
            await bot.read(cid, b)
        else:
            await bot.exchange(cid, [(b, True)], tools=0.0)
        await maintain(cid, i)
    return [cid]


PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
    "YPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


async def p_shapes(bot: Bot, b: int, turns: int) -> list[str]:
    maintain = _maintain_every(bot, 4)
    cid = "shapes"
    for i in range(turns):
        kind = i % 7
        line = bot.text.line()
        if kind == 0:
            msg = {
                "role": "user",
                "name": "alice",
                "content": [
                    {"type": "text", "text": line},
                    {
                        "type": "image_url",
                        "image_url": {
                            "url": PNG if i % 2 else "https://example.com/cat.jpg",
                            "detail": "low",
                        },
                    },
                ],
            }
            await bot.add(cid, msg)
            await bot.read(cid, b)
            await bot.add(cid, {"role": "assistant", "name": "helper", "content": bot.text.line()})
        elif kind == 1:
            await bot.add(cid, {"role": "user", "content": line})
            await bot.read(cid, b)
            fc = {"name": "get_weather", "arguments": json.dumps({"city": f"c{i}"})}
            await bot.add(cid, {"role": "assistant", "content": None, "function_call": fc})
            await bot.read(cid, b)
            await bot.add(
                cid,
                {"role": "function", "name": "get_weather", "content": bot.text.doc(_result_chars(bot.rng))},
            )
            await bot.read(cid, b)
            await bot.add(cid, {"role": "assistant", "content": bot.text.line()})
        elif kind == 2:
            await bot.add(cid, {"role": "user", "content": line})
            await bot.read(cid, b)
            await bot.add(
                cid, {"role": "assistant", "content": None, "refusal": "I can't help with that request."}
            )
        elif kind == 3:
            await bot.add(cid, {"role": "user", "content": line})
            await bot.read(cid, b)
            audio = {
                "id": f"audio_{i}",
                "data": "UklGRiQAAABXQVZFZm10IBAAAAABAAEA",
                "expires_at": 1767000000,
                "transcript": bot.text.line(),
            }
            await bot.add(cid, {"role": "assistant", "content": None, "audio": audio})
        elif kind == 4:
            await bot.add(cid, {"role": "user", "content": [{"type": "text", "text": line}]})
            await bot.read(cid, b)
            calls = _calls(bot.rng, 2, i)
            await bot.add(
                cid,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": calls,
                    "refusal": None,
                    "annotations": [],
                },
            )
            await bot.read(cid, b)
            for c in calls:
                await bot.add(
                    cid,
                    {
                        "role": "tool",
                        "tool_call_id": c["id"],
                        "content": [{"type": "text", "text": bot.text.doc(300)}],
                    },
                )
                await bot.read(cid, b)
            await bot.add(cid, {"role": "assistant", "content": bot.text.line()})
        else:
            await bot.exchange(cid, [(b, True)], tools=0.0)
            continue
        await bot.read(cid, b)
        await maintain(cid, i)
    return [cid]


async def p_pins_near_limit(bot: Bot, b: int, turns: int) -> list[str]:
    maintain = _maintain_every(bot, 4)
    cid = "pins"
    big = b * 55 // 100  # the system prompt: more than half the budget

    def sized(tokens: int, seed: str) -> str:
        words = (seed + " ").split() or ["pin"]
        out: list[str] = []
        while bot.c.counter.count(" ".join(out)) < tokens:
            out += words
        return " ".join(out)

    await bot.pin(
        cid, {"role": "system", "content": sized(big, "Always answer in French and cite sources.")}, "system"
    )
    for i in range(turns):
        if i % 4 == 2:
            # Up to three notes of 8 % each beside the prompt: pins then hold up to 94 % of the budget.
            note = sized(b * 8 // 100, f"Note {i}: " + bot.text.line())
            await bot.pin(cid, {"role": "user", "content": note}, f"note{(i // 4) % 3}")
        if i % 9 == 5:
            await bot.unpin(cid, f"note{(i // 9) % 3}")
        if i % 10 == 7:
            # Re-pin the system prompt, larger (the bot grew it): about 70 % of the budget.
            await bot.pin(
                cid,
                {"role": "system", "content": sized(b * 70 // 100, "Prompt v2 " + bot.text.line())},
                "system",
            )
        if i % 5 == 3:
            calls = _calls(bot.rng, 1, i)
            for msg in (
                {"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "tool_call_id": calls[0]["id"], "content": "pinned result"},
            ):
                try:
                    await bot.h.pin(cid, msg, key=f"tool{i}")
                except InvalidMessageError:
                    bot.c.res.refused_pins += 1
                else:
                    bot.c.res.add(bot.c.turn, cid, "tool message pinned", str(msg)[:80])
        await bot.exchange(cid, [(b, True)], tools=0.3)
        await maintain(cid, i)
    return [cid]


async def p_background(bot: Bot, b: int, turns: int) -> list[str]:
    await bot.h.start_background(0.05)
    cids = ["bg1", "bg2"]
    for _i in range(turns):
        for cid in cids:
            await bot.exchange(cid, [(b, True)], tools=0.3)
            await asyncio.sleep(0)
    await bot.h.stop_background()
    return cids


PATTERNS = {
    "fork+import": p_fork_import,
    "delete+recreate": p_delete_recreate,
    "previews+small": p_previews_small,
    "long messages": p_long_messages,
    "shapes": p_shapes,
    "pins near limit": p_pins_near_limit,
    "background": p_background,
}


async def replay(pattern: str, store: str, recall: bool, budget: int, turns: int, seed: int = 11) -> Result:
    started = time.perf_counter()
    res = Result(pattern, store, recall, budget)
    checker = Checker(res)
    with tempfile.TemporaryDirectory() as tmp:
        url = "memory://" if store == "memory" else f"sqlite:///{tmp}/more.db"
        overrides: dict[str, Any] = api.recall_overrides(recall) or {}
        if pattern == "background":
            overrides["silence_minutes"] = 0.02  # topics seal on silence while the bot talks
        async with HistoryCompressor.from_url(url, context_budget=budget, **overrides) as h:
            bot = Bot(h, checker, seed, real_time=pattern == "background")
            try:
                cids = await PATTERNS[pattern](bot, budget, turns)
            except Exception as exc:
                res.add(checker.turn, pattern, "replay stopped", f"{type(exc).__name__}: {exc}"[:300])
                cids = list(checker.given)
            await checker.final(h, cids)
    res.seconds = time.perf_counter() - started
    return res


# -- two processes on one database --------------------------------------------------------------------


def _worker(url: str, name: str, budget: int, turns: int, seed: int, out: Any) -> None:
    """One bot process: replies into the shared conversation and its own, reading after every
    message, with background maintenance running; sends back what it gave and its findings."""
    out.put(asyncio.run(_work(url, name, budget, turns, seed)))


async def _work(url: str, name: str, budget: int, turns: int, seed: int) -> dict[str, Any]:
    res = Result("processes", url.split(":", 1)[0], True, budget)
    checker = Checker(res)
    async with HistoryCompressor.from_url(url, context_budget=budget, silence_minutes=0.05) as h:
        await h.start_background(0.1)
        bot = Bot(h, checker, seed, real_time=True)
        own = f"own-{name}"
        try:
            for i in range(turns):
                await bot.exchange(own, [(budget, True)], tools=0.3)
                line = f"[{name} {i}] " + bot.text.line()
                msg = {
                    "role": "user" if i % 2 == 0 else "assistant",
                    "content": line,
                    "timestamp": datetime.now(UTC),
                }
                stored = await h.add_message("shared", msg)
                checker.turn += 1
                checker.given.setdefault("shared-mine", []).append(msg)
                for (c, _b, _r), p in checker.prev.items():
                    if c == "shared":
                        p.added_since += stored.token_count
                # The shared conversation: checked for budget, units and the prefix between this
                # process's reads (the other process's messages are only appends).
                ctx = await h.get_context("shared", budget)
                _check_shared(checker, ctx, budget, stored.sequence)
        finally:
            await h.stop_background()
        await checker.final(h, [own])
    return {
        "name": name,
        "given": [
            {**wire_of(m), "timestamp": m["timestamp"].isoformat()} for m in checker.given["shared-mine"]
        ],
        "result": {k: v for k, v in res.__dict__.items() if k != "findings"},
        "findings": [f.__dict__ for f in res.findings],
    }


def _check_shared(checker: Checker, ctx: CompressedContext, budget: int, seq: int) -> None:
    """The shared conversation: per-read checks without the given-message comparison (the other
    process's messages are not known here; they are checked by the parent at the end)."""
    saved = checker.given.get("shared")
    checker.given["shared"] = []
    skip = checker.res.changed_in_context
    checker.check("shared", ctx, budget)
    # Messages of the shared conversation are compared at the end, not here.
    drop = checker.res.changed_in_context - skip
    if drop:
        checker.res.changed_in_context = skip
        checker.res.findings = [f for f in checker.res.findings if f.kind != "message changed in context"]
    if saved is not None:
        checker.given["shared"] = saved


async def replay_processes(store: str, budget: int, turns: int, seed: int = 11) -> Result:
    """Two spawned processes on one SQLite file or PostgreSQL database (``store``: a URL for
    PostgreSQL, else ``sqlite``)."""
    started = time.perf_counter()
    res = Result("processes", store if store == "sqlite" else "postgresql", True, budget)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/procs.db" if store == "sqlite" else store
        async with HistoryCompressor.from_url(url, context_budget=budget) as h:
            await h.initialize()
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        procs = [
            ctx.Process(target=_worker, args=(url, n, budget, turns, seed + k, out))
            for k, n in enumerate("AB")
        ]
        for p in procs:
            p.start()
        reports = [out.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(60)
        async with HistoryCompressor.from_url(url, context_budget=budget) as h:
            await h.maintain()
            stored = await h.get_messages("shared")
            mine: dict[str, list[dict[str, Any]]] = {}
            for m in stored:
                who = m.content[1:2]
                mine.setdefault(who, []).append(m.to_openai())
            for rep in reports:
                want = [{k: v for k, v in g.items() if k != "timestamp"} for g in rep["given"]]
                got = mine.get(rep["name"], [])
                if got != want:
                    res.storage += 1
                    res.add(
                        0, "shared", "storage", f"process {rep['name']}: {len(got)} stored, {len(want)} given"
                    )
                for k, v in rep["result"].items():
                    if isinstance(v, int) and k != "budget":
                        setattr(res, k, getattr(res, k) + v)
                    elif k == "shares":
                        res.shares += v
                res.findings += [Finding(**f) for f in rep["findings"]]
            res.duplicate_summaries += await duplicate_summaries(h, "shared", res)
            for n in "AB":
                res.duplicate_summaries += await duplicate_summaries(h, f"own-{n}", res)
    res.seconds = time.perf_counter() - started
    return res


# -- the report ------------------------------------------------------------------------------------

HEADER = (
    "| pattern | store | recall | budget | reads (previews, <2048) | mean prefix share | losses w/o event "
    "(excused) | over budget | broken units | pins lost | changed in context | storage | dup. summaries "
    "| read errors (too small) | events seen | s |"
)


def row(r: Result) -> str:
    return (
        f"| {r.pattern} | {r.store} | {'on' if r.recall else 'off'} | {r.budget} "
        f"| {r.reads} ({r.previews}, {r.small_reads}) | {100 * r.mean_share():.1f} % "
        f"| {r.losses} ({r.excused}) "
        f"| {r.over_budget} | {r.broken_units} | {r.pins_lost} | {r.changed_in_context} | {r.storage} "
        f"| {r.duplicate_summaries} | {r.errors} ({r.too_small}) | {r.events} | {r.seconds:.1f} |"
    )


PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def pg_database() -> tuple[str, Any]:
    """A throwaway PostgreSQL database on this machine: its URL and the callable that drops it."""
    import uuid

    import psycopg

    name = f"th_more_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return PG_ADMIN.rsplit("/", 1)[0] + "/" + name, drop


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=40, help="exchanges per replay")
    ap.add_argument("--pattern", action="append", choices=[*PATTERNS, "processes"])
    ap.add_argument("--budget", type=int, action="append")
    ap.add_argument("--store", action="append", help="memory, sqlite, or a postgresql:// URL (processes)")
    ap.add_argument("--recall", action="append", choices=("on", "off"))
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args(argv)
    patterns = args.pattern or [*PATTERNS, "processes"]
    budgets = args.budget or [4000, 8000]
    stores = args.store or ["memory", "sqlite"]
    recalls = [r == "on" for r in (args.recall or ["on", "off"])]
    print(HEADER)
    print("|" + " --- |" * 16)
    found: list[tuple[Result, Finding]] = []
    for pattern in patterns:
        for budget in budgets:
            for store in stores:
                if pattern in ("background", "processes") and store == "memory":
                    continue  # one process's memory: nothing to share, and nothing waits
                if pattern == "processes" and store == "postgresql":
                    url, drop = pg_database()
                    try:
                        runs = [asyncio.run(replay_processes(url, budget, args.turns // 2, args.seed))]
                    finally:
                        drop()
                elif pattern == "processes":
                    runs = [asyncio.run(replay_processes(store, budget, args.turns // 2, args.seed))]
                elif store == "postgresql":
                    continue  # the single-process patterns run on memory:// and SQLite
                else:
                    runs = [
                        asyncio.run(replay(pattern, store, rc, budget, args.turns, args.seed))
                        for rc in recalls
                    ]
                for r in runs:
                    print(row(r), flush=True)
                    found += [(r, f) for f in r.findings]
    if found:
        print("\nfindings:")
        seen: dict[tuple[str, str], int] = {}
        for r, f in found:
            k = (r.pattern, f.kind)
            seen[k] = seen.get(k, 0) + 1
            if seen[k] <= 5:
                print(
                    f"- {r.pattern} / {r.store} / recall {'on' if r.recall else 'off'}: "
                    f"turn {f.turn} {f.where}: {f.kind}: {f.detail}"
                )
        for (pat, kind), n in seen.items():
            print(f"  {pat}: {kind}: {n} in all")


if __name__ == "__main__":
    main()
