"""Agentic replays: the cached-prefix and structural promises under real-bot patterns.

``bench.retention.prefix`` replays plain chats and meetings (one budget, no tools, no pins, no
explicit query). Here a bot's ways of using one conversation are replayed, deterministic and
seeded, over TIAGE dialogues (the chat) and QMSum turns (long tool results):

* ``tools``: user asks, the assistant calls 1-3 tools, their results (some long, some short)
  arrive one by one, then the answer; ``get_context`` after every message, as a bot in a tool
  loop reads (right after the call, between results);
* ``parallel+abandon``: parallel calls, and calls the user walks away from without results;
* ``pins``: a pinned system prompt, pins added and taken out mid-conversation (``pin``/``unpin``);
* ``query``: ``get_context(query=...)`` with the bot's own query (in a chat with a few tool
  calls, and ``tools+query``: in a tool loop, the task's words, then the calls' arguments);
* ``two budgets``: one conversation read at 4,000 and 8,000 tokens in turn (two models);
* ``silence+seal``: sessions hours apart (topics seal on silence), ``maintain()`` every N turns
  and ``seal_current_topic`` now and then.

Each runs on ``memory://`` and SQLite, recall on and off, at 2,000 (below ``cache_min_tokens``:
no prefix promise, only the budget, units, pins and storage), 4,000 and 8,000 tokens.

Per ``get_context`` it checks:

1. the context is within ``max_tokens`` as the library counts (``TokenCounter.messages_tokens``);
2. every tool result follows its call in the same context, every call is followed by all its
   results (unless it is the newest unit, still awaiting them); every active pin is sent first,
   verbatim;
3. prefix: against the previous context read at the same budget, with no event between (the
   same ``maintenance_epoch``), the previous context's wire tokens before its recall part
   (:class:`bench.retention.prefix.Wire`) must be a prefix of the new one's. A loss is reported
   as *excused* when the library documents it: the newest unit did not fit beside the window
   (the tokens added since the previous read plus its non-recall part exceed the budget), or the
   lost part is only a newest tool call abandoned since (sent unanswered it is a 400);

and at the end 4: ``get_messages`` gives back every message exactly as the bot gave it.

    PYTHONPATH=. python -m bench.agentic_prefix [--turns 240] [--pattern tools] [--budget 4000]
        [--store memory] [--recall on] [--details]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tiered_history import CompressedContext, HistoryCompressor
from tiered_history.tokens import TokenCounter

from .retention import api
from .retention.prefix import Wire, common_prefix

DATA = Path("/work/shared/data")
START = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
CID = "agentic"
#: Below this budget (the ``cache_min_tokens`` default) the layout is for relevance alone: no prefix promise.
CACHE_MIN = 2048

# -- text ------------------------------------------------------------------------------------------


def _dialogues() -> list[list[str]]:
    raw = json.loads((DATA / "tiage" / "anno_test.json").read_text(encoding="utf-8"))
    return [[str(t) for t, _ in d] for d in raw.values()]


def _meeting_text() -> list[str]:
    out: list[str] = []
    for path in sorted((DATA / "qmsum" / "test").glob("*.json"))[:6]:
        data = json.loads(path.read_text(encoding="utf-8"))
        out += [str(t.get("content") or "") for t in data["meeting_transcripts"] if t.get("content")]
    return out


class Text:
    """Deterministic text: chat lines (TIAGE) and long documents (QMSum turns joined)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.dialogues = _dialogues()
        self.meeting = _meeting_text()
        self.d = 0
        self.i = 0
        self.m = self.rng.randrange(len(self.meeting))

    def line(self) -> str:
        """The next line of the chat (dialogues back to back)."""
        d = self.dialogues[self.d % len(self.dialogues)]
        if self.i >= len(d):
            self.d, self.i = self.d + 1, 0
            d = self.dialogues[self.d % len(self.dialogues)]
        self.i += 1
        return d[self.i - 1]

    def session_over(self) -> bool:
        return self.i >= len(self.dialogues[self.d % len(self.dialogues)])

    def doc(self, chars: int) -> str:
        """About ``chars`` characters of meeting text (a tool result: a search hit, a file)."""
        parts: list[str] = []
        n = 0
        while n < chars:
            t = self.meeting[self.m % len(self.meeting)]
            self.m += 1
            parts.append(t)
            n += len(t) + 1
        return "\n".join(parts)[:chars]


# -- the bot's operations --------------------------------------------------------------------------


@dataclass
class Op:
    kind: str  # "add" | "pin" | "unpin" | "seal" | "maintain" | "read"
    message: dict[str, Any] | None = None
    key: str | None = None
    budget: int | None = None
    query: str | None = None
    at: datetime | None = None


Script = Callable[[int, int, int], Iterator[Op]]
"""(turns, budget, seed) -> the bot's operations."""


class Clock:
    def __init__(self) -> None:
        self.now = START

    def tick(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


def _calls(rng: random.Random, n: int, turn: int) -> list[dict[str, Any]]:
    names = ("search_docs", "get_weather", "read_file", "run_sql", "lookup_user")
    return [
        {
            "id": f"call_{turn}_{j}",
            "type": "function",
            "function": {
                "name": rng.choice(names),
                "arguments": json.dumps({"q": f"item {turn}-{j}", "limit": rng.randint(1, 9)}),
            },
        }
        for j in range(n)
    ]


def _result_chars(rng: random.Random) -> int:
    return rng.choice((60, 150, 400, 900, 1800, 3500, 6000))


def tool_loop(
    turns: int, budget: int, seed: int, parallel: bool = False, abandon: float = 0.0, query: bool = False
) -> Iterator[Op]:
    """User asks; the assistant calls 1-3 tools (a few times in a row, or all at once with
    ``parallel``); results arrive one by one; the answer. A read after every message. With
    ``abandon``, that share of calls is left without (some of) its results: the user moves on."""
    rng, text, clock = random.Random(seed), Text(seed), Clock()
    n = 0
    q: str | None = None
    while n < turns:
        asked = text.line()
        yield Op("add", {"role": "user", "content": asked, "timestamp": clock.tick(rng.randint(20, 120))})
        # With ``query``: the bot's own query, the task's words, then each tool's arguments.
        q = asked if query else None
        yield Op("read", budget=budget, query=q)
        n += 1
        for _round in range(1 if parallel else rng.randint(1, 2)):
            k = rng.randint(2, 3) if parallel else rng.randint(1, 3)
            calls = _calls(rng, k, n)
            pre = rng.choice(("", "", "Let me check that."))
            yield Op(
                "add", {"role": "assistant", "content": pre, "tool_calls": calls, "timestamp": clock.tick(2)}
            )
            if query:
                q = " ".join(json.loads(c["function"]["arguments"])["q"] + " " + asked for c in calls)
            yield Op("read", budget=budget, query=q)
            n += 1
            answered = k if rng.random() >= abandon else rng.randint(0, k - 1)
            order = list(range(k))
            if parallel:
                rng.shuffle(order)  # parallel results come back in any order
            for j in order[:answered]:
                content = text.doc(_result_chars(rng))
                msg = {"role": "tool", "tool_call_id": calls[j]["id"], "content": content}
                yield Op("add", {**msg, "timestamp": clock.tick(rng.randint(1, 20))})
                yield Op("read", budget=budget, query=q)
                n += 1
            if answered < k:
                break  # abandoned: the user speaks next
        else:
            yield Op("add", {"role": "assistant", "content": text.line(), "timestamp": clock.tick(5)})
            yield Op("read", budget=budget, query=q)
            n += 1


def chat(
    turns: int,
    budget: int | Sequence[int],
    seed: int,
    *,
    query: bool = False,
    pins: bool = False,
    silence: bool = False,
    maintain_every: int = 0,
    seal_every: int = 0,
    tools: float = 0.0,
) -> Iterator[Op]:
    """A two-party chat (TIAGE dialogues back to back), with the options a bot adds."""
    rng, text, clock = random.Random(seed), Text(seed), Clock()
    budgets = [budget] if isinstance(budget, int) else list(budget)
    pinned: list[str] = []
    if pins:
        system = "You are a helpful assistant. Answer briefly and cite tool results. " * 3
        yield Op("pin", {"role": "system", "content": system}, key="system")
    for n in range(1, turns + 1):
        role = "user" if n % 2 else "assistant"
        gap = rng.randint(10, 90)
        if silence and role == "user" and text.session_over():
            gap = rng.randint(3, 30) * 3600  # the next session: hours later
        msg: dict[str, Any] = {"role": role, "content": text.line(), "timestamp": clock.tick(gap)}
        if role == "assistant" and tools and rng.random() < tools:
            calls = _calls(rng, rng.randint(1, 2), n)
            yield Op("add", {"role": "assistant", "content": "", "tool_calls": calls, "timestamp": clock.now})
            yield from _reads(budgets, n, query, msg_text="")
            for c in calls:
                res = {"role": "tool", "tool_call_id": c["id"], "content": text.doc(_result_chars(rng))}
                yield Op("add", {**res, "timestamp": clock.tick(3)})
                yield from _reads(budgets, n, query, msg_text="")
        yield Op("add", msg)
        if pins and n % 37 == 0:
            key = f"note{n}"
            pinned.append(key)
            note = f"Remember: the user's preference number {n} is {text.line()}"
            yield Op("pin", {"role": "user", "content": note}, key=key)
        if pins and n % 61 == 0:
            # A pin made the other way: a message added with ``pinned`` (it has no key: never unpinned).
            policy = {"role": "system", "content": f"Policy {n}: {text.line()}", "pinned": True}
            yield Op("add", {**policy, "timestamp": clock.now})
            yield from _reads(budgets, n, query, msg_text="")
        if pins and n % 53 == 0 and pinned:
            yield Op("unpin", key=pinned.pop(0))
        if seal_every and n % seal_every == 0:
            yield Op("seal")
        if maintain_every and n % maintain_every == 0:
            yield Op("maintain", at=clock.now)
        yield from _reads(budgets, n, query, msg["content"])


def _reads(budgets: Sequence[int], n: int, query: bool, msg_text: str) -> Iterator[Op]:
    for b in budgets:
        q = None
        if query:
            # The bot's own query: its last words, or a fixed question every few turns.
            q = "what did we say about the weather and food?" if n % 5 == 0 else (msg_text[-60:] or "tools")
        yield Op("read", budget=b, query=q)


def with_maintenance(script: Iterator[Op], every: int) -> Iterator[Op]:
    """``maintain(now=...)`` before the read after every ``every`` messages (the background worker)."""
    added = 0
    last: datetime = START
    for op in script:
        if op.kind == "add" and op.message is not None:
            added += 1
            last = op.message.get("timestamp", last)
        elif op.kind == "read" and added >= every:
            added = 0
            yield Op("maintain", at=last)
        yield op


PATTERNS: dict[str, Script] = {
    "tools": lambda t, b, s: with_maintenance(tool_loop(t, b, s), 10),
    "parallel+abandon": lambda t, b, s: with_maintenance(tool_loop(t, b, s, parallel=True, abandon=0.3), 10),
    "tools+query": lambda t, b, s: with_maintenance(tool_loop(t, b, s, query=True), 10),
    "pins": lambda t, b, s: chat(t, b, s, pins=True, maintain_every=10, tools=0.15),
    "query": lambda t, b, s: chat(t, b, s, query=True, maintain_every=10, tools=0.15),
    "two budgets": lambda t, b, s: chat(t, (b, 2 * b), s, maintain_every=10),
    "silence+seal": lambda t, b, s: chat(t, b, s, silence=True, maintain_every=7, seal_every=41, tools=0.1),
}


# -- the checks ------------------------------------------------------------------------------------


@dataclass
class Finding:
    turn: int
    budget: int
    kind: str
    detail: str


@dataclass
class Result:
    pattern: str
    store: str
    recall: bool
    budget: int
    reads: int = 0
    shares: list[float] = field(default_factory=list)
    rewrites_event: int = 0
    rewrites_no_event: int = 0
    losses: int = 0
    excused: int = 0
    over_budget: int = 0
    broken_units: int = 0
    pins_lost: int = 0
    storage: int = 0
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0

    def mean_share(self) -> float:
        return sum(self.shares) / len(self.shares) if self.shares else 1.0


def unit_problems(msgs: Sequence[Mapping[str, Any]], newest_open: bool) -> list[str]:
    """Tool results without their call before them, calls without all their results after them
    (but the last call when ``newest_open``: its results may still be coming)."""
    out: list[str] = []
    i = 0
    last_call = max((j for j, m in enumerate(msgs) if m.get("tool_calls")), default=-1)
    while i < len(msgs):
        m = msgs[i]
        if m.get("role") == "tool":
            out.append(f"tool result {m.get('tool_call_id')} at {i} without its call before it")
            i += 1
            continue
        i += 1
        if m.get("tool_calls"):
            want = {str(c["id"]) for c in m["tool_calls"]}
            got: set[str] = set()
            while i < len(msgs) and msgs[i].get("role") == "tool":
                tid = str(msgs[i].get("tool_call_id"))
                if tid not in want:
                    out.append(f"tool result {tid} at {i} after another call")
                got.add(tid)
                i += 1
            if want - got and not (newest_open and i - 1 - len(got) == last_call and i == len(msgs)):
                out.append(f"call at {i - 1 - len(got)} missing results {sorted(want - got)}")
    return out


def _awaiting_tail(stable: Sequence[Mapping[str, Any]]) -> int:
    """Messages at the end of ``stable`` that are a tool call still awaiting results (and the
    results it has): they leave the context once the user moves on (a documented exception)."""
    calls = [i for i, m in enumerate(stable) if m.get("tool_calls")]
    if not calls:
        return 0
    c = calls[-1]
    if any(m.get("role") != "tool" for m in stable[c + 1 :]):
        return 0
    answered = {m.get("tool_call_id") for m in stable[c + 1 :]}
    return len(stable) - c if {x["id"] for x in stable[c]["tool_calls"]} - answered else 0


@dataclass
class Prev:
    wire: list[tuple[int, ...]]
    stable: list[dict[str, Any]]
    stable_tokens: int
    epoch: int
    unrecalled: int
    added_since: int = 0
    sequence: int = 0


async def replay(
    pattern: str, store: str, recall: bool, budget: int, turns: int, seed: int = 11, details: bool = False
) -> list[Result]:
    started = time.perf_counter()
    counter = TokenCounter()
    wire = Wire(counter)
    script = PATTERNS[pattern](turns, budget, seed)
    results: dict[int, Result] = {}
    prev: dict[int, Prev] = {}
    given: list[dict[str, Any]] = []
    active_pins: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        url = "memory://" if store == "memory" else f"sqlite:///{tmp}/agentic.db"
        overrides = api.recall_overrides(recall) or {}
        async with HistoryCompressor.from_url(url, context_budget=budget, **overrides) as h:
            turn = 0
            for op in script:
                if op.kind == "add":
                    assert op.message is not None
                    stored = await h.add_message(CID, op.message)
                    given.append(op.message)
                    turn += 1
                    if op.message.get("pinned"):
                        active_pins[f"#{stored.sequence}"] = op.message
                    for p in prev.values():
                        p.added_since += stored.token_count
                elif op.kind == "pin":
                    assert op.message is not None
                    await h.pin(CID, op.message, key=op.key)
                    given.append(op.message)
                    active_pins[str(op.key)] = op.message
                elif op.kind == "unpin":
                    await h.unpin(CID, str(op.key))
                    active_pins.pop(str(op.key), None)
                elif op.kind == "seal":
                    await h.seal_current_topic(CID)
                elif op.kind == "maintain":
                    await h.maintain(CID, now=op.at)
                elif op.kind == "read":
                    b = int(op.budget or budget)
                    res = results.setdefault(b, Result(pattern, store, recall, b))
                    ctx = await h.get_context(CID, max_tokens=b, query=op.query)
                    _check(res, ctx, b, turn, counter, wire, prev, active_pins, details)
            stored_all = await h.get_messages(CID)
    for res in results.values():
        res.storage = _storage_problems(stored_all, given)
        res.seconds = time.perf_counter() - started
    return list(results.values())


def _check(
    res: Result,
    ctx: CompressedContext,
    b: int,
    turn: int,
    counter: TokenCounter,
    wire: Wire,
    prev: dict[int, Prev],
    active_pins: Mapping[str, Mapping[str, Any]],
    details: bool,
) -> None:
    res.reads += 1
    msgs = ctx.to_messages()
    counted = counter.messages_tokens(msgs)
    if counted > b or ctx.total_tokens > b:
        res.over_budget += 1
        res.findings.append(Finding(turn, b, "over budget", f"{counted} / {ctx.total_tokens} > {b}"))
    newest_open = bool(ctx.current_topic) and (
        ctx.current_topic[-1].role == "tool" or bool(ctx.current_topic[-1].tool_calls)
    )
    probs = unit_problems(msgs, newest_open)
    if probs:
        res.broken_units += 1
        res.findings.append(Finding(turn, b, "broken unit", "; ".join(probs)))
    head = msgs[: len(active_pins)]
    for pin in active_pins.values():
        want = {k: v for k, v in pin.items() if k not in ("timestamp", "pinned")}
        if want not in head:
            res.pins_lost += 1
            res.findings.append(Finding(turn, b, "pin lost", str(want)[:80]))
    tokens = wire.context(msgs)
    start = api.recall_start(ctx)
    stable = msgs[:start] if start is not None else msgs
    epoch = api.maintenance_epoch(ctx) or 0
    unrecalled = ctx.total_tokens - ctx.tier_tokens.get("recall", 0)
    p = prev.get(b)
    if p is not None and b >= CACHE_MIN:
        common = common_prefix(p.wire, tokens)
        total = sum(len(x) for x in tokens)
        prev_total = sum(len(x) for x in p.wire)
        res.shares.append(common / total if total else 1.0)
        event = epoch != p.epoch
        if common < prev_total * 0.5:
            if event:
                res.rewrites_event += 1
            else:
                res.rewrites_no_event += 1
        if common < p.stable_tokens and not event:
            tail = _awaiting_tail(p.stable)
            kept = sum(len(x) for x in wire.context(p.stable[: len(p.stable) - tail]))
            full = p.unrecalled + p.added_since > b
            why = ""
            if tail and common >= kept:
                why = "abandoned call left the context"
            elif full:
                why = f"newest unit did not fit ({p.unrecalled}+{p.added_since} > {b})"
            if why:
                res.excused += 1
            else:
                res.losses += 1
            if not why or details:
                lost_at = _first_difference(p.stable, msgs)
                res.findings.append(
                    Finding(
                        turn,
                        b,
                        "excused loss" if why else "loss without event",
                        f"kept {common}/{p.stable_tokens} stable tokens; {why or lost_at}",
                    )
                )
    prev[b] = Prev(tokens, stable, sum(len(x) for x in tokens[: len(stable)]), epoch, unrecalled)


def _first_difference(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"message {i}: was {_short(x)} now {_short(y)}"
    return f"message {len(b)}: was {_short(a[len(b)])}, now the context ends" if len(a) > len(b) else "?"


def _short(m: Mapping[str, Any]) -> str:
    c = str(m.get("content") or "")
    extra = (
        " calls"
        if m.get("tool_calls")
        else (f" result {m.get('tool_call_id')}" if m.get("tool_call_id") else "")
    )
    return f"[{m.get('role')}{extra}] {c[:50]!r}"


def _storage_problems(stored: Sequence[Any], given: Sequence[Mapping[str, Any]]) -> int:
    bad = 0
    if len(stored) != len(given):
        return abs(len(stored) - len(given)) or 1
    for s, g in zip(stored, given, strict=True):
        want = {k: v for k, v in g.items() if k not in ("timestamp", "pinned", "metadata")}
        got = {"role": s.role, "content": s.content}
        if s.name is not None:
            got["name"] = s.name
        if s.tool_calls is not None:
            got["tool_calls"] = s.tool_calls
        if s.tool_call_id is not None:
            got["tool_call_id"] = s.tool_call_id
        if got != want:
            bad += 1
    return bad


# -- the report ------------------------------------------------------------------------------------

HEADER = (
    "| pattern | store | recall | budget | reads | mean prefix share | rewrites event / no event "
    "| losses w/o event (excused) | over budget | broken units | pins lost | storage |"
)


def row(r: Result) -> str:
    cached = r.budget >= 2048
    share = f"{100 * r.mean_share():.1f} %" if cached else "n/a"
    rew = f"{r.rewrites_event} / {r.rewrites_no_event}" if cached else "n/a"
    loss = f"{r.losses} ({r.excused})" if cached else "n/a"
    return (
        f"| {r.pattern} | {r.store} | {'on' if r.recall else 'off'} | {r.budget} | {r.reads} | {share} "
        f"| {rew} | {loss} | {r.over_budget} | {r.broken_units} | {r.pins_lost} | {r.storage} |"
    )


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=240, help="messages per replay")
    ap.add_argument("--pattern", action="append", choices=sorted(PATTERNS))
    ap.add_argument("--budget", type=int, action="append")
    ap.add_argument("--store", action="append", choices=("memory", "sqlite"))
    ap.add_argument("--recall", action="append", choices=("on", "off"))
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--details", action="store_true", help="print every finding, excused ones too")
    args = ap.parse_args(argv)
    patterns = args.pattern or list(PATTERNS)
    budgets = args.budget or [2000, 4000, 8000]
    stores = args.store or ["memory", "sqlite"]
    recalls = [r == "on" for r in (args.recall or ["on", "off"])]
    print(HEADER)
    print("|" + " --- |" * 12)
    findings: list[tuple[Result, Finding]] = []
    for pattern in patterns:
        for budget in budgets:
            if pattern == "two budgets" and budget == 8000:
                continue  # 4,000 and 8,000 in turn: the 4,000 replay reads both
            for store in stores:
                for recall in recalls:
                    for r in asyncio.run(
                        replay(pattern, store, recall, budget, args.turns, args.seed, args.details)
                    ):
                        print(row(r), flush=True)
                        findings += [(r, f) for f in r.findings]
    if findings:
        print("\nfindings:")
        for r, f in findings:
            print(
                f"- {r.pattern} / {r.store} / recall {'on' if r.recall else 'off'} / {f.budget}: "
                f"turn {f.turn}: {f.kind}: {f.detail}"
            )


if __name__ == "__main__":
    main()
