"""Markdown tables and the retention plot."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench._common import table

from .data import DOMAINS
from .peers import Cost
from .replay import FULL, OURS, SUMMARIZATION, SYSTEMS, TIERS, MeetingResult, TierTally
from .speed import SpeedResults


@dataclass(frozen=True, slots=True)
class Summary:
    """Retention per (system, budget, domain) over queries; domain ``all`` pools every query."""

    means: dict[tuple[str, int, str], float]
    counts: dict[tuple[int, str], int]


def summarise(results: Sequence[MeetingResult], budgets: Sequence[int]) -> Summary:
    means: dict[tuple[str, int, str], float] = {}
    counts: dict[tuple[int, str], int] = {}
    for budget in budgets:
        for domain in (*DOMAINS, "all"):
            chosen = [r for r in results if domain in {"all", r.domain}]
            for system in SYSTEMS:
                scores = [s for r in chosen for s in r.budgets[budget].scores[system]]
                means[(system, budget, domain)] = statistics.fmean(scores) if scores else float("nan")
            full = [s for r in chosen if r.budgets[budget].full_fits for s in r.budgets[budget].scores[OURS]]
            counts[(budget, domain)] = sum(1 for r in chosen if r.budgets[budget].full_fits)
            means[(FULL, budget, domain)] = 1.0 if full else float("nan")
    return Summary(means, counts)


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.1f}"


def retention_tables(s: Summary, results: Sequence[MeetingResult], budgets: Sequence[int]) -> list[str]:
    lines: list[str] = []
    headers = ["system", *[f"{b:,}" for b in budgets]]
    for domain in ("all", *DOMAINS):
        chosen = [r for r in results if domain in {"all", r.domain}]
        if not chosen:
            continue
        nq = sum(r.queries for r in chosen)
        title = "All meetings" if domain == "all" else domain
        lines += [f"**{title}** ({len(chosen)} meetings, {nq} queries): mean retention (%) per budget", ""]
        rows: list[list[object]] = []
        for system in SYSTEMS:
            rows.append([system, *[_pct(s.means[(system, b, domain)]) for b in budgets]])
        rows.append(
            [
                f"{FULL} (ceiling)",
                *[
                    f"fits {s.counts[(b, domain)]}/{len(chosen)} meetings"
                    if s.counts[(b, domain)]
                    else "n/a (fits no meeting)"
                    for b in budgets
                ],
            ]
        )
        lines += [table(headers, rows), ""]
    return lines


def fits_table(results: Sequence[MeetingResult], budgets: Sequence[int]) -> list[str]:
    """On the meetings whose whole transcript fits, what each system keeps (the ceiling is 100%)."""
    rows: list[list[object]] = []
    for b in budgets:
        fit = [r for r in results if r.budgets[b].full_fits]
        if not fit:
            rows.append([f"{b:,}", 0, *["n/a"] * len(SYSTEMS)])
            continue
        cells = []
        for system in SYSTEMS:
            scores = [x for r in fit for x in r.budgets[b].scores[system]]
            cells.append(_pct(statistics.fmean(scores)))
        rows.append([f"{b:,}", len(fit), *cells])
    return [table(["budget", "meetings that fit whole", *SYSTEMS], rows)]


def utilisation_table(results: Sequence[MeetingResult], budgets: Sequence[int]) -> list[str]:
    rows: list[list[object]] = []
    for system in SYSTEMS:
        cells = []
        for b in budgets:
            used = [r.budgets[b].used[system] / min(b, r.tokens) for r in results]
            over = sum(1 for r in results if r.budgets[b].used[system] > b)
            cell = f"{100 * statistics.fmean(used):.0f}%"
            cells.append(cell + (f" ({over} over budget!)" if over else ""))
        rows.append([system, *cells])
    return [table(["system", *[f"{b:,}" for b in budgets]], rows)]


def tier_table(results: Sequence[MeetingResult], budgets: Sequence[int]) -> list[str]:
    rows: list[list[object]] = []
    for b in budgets:
        tally = TierTally()
        for r in results:
            tally.add(r.budgets[b].tiers)
        total = sum(tally.words.values()) or 1
        cells = []
        for t in TIERS:
            w, k = tally.words[t], tally.kept[t]
            cells.append(f"{100 * w / total:.0f}% (kept {_pct(k / w) if w else 'n/a'})")
        sk = sum(r.budgets[b].summary_keep[0] for r in results)
        st = sum(r.budgets[b].summary_keep[1] for r in results)
        rows.append([f"{b:,}", *cells, _pct(sk / st) if st else "n/a"])
    return [
        table(
            [
                "budget",
                *[f"evidence: {t}" for t in TIERS],
                "words of summarised evidence found in the summary text itself",
            ],
            rows,
        )
    ]


def cost_table(results: Sequence[MeetingResult], budgets: Sequence[int]) -> list[str]:
    messages = sum(r.messages for r in results)
    rows: list[list[object]] = []
    for system in (OURS, SUMMARIZATION):
        for b in budgets:
            c = Cost()
            for r in results:
                c.add(r.budgets[b].cost[system])
            k = 1000 / messages
            rows.append(
                [
                    system,
                    f"{b:,}",
                    f"{c.calls * k:.1f}" + (f" ({c.merge_calls * k:.1f} merges)" if c.merge_calls else ""),
                    f"{c.input_tokens * k:,.0f}",
                    f"{c.output_tokens * k:,.0f}",
                    f"{c.input_tokens / c.calls:,.0f}" if c.calls else "n/a",
                    f"{1000 * c.seconds / c.calls:.1f}" if c.calls else "n/a",
                ]
            )
    return [
        table(
            [
                "system",
                "budget",
                "summariser calls / 1k msgs",
                "input tokens / 1k msgs",
                "output tokens / 1k msgs",
                "input tokens / call",
                "extractive ms / call",
            ],
            rows,
        )
    ]


def replay_time_table(results: Sequence[MeetingResult], budgets: Sequence[int]) -> list[str]:
    messages = sum(r.messages for r in results) * len(budgets)
    rows = []
    for system in SYSTEMS:
        secs = sum(r.budgets[b].seconds[system] for r in results for b in budgets)
        rows.append([system, f"{secs:.1f}", f"{1000 * secs / messages:.2f}"])
    return [table(["system", "total seconds (all meetings, all budgets)", "ms per message replayed"], rows)]


def speed_tables(sp: SpeedResults) -> list[str]:
    sizes = sorted({t.size for t in sp.timings})
    systems = list(dict.fromkeys(t.system for t in sp.timings))
    rows: list[list[object]] = []
    for system in systems:
        cells = []
        for size in sizes:
            t = next((x for x in sp.timings if x.system == system and x.size == size), None)
            if t is None or not t.samples:
                cells.append("n/a")
                continue
            cells.append(f"{t.p50:,.2f} / {t.cpu_p50:,.2f} (n={len(t.samples)})")
        rows.append([system, *cells])
    lines = [table(["system: p50 ms per call, wall / CPU", *[f"{s:,} messages" for s in sizes]], rows), ""]
    lines += ["tiered_history setup per size (SQLite file; not part of the per-call figure):", ""]
    lines.append(
        table(
            ["messages", "bulk fill (s)", "maintain() (s)", "context at 8,000"],
            [
                [f"{x.size:,}", f"{x.fill_seconds:.1f}", f"{x.maintain_seconds:.1f}", x.shape]
                for x in sp.setups
            ],
        )
    )
    lines += [
        "",
        "`add_message` throughput (SQLite file, sequential awaited calls, "
        f"{sp.throughput_messages:,} messages): "
        f"{sp.throughput_single:,.0f} msg/s into one conversation, {sp.throughput_multi:,.0f} msg/s "
        "round-robin over 100 conversations. The peers have no store: adding a message is a list append.",
    ]
    return lines


def plot(s: Summary, budgets: Sequence[int], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    styles = ["o-", "s--", "^:", "v-.", "D-"]
    for system, style in zip(SYSTEMS, styles, strict=True):
        ys = [100 * s.means[(system, b, "all")] for b in budgets]
        ax.plot(list(budgets), ys, style, label=system, linewidth=2 if system == OURS else 1.4)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(budgets))
    ax.set_xticklabels([f"{b:,}" for b in budgets])
    ax.set_xlabel("context budget (tokens, cl100k_base, OpenAI framing)")
    ax.set_ylabel("evidence content words retained (%)")
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
