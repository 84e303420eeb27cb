"""get_context latency and add_message throughput on SQLite and PostgreSQL.

For every backend and size N, one conversation is filled with N messages (mixed
lengths, an explicit topic-change phrase every ~30 messages, timestamps seconds
apart and ending now), ``maintain()`` builds the tiers, then ``get_context`` is
timed. Usage (from the repository root)::

    python -m bench.latency --backend all --sizes 1000,10000,100000 --out docs/benchmarks.md

How the history is filled: all but the last ``--tail`` messages are inserted in
bulk with SQLAlchemy Core, exactly the rows ``add_message`` would write (token
counts from ``HistoryCompressor.prepare``, topic boundaries from the compressor's
own boundary policy, pending topic rows like ``SQLStore._seal_range``); the last
``--tail`` messages go through ``add_message``. ``maintain()`` then summarises,
merges and drops with the real code.

The read-path table (``measure_reads``, skip with ``--no-reads``) times the sync
``get_context`` with recall on and off in two patterns: the same call repeated (the
context cache answers after one primary-key read) and the reply pattern (``add_message``,
then ``get_context``: built again, recall searching the new message), also with a worker's
``maintain()`` every ``WORKER_EVERY`` replies. Each call is followed
by the floor: one bare indexed query reading the same rows with sqlite3 or psycopg.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as ``python bench/latency.py``
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import sqlalchemy as sa

from bench._common import REPO, git_revision, log, machine, percentile, table, update_section
from tiered_history import HistoryCompressor, SyncHistoryCompressor
from tiered_history.store.schema import conversations as C
from tiered_history.store.schema import messages as M
from tiered_history.store.schema import summaries as S

PG_ADMIN_URL = os.environ.get("TIERED_HISTORY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
MAX_TOKENS = 8000
#: The read path's third pattern runs a worker's ``maintain()`` after every this many replies.
WORKER_EVERY = 10

_COMMON_TEXT = (
    "the a to and of in that is it for on with as this was be at by not are from or have an "
    "they which you we can will would should could about there their what when so if more some "
    "then than into also just like only over such because these those other how after before "
    "while where very much many most"
)
_COMMON = _COMMON_TEXT.split()
_SUBJECTS_TEXT = (
    "database migration schema index query latency cache deploy release budget invoice customer "
    "order shipping warehouse garden tomato recipe oven flour travel flight hotel museum train "
    "ticket guitar chord concert piano lesson marathon training shoes injury recovery python "
    "typescript compiler test fixture coverage refactor kubernetes cluster node pod ingress "
    "certificate renewal mortgage interest savings pension insurance claim dentist appointment "
    "vaccine allergy pollen weather forecast storm camping tent trail mountain lake fishing "
    "boat sailing wind harbour novel chapter author poem essay"
)
_SUBJECTS = _SUBJECTS_TEXT.split()
_SHIFTS = (
    "Let's move on to {s}.",
    "New topic: {s}.",
    "On another note, what about {s}?",
    "Changing the subject, {s}.",
    "Unrelated question about {s}.",
)


@dataclass(frozen=True, slots=True)
class Msg:
    role: str
    content: str
    timestamp: datetime

    def as_dict(self) -> dict[str, Any]:
        return {"role": self.role, "content": self.content, "timestamp": self.timestamp}


def generate(n: int, seed: int = 7, end: datetime | None = None) -> list[Msg]:
    """``n`` alternating user/assistant messages, 20-600 characters, a topic phrase every ~30."""
    rng = random.Random(seed)
    end = end or datetime.now(UTC)
    gaps = [rng.uniform(2.0, 20.0) for _ in range(n)]
    t = end - timedelta(seconds=sum(gaps))
    out: list[Msg] = []
    next_shift = rng.randint(13, 17) * 2
    subjects = rng.sample(_SUBJECTS, 6)
    for i in range(n):
        t += timedelta(seconds=gaps[i])
        role = "user" if i % 2 == 0 else "assistant"
        r = rng.random()
        lo, hi = (20, 120) if r < 0.5 else (120, 350) if r < 0.85 else (350, 600)
        length = rng.randint(lo, hi)
        prefix = ""
        if i == next_shift:
            subjects = rng.sample(_SUBJECTS, 6)
            prefix = rng.choice(_SHIFTS).format(s=" and ".join(subjects[:2])) + " "
            next_shift += rng.randint(13, 17) * 2
        words: list[str] = []
        size = len(prefix)
        while size < length or len(words) < 3:
            w = rng.choice(subjects) if rng.random() < 0.25 else rng.choice(_COMMON)
            words.append(w)
            size += len(w) + 1
        body = " ".join(words)
        body = body[0].upper() + body[1:] + rng.choice((".", "?", "!", "."))
        out.append(Msg(role, (prefix + body)[: max(length, len(prefix) + 1)], t))
    return out


# -- databases --------------------------------------------------------------------------------------


@dataclass
class Database:
    backend: str
    url: str
    cleanup: Callable[[], None]


def make_database(backend: str, tmp: Path) -> Database:
    if backend == "sqlite":
        path = tmp / f"bench-{uuid.uuid4().hex[:8]}.db"

        def rm() -> None:
            for suffix in ("", "-wal", "-shm"):
                Path(str(path) + suffix).unlink(missing_ok=True)

        return Database("sqlite", f"sqlite:///{path}", rm)
    import psycopg

    name = f"th_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return Database("postgresql", f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}", drop)


def pg_version() -> str:
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else "?"
    except Exception as exc:  # report, do not fail the SQLite part
        return f"unavailable ({type(exc).__name__})"


# -- filling -----------------------------------------------------------------------------------------


def _chunks(items: list[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


async def bulk_fill(h: HistoryCompressor, cid: str, msgs: list[Msg]) -> None:
    """Insert ``msgs`` exactly as ``add_message`` would (the same rows, seals and state), in
    batches of ``add_messages`` (one transaction each)."""
    batch = 2000
    for i in range(0, len(msgs), batch):
        await h.add_messages(cid, [m.as_dict() for m in msgs[i : i + batch]])


def summarize_ms(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {
        "p50": percentile(s, 50),
        "p90": percentile(s, 90),
        "p99": percentile(s, 99),
        "mean": statistics.fmean(s),
    }


async def time_async(fn: Callable[[], Awaitable[Any]], calls: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        await fn()
    out: list[float] = []
    for _ in range(calls):
        t = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def time_sync(fn: Callable[[], Any], calls: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out: list[float] = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


@dataclass
class SizeResult:
    backend: str
    size: int
    fill_seconds: float
    tail_rate: float
    maintain_seconds: float
    topics: int
    archives: int
    context: dict[str, float] = field(default_factory=dict)
    sync_context: dict[str, float] = field(default_factory=dict)
    shape: str = ""
    reads: list[ReadRow] = field(default_factory=list)


def copy_rows(src_url: str, dst_url: str) -> None:
    """Copy every row of a SQLite benchmark database into an (empty, migrated) PostgreSQL one,
    then VACUUM ANALYZE it."""
    src = sa.create_engine(src_url)
    dst = sa.create_engine(dst_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with src.connect() as s, dst.begin() as d:
            for table, key in ((C, "key"), (S, "id"), (M, "id")):
                rows = [dict(r._mapping) for r in s.execute(sa.select(table).order_by(table.c[key]))]
                for chunk in _chunks(rows, 5000):
                    d.execute(sa.insert(table), chunk)
                d.execute(
                    sa.text(
                        f"SELECT setval(pg_get_serial_sequence('{table.name}', '{key}'), "
                        f"(SELECT max({key}) FROM {table.name}))"
                    )
                )
    finally:
        src.dispose()
        dst.dispose()
    vacuum_analyze(dst_url)


def vacuum_analyze(url: str) -> None:
    """PostgreSQL: what autovacuum does to a live database a while after a fill (planner
    statistics, the GIN pending list), done now: without statistics the planner reads rows by id
    and finds a word's candidates with plans many times slower (autovacuum may be off on a test
    server, as on this project's machines)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


# -- the get_context read path: cache hits, reads after a write, the floor ------------------------


@dataclass
class ReadRow:
    """One get_context pattern on one database, beside the floor measured in the same run."""

    recall: bool
    pattern: str
    took: dict[str, float]
    floor: dict[str, float]


class FloorRead:
    """One bare indexed query reading the rows a context holds (its current-topic and pinned
    messages, the summaries shown) in a read transaction, on the driver directly: what any
    implementation pays to read them."""

    def __init__(self, url: str, cid: str, ctx: Any) -> None:
        seqs = [m.sequence for m in ctx.current_topic] + [m.sequence for m in ctx.pinned]
        lo, hi = (min(seqs), max(seqs)) if seqs else (0, -1)
        ids = [x.id for x in ctx.historical_topics + ctx.bulk_archives] or [-1]
        cols = "content, tokens"
        self.sqlite = url.startswith("sqlite")
        if self.sqlite:
            import sqlite3

            self.conn: Any = sqlite3.connect(url.split("///", 1)[1], isolation_level=None)
            key = self.conn.execute("SELECT key FROM conversations WHERE id = ?", (cid,)).fetchone()[0]
            self.sql = (
                f"SELECT {cols} FROM messages WHERE conv = ? AND seq BETWEEN ? AND ? UNION ALL "
                f"SELECT {cols} FROM summaries WHERE conv = ? AND id IN ({','.join('?' * len(ids))})"
            )
            self.args: tuple[Any, ...] = (key, lo, hi, key, *ids)
        else:
            import psycopg

            self.conn = psycopg.connect(url, autocommit=True)
            key = self.conn.execute("SELECT key FROM conversations WHERE id = %s", (cid,)).fetchone()[0]
            self.sql = (
                f"SELECT {cols} FROM messages WHERE conv = %s AND seq BETWEEN %s AND %s UNION ALL "
                f"SELECT {cols} FROM summaries WHERE conv = %s AND id = ANY(%s)"
            )
            self.args = (key, lo, hi, key, ids)

    def __call__(self) -> Any:
        if self.sqlite:
            self.conn.execute("BEGIN")
            rows = self.conn.execute(self.sql, self.args).fetchall()
            self.conn.execute("COMMIT")
            return rows
        # One round trip: an autocommit statement is its own transaction.
        return self.conn.execute(self.sql, self.args, prepare=True).fetchall()

    def close(self) -> None:
        self.conn.close()


def _timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def _reply_reads(
    h: SyncHistoryCompressor,
    cid: str,
    read: Callable[[], Any],
    floor: FloorRead,
    replies: Iterator[Msg],
    calls: int,
    skip: int,
    every: int,
) -> tuple[dict[str, float], dict[str, float]]:
    """The reply pattern (add_message, get_context, add_message) ``skip + calls`` times, with
    ``maintain()`` after every ``every`` replies (0: never): the timed reads and their floors,
    the first ``skip`` left out."""
    took: list[float] = []
    base: list[float] = []
    for i in range(skip + calls):
        now = datetime.now(UTC)
        h.add_message(cid, {"role": "user", "content": next(replies).content, "timestamp": now})
        a, b = _timed(read), _timed(floor)
        if i >= skip:
            took.append(a)
            base.append(b)
        h.add_message(cid, {"role": "assistant", "content": next(replies).content, "timestamp": now})
        if every and i % every == every - 1:
            h.maintain(cid)
    return summarize_ms(took), summarize_ms(base)


def measure_reads(url: str, cid: str, calls: int, warmup: int) -> list[ReadRow]:
    """get_context(8k) p50/p99 with recall on and off: the same call repeated (a cache hit: the
    conversation did not change), and the reply pattern (add_message, then get_context: the
    context is built again), without and with a worker's maintenance step every
    :data:`WORKER_EVERY` replies. Each call is followed by the floor read of the same rows."""
    out: list[ReadRow] = []
    replies = iter(generate(2 * (calls + warmup) * 2 * 2 + 2, seed=99))
    for recall in (True, False):
        h = SyncHistoryCompressor(url, recall={"enabled": recall})
        read = partial(h.get_context, cid, MAX_TOKENS)
        floor = FloorRead(url, cid, read())
        try:
            took: list[float] = []
            base: list[float] = []
            for i in range(warmup + calls):
                a, b = _timed(read), _timed(floor)
                if i >= warmup:
                    took.append(a)
                    base.append(b)
            out.append(ReadRow(recall, "repeated read (cache hit)", summarize_ms(took), summarize_ms(base)))
            out.append(
                ReadRow(
                    recall,
                    "read after a write (add_message, then get_context)",
                    *_reply_reads(h, cid, read, floor, replies, calls, warmup // 2, 0),
                )
            )
            # The same with a worker's step every WORKER_EVERY replies (maintain(): the topics
            # sealed since are summarised, maybe merged), as when the background worker runs: the
            # read after it finds new summaries.
            pattern = f"read after a write, maintain() every {WORKER_EVERY} replies"
            out.append(
                ReadRow(
                    recall,
                    pattern,
                    *_reply_reads(h, cid, read, floor, replies, calls, warmup // 2, WORKER_EVERY),
                )
            )
        finally:
            floor.close()
            h.close()
    return out


async def run_size(
    backend: str,
    size: int,
    tmp: Path,
    args: argparse.Namespace,
    source: Database | None = None,
    keep: bool = False,
) -> tuple[SizeResult, Database | None]:
    """Fill, maintain and time one database. With ``source``, copy its rows instead of filling."""
    db = make_database(backend, tmp)
    calls, warmup, tail = args.calls, args.warmup, args.tail
    try:
        msgs = generate(size, seed=size)
        cid = "bench-conversation"
        h = HistoryCompressor(db.url)
        await h.initialize()
        t0 = time.perf_counter()
        tail_n = 0
        t1 = t2 = t0
        if source is not None:
            await h.close()
            copy_rows(source.url, db.url)
            h = HistoryCompressor(db.url)
            t2 = time.perf_counter()
            log(f"  {backend} N={size}: copied the maintained SQLite database in {t2 - t0:.1f}s")
            maintain_s = float("nan")
        else:
            bulk = msgs[: max(size - tail, 0)]
            if bulk:
                await bulk_fill(h, cid, bulk)
            t1 = time.perf_counter()
            for m in msgs[len(bulk) :]:
                await h.add_message(cid, m.as_dict())
            t2 = time.perf_counter()
            tail_n = size - len(bulk)
            log(
                f"  {backend} N={size}: bulk {len(bulk)} rows {t1 - t0:.1f}s, "
                f"add_message x{tail_n} {t2 - t1:.1f}s"
            )
            t3 = time.perf_counter()
            report = await h.maintain(cid)
            maintain_s = time.perf_counter() - t3
            log(f"  maintain {maintain_s:.1f}s: {report}")
            if backend == "postgresql":
                vacuum_analyze(db.url)
        stats = (await h.stats(cid))[0]
        ctx = await h.get_context(cid, MAX_TOKENS)
        shape = (
            f"{len(ctx.current_topic)} msgs + {len(ctx.historical_topics)} topics + "
            f"{len(ctx.bulk_archives)} archives, {ctx.total_tokens} tokens"
        )
        samples = await time_async(lambda: h.get_context(cid, MAX_TOKENS), calls, warmup)
        await h.close()
        sync = SyncHistoryCompressor(db.url)
        try:
            sync_samples = time_sync(lambda: sync.get_context(cid, MAX_TOKENS), calls, warmup)
        finally:
            sync.close()
        reads = measure_reads(db.url, cid, args.calls, args.warmup) if args.reads else []
        result = SizeResult(
            backend=backend,
            size=size,
            fill_seconds=t2 - t0,
            tail_rate=tail_n / (t2 - t1) if tail_n else float("nan"),
            maintain_seconds=maintain_s,
            topics=stats.topics,
            archives=stats.archives,
            context=summarize_ms(samples),
            sync_context=summarize_ms(sync_samples),
            shape=shape + (" (rows copied from the SQLite run)" if source is not None else ""),
            reads=reads,
        )
    except BaseException:
        db.cleanup()
        raise
    if keep:
        return result, db
    db.cleanup()
    return result, None


@dataclass
class Throughput:
    backend: str
    single: float
    multi: float
    messages: int


async def run_throughput(backend: str, tmp: Path, n: int) -> Throughput:
    """Sequential add_message: one conversation, then round-robin over 100 conversations."""
    db = make_database(backend, tmp)
    try:
        msgs = generate(n, seed=1)
        h = HistoryCompressor(db.url)
        await h.initialize()
        await h.add_message("warm", msgs[0].as_dict())
        t = time.perf_counter()
        for m in msgs:
            await h.add_message("single", m.as_dict())
        single = n / (time.perf_counter() - t)
        t = time.perf_counter()
        for i, m in enumerate(msgs):
            await h.add_message(f"multi-{i % 100}", m.as_dict())
        multi = n / (time.perf_counter() - t)
        await h.close()
        return Throughput(backend, single, multi, n)
    finally:
        db.cleanup()


def import_time(runs: int = 5) -> tuple[float, str]:
    """Median wall time of ``import tiered_history`` in a fresh interpreter, and the heaviest imports."""
    code = "import time; t = time.perf_counter(); import tiered_history; print(time.perf_counter() - t)"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    times = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
        times.append(float(out.stdout.strip()) * 1000)
    prof = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import tiered_history"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    ).stderr
    heavy: list[tuple[int, str]] = []
    for line in prof.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            name = parts[2].rstrip()
            depth = (len(name) - len(name.lstrip())) // 2
            if depth <= 1:
                heavy.append((int(parts[1]), name.strip()))
    heavy.sort(reverse=True)
    top = ", ".join(f"{n} {us / 1000:.0f} ms" for us, n in heavy[:6])
    return statistics.median(times), top


# -- report ------------------------------------------------------------------------------------------


def render(
    sizes: list[SizeResult], thr: list[Throughput], imp: tuple[float, str] | None, args: argparse.Namespace
) -> str:
    lines = [
        "### Run",
        "",
        f"- Machine: {machine()}; PostgreSQL {pg_version()}",
        f"- Library: git {git_revision()}",
        f"- Command: `python -m bench.latency --backend {args.backend} --sizes {args.sizes} "
        f"--calls {args.calls} --tail {args.tail} --copy-above {args.copy_above}`",
        f"- get_context(conv, max_tokens={MAX_TOKENS}): {args.warmup} warm-up calls, then {args.calls} "
        "timed calls, one at a time; default settings, extractive summariser.",
        "",
        "### get_context latency (ms)",
        "",
    ]
    rows = []
    for r in sizes:
        a, s = r.context, r.sync_context
        rows.append(
            [
                r.backend,
                f"{r.size:,}",
                f"{r.topics:,} / {r.archives:,}",
                f"{a['p50']:.2f}",
                f"{a['p90']:.2f}",
                f"{a['p99']:.2f}",
                f"{s['p50']:.2f}",
                f"{s['p90']:.2f}",
                f"{s['p99']:.2f}",
            ]
        )
    lines.append(
        table(
            [
                "backend",
                "messages",
                "topics / archives",
                "async p50",
                "async p90",
                "async p99",
                "sync p50",
                "sync p90",
                "sync p99",
            ],
            rows,
        )
    )
    reads = [(r, x) for r in sizes for x in r.reads]
    if reads:
        lines += [
            "",
            "### get_context read path: cache hits and reads after a write (ms, sync API)",
            "",
            "A repeated read finds the conversation unchanged (one primary-key read, the kept context); "
            "a read after a write follows `add_message` (the reply pattern), so the context is built "
            "again (recall searches the newest user message); with `maintain()` every "
            f"{WORKER_EVERY} replies, as the background worker would run it, the read after it finds "
            "the topics sealed since summarised. The floor is one bare indexed query "
            "reading the same rows (messages, pinned, summaries shown) with sqlite3/psycopg, timed "
            "right after each call.",
            "",
            table(
                ["backend", "messages", "recall", "pattern", "p50", "p99", "floor p50", "floor p99"],
                [
                    [
                        r.backend,
                        f"{r.size:,}",
                        "on" if x.recall else "off",
                        x.pattern,
                        f"{x.took['p50']:.3f}",
                        f"{x.took['p99']:.3f}",
                        f"{x.floor['p50']:.3f}",
                        f"{x.floor['p99']:.3f}",
                    ]
                    for r, x in reads
                ],
            ),
        ]
    lines += ["", "Context returned (per size):", ""]
    lines += [f"- {r.backend} {r.size:,}: {r.shape}" for r in sizes]
    lines += ["", "### Filling and maintenance", ""]
    lines.append(
        table(
            ["backend", "messages", "fill (s)", "add_message tail (msg/s)", "maintain() (s)"],
            [
                [
                    r.backend,
                    f"{r.size:,}",
                    f"{r.fill_seconds:.1f}",
                    "-"
                    if r.tail_rate != r.tail_rate
                    else f"{r.tail_rate:.0f} (last {min(args.tail, r.size)})",
                    "copied from SQLite"
                    if r.maintain_seconds != r.maintain_seconds
                    else f"{r.maintain_seconds:.1f}",
                ]
                for r in sizes
            ],
        )
    )
    if thr:
        lines += ["", "### add_message throughput (sequential, one awaited call at a time)", ""]
        lines.append(
            table(
                ["backend", "messages", "1 conversation (msg/s)", "100 conversations round-robin (msg/s)"],
                [[t.backend, t.messages, f"{t.single:.0f}", f"{t.multi:.0f}"] for t in thr],
            )
        )
    if imp is not None:
        lines += [
            "",
            "### Import time",
            "",
            f"`import tiered_history` in a fresh interpreter: median {imp[0]:.0f} ms over 5 runs. "
            f"Heaviest top-level imports (`-X importtime`, cumulative): {imp[1]}.",
        ]
    return "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace) -> str:
    backends = ["sqlite", "postgresql"] if args.backend == "all" else [args.backend]
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    results: list[SizeResult] = []
    thr: list[Throughput] = []
    with tempfile.TemporaryDirectory(prefix="th-bench-") as tmpdir:
        tmp = Path(tmpdir)
        kept: dict[int, Database] = {}
        try:
            for backend in backends:
                if args.throughput > 0:
                    log(f"{backend}: add_message throughput ({args.throughput} messages)")
                    thr.append(await run_throughput(backend, tmp, args.throughput))
                for size in sizes:
                    log(f"{backend}: N={size}")
                    copy = size > args.copy_above and "postgresql" in backends
                    source = kept.get(size) if backend == "postgresql" and copy else None
                    keep = backend == "sqlite" and copy
                    result, db = await run_size(backend, size, tmp, args, source=source, keep=keep)
                    results.append(result)
                    if db is not None:
                        kept[size] = db
        finally:
            for db in kept.values():
                db.cleanup()
    imp = import_time() if not args.no_import else None
    return render(results, thr, imp, args)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--backend", choices=["sqlite", "postgresql", "all"], default="all")
    p.add_argument("--sizes", default="1000,10000,100000")
    p.add_argument("--calls", type=int, default=300, help="timed get_context calls per size")
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--tail", type=int, default=500, help="last messages added through add_message")
    p.add_argument("--throughput", type=int, default=1000, help="messages for the throughput test (0: skip)")
    p.add_argument(
        "--copy-above",
        type=int,
        default=20000,
        help="with --backend all, PostgreSQL sizes above this copy the maintained SQLite rows "
        "instead of running maintain() again",
    )
    p.add_argument("--no-import", action="store_true", help="skip the import-time measurement")
    p.add_argument(
        "--no-reads",
        dest="reads",
        action="store_false",
        help="skip the read-path table (cache hits and reads after a write, recall on and off)",
    )
    p.add_argument("--out", type=Path, help="update the latency section of this markdown file")
    args = p.parse_args(argv)
    md = asyncio.run(main_async(args))
    if args.out:
        update_section(args.out, "latency", md)
        log(f"updated {args.out}")
    else:
        print(md)


if __name__ == "__main__":
    main()
