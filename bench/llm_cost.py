"""``python -m bench.llm_cost``: LLM summariser calls and tokens per 1,000 QMSum messages.

QMSum meetings are replayed, one message per transcript turn, into a ``HistoryCompressor``
whose summariser is the real ``litellm`` one (``summarizer.kind: litellm``), pointed at the
local OpenAI-compatible server of ``tests/openai_server.py`` on 127.0.0.1. Every request
the summariser sends is answered there, so the figures count real HTTP calls and the
``usage`` the server reported for them; they are compared with what the library recorded
(``stats()``). The same server then answers two baselines that summarise on every turn:

* **summarise everything every turn**: one call per message whose data is the whole
  conversation so far (the newest messages that fit the summariser's input window);
* **rolling summary**: one call per message whose data is the previous summary plus the
  new message.

Both baselines go through the library's own ``LiteLLMSummarizer`` (same prompt, same
target size), so only the strategy differs. The server's answers are extracts of the data
in the prompt, sized to the requested length, and its token counts are exact: the prompt
with OpenAI's chat framing and the completion, both with the model's tokenizer (tiktoken,
offline: tiered_history points it at litellm's bundled files).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

# Before litellm is imported anywhere: use its bundled price map, never fetch one.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from bench._common import REPO, WarningCounter, git_revision, log, machine, table, update_section
from bench.retention.data import TURN_SECONDS, Meeting, load_meeting, meeting_paths
from tests.openai_server import OpenAIServer, Reply
from tiered_history import HistoryCompressor, Settings, SummaryInput
from tiered_history.summarizers.llm import INPUT_SHARE, LiteLLMSummarizer
from tiered_history.tokens import TokenCounter

SECTION = "llm_cost"
MODEL = "openai/gpt-4o-mini"
#: Meetings replayed by default (spread over the split): about 4,800 messages.
DEFAULT_LIMIT = 8
#: maintain() every this many messages: the default ``maintenance_interval_seconds`` (30 s)
#: at the replay clock's 5 s between turns.
DEFAULT_MAINTAIN_EVERY = 6
CONVERSATION = "meeting"
OURS = "tiered_history"
EVERY_TURN = "summarise everything every turn"
ROLLING = "rolling summary (previous summary + new message)"
#: Room left in the summariser's input share for its instructions when capping baseline input.
PROMPT_ROOM = 1_000

_DATA_RE = re.compile(r"<(transcript|summaries)>\n(.*)\n</\1>", re.S)
_TARGET_RE = re.compile(r"in about (\d+) tokens")
# "[12] user (Name): ", "[summary 1, messages 1-30, ...]: ", "[part 1 of 2]: " at a line start.
_LABEL_RE = re.compile(r"^\[[^\]\n]*\][^:\n]*: ", re.M)
_SENTENCE_RE = re.compile(r"[^.!?]+(?:[.!?]+|$)")


# -- the local LLM -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Call:
    """One chat completion the server answered, with the usage it reported."""

    kind: str  # "topic" (a transcript to summarise) or "merge" (summaries to merge)
    prompt_tokens: int
    completion_tokens: int


class LocalLLM:
    """The test server of ``tests/openai_server.py`` with a summarising responder and exact usage."""

    def __init__(self, model: str) -> None:
        self.counter = TokenCounter(model)  # the model's own tokenizer: o200k_base for gpt-4o-mini
        self.server = OpenAIServer()
        self.server.script(responder=self._respond)
        self._calls: list[Call] = []
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.server.url

    def close(self) -> None:
        self.server.close()

    @property
    def received(self) -> int:
        """HTTP requests received since the last :meth:`drain`."""
        return len(self.server.requests)

    def drain(self) -> tuple[int, list[Call]]:
        """Requests received and calls answered since the last drain; forgets the request bodies."""
        # Safe between awaited calls: no request is in flight, so no handler touches these lists.
        received = len(self.server.requests)
        self.server.requests.clear()
        self.server.paths.clear()
        self.server.headers.clear()
        with self._lock:
            calls, self._calls = self._calls, []
        return received, calls

    def _respond(self, body: dict[str, Any]) -> Reply:
        messages = body.get("messages") or []
        prompt = "\n".join(str(m.get("content") or "") for m in messages)
        found = _TARGET_RE.search(prompt)
        limit = int(body.get("max_tokens") or 256)
        target = min(int(found.group(1)), limit) if found else limit
        data = _DATA_RE.search(prompt)
        text = self.extract(data.group(2) if data else prompt, target)
        call = Call(
            kind="merge" if data is not None and data.group(1) == "summaries" else "topic",
            prompt_tokens=self.counter.messages_tokens(messages),
            completion_tokens=self.counter.count(text),
        )
        with self._lock:
            self._calls.append(call)
        return Reply(text=text, prompt_tokens=call.prompt_tokens, completion_tokens=call.completion_tokens)

    def extract(self, data: str, target: int) -> str:
        """A stand-in summary: sentences of ``data`` in order, labels removed, up to ``target`` tokens."""
        words = " ".join(_LABEL_RE.sub("", data).split())
        parts: list[str] = []
        left = max(1, target)
        for m in _SENTENCE_RE.finditer(words):
            sentence = m.group(0).strip()
            if not sentence:
                continue
            cost = self.counter.count(sentence) + 1
            if cost <= left:
                parts.append(sentence)
                left -= cost
            elif not parts:  # a first sentence longer than the target: cut it
                parts.append(self.counter.decode(self.counter.encode(sentence)[: max(1, left - 1)]))
                break
            if left < 8:
                break
        return " ".join(parts) or "Nothing to summarise."


# -- tallies -------------------------------------------------------------------------------


@dataclass
class Usage:
    requests: int = 0
    calls: int = 0
    topic_calls: int = 0
    merge_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    max_prompt_tokens: int = 0

    def add_calls(self, received: int, calls: Sequence[Call]) -> None:
        self.requests += received
        self.calls += len(calls)
        self.topic_calls += sum(c.kind == "topic" for c in calls)
        self.merge_calls += sum(c.kind == "merge" for c in calls)
        self.prompt_tokens += sum(c.prompt_tokens for c in calls)
        self.completion_tokens += sum(c.completion_tokens for c in calls)
        self.max_prompt_tokens = max([self.max_prompt_tokens, *(c.prompt_tokens for c in calls)])

    def add(self, other: Usage) -> None:
        for name in ("requests", "calls", "topic_calls", "merge_calls", "prompt_tokens", "completion_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_prompt_tokens = max(self.max_prompt_tokens, other.max_prompt_tokens)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Recorded:
    """What the library (or the summariser, for the baselines) recorded for its calls."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0

    def add(self, other: Recorded) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cost += other.cost


@dataclass
class Run:
    """One system over the replayed meetings."""

    name: str
    budget: int | None = None
    messages: int = 0
    usage: Usage = field(default_factory=Usage)
    recorded: Recorded = field(default_factory=Recorded)
    topics: int = 0
    topics_llm: int = 0
    topics_verbatim: int = 0
    topics_fallback: int = 0
    archives: int = 0
    archives_llm: int = 0
    archives_dropped: int = 0
    warnings: int = 0
    context_calls: int = 0
    context_over_budget: int = 0
    calls_during_get_context: int = 0
    capped_calls: int = 0
    seconds: float = 0.0

    def add(self, other: Run) -> None:
        for name, value in vars(other).items():
            if isinstance(value, int) and not isinstance(value, bool) and name != "budget":
                setattr(self, name, getattr(self, name) + value)
        self.seconds += other.seconds
        self.usage.add(other.usage)
        self.recorded.add(other.recorded)


def price(prompt_tokens: int, completion_tokens: int, model: str = MODEL) -> float:
    """USD for this usage at litellm's list price for ``model``."""
    import litellm  # slow import: only when pricing

    p, c = litellm.cost_per_token(
        model=model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
    )
    return float(p) + float(c)


# -- no network beyond this machine ----------------------------------------------------------


def refuse_remote_connections() -> None:
    """Make any attempt to reach a host other than 127.0.0.1/::1/localhost fail at once."""
    real_connect = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> None:
        inet = self.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple)
        if inet and str(address[0]) not in {"127.0.0.1", "::1", "localhost"}:
            raise ConnectionRefusedError(f"bench.llm_cost stays on this machine (tried {address[0]!r})")
        real_connect(self, address)

    socket.socket.connect = connect  # type: ignore[method-assign,assignment]


# -- replays ---------------------------------------------------------------------------------


def settings_for(budget: int, api_base: str) -> Settings:
    """Library defaults plus the litellm summariser on the local server.

    ``Settings`` also reads ``TIERED_HISTORY_*`` variables; :func:`main` clears them first.
    """
    return Settings.model_validate(
        {
            "context_budget": budget,
            "summarizer": {
                "kind": "litellm",
                "model": MODEL,
                "api_base": api_base,
                "api_key": "local-bench",
                "timeout": 120.0,
            },
        }
    )


async def replay_ours(meeting: Meeting, budget: int, llm: LocalLLM, maintain_every: int) -> Run:
    """Add every turn, ``maintain()`` every ``maintain_every`` messages, ``get_context`` every turn."""
    started = time.perf_counter()
    settings = settings_for(budget, llm.url)
    run = Run(OURS, budget, messages=len(meeting.turns))
    warn = WarningCounter()
    logging.getLogger("tiered_history").addHandler(warn)
    h = HistoryCompressor("memory://", settings=settings)
    try:
        await h.initialize()
        llm.drain()
        for n, turn in enumerate(meeting.turns, 1):
            await h.add_message(
                CONVERSATION,
                {"role": "user", "content": turn.content, "name": turn.name, "timestamp": turn.timestamp},
            )
            if n % maintain_every == 0:
                await h.maintain(CONVERSATION, now=turn.timestamp)
            before = llm.received
            ctx = await h.get_context(CONVERSATION, max_tokens=budget)
            run.calls_during_get_context += llm.received - before
            run.context_calls += 1
            run.context_over_budget += ctx.total_tokens > budget
        # The meeting is over: after silence_minutes the background job seals and summarises the
        # last topic too. Counted, as a deployment would pay for it.
        quiet = meeting.turns[-1].timestamp + timedelta(minutes=settings.silence_minutes + 1)
        await h.maintain(CONVERSATION, now=quiet)
        run.usage.add_calls(*llm.drain())
        stats = (await h.stats(CONVERSATION))[0]
        run.recorded = Recorded(
            stats.summarizer_prompt_tokens, stats.summarizer_completion_tokens, stats.summarizer_cost
        )
        history = await h.get_history(CONVERSATION)
    finally:
        await h.close()
        logging.getLogger("tiered_history").removeHandler(warn)
    run.topics = len(history.topics)
    run.topics_llm = sum(t.summarizer == "litellm" for t in history.topics)
    run.topics_verbatim = sum(t.summarizer == "verbatim" for t in history.topics)
    run.topics_fallback = sum(t.summarizer == "extractive" for t in history.topics)
    run.archives = len(history.archives)
    run.archives_llm = sum(a.summarizer == "litellm" for a in history.archives)
    run.archives_dropped = sum(a.dropped_at is not None for a in history.archives)
    run.warnings = warn.count
    run.seconds = time.perf_counter() - started
    return run


def _inputs(meeting: Meeting) -> list[SummaryInput]:
    return [SummaryInput(t.sequence, "user", t.content, t.timestamp, t.name) for t in meeting.turns]


async def replay_every_turn(
    meeting: Meeting, llm: LocalLLM, summarizer: LiteLLMSummarizer, target: int, window: int
) -> Run:
    """One call per message over the whole conversation so far (newest messages that fit)."""
    started = time.perf_counter()
    run = Run(EVERY_TURN, messages=len(meeting.turns))
    inputs = _inputs(meeting)
    counter = summarizer.counter
    sizes = [counter.count(f"[{m.sequence}] user ({m.name}): {m.content}\n") for m in inputs]
    cap = int(window * INPUT_SHARE) - PROMPT_ROOM
    llm.drain()
    first, held = 0, 0
    for n in range(1, len(inputs) + 1):
        held += sizes[n - 1]
        while held > cap and first < n - 1:
            held -= sizes[first]
            first += 1
        run.capped_calls += first > 0
        result = await summarizer.summarize(inputs[first:n], target)
        run.recorded.add(Recorded(result.prompt_tokens, result.completion_tokens, result.cost))
        if n % 200 == 0:  # keep the server's request log small (bodies grow to ~150 kB)
            run.usage.add_calls(*llm.drain())
    run.usage.add_calls(*llm.drain())
    run.seconds = time.perf_counter() - started
    return run


async def replay_rolling(meeting: Meeting, llm: LocalLLM, summarizer: LiteLLMSummarizer, target: int) -> Run:
    """One call per message: the previous summary (as a data line) plus the new message."""
    started = time.perf_counter()
    run = Run(ROLLING, messages=len(meeting.turns))
    llm.drain()
    summary: str | None = None
    for m in _inputs(meeting):
        data = [m]
        if summary is not None:
            data.insert(0, SummaryInput(m.sequence - 1, "system", summary, m.timestamp, "summary_so_far"))
        result = await summarizer.summarize(data, target)
        summary = result.text
        run.recorded.add(Recorded(result.prompt_tokens, result.completion_tokens, result.cost))
    run.usage.add_calls(*llm.drain())
    run.seconds = time.perf_counter() - started
    return run


@dataclass
class Totals:
    meetings: list[tuple[str, str, int]] = field(default_factory=list)  # id, domain, messages
    ours: dict[int, Run] = field(default_factory=dict)
    every_turn: Run = field(default_factory=lambda: Run(EVERY_TURN))
    rolling: Run = field(default_factory=lambda: Run(ROLLING))
    window: int = 0
    target: int = 0

    @property
    def messages(self) -> int:
        return sum(n for _, _, n in self.meetings)


async def run_all(
    meetings: Iterable[Meeting],
    budgets: Sequence[int],
    maintain_every: int,
    baselines: bool,
) -> Totals:
    """Replay ``meetings`` (loaded lazily, one at a time) through every system on one local server."""
    import litellm  # the summariser imports it too; needed here for the model's window

    totals = Totals()
    info = litellm.get_model_info(MODEL)
    totals.window = int(info.get("max_input_tokens") or info.get("max_tokens") or 0)
    defaults = Settings.model_validate({})
    totals.target = defaults.topic_summary_tokens
    totals.ours = {b: Run(OURS, b) for b in budgets}
    llm = LocalLLM(MODEL)
    try:
        # The baselines' summariser counts like the library's (its Settings.model, cl100k_base).
        summarizer = LiteLLMSummarizer(
            MODEL,
            api_base=llm.url,
            api_key="local-bench",
            timeout=120.0,
            counter=TokenCounter(defaults.model),
        )
        for meeting in meetings:
            totals.meetings.append((meeting.id, meeting.domain, len(meeting.turns)))
            line = [f"{meeting.id}: {len(meeting.turns)} messages"]
            for b in budgets:
                r = await replay_ours(meeting, b, llm, maintain_every)
                totals.ours[b].add(r)
                line.append(f"ours@{b} {r.usage.calls} calls {r.usage.total_tokens:,} tok ({r.seconds:.0f}s)")
            if baselines:
                r = await replay_every_turn(meeting, llm, summarizer, totals.target, totals.window)
                totals.every_turn.add(r)
                line.append(
                    f"every-turn {r.usage.calls} calls {r.usage.total_tokens:,} tok ({r.seconds:.0f}s)"
                )
                r = await replay_rolling(meeting, llm, summarizer, totals.target)
                totals.rolling.add(r)
                line.append(f"rolling {r.usage.calls} calls {r.usage.total_tokens:,} tok ({r.seconds:.0f}s)")
            log("  " + "; ".join(line))
    finally:
        llm.close()
    return totals


# -- report ----------------------------------------------------------------------------------


def _per_k(value: float, messages: int) -> float:
    return 1000.0 * value / messages if messages else float("nan")


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _usd(value: float) -> str:
    return f"{value:.4f}" if value < 1 else f"{value:,.2f}"


def mismatches(totals: Totals) -> list[str]:
    """Every disagreement between server-reported and recorded usage, and every other anomaly."""
    out: list[str] = []
    runs = [*totals.ours.values()]
    if totals.every_turn.messages:
        runs += [totals.every_turn, totals.rolling]
    for r in runs:
        label = f"{r.name}" + (f" (budget {r.budget:,})" if r.budget else "")
        u, rec = r.usage, r.recorded
        if u.requests != u.calls:
            out.append(f"{label}: server received {u.requests} requests but answered {u.calls}")
        if (rec.prompt_tokens, rec.completion_tokens) != (u.prompt_tokens, u.completion_tokens):
            out.append(
                f"{label}: recorded {rec.prompt_tokens:,} prompt + {rec.completion_tokens:,} completion "
                f"tokens, server reported {u.prompt_tokens:,} + {u.completion_tokens:,}"
            )
        expected = price(u.prompt_tokens, u.completion_tokens)
        if abs(rec.cost - expected) > max(1e-9, 1e-6 * expected):
            out.append(
                f"{label}: recorded cost ${rec.cost:.6f}, list price of the reported usage ${expected:.6f}"
            )
        if r.calls_during_get_context:
            out.append(f"{label}: {r.calls_during_get_context} summariser calls during get_context")
        if r.context_over_budget:
            out.append(f"{label}: {r.context_over_budget} contexts over budget")
        if r.topics_fallback or r.warnings:
            out.append(f"{label}: {r.topics_fallback} extractive fallbacks, {r.warnings} warnings logged")
        if r.archives and r.archives_llm != r.archives:
            out.append(f"{label}: {r.archives - r.archives_llm} archives not written by the LLM")
    return out


def command(args: argparse.Namespace) -> str:
    parts = ["python -m bench.llm_cost", f"--split {args.split}", f"--limit {args.limit}"]
    parts += [f"--budgets {args.budgets}", f"--maintain-every {args.maintain_every}"]
    if args.no_baselines:
        parts.append("--no-baselines")
    return " ".join(parts)


def render(args: argparse.Namespace, totals: Totals, seconds: float, start_machine: str) -> str:
    n = totals.messages
    budgets = sorted(totals.ours, reverse=True)
    ref = totals.ours[budgets[0]]
    ref_cost = price(ref.usage.prompt_tokens, ref.usage.completion_tokens)
    rows: list[list[object]] = []
    runs = [totals.ours[b] for b in budgets]
    if totals.every_turn.messages:
        runs += [totals.every_turn, totals.rolling]
    for r in runs:
        u = r.usage
        cost = price(u.prompt_tokens, u.completion_tokens)
        name = f"{OURS}, budget {r.budget:,}" if r.budget else r.name
        kinds = f"{_fmt(_per_k(u.topic_calls, n))} / {_fmt(_per_k(u.merge_calls, n))}"
        rows.append(
            [
                name,
                _fmt(_per_k(u.calls, n)),
                kinds if r.budget else "-",
                _fmt(_per_k(u.prompt_tokens, n)),
                _fmt(_per_k(u.completion_tokens, n)),
                _fmt(_per_k(u.total_tokens, n)),
                _usd(_per_k(cost, n)),
                f"{u.total_tokens / ref.usage.total_tokens:,.1f}x" if ref.usage.total_tokens else "-",
                f"{cost / ref_cost:,.1f}x" if ref_cost else "-",
            ]
        )
    by_domain: dict[str, int] = {}
    for _, domain, _m in totals.meetings:
        by_domain[domain] = by_domain.get(domain, 0) + 1
    sizes = sorted(m for _, _, m in totals.meetings)
    shape_rows: list[list[object]] = []
    for b in budgets:
        r = totals.ours[b]
        shape_rows.append(
            [
                f"{b:,}",
                r.topics,
                f"{r.topics_llm} / {r.topics_verbatim} / {r.topics_fallback}",
                f"{r.archives} ({r.archives_dropped} dropped)",
                f"{r.usage.prompt_tokens / r.usage.calls:,.0f}" if r.usage.calls else "-",
                f"{r.usage.max_prompt_tokens:,}",
                f"{r.seconds:.0f}",
            ]
        )
    problems = mismatches(totals)
    lines = [
        "### Run",
        "",
        f"- Machine: {start_machine}; library: git {git_revision()}.",
        f"- Command: `{command(args)}` (whole run {seconds / 60:.1f} min).",
        f"- Data: QMSum {args.split} split, {len(totals.meetings)} meetings ("
        + ", ".join(f"{k} {v}" for k, v in sorted(by_domain.items()))
        + f"; {sizes[0]:,}-{sizes[-1]:,} messages each), {n:,} messages in all: "
        + ", ".join(f"{mid} ({m:,})" for mid, _, m in totals.meetings)
        + ".",
        f"- Summariser: `{MODEL}` through litellm to the local test server; price from litellm's "
        f"bundled table (${price(1_000_000, 0):.2f} per million prompt tokens, "
        f"${price(0, 1_000_000):.2f} per million completion tokens). Summary target "
        f"{totals.target} tokens (`topic_summary_tokens`) for the baselines; window "
        f"{totals.window:,} tokens.",
        f"- Cadence: `maintain()` after every {args.maintain_every} messages "
        f"({args.maintain_every * TURN_SECONDS} s of replay time), once more after the meeting "
        "(past `silence_minutes`, sealing the last topic); `get_context(max_tokens=<budget>)` after "
        "every message. Baselines: one call after every message.",
        "",
        f"### Per 1,000 messages (all {len(totals.meetings)} meetings pooled)",
        "",
        table(
            [
                "system",
                "calls",
                "topic / merge calls",
                "prompt tokens",
                "completion tokens",
                "total tokens",
                "USD",
                f"tokens vs ours at {budgets[0]:,}",
                f"USD vs ours at {budgets[0]:,}",
            ],
            rows,
        ),
        "",
        "tiered_history's work behind those calls:",
        "",
        table(
            [
                "budget",
                "topics sealed",
                "by LLM / kept verbatim / extractive fallback",
                "archives",
                "mean prompt tokens per call",
                "largest prompt",
                "replay seconds",
            ],
            shape_rows,
        ),
        "",
    ]
    if totals.every_turn.messages:
        e = totals.every_turn
        lines += [
            f"Baselines: summarise-everything's largest prompt was {e.usage.max_prompt_tokens:,} tokens; "
            f"{e.capped_calls} of its {e.usage.calls:,} calls were capped to the window "
            f"({INPUT_SHARE:.0%} of {totals.window:,} tokens, the summariser's own input share). "
            f"Replay seconds: summarise-everything {e.seconds:.0f}, rolling {totals.rolling.seconds:.0f}.",
            "",
        ]
    lines.append(
        "Cross-check (HTTP requests received = calls answered; tokens recorded by the library in `stats()` "
        "and by the baselines' `SummaryResult`s = tokens the server reported; recorded cost = list price "
        "of the reported tokens; no summariser call inside `get_context`; no context over budget; "
        "no fallback): " + ("all agree." if not problems else "**mismatches:** " + "; ".join(problems) + ".")
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="LLM summariser calls and tokens per 1,000 QMSum messages.")
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--split", default="test", choices=["train", "val", "test"])
    p.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        help=f"meetings, spread evenly over the split (default {DEFAULT_LIMIT}; 0 = all)",
    )
    p.add_argument("--budgets", default="8000,4000", help="context budgets for tiered_history")
    p.add_argument("--maintain-every", type=int, default=DEFAULT_MAINTAIN_EVERY)
    p.add_argument("--no-baselines", action="store_true", help="skip the every-turn baselines")
    p.add_argument("--out", type=Path, help="update the llm_cost section of this markdown file")
    args = p.parse_args(argv)
    if args.maintain_every < 1:
        p.error("--maintain-every must be >= 1")
    refuse_remote_connections()
    ignored = sorted(k for k in os.environ if k.startswith("TIERED_HISTORY_"))
    for key in ignored:  # the figures are for the library's defaults (Settings reads these)
        del os.environ[key]
    if ignored:
        log(f"ignoring {', '.join(ignored)}: the benchmark runs the default settings")
    started = time.perf_counter()
    start_machine = machine()
    budgets = [int(b) for b in args.budgets.split(",") if b.strip()]
    paths = meeting_paths(args.data, args.split, args.limit or None)
    log(f"llm_cost: {len(paths)} meetings, budgets {budgets}, maintain() every {args.maintain_every}")
    meetings = (load_meeting(path) for path in paths)
    totals = asyncio.run(run_all(meetings, budgets, args.maintain_every, not args.no_baselines))
    md = render(args, totals, time.perf_counter() - started, start_machine)
    print(md)
    problems = mismatches(totals)
    for problem in problems:
        log(f"MISMATCH: {problem}")
    if args.out:
        update_section(args.out, SECTION, md)
        log(f"wrote the {SECTION} section of {args.out}")
    log(f"llm_cost done in {time.perf_counter() - started:.0f}s")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
