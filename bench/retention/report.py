"""Markdown tables and the retention plot."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench._common import table

from .data import DOMAINS
from .peers import Cost
from .prefix import PrefixResult
from .replay import QUERY, STATIC, TIERS, MeetingResult, TierTally
from .speed import SpeedResults
from .systems import FULL, OURS, SUMMARIZATION

NA = "n/a"


@dataclass(frozen=True, slots=True)
class Summary:
    """Mean retention per (system, budget, domain) over queries; domain ``all`` pools every query."""

    kind: str
    """``static`` or ``query``."""
    systems: tuple[str, ...]
    means: dict[tuple[str, int, str], float]
    fits: dict[tuple[int, str], int]
    """Meetings whose whole transcript fits the budget."""

    def mean(self, system: str, budget: int, domain: str = "all") -> float:
        return self.means.get((system, budget, domain), float("nan"))


def _scores(r: MeetingResult, budget: int, kind: str) -> dict[str, list[float]]:
    b = r.budgets[budget]
    return b.static if kind == STATIC else b.query


def summarise(
    results: Sequence[MeetingResult], budgets: Sequence[int], kind: str, systems: Sequence[str]
) -> Summary:
    means: dict[tuple[str, int, str], float] = {}
    fits: dict[tuple[int, str], int] = {}
    for budget in budgets:
        for domain in (*DOMAINS, "all"):
            chosen = [r for r in results if domain in {"all", r.domain}]
            for system in systems:
                scores = [s for r in chosen for s in _scores(r, budget, kind).get(system, [])]
                means[(system, budget, domain)] = statistics.fmean(scores) if scores else float("nan")
            fits[(budget, domain)] = sum(1 for r in chosen if r.budgets[budget].full_fits)
    return Summary(kind, tuple(systems), means, fits)


def pct(x: float) -> str:
    return NA if x != x else f"{100 * x:.1f}"


def retention_tables(s: Summary, results: Sequence[MeetingResult], budgets: Sequence[int]) -> list[str]:
    lines: list[str] = []
    headers = ["system", *[f"{b:,}" for b in budgets]]
    for domain in ("all", *DOMAINS):
        chosen = [r for r in results if domain in {"all", r.domain}]
        if not chosen:
            continue
        nq = sum(r.queries for r in chosen)
        title = "All meetings" if domain == "all" else domain
        n = f"{len(chosen)} meeting{'s' if len(chosen) > 1 else ''}"
        lines += [f"**{title}** ({n}, {nq} queries): mean retention (%) per budget", ""]
        rows: list[list[object]] = [
            [system, *[pct(s.mean(system, b, domain)) for b in budgets]] for system in s.systems
        ]
        rows.append(
            [
                f"{FULL} (ceiling)",
                *[
                    f"fits {s.fits[(b, domain)]}/{len(chosen)} meetings"
                    if s.fits[(b, domain)]
                    else "fits none"
                    for b in budgets
                ],
            ]
        )
        lines += [table(headers, rows), ""]
    return lines


def ratio(a: float, b: float) -> str:
    return NA if a != a or b != b or b == 0 else f"{a / b:.2f}x"


def points(a: float, b: float) -> str:
    return NA if a != a or b != b else f"{100 * (a - b):+.1f}"


def fits_table(s: Summary, results: Sequence[MeetingResult], budgets: Sequence[int]) -> list[str]:
    """On the meetings whose whole transcript fits, what each system keeps (the ceiling is 100%)."""
    rows: list[list[object]] = []
    for b in budgets:
        fit = [r for r in results if r.budgets[b].full_fits]
        cells = []
        for system in s.systems:
            scores = [x for r in fit for x in _scores(r, b, s.kind).get(system, [])]
            cells.append(pct(statistics.fmean(scores)) if scores else NA)
        rows.append([f"{b:,}", len(fit), *cells])
    return [table(["budget", "meetings that fit whole", *s.systems], rows)]


def utilisation_table(
    results: Sequence[MeetingResult], budgets: Sequence[int], kind: str, systems: Sequence[str]
) -> list[str]:
    """Tokens used / min(budget, whole meeting), mean over contexts; contexts over budget flagged."""
    rows: list[list[object]] = []
    for system in systems:
        cells = []
        for b in budgets:
            used: list[tuple[int, int]] = []
            for r in results:
                br = r.budgets[b]
                if kind == STATIC and system in br.static_used:
                    used.append((br.static_used[system], min(b, r.tokens)))
                elif kind == QUERY and system in br.query_used:
                    used += [(u, b) for u in br.query_used[system]]
            if not used:
                cells.append(NA)
                continue
            over = sum(1 for u, _ in used if u > b)
            cell = f"{100 * statistics.fmean(u / cap for u, cap in used):.0f}%"
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
            cells.append(f"{100 * w / total:.0f}% (kept {pct(k / w) if w else NA})")
        sk = sum(r.budgets[b].summary_keep[0] for r in results)
        st = sum(r.budgets[b].summary_keep[1] for r in results)
        rows.append([f"{b:,}", *cells, pct(sk / st) if st else NA])
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
                c.add(r.budgets[b].cost.get(system, Cost()))
            k = 1000 / messages
            rows.append(
                [
                    system,
                    f"{b:,}",
                    f"{c.calls * k:.1f}" + (f" ({c.merge_calls * k:.1f} merges)" if c.merge_calls else ""),
                    f"{c.input_tokens * k:,.0f}",
                    f"{c.output_tokens * k:,.0f}",
                    f"{c.input_tokens / c.calls:,.0f}" if c.calls else NA,
                    f"{1000 * c.seconds / c.calls:.1f}" if c.calls else NA,
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


def replay_time_table(
    results: Sequence[MeetingResult], budgets: Sequence[int], systems: Sequence[str]
) -> list[str]:
    messages = sum(r.messages for r in results) * len(budgets)
    queries = sum(r.queries for r in results) * len(budgets)
    rows = []
    for system in systems:
        secs = [
            r.budgets[b].seconds[system] for r in results for b in budgets if system in r.budgets[b].seconds
        ]
        asks = [
            r.budgets[b].query_seconds[system]
            for r in results
            for b in budgets
            if system in r.budgets[b].query_seconds
        ]
        if not secs:
            rows.append([system, NA, NA, NA])
            continue
        rows.append(
            [
                system,
                f"{sum(secs):.1f}",
                f"{1000 * sum(secs) / messages:.2f}",
                f"{1000 * sum(asks) / queries:.1f}" if asks and queries else NA,
            ]
        )
    return [
        table(
            [
                "system",
                "replay seconds (all meetings, all budgets)",
                "ms per message replayed",
                "ms per query answered (copy included)",
            ],
            rows,
        )
    ]


def prefix_table(results: Sequence[PrefixResult | None], names: Sequence[str]) -> list[str]:
    rows: list[list[object]] = []
    for name, r in zip(names, results, strict=True):
        if r is None:
            rows.append([name, *[NA] * 8])
            continue
        rows.append(
            [
                name,
                f"{r.turns:,}",
                f"{statistics.fmean(r.tokens):,.0f}",
                f"{100 * statistics.fmean(r.shares()):.1f}%",
                f"{statistics.fmean(r.uncached()):,.0f}",
                f"{sum(r.event):,}",
                r.rewrites(True),
                r.rewrites(False),
                r.losses_without_event(),
            ]
        )
    return [
        table(
            [
                "system",
                "turns",
                "mean context tokens",
                "mean prefix share",
                "uncached tokens per turn",
                "turns after an event",
                "rewrites after an event",
                "rewrites without an event",
                "losses without an event",
            ],
            rows,
        )
    ]


def speed_tables(sp: SpeedResults) -> list[str]:
    sizes = sorted({t.size for t in sp.timings})
    systems = list(dict.fromkeys(t.system for t in sp.timings))
    rows: list[list[object]] = []
    for system in systems:
        cells = []
        for size in sizes:
            t = next((x for x in sp.timings if x.system == system and x.size == size), None)
            if t is None or not t.samples:
                cells.append(NA)
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


def dump(results: Sequence[MeetingResult], prefix: Sequence[PrefixResult | None], path: Path) -> None:
    """Every per-query figure and every prefix turn as JSON, to dig into a run."""
    rows: list[dict[str, object]] = []
    for r in results:
        for budget, b in r.budgets.items():
            for part, scores, used in ((STATIC, b.static, None), (QUERY, b.query, b.query_used)):
                for system, values in scores.items():
                    for i, value in enumerate(values):
                        tokens = used[system][i] if used is not None else b.static_used[system]
                        rows.append(
                            {
                                "meeting": r.id,
                                "domain": r.domain,
                                "budget": budget,
                                "part": part,
                                "system": system,
                                "query": r.query_texts[i] if i < len(r.query_texts) else i,
                                "retention": round(value, 4),
                                "tokens": tokens,
                            }
                        )
    turns = [
        {"system": p.system, "tokens": p.tokens, "common": p.common, "event": p.event}
        for p in prefix
        if p is not None
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"retention": rows, "prefix": turns}), encoding="utf-8")


def plot(summaries: Sequence[tuple[Summary, str]], budgets: Sequence[int], path: Path) -> None:
    """One panel per (summary, title): retention against budget for every system that ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(summaries), figsize=(6.5 * len(summaries), 4.8), dpi=120, squeeze=False)
    styles = ["o-", "D-", "s--", "^:", "v-.", "P--", "x-"]
    for ax, (s, title) in zip(axes[0], summaries, strict=True):
        for system, style in zip(s.systems, styles, strict=False):
            ys = [100 * s.mean(system, b) for b in budgets]
            if all(y != y for y in ys):
                continue
            ax.plot(
                list(budgets), ys, style, label=system, linewidth=2 if system.startswith("tiered") else 1.4
            )
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
