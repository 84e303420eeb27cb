"""Write throughput: ``add_message`` and ``add_messages`` on SQLite and PostgreSQL, each beside its floor.

    python -m bench.writes --out /tmp/writes.md          # both backends
    python -m bench.writes --backend sqlite --messages 2000 --repeats 3

Every figure is printed beside a *floor* measured in the same run, on the same database and
schema (full-text index and triggers included): what storing the same messages costs with
nothing but the driver, i.e. counting the message's tokens with tiktoken, one ``INSERT`` into
``messages`` and the commit (one transaction per message for ``add_message``, per batch for
``add_messages``). The ratio (ours / floor) is the figure to compare across machines; the
absolute rates follow the machine's load (printed). Each figure is the median of ``--repeats``
runs, a floor run and ours alternating.

PostgreSQL with ``synchronous_commit = on`` waits for the WAL to reach the disk at every commit:
one client's sequential writes are bounded by that flush (printed as "commit wait"), for the
floor as for us. Concurrent clients share flushes (group commit): the ``×4`` rows run four
clients at once, each on its own conversation.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as ``python bench/writes.py``
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from bench._common import git_revision, log, machine, table, update_section
from bench.latency import Database, generate, make_database, pg_version
from tiered_history import HistoryCompressor, SyncHistoryCompressor
from tiered_history.tokens import TokenCounter

BATCH = 100
CLIENTS = 4
_SEQ_BASES = itertools.count(10_000_000, 1_000_000)


@dataclass(frozen=True)
class Rate:
    per_second: float
    """Messages per second (wall clock)."""
    cpu_us: float
    """This process's CPU time per message (all its threads), µs: steadier than the wall clock
    on a loaded machine; the database server's own time is not in it."""

    @staticmethod
    def median(rates: list[Rate]) -> Rate:
        return Rate(
            statistics.median(r.per_second for r in rates), statistics.median(r.cpu_us for r in rates)
        )


class Clock:
    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.cpu = time.process_time()

    def rate(self, n: int) -> Rate:
        return Rate(n / (time.perf_counter() - self.wall), (time.process_time() - self.cpu) / n * 1e6)


@dataclass
class Row:
    path: str
    ours: Rate
    floor: Rate
    note: str = ""


def _messages(n: int, seed: int) -> list[dict[str, Any]]:
    return [m.as_dict() for m in generate(n, seed=seed)]


# -- floors: the driver alone --------------------------------------------------------------------------


class Floor:
    """Bare-driver writes into the benchmark database's own ``messages`` table (conversation ``conv``)."""

    def __init__(self, db: Database, conv: int) -> None:
        self.sqlite = db.backend == "sqlite"
        # The encoding the library counts with by default (cl100k_base): the same work per message.
        self.counter = TokenCounter()
        self.conv = conv
        # Far above anything the library writes in this conversation, and apart for every floor.
        self.seq = next(_SEQ_BASES)
        if self.sqlite:
            import sqlite3

            self.conn: Any = sqlite3.connect(db.url.removeprefix("sqlite:///"), isolation_level=None)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.sql = (
                "INSERT INTO messages (conv, seq, role, created_at, tokens, full_tokens, pinned, content) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            )
        else:
            import psycopg

            self.conn = psycopg.connect(db.url, autocommit=True)
            self.sql = (
                "INSERT INTO messages (conv, seq, role, created_at, tokens, full_tokens, pinned, content) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
            )

    def _row(self, m: dict[str, Any]) -> tuple[Any, ...]:
        self.seq += 1
        n = self.counter.message_tokens({"role": m["role"], "content": m["content"]})
        at = m["timestamp"].isoformat(sep=" ") if self.sqlite else m["timestamp"]
        return (self.conv, self.seq, m["role"], at, n, n, False, m["content"])

    def write(self, msgs: list[dict[str, Any]], batch: int) -> Rate:
        """``batch`` rows per transaction."""
        cur = self.conn.cursor()
        t = Clock()
        for i in range(0, len(msgs), batch):
            rows = [self._row(m) for m in msgs[i : i + batch]]
            cur.execute("BEGIN IMMEDIATE" if self.sqlite else "BEGIN")
            if len(rows) == 1:
                cur.execute(self.sql, rows[0])
            else:
                cur.executemany(self.sql, rows)
            cur.execute("COMMIT")
        return t.rate(len(msgs))

    def close(self) -> None:
        self.conn.close()


def conv_key(db: Database, conversation_id: str) -> int:
    if db.backend == "sqlite":
        import sqlite3

        with sqlite3.connect(db.url.removeprefix("sqlite:///")) as c:
            row = c.execute("SELECT key FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
            return int(row[0])
    import psycopg

    with psycopg.connect(db.url) as c:
        row = c.execute("SELECT key FROM conversations WHERE id = %s", (conversation_id,)).fetchone()
        assert row is not None
        return int(row[0])


def commit_wait_ms(db: Database, n: int = 200) -> float:
    """PostgreSQL: median time of an empty-ish commit (a one-row insert), i.e. the WAL flush."""
    import psycopg

    with psycopg.connect(db.url, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS bench_flush (x int)")
        times = []
        for i in range(n):
            t = time.perf_counter()
            c.execute("INSERT INTO bench_flush VALUES (%s)", (i,))
            times.append(time.perf_counter() - t)
        c.execute("DROP TABLE bench_flush")
    return statistics.median(times) * 1000


# -- ours ------------------------------------------------------------------------------------------------


def run_sync(url: str, msgs: list[dict[str, Any]], cid: str, batch: int) -> Rate:
    with SyncHistoryCompressor(url, summarize_inline=False) as h:
        h.add_message(cid, msgs[0])  # creates it: the timed writes all append
        t = Clock()
        if batch == 1:
            for m in msgs[1:]:
                h.add_message(cid, m)
        else:
            for i in range(1, len(msgs), batch):
                h.add_messages(cid, msgs[i : i + batch])
        return t.rate(len(msgs) - 1)


def run_async(url: str, msgs: list[dict[str, Any]], cid: str, clients: int = 1) -> Rate:
    """``clients`` concurrent tasks on one compressor, each adding to its own conversation."""

    async def go() -> Rate:
        async with HistoryCompressor(url, summarize_inline=False) as h:
            for k in range(clients):
                await h.add_message(f"{cid}-{k}", msgs[0])
            share = [msgs[1 + k :: clients] for k in range(clients)]

            async def client(k: int) -> None:
                for m in share[k]:
                    await h.add_message(f"{cid}-{k}", m)

            t = Clock()
            await asyncio.gather(*(client(k) for k in range(clients)))
            return t.rate(len(msgs) - 1)

    return asyncio.run(go())


def floor_threads(db: Database, conv: int, msgs: list[dict[str, Any]], clients: int) -> Rate:
    """``clients`` threads of bare single-row transactions at once: aggregate messages per second."""
    floors = [Floor(db, conv) for _ in range(clients)]
    share = [msgs[k::clients] for k in range(clients)]
    failed: list[BaseException] = []

    def write(f: Floor, part: list[dict[str, Any]]) -> None:
        try:
            f.write(part, 1)
        except BaseException as e:
            failed.append(e)

    threads = [threading.Thread(target=write, args=(f, share[k])) for k, f in enumerate(floors)]
    t = Clock()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    rate = t.rate(len(msgs))
    if failed:
        raise failed[0]
    for f in floors:
        f.close()
    return rate


def driver_choice(db: Database, n: int, clients: int) -> tuple[float, float]:
    """PostgreSQL from asyncio, ``clients`` tasks of single-row autocommitted INSERTs: psycopg's
    async driver vs the sync driver on a thread pool (what the store does). Messages per second."""
    import psycopg

    sql = "INSERT INTO bench_driver (x, t) VALUES (%s, %s)"
    with psycopg.connect(db.url, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS bench_driver (x int, t text)")

    async def native() -> float:
        conns = [await psycopg.AsyncConnection.connect(db.url, autocommit=True) for _ in range(clients)]

        async def one(c: Any) -> None:
            for i in range(n):
                await c.execute(sql, (i, "hello world"))

        t = time.perf_counter()
        await asyncio.gather(*(one(c) for c in conns))
        rate = n * clients / (time.perf_counter() - t)
        for c in conns:
            await c.close()
        return rate

    async def pooled() -> float:
        from concurrent.futures import ThreadPoolExecutor

        conns = [psycopg.connect(db.url, autocommit=True) for _ in range(clients)]
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(clients) as pool:

            async def one(c: Any) -> None:
                for i in range(n):
                    await loop.run_in_executor(pool, c.execute, sql, (i, "hello world"))

            t = time.perf_counter()
            await asyncio.gather(*(one(c) for c in conns))
            rate = n * clients / (time.perf_counter() - t)
        for c in conns:
            c.close()
        return rate

    return asyncio.run(native()), asyncio.run(pooled())


def median_pair(repeats: int, floor: Callable[[int], Rate], ours: Callable[[int], Rate]) -> tuple[Rate, Rate]:
    fs, os_ = [], []
    for r in range(repeats):
        fs.append(floor(r))
        os_.append(ours(r))
    return Rate.median(os_), Rate.median(fs)


def bench_backend(backend: str, tmp: Path, n: int, batches: int, repeats: int) -> tuple[list[Row], str]:
    db = make_database(backend, tmp)
    try:
        pg = backend == "postgresql"
        n_single = min(n, 300) if pg else n
        rows: list[Row] = []
        msgs = _messages(max(n_single, batches * BATCH) + 1, seed=3)
        # The schema, and the conversation the floors write into.
        with SyncHistoryCompressor(db.url) as h:
            h.add_message("floor", msgs[0])
        floor = Floor(db, conv_key(db, "floor"))
        one = msgs[: n_single + 1]
        bulk = msgs[: batches * BATCH + 1]
        log(f"{backend}: add_message sync")
        ours, fl = median_pair(
            repeats, lambda r: floor.write(one[1:], 1), lambda r: run_sync(db.url, one, f"sync-{r}", 1)
        )
        rows.append(Row(f"`add_message`, {backend}, sync", ours, fl))
        log(f"{backend}: add_message async")
        ours, fl = median_pair(
            repeats, lambda r: floor.write(one[1:], 1), lambda r: run_async(db.url, one, f"async-{r}")
        )
        rows.append(Row(f"`add_message`, {backend}, async", ours, fl))
        if pg:
            log(f"{backend}: add_message async, {CLIENTS} clients")
            four = msgs[: min(len(msgs), n_single * CLIENTS) + 1]
            ours, fl = median_pair(
                repeats,
                lambda r: floor_threads(db, floor.conv, four[1:], CLIENTS),
                lambda r: run_async(db.url, four, f"four-{r}", CLIENTS),
            )
            rows.append(
                Row(
                    f"`add_message`, {backend}, async, {CLIENTS} clients (total)",
                    ours,
                    fl,
                    f"per client {ours.per_second / CLIENTS:,.0f}/s; floor: {CLIENTS} threads",
                )
            )
        log(f"{backend}: add_messages")
        ours, fl = median_pair(
            repeats,
            lambda r: floor.write(bulk[1:], BATCH),
            lambda r: run_sync(db.url, bulk, f"bulk-{r}", BATCH),
        )
        rows.append(Row(f"`add_messages`, {backend}, {BATCH} a batch", ours, fl))
        floor.close()
        extra = ""
        if pg:
            log(f"{backend}: async driver vs pooled sync driver")
            native, pooled = zip(
                *(driver_choice(db, n_single // 2, CLIENTS) for _ in range(repeats)), strict=True
            )
            extra = (
                f"commit wait {commit_wait_ms(db):.2f} ms (median single-row commit); from asyncio, "
                f"{CLIENTS} tasks of single-row commits: psycopg's async driver "
                f"{statistics.median(native):,.0f}/s, the sync driver on a thread pool (what the store "
                f"does) {statistics.median(pooled):,.0f}/s"
            )
        return rows, extra
    finally:
        db.cleanup()


def render(rows: list[Row], notes: list[str], args: argparse.Namespace, where: str) -> str:
    body = [
        [
            r.path,
            f"{r.ours.per_second:,.0f}",
            f"{r.floor.per_second:,.0f}",
            f"{r.ours.per_second / r.floor.per_second:.2f}",
            f"{r.ours.cpu_us:,.0f}",
            f"{r.floor.cpu_us:,.0f}",
            f"{r.floor.cpu_us / r.ours.cpu_us:.2f}",
            r.note,
        ]
        for r in rows
    ]
    lines = [
        f"`python -m bench.writes --messages {args.messages} --batches {args.batches} "
        f"--repeats {args.repeats}` on {where}; revision {git_revision()}; "
        f"load average at the end {', '.join(f'{x:.2f}' for x in os.getloadavg())}.",
        "",
        "Floor: tiktoken count + one INSERT into `messages` + COMMIT with the bare driver "
        f"(sqlite3 / psycopg), one message a transaction (`add_messages`: {BATCH} a transaction), "
        "same database, same run; medians of the repeats.",
        "",
        table(
            [
                "path",
                "msg/s",
                "floor msg/s",
                "ours / floor",
                "CPU µs/msg",
                "floor CPU µs/msg",
                "floor / ours (CPU)",
                "note",
            ],
            body,
        ),
    ]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["sqlite", "postgresql", "all"], default="all")
    p.add_argument("--messages", type=int, default=2000, help="add_message calls per run (PostgreSQL: ≤ 300)")
    p.add_argument("--batches", type=int, default=100, help=f"add_messages batches of {BATCH} per run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, help="write the writes section of this markdown file")
    args = p.parse_args(argv)
    backends = ["sqlite", "postgresql"] if args.backend == "all" else [args.backend]
    rows: list[Row] = []
    notes: list[str] = []
    where = machine()
    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            got, extra = bench_backend(backend, Path(tmp), args.messages, args.batches, args.repeats)
            rows += got
            if extra:
                notes.append(f"PostgreSQL {pg_version()}: {extra}.")
    text = render(rows, notes, args, where)
    print(text)
    if args.out:
        update_section(args.out, "writes", text)


if __name__ == "__main__":
    main()
