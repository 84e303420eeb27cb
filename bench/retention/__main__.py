"""``python -m bench.retention``: retention, speed and cost against peers; writes markdown and a plot."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from bench._common import REPO, git_revision, log, machine, update_section

from . import report
from .data import DOMAINS, STOPWORDS, TURN_SECONDS, meeting_paths
from .peers import SUMMARY_OVERHEAD
from .replay import MAINTAIN_EVERY, OURS, SYSTEMS, MeetingResult, run_meeting
from .speed import BUDGET, SpeedResults, run_sync

SECTION = "peers"
#: Meetings replayed by default: keeps the whole run near 10 minutes on 2 busy cores.
DEFAULT_LIMIT = 20


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def versions() -> str:
    dists = (
        "tiered-history",
        "langchain-core",
        "summarization-pydantic-ai",
        "pydantic-ai-slim",
        "tiktoken",
        "matplotlib",
    )
    return ", ".join(f"{d} {_version(d)}" for d in dists)


def command(args: argparse.Namespace) -> str:
    parts = ["python -m bench.retention", f"--split {args.split}"]
    parts.append(f"--limit {args.limit}")
    parts += [f"--budgets {args.budgets}", f"--speed-sizes {args.speed_sizes}"]
    if args.no_speed:
        parts.append("--no-speed")
    return " ".join(parts)


def _findings(s: report.Summary, results: Sequence[MeetingResult], budgets: Sequence[int]) -> list[str]:
    lines: list[str] = []
    for b in budgets:
        ours = s.means[(OURS, b, "all")]
        peers = {p: s.means[(p, b, "all")] for p in SYSTEMS if p != OURS}
        best = max(peers, key=lambda p: peers[p])
        gap = 100 * (ours - peers[best])
        used = statistics.fmean(r.budgets[b].used[OURS] / min(b, r.tokens) for r in results)
        verdict = "ahead of" if gap > 0 else "behind"
        lines.append(
            f"- {b:,} tokens: tiered_history {100 * ours:.1f}% vs best peer ({best}) "
            f"{100 * peers[best]:.1f}%: {abs(gap):.1f} points {verdict}; "
            f"recency truncation {100 * peers['recency truncation']:.1f}%. "
            f"tiered_history filled {100 * used:.0f}% of what it could use (min(budget, whole meeting))."
        )
    return lines


def render(
    args: argparse.Namespace,
    results: Sequence[MeetingResult],
    speed: SpeedResults | None,
    seconds: float,
    start_machine: str,
) -> str:
    budgets = [int(b) for b in args.budgets.split(",")]
    s = report.summarise(results, budgets)
    by_domain = {d: sum(1 for r in results if r.domain == d) for d in DOMAINS}
    msgs = sum(r.messages for r in results)
    toks = [r.tokens for r in results]
    lines = [
        "## Retention, speed and cost against peers",
        "",
        "### Run",
        "",
        f"- Machine: {start_machine} (other jobs shared the machine: wall-clock timings are inflated; "
        "CPU times are given beside them).",
        f"- Library: git {git_revision()}; {versions()}.",
        f"- Command: `{command(args)}` (whole run {seconds / 60:.1f} min).",
        f"- Data: QMSum {args.split} split, {len(results)} meetings ("
        + ", ".join(f"{n} {d}" for d, n in by_domain.items())
        + f"), {msgs:,} messages, {sum(r.queries for r in results)} specific queries; meetings of "
        f"{min(toks):,}-{max(toks):,} tokens (median {statistics.median(toks):,.0f}) with OpenAI framing. "
        f"{sum(r.skipped_turns for r in results)} empty turns skipped; "
        f"{sum(r.dropped_queries for r in results)} queries without evidence content words dropped.",
        "",
        "### Method",
        "",
        "- Replay: each meeting is one conversation, one `user` message per turn, `name` = the speaker "
        "sanitised to `[A-Za-z0-9_-]{1,64}` (pydantic-ai user parts have no name, so there the same "
        f"sanitised name prefixes the text: `Name: text`), timestamps {TURN_SECONDS} s apart from "
        "2024-01-15 09:00 UTC.",
        f"- tiered_history: `HistoryCompressor.from_url('memory://', context_budget=<budget>, "
        f"summarizer=<counting wrapper around ExtractiveSummarizer>)`, all other settings default "
        f"(tiers 50/30/20, topic summaries 200 tokens, archives 300, size rule at 60% of the current-topic "
        f"share, explicit phrases on); `maintain(now=<replay time>)` every {MAINTAIN_EVERY} messages and at "
        "the end; then `get_context(conv, max_tokens=<budget>).to_messages()`. One replay per budget.",
        "- recency truncation: the newest messages whose framed cost fits. langchain-core: "
        "`trim_messages(strategy='last', token_counter=<tiktoken list counter with framing>, "
        "max_tokens=<budget>)`. pydantic-ai SlidingWindow: `SlidingWindowProcessor(trigger=('tokens', "
        "budget), keep=('tokens', budget), token_counter=<same counter>)` on the full list.",
        "- pydantic-ai Summarization: `SummarizationProcessor(model=FunctionModel(<answers the summary "
        "prompt with tiered_history's ExtractiveSummarizer>), trigger=('tokens', budget), keep=('tokens', "
        f"budget // 2), token_counter=<same counter>)`, summaries of at most budget - budget // 2 - "
        f"{SUMMARY_OVERHEAD} tokens, run after every message on the history it returned last time (as an "
        "agent that stores the processed history does); its other settings are its defaults, so the text "
        "it summarises is cut to its last 16,000 characters (`trim_tokens_to_summarize=4000`).",
        "- Full history: the whole meeting, where it fits the budget (then retention is 100%).",
        f"- Retention: for each query, the share of the distinct content words of its evidence span "
        f"(lower-cased `\\w+`, not digits, not one of {len(STOPWORDS)} fixed stopwords: NLTK's English "
        "list plus QMSum markup such as `disfmarker` and fillers such as `um`, `yeah`) found anywhere in "
        "the context's text (contents and names); averaged over queries.",
        "",
        "### Retention",
        "",
        *([f"![retention vs budget]({Path(args.plot).name})", ""] if args.plot else []),
    ]
    lines += report.retention_tables(s, results, budgets)
    lines += ["Summary:", "", *_findings(s, results, budgets), ""]
    lines += [
        "On the meetings whose whole transcript fits the budget (so the ceiling is 100%):",
        "",
        *report.fits_table(results, budgets),
        "",
        "Share of the usable window each system filled (tokens used / min(budget, whole meeting), mean "
        "over meetings):",
        "",
        *report.utilisation_table(results, budgets),
        "",
        "Where tiered_history's evidence sat at the end of the replay (share of evidence words by the tier "
        "of their turn; 'kept': share found in the context), and how many words of evidence represented by "
        "a summary or archive in the context appear in that summary text:",
        "",
        *report.tier_table(results, budgets),
        "",
        "### Summariser cost",
        "",
        "Per 1,000 replayed messages (QMSum replays above). Input = the transcript or summaries handed to "
        "the summariser; output = the summary; both in cl100k tokens, without the prompt template an LLM "
        "would also read on each call. The other peers never summarise.",
        "",
        *report.cost_table(results, budgets),
        "",
        "Replay time (everything each system did during the replays, extractive summaries included):",
        "",
        *report.replay_time_table(results, budgets),
        "",
    ]
    if speed is not None:
        lines += [
            "### Speed",
            "",
            f"Per-call latency of building a context of at most {BUDGET:,} tokens (synthetic conversation of "
            "`bench.latency.generate`; tiered_history: `get_context` on a SQLite file after `maintain()`; "
            "peers: one call over the full message list with a tiktoken counter that counts every message "
            "each call; pydantic-ai Summarization's figure includes its extractive summary). Few calls "
            f"where one call is slow: at most ~{args.speed_seconds:.0f} s of calls per cell.",
            "",
            *report.speed_tables(speed),
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Retention, speed and cost of tiered_history against peers.")
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--split", default="test", choices=["train", "val", "test"])
    p.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        help=f"meetings, spread evenly over the split (default {DEFAULT_LIMIT}; 0 = all)",
    )
    p.add_argument("--budgets", default="1000,2000,4000,8000")
    p.add_argument("--out", type=Path, help="update the peers section of this markdown file")
    p.add_argument("--plot", type=Path, help="retention plot (default: retention.png beside --out)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--speed-sizes", default="1000,10000,100000")
    p.add_argument("--speed-calls", type=int, default=30)
    p.add_argument("--speed-seconds", type=float, default=12.0, help="time box per (system, size) cell")
    p.add_argument("--throughput", type=int, default=1000, help="messages for the add_message throughput")
    p.add_argument("--no-speed", action="store_true")
    args = p.parse_args(argv)
    started = time.perf_counter()
    start_machine = machine()
    budgets = tuple(int(b) for b in args.budgets.split(","))
    paths = meeting_paths(args.data, args.split, args.limit or None)
    log(f"retention: {len(paths)} meetings x budgets {budgets} on {args.jobs} processes")
    results: list[MeetingResult] = []
    jobs = [(path, budgets) for path in paths]
    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            for r in pool.map(run_meeting, jobs):
                results.append(r)
                log(f"  {r.id}: {r.messages} messages, {r.queries} queries")
    else:
        for job in jobs:
            results.append(run_meeting(job))
            log(f"  {results[-1].id}: {results[-1].messages} messages")
    log(f"retention done in {time.perf_counter() - started:.0f}s")
    speed = None
    if not args.no_speed:
        sizes = [int(x) for x in args.speed_sizes.split(",") if x.strip()]
        speed = run_sync(sizes, args.speed_calls, args.speed_seconds, args.throughput)
    s = report.summarise(results, list(budgets))
    queries = sum(r.queries for r in results)
    plot = args.plot = args.plot or (args.out.parent / "retention.png" if args.out else None)
    if plot is not None:
        report.plot(s, budgets, plot, f"QMSum {args.split}: {len(results)} meetings, {queries} queries")
    md = render(args, results, speed, time.perf_counter() - started, start_machine)
    if args.out is None:  # like the other benchmarks: print unless told where to write
        print(md)
        return
    if args.out.exists():
        update_section(args.out, SECTION, md)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        block = f"<!-- {SECTION}:begin -->\n{md.rstrip()}\n<!-- {SECTION}:end -->\n"
        args.out.write_text(f"# Benchmarks against peers\n\n{block}", encoding="utf-8")
    log(f"wrote {args.out}{f' and {plot}' if plot else ''} in {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
