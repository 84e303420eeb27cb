"""``python -m bench.retention``: query retention, static retention (with cost and speed), cached prefix."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from bench._common import REPO, log, machine, update_section

from . import render, report, systems
from .data import DOMAINS, Turn, domain_of, meeting_paths
from .prefix import BUDGET as PREFIX_BUDGET
from .prefix import (
    CHAT_TURN_SECONDS,
    SESSION_GAP_HOURS,
    PrefixResult,
    chat_turns,
    conversation_turns,
    meetings_in,
    run_prefix,
    sessions_in,
)
from .prefix import MAINTAIN_EVERY as PREFIX_EVERY
from .prefix import SYSTEMS as PREFIX_SYSTEMS
from .prefix import TURNS as PREFIX_TURNS
from .replay import QUERY, STATIC, MeetingResult, run_meeting
from .speed import run_sync
from .systems import QUERY_SYSTEMS, STATIC_SYSTEMS

#: The replays' interval as the module sets it (``main`` overwrites ``systems.MAINTAIN_EVERY``).
DEFAULT_MAINTAIN_EVERY = systems.MAINTAIN_EVERY

T = TypeVar("T")
PREFIX = "prefix"
PARTS = (QUERY, STATIC, PREFIX)
#: Sections of the benchmarks document, one per part (``--only`` rewrites just its own).
SECTIONS = {QUERY: "retention_query", STATIC: "peers", PREFIX: "retention_prefix"}
#: The prefix part's section when it replays the two-party chat (``--prefix-data chat``).
CHAT_SECTION = "retention_prefix_chat"
#: New sections go before this one when the document does not have them yet.
ANCHOR = "peers"
DEFAULT_BUDGETS = "1000,2000,4000,8000"
QUICK = {"budgets": "1000,4000", "prefix_turns": 400}


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.retention",
        description="Query retention, static retention, cost, speed and cached-prefix share on QMSum.",
    )
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--split", default="test", choices=["train", "val", "test"])
    p.add_argument("--limit", type=int, help="meetings, spread evenly over the split (default: all; 0 = all)")
    p.add_argument("--budgets", help=f"comma-separated token budgets (default {DEFAULT_BUDGETS})")
    p.add_argument("--only", choices=PARTS, help="run one part (default: all three)")
    p.add_argument("--out", type=Path, help="rewrite this part's sections of this markdown file")
    p.add_argument("--plot", type=Path, help="retention plot (default: retention.png beside --out)")
    p.add_argument("--json", type=Path, help="also write every per-query figure and prefix turn here")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    p.add_argument("--store", choices=["memory", "sqlite"], default="memory", help="tiered_history's store")
    p.add_argument(
        "--maintain-every",
        type=int,
        default=DEFAULT_MAINTAIN_EVERY,
        help="retention replays: maintain() every N messages (0: only after the last one, a backlog)",
    )
    p.add_argument("--prefix-turns", type=int, help=f"turns of the prefix replay (default {PREFIX_TURNS})")
    p.add_argument("--prefix-budget", type=int, default=PREFIX_BUDGET)
    p.add_argument("--prefix-every", type=int, default=PREFIX_EVERY, help="maintain() every N turns")
    p.add_argument(
        "--prefix-data",
        choices=["qmsum", "chat"],
        default="qmsum",
        help="prefix replay of QMSum meetings, or of a two-party chat (TIAGE dialogues, sessions days apart)",
    )
    p.add_argument("--speed-sizes", default="1000,10000,100000")
    p.add_argument("--speed-calls", type=int, default=30)
    p.add_argument("--speed-seconds", type=float, default=12.0, help="time box per (system, size) cell")
    p.add_argument("--throughput", type=int, default=1000, help="messages for the add_message throughput")
    p.add_argument("--no-speed", action="store_true", help="skip the speed part of the static section")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: one meeting per domain, budgets {QUICK['budgets']}, "
        f"{QUICK['prefix_turns']} prefix turns, no speed (explicit options win)",
    )
    args = p.parse_args(argv)
    args.per_domain = args.quick and args.limit is None
    if args.quick:
        args.budgets = args.budgets or QUICK["budgets"]
        args.prefix_turns = args.prefix_turns or QUICK["prefix_turns"]
        args.no_speed = True
    args.limit = args.limit or 0
    args.budgets = args.budgets or DEFAULT_BUDGETS
    args.prefix_turns = args.prefix_turns or PREFIX_TURNS
    return args


class Inline(Executor):
    """Runs each job as it is submitted, in this process (``--jobs 1``: tests, profiling, debugging)."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        f: Future[T] = Future()
        f.set_result(fn(*args, **kwargs))
        return f


def one_per_domain(paths: Sequence[Path]) -> list[Path]:
    """The middle meeting (in name order) of each domain."""
    out = []
    for d in DOMAINS:
        mine = [p for p in paths if domain_of(p.stem) == d]
        if mine:
            out.append(mine[len(mine) // 2])
    return out


def command(args: argparse.Namespace, parts: Sequence[str]) -> str:
    out = ["python -m bench.retention", f"--split {args.split}"]
    if QUERY in parts or STATIC in parts:
        out += [] if args.per_domain else [f"--limit {args.limit}"]
        out.append(f"--budgets {args.budgets}")
    if args.only:
        out.append(f"--only {args.only}")
    if args.store != "memory":
        out.append(f"--store {args.store}")
    if (QUERY in parts or STATIC in parts) and args.maintain_every != DEFAULT_MAINTAIN_EVERY:
        out.append(f"--maintain-every {args.maintain_every}")
    if PREFIX in parts:
        out += [f"--prefix-turns {args.prefix_turns}", f"--prefix-budget {args.prefix_budget}"]
        out.append(f"--prefix-every {args.prefix_every}")
    if STATIC in parts and not args.no_speed:
        out.append(f"--speed-sizes {args.speed_sizes}")
    elif STATIC in parts:
        out.append("--no-speed")
    if args.quick:
        out.append("--quick")
    return " ".join(out)


def write(path: Path, name: str, md: str) -> None:
    """Rewrite section ``name`` of ``path``; a new section goes before :data:`ANCHOR` if that is there."""
    begin = f"<!-- {name}:begin -->"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    anchor = f"<!-- {ANCHOR}:begin -->"
    if begin not in text and anchor in text and name != ANCHOR:
        block = f"{begin}\n{md.rstrip()}\n<!-- {name}:end -->\n\n"
        path.write_text(text.replace(anchor, block + anchor, 1), encoding="utf-8")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    update_section(path, name, md)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    # Read by the replays in the worker processes (forked after this) and by the method text.
    systems.MAINTAIN_EVERY = args.maintain_every
    started = time.perf_counter()
    start_machine = machine()
    parts = [args.only] if args.only else list(PARTS)
    budgets = tuple(int(b) for b in args.budgets.split(","))
    sections = tuple(p for p in (QUERY, STATIC) if p in parts)
    paths = meeting_paths(args.data, args.split, args.limit or None) if sections else []
    if args.per_domain:
        paths = one_per_domain(paths)
    prefix_names = PREFIX_SYSTEMS
    chat = args.prefix_data == "chat"
    turns: list[Turn] = []
    if PREFIX in parts:
        turns = (
            chat_turns(args.data, args.prefix_turns)
            if chat
            else conversation_turns(args.data, args.split, args.prefix_turns)
        )
    log(
        f"retention: {len(paths)} meetings x budgets {budgets} ({', '.join(sections) or 'no retention'})"
        + (f"; prefix replay of {len(turns)} turns" if turns else "")
        + f" on {args.jobs} processes"
    )
    results: list[MeetingResult] = []
    prefix: list[PrefixResult | None] = []
    with ProcessPoolExecutor(max_workers=args.jobs) if args.jobs > 1 else Inline() as pool:
        # Prefix replays first: they are long single jobs; the meetings then fill both workers.
        pre: list[Future[PrefixResult | None]] = [
            pool.submit(run_prefix, (n, tuple(turns), args.prefix_budget, args.prefix_every))
            for n in (prefix_names if turns else ())
        ]
        jobs: list[Future[MeetingResult]] = [
            pool.submit(run_meeting, (path, budgets, sections, args.store)) for path in paths
        ]
        for job in jobs:
            r = job.result()
            results.append(r)
            log(f"  {r.id}: {r.messages} messages, {r.queries} queries")
        for system, done in zip(prefix_names if turns else (), pre, strict=True):
            prefix.append(done.result())
            log(f"  prefix {system}: {'n/a' if prefix[-1] is None else 'done'}")
    log(f"replays done in {time.perf_counter() - started:.0f}s")
    speed = None
    if STATIC in parts and not args.no_speed:
        sizes = [int(x) for x in args.speed_sizes.split(",") if x.strip()]
        speed = run_sync(sizes, args.speed_calls, args.speed_seconds, args.throughput)
    plot = args.plot or (args.out.parent / "retention.png" if args.out and sections else None)
    if plot is not None and sections:
        panels: list[tuple[report.Summary, str]] = []
        queries = sum(r.queries for r in results)
        where = f"QMSum {args.split}: {len(results)} meetings, {queries} queries"
        if QUERY in sections:
            panels.append(
                (report.summarise(results, budgets, QUERY, QUERY_SYSTEMS), f"query retention, {where}")
            )
        if STATIC in sections:
            s = report.summarise(results, budgets, STATIC, STATIC_SYSTEMS)
            panels.append((s, f"static retention, {where}"))
        report.plot(panels, budgets, plot)
    if args.json is not None:
        report.dump(results, prefix, args.json)
    info = render.RunInfo(
        start_machine, command(args, parts), (time.perf_counter() - started) / 60, args.split, args.store
    )
    out: dict[str, str] = {}
    if QUERY in parts:
        out[QUERY] = render.query_section(info, results, budgets)
    if STATIC in parts:
        plot_name = plot.name if plot else None
        out[STATIC] = render.static_section(info, results, budgets, speed, args.speed_seconds, plot_name)
    if PREFIX in parts:
        if chat:
            title = "Cached-prefix share (two-party chat replay with maintenance running)"
            data = (
                f"TIAGE test dialogues (PersonaChat) in file order, its first {len(turns):,} turns "
                f"({sessions_in(turns)} dialogues) as one chat: each dialogue a session of alternating "
                f"user / assistant turns {CHAT_TURN_SECONDS[0]}-{CHAT_TURN_SECONDS[1]} s apart, sessions "
                f"{SESSION_GAP_HOURS[0]}-{SESSION_GAP_HOURS[1]} hours apart (fixed seed), so silence "
                "ends each topic, as in a bot's chat that spans weeks."
            )
        else:
            title = "Cached-prefix share (QMSum replay with maintenance running)"
            data = (
                f"QMSum {args.split} split, its first {len(turns):,} stored turns in meeting-name order "
                f"({meetings_in(turns)} meetings back to back) as one conversation."
            )
        out[PREFIX] = render.prefix_section(info, prefix, prefix_names, title, data)
    if args.out is None:  # like the other benchmarks: print unless told where to write
        print("\n\n".join(out[p] for p in PARTS if p in out))
        return
    for part, md in out.items():
        write(args.out, CHAT_SECTION if part == PREFIX and chat else SECTIONS[part], md)
    log(f"wrote {args.out}{f' and {plot}' if plot else ''} in {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
