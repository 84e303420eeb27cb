"""Sustained-load benchmark: bot replies across many conversations while workers compress them.

    python -m bench.load --backend postgresql --conversations 1000 --clients 4 --workers 2 --seconds 60

Each client process runs ``--concurrency`` reply loops; a reply is what a bot does per turn: add
the user's message, ``get_context``, add the answer. Worker processes run ``run_worker`` (the
standalone ``maintain()`` loop) meanwhile. Afterwards every conversation's stored message count is
checked against what the clients sent. Prints a markdown table (for docs/benchmarks.md); exits 1
if any error happened or any message was lost.

PostgreSQL: a throwaway database is created next to ``TIERED_HISTORY_TEST_PG`` (default
``postgresql://postgres@127.0.0.1:5432/test``) and dropped afterwards, unless ``--url`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import git_revision, log, machine, percentile, table
from bench.latency import make_database

SPAWN = multiprocessing.get_context("spawn")
MAX_TOKENS = 4000

_VOCABULARY = (
    "deploy cluster invoice refund schedule meeting budget forecast latency cache index query "
    "migration backup restore password account travel flight hotel visa recipe oven garden tomato "
    "battery charger router firmware printer driver contract clause tenant landlord deposit "
    "insurance claim "
)
WORDS = _VOCABULARY.split()


def _settings() -> dict[str, Any]:
    return {
        "summarize_inline": False,
        "lease_seconds": 60,
        "boundaries": {"temporal": False},
    }


def _text(rng: random.Random, n_words: int) -> str:
    words = [rng.choice(WORDS) for _ in range(n_words)]
    return " ".join(words).capitalize() + "."


# -- client and worker processes ----------------------------------------------------------------


def _client_main(
    url: str, k: int, conversations: list[str], concurrency: int, go: Any, stop: Any, out: str
) -> None:
    from tiered_history import HistoryCompressor

    async def main() -> dict[str, Any]:
        sent: dict[str, int] = {}
        context_ms: list[float] = []
        reply_ms: list[float] = []
        errors: list[str] = []
        over_budget = 0
        async with HistoryCompressor(url, **_settings()) as hc:
            await hc.exists("warm-up")  # pool and schema check done before the clock starts
            Path(out + ".ready").touch()
            go.wait()
            begun = time.monotonic()

            async def loop(j: int) -> None:
                nonlocal over_budget
                rng = random.Random(k * 1000 + j)
                mine = conversations[j::concurrency]
                while not stop.is_set() and mine:
                    cid = rng.choice(mine)
                    question = _text(rng, rng.randint(8, 60))
                    if rng.random() < 0.15:
                        question = "New topic: " + question
                    started = time.perf_counter()
                    try:
                        await hc.add_message(cid, {"role": "user", "content": question})
                        sent[cid] = sent.get(cid, 0) + 1
                        t0 = time.perf_counter()
                        ctx = await hc.get_context(cid, MAX_TOKENS)
                        context_ms.append((time.perf_counter() - t0) * 1000)
                        over_budget += ctx.total_tokens > MAX_TOKENS
                        answer = _text(rng, rng.randint(20, 160))
                        await hc.add_message(cid, {"role": "assistant", "content": answer})
                        sent[cid] += 1
                        reply_ms.append((time.perf_counter() - started) * 1000)
                    except Exception as exc:
                        errors.append(f"{cid}: {exc!r}")

            await asyncio.gather(*(loop(j) for j in range(concurrency)))
            ran = time.monotonic() - begun
        return {
            "seconds": ran,
            "sent": sent,
            "context_ms": context_ms,
            "reply_ms": reply_ms,
            "errors": errors,
            "over_budget": over_budget,
        }

    Path(out).write_text(json.dumps(asyncio.run(main())))


def _worker_main(url: str, stop: Any, out: str) -> None:
    from tests._procs import CountingMaintainer, run_worker_until
    from tiered_history import HistoryCompressor

    async def main() -> dict[str, Any]:
        logging.basicConfig(level=logging.ERROR)
        async with HistoryCompressor(url, **_settings()) as hc:
            counting = CountingMaintainer(hc)
            await run_worker_until(counting, 0.5, stop)
        return {**counting.totals, "errors": counting.errors}

    Path(out).write_text(json.dumps(asyncio.run(main())))


# -- orchestration ------------------------------------------------------------------------------


async def _stored_counts(url: str) -> dict[str, tuple[int, int]]:
    """Messages per conversation: (rows stored, last sequence)."""
    from tiered_history import HistoryCompressor

    async with HistoryCompressor(url, **_settings()) as hc:
        stats = await hc.stats()
        out = {}
        for s in stats:
            state = await hc.store.state(s.conversation_id)
            out[s.conversation_id] = (s.messages, state.last_sequence if state else -1)
        return out


def run(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="th-load-"))
    drop = None
    if args.url:
        url = args.url
    elif args.backend == "postgresql":
        db = make_database("postgresql", tmp)
        url, drop = db.url, db.cleanup
    else:
        url = f"sqlite:///{tmp / 'load.db'}"
    try:
        asyncio.run(_init(url))
        cids = [f"load-{i:05d}" for i in range(args.conversations)]
        go, stop, wstop = SPAWN.Event(), SPAWN.Event(), SPAWN.Event()
        clients = [
            SPAWN.Process(
                target=_client_main,
                args=(
                    url,
                    k,
                    cids[k :: args.clients],
                    args.concurrency,
                    go,
                    stop,
                    str(tmp / f"client{k}.json"),
                ),
            )
            for k in range(args.clients)
        ]
        workers = [
            SPAWN.Process(target=_worker_main, args=(url, wstop, str(tmp / f"worker{k}.json")))
            for k in range(args.workers)
        ]
        for p in workers + clients:
            p.start()
        deadline = time.monotonic() + 120
        while not all((tmp / f"client{k}.json.ready").exists() for k in range(args.clients)):
            if time.monotonic() > deadline or any(p.exitcode not in (None, 0) for p in clients):
                log("client processes did not start")
                stop.set()
                go.set()
                wstop.set()
                return 1
            time.sleep(0.05)
        log(f"running {args.seconds} s on {args.backend} ({len(cids)} conversations)")
        go.set()
        time.sleep(args.seconds)
        stop.set()
        for p in clients:
            p.join(120)
        wstop.set()
        for p in workers:
            p.join(120)
        failed = [p.exitcode for p in clients + workers if p.exitcode != 0]
        if failed:
            log(f"child processes failed: exit codes {failed}")
            return 1

        results = [json.loads((tmp / f"client{k}.json").read_text()) for k in range(args.clients)]
        worked = [json.loads((tmp / f"worker{k}.json").read_text()) for k in range(args.workers)]
        # From the start signal until the last in-flight reply finished.
        elapsed = max(r["seconds"] for r in results)
        sent: dict[str, int] = {}
        for r in results:
            for cid, n in r["sent"].items():
                sent[cid] = sent.get(cid, 0) + n
        stored = asyncio.run(_stored_counts(url))
        lost = sum(max(n - stored.get(cid, (0, 0))[0], 0) for cid, n in sent.items())
        extra = sum(max(s[0] - sent.get(cid, 0), 0) for cid, s in stored.items())
        gaps = sum(1 for rows, last in stored.values() if rows != last)
        ctx_ms = sorted(x for r in results for x in r["context_ms"])
        reply_ms = sorted(x for r in results for x in r["reply_ms"])
        errors = [e for r in results for e in r["errors"]] + [e for w in worked for e in w["errors"]]
        over = sum(r["over_budget"] for r in results)
        replies = len(reply_ms)
        rows = [
            [
                args.backend,
                args.conversations,
                f"{args.clients} × {args.concurrency}",
                args.workers,
                f"{elapsed:.0f}",
                replies,
                f"{replies / elapsed:.1f}",
                f"{percentile(ctx_ms, 50):.1f}",
                f"{percentile(ctx_ms, 99):.1f}",
                f"{percentile(reply_ms, 50):.1f}",
                f"{percentile(reply_ms, 99):.1f}",
                sum(w["summarized"] for w in worked),
                sum(w["merged"] for w in worked),
                len(errors),
                lost + extra + gaps,
            ]
        ]
        headers = [
            "backend",
            "conversations",
            "clients × loops",
            "workers",
            "seconds",
            "replies",
            "replies/s",
            "get_context p50 ms",
            "get_context p99 ms",
            "reply p50 ms",
            "reply p99 ms",
            "topics summarised",
            "archives merged",
            "errors",
            "messages lost/duplicated",
        ]
        print(table(headers, rows))
        print()
        print(f"Machine: {machine()}; revision {git_revision()}; over-budget contexts: {over}.")
        for e in errors[:10]:
            log(f"error: {e}")
        if lost or extra or gaps:
            log(f"INTEGRITY: {lost} lost, {extra} extra, {gaps} conversations with sequence gaps")
        ok = not errors and not (lost or extra or gaps) and over == 0 and replies > 0
        return 0 if ok else 1
    finally:
        if drop is not None and not args.keep:
            drop()


async def _init(url: str) -> None:
    from tiered_history import HistoryCompressor

    async with HistoryCompressor(url, **_settings()):
        pass  # creates the schema once, before the processes race for it


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["postgresql", "sqlite"], default="postgresql")
    p.add_argument("--url", help="use this database instead of a throwaway one (not dropped)")
    p.add_argument("--conversations", type=int, default=1000)
    p.add_argument("--clients", type=int, default=4, help="client processes")
    p.add_argument("--concurrency", type=int, default=4, help="reply loops per client process")
    p.add_argument("--workers", type=int, default=2, help="maintenance worker processes")
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--keep", action="store_true", help="keep the throwaway PostgreSQL database")
    args = p.parse_args(argv)
    if args.conversations < 1 or args.clients < 1 or args.concurrency < 1 or args.seconds <= 0:
        p.error("counts and duration must be positive")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
