"""Where does ``get_context`` spend its time? A breakdown on one SQLite (or PostgreSQL) conversation.

    python -m bench.profile_context --size 10000 [--backend sqlite] [--cprofile 25]

Reports, per call (median of ``--calls``): the whole ``get_context``; the store's
``read_context``; the pure ``assemble``; the SQL statements issued (count and
text); those same statements replayed on a bare DB-API connection (the floor any
store implementation pays); the round trip of one event-loop -> thread hop; and,
if the store runs on aiosqlite, how many aiosqlite thread hops one call makes.
Works with either store flavour (AsyncEngine + aiosqlite/psycopg async, or a
blocking Engine on a thread pool).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import io
import pstats
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import event

from bench._common import git_revision, machine
from bench.latency import MAX_TOKENS, bulk_fill, generate, make_database
from tiered_history import HistoryCompressor


async def median_ms(fn: Callable[[], Awaitable[Any]], calls: int, warmup: int = 20) -> float:
    for _ in range(warmup):
        await fn()
    out = []
    for _ in range(calls):
        t = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - t) * 1000)
    return statistics.median(out)


def sync_median_ms(fn: Callable[[], Any], calls: int, warmup: int = 20) -> float:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return statistics.median(out)


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="th-prof-") as tmpdir:
        db = make_database(args.backend, Path(tmpdir))
        try:
            await profile(db.url, args)
        finally:
            db.cleanup()


async def profile(url: str, args: argparse.Namespace) -> None:
    cid = "bench-conversation"
    h = HistoryCompressor(url)
    await h.initialize()
    msgs = generate(args.size, seed=args.size)
    await bulk_fill(h, cid, msgs[:-50])
    for m in msgs[-50:]:
        await h.add_message(cid, m.as_dict())
    await h.maintain(cid)
    store: Any = h.store
    engine = store.engine
    sync_engine = getattr(engine, "sync_engine", engine)
    print(f"# get_context breakdown: {args.backend}, {args.size:,} messages, max_tokens={MAX_TOKENS}")
    print(f"machine: {machine()}; library: git {git_revision()}; store engine: {type(engine).__name__}")

    statements: list[tuple[str, Any]] = []
    capture = [False]

    def on_execute(conn: Any, cursor: Any, stmt: str, params: Any, ctx: Any, many: bool) -> None:
        if capture[0]:
            statements.append((stmt, params))

    event.listen(sync_engine, "before_cursor_execute", on_execute)
    hops: collections.Counter[str] = collections.Counter()
    try:
        import aiosqlite.core as aiocore

        original: Any = aiocore.Connection._execute

        async def counting(self: Any, fn: Any, *a: Any, **k: Any) -> Any:
            hops[getattr(fn, "__name__", "call")] += 1
            return await original(self, fn, *a, **k)

        aiocore.Connection._execute = counting  # type: ignore[method-assign]
    except ImportError:
        pass

    await h.get_context(cid, MAX_TOKENS)
    hops.clear()
    capture[0] = True
    ctx = await h.get_context(cid, MAX_TOKENS)
    capture[0] = False
    print(
        f"context: {len(ctx.current_topic)} messages, {len(ctx.historical_topics)} topics, "
        f"{len(ctx.bulk_archives)} archives, {ctx.total_tokens} tokens"
    )
    print(f"SQL statements per get_context: {len(statements)}")
    for stmt, params in statements:
        flat = " ".join(stmt.split())
        print(f"  - {flat[:60]} ... {flat[-60:] if len(flat) > 120 else ''} {params!r:.80}")
    if hops:
        print(f"aiosqlite thread hops per get_context: {sum(hops.values())} {dict(hops)}")

    n = args.calls
    whole = await median_ms(lambda: h.get_context(cid, MAX_TOKENS), n)
    read = await median_ms(lambda: store.read_context(cid, MAX_TOKENS), n)
    rows = await store.read_context(cid, MAX_TOKENS)

    def do_assemble() -> Any:
        return h._assemble(cid, MAX_TOKENS, rows)  # the pure assembly get_context runs

    asm = sync_median_ms(do_assemble, n)
    loop = asyncio.get_running_loop()
    hop = await median_ms(lambda: loop.run_in_executor(None, int), n)
    print(f"median ms over {n} calls:")
    print(f"  get_context                       {whole:7.3f}")
    print(f"  store.read_context                {read:7.3f}")
    print(f"  assemble (pure, no I/O)           {asm:7.3f}")
    print(f"  one run_in_executor round trip    {hop:7.3f}")

    if args.backend == "sqlite":
        path = sync_engine.url.database
        raw = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        replay = [(s, p) for s, p in statements if s.strip().upper() not in {"BEGIN", "BEGIN IMMEDIATE"}]

        def bare() -> None:
            raw.execute("BEGIN")
            for s, p in replay:
                raw.execute(s, p).fetchall()
            raw.execute("COMMIT")

        floor = sync_median_ms(bare, n)
        print(f"  same SQL on bare sqlite3 (floor)  {floor:7.3f}")
        raw.close()
    else:
        import psycopg

        pg_url = str(sync_engine.url.set(drivername="postgresql")).replace("***", "")
        with psycopg.connect(pg_url, autocommit=True) as pconn:
            replay = [(s, p) for s, p in statements if not s.strip().upper().startswith("BEGIN")]

            def bare_pg() -> None:
                with pconn.transaction(), pconn.cursor() as cur:
                    for s, p in replay:
                        cur.execute(s, p)
                        cur.fetchall()

            floor = sync_median_ms(bare_pg, n)
        print(f"  same SQL on bare psycopg (floor)  {floor:7.3f}")

    if args.cprofile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            await h.get_context(cid, MAX_TOKENS)
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.cprofile)
        print(buf.getvalue())
    await h.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="get_context time breakdown")
    p.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    p.add_argument("--size", type=int, default=10000)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--cprofile", type=int, default=0, help="print the N top functions by own time")
    asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
