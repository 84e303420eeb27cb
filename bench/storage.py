"""Bytes per stored message on SQLite and PostgreSQL: table, indexes, full-text index.

A database is filled with ``--messages`` messages (default 1,000,000): QMSum meeting turns from
``../shared/data/qmsum`` (every split, in name order, cycled with new conversation ids until
enough), one conversation per meeting, roles alternating user/assistant, timestamps 20 s apart.
Then its space is measured per part and divided by the number of messages.

How the rows are written: exactly as the library writes them. Each conversation's messages
go through ``core.transitions.append`` (token counts from ``HistoryCompressor.prepare``, topic
boundaries from the default settings' rules) and are stored by ``SQLStore.commit`` in one
transaction per conversation; its topics are then summarised (``record_summary``), all but the
newest 12 merged three by three into archives (``record_archive``) and all but the newest 5
archives dropped (``drop_archives``), one commit per step, as maintenance leaves a
conversation under the default 8,000-token budget. Summary texts are not a summariser's: a
topic's is its transcript cut to 4 x ``topic_summary_tokens`` characters, an archive's its
topics' summaries cut to 4 x ``bulk_summary_tokens`` (sizes like real summaries; the words do
not matter for bytes).

Measured (after a checkpoint / ``VACUUM ANALYZE``): SQLite with the ``dbstat`` virtual table,
pages per b-tree (``messages_fts_*`` is the FTS5 index); PostgreSQL with ``pg_table_size``
(heap and TOAST), ``pg_relation_size`` per index and ``pg_column_size`` of the ``tsv`` column
(the full-text vector is stored in the row, its GIN index apart). Usage::

    python -m bench.storage                                  # 1M messages, both backends
    python -m bench.storage --messages 100000 --backend sqlite
    python -m bench.storage --pg-partitions 8 --out docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

if __package__ in (None, ""):  # run as ``python bench/storage.py``
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import sqlalchemy as sa

from bench._common import REPO, git_revision, log, machine, percentile, table, update_section
from tiered_history import HistoryCompressor, SyncHistoryCompressor
from tiered_history.core.render import render_summary
from tiered_history.core.state import (
    ConversationState,
    Guard,
    NewMessage,
    NewRef,
    NewSummary,
    SummaryUpdate,
    Writes,
)
from tiered_history.core.transitions import (
    Incoming,
    SummaryWrite,
    append,
    drop_archives,
    record_archive,
    record_summary,
)
from tiered_history.models import Summary
from tiered_history.store import migrate
from tiered_history.store.dialect import create_engine
from tiered_history.store.sql import SQLStore

PG_ADMIN_URL = os.environ.get("TIERED_HISTORY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
DATA = REPO.parent / "shared" / "data" / "qmsum"
START = datetime(2025, 1, 6, 9, 0, tzinfo=UTC)
GAP = timedelta(seconds=20)
#: What maintenance leaves under the default budget: active topic summaries and archives.
KEEP_TOPICS, KEEP_ARCHIVES, MERGE = 12, 5, 3


# -- data -------------------------------------------------------------------------------------------


def meetings() -> list[list[str]]:
    """Every QMSum meeting's non-empty turns, all splits, in name order."""
    out = []
    for path in sorted(DATA.glob("*/*.json")):
        turns = json.loads(path.read_text(encoding="utf-8"))["meeting_transcripts"]
        texts = [str(t.get("content") or "").strip() for t in turns]
        out.append([t for t in texts if t])
    if not out:
        raise SystemExit(f"no QMSum meetings under {DATA}")
    return out


def conversations(total: int, join: int = 1) -> Iterator[tuple[str, list[str]]]:
    """``(id, messages)`` until ``total`` messages: the meetings, again and again under new ids.

    ``join`` consecutive turns make one message (longer, chat-assistant-like messages)."""
    source = [["\n".join(m[k : k + join]) for k in range(0, len(m), join)] for m in meetings()]
    left, k = total, 0
    while left > 0:
        turns = source[k % len(source)][:left]
        yield f"meeting-{k:06d}", turns
        left -= len(turns)
        k += 1


# -- filling ----------------------------------------------------------------------------------------


@dataclass
class Filled:
    messages: int = 0
    ids: list[str] = field(default_factory=list)
    conversations: int = 0
    topics: int = 0
    archives: int = 0
    content_bytes: int = 0
    seconds: float = 0.0


class Filler:
    """Writes conversations with the library's own transitions and store."""

    def __init__(self, store: SQLStore) -> None:
        self.store = store
        self.hc = HistoryCompressor("memory://")  # settings, token counter, boundary rules; never opened
        self.rules = self.hc.reply.rules_for(None)
        self.encoding = self.hc.counter.encoding_name
        s = self.hc.settings
        self.topic_chars, self.archive_chars = 4 * s.topic_summary_tokens, 4 * s.bulk_summary_tokens
        self._prepared: dict[tuple[str, str], Incoming] = {}

    def prepare(self, role: str, text: str, at: datetime) -> Incoming:
        """Token counts once per distinct text (meetings repeat when cycled)."""
        key = (role, text)
        found = self._prepared.get(key)
        if found is None:
            found = self._prepared[key] = self.hc.prepare({"role": role, "content": text, "timestamp": at})
        return replace(found, timestamp=at)

    def conversation(self, cid: str, turns: list[str], out: Filled) -> None:
        state: ConversationState | None = None
        rows: list[NewMessage] = []
        topics: list[NewSummary] = []
        for i, text in enumerate(turns):
            at = START + GAP * (out.messages + i)
            msg = self.prepare("user" if i % 2 == 0 else "assistant", text, at)
            done = append(state, cid, msg, self.rules, platform=None, encoding=self.encoding, now=at)
            rows.extend(done.writes.messages)
            topics.extend(done.writes.summaries)
            state = done.writes.state
            out.content_bytes += len(text.encode())
        assert state is not None
        self._commit(cid, None, Writes(state, messages=tuple(rows), summaries=tuple(topics), create=True))
        out.messages += len(turns)
        out.conversations += 1
        out.ids.append(cid)
        out.topics += len(topics)
        out.archives += self._maintain(
            cid, {m.sequence: m.content for m in rows}, state.last_message_at or START
        )

    def _commit(self, cid: str, version: int | None, writes: Writes) -> None:
        done = self.store.commit(cid, Guard(version), writes)
        assert done.ok, done

    def _maintain(self, cid: str, texts: dict[int, str], now: datetime) -> int:
        """Summarise every topic, merge the oldest into archives, drop old archives: three commits."""
        state = self.store.read_state(cid)
        assert state is not None
        version = state.version
        updates: list[SummaryUpdate] = []
        for t in self.store.read_summaries(cid, "topic"):
            body = "\n".join(texts[k] for k in range(t.first_sequence, t.last_sequence + 1))
            w = self._write("topic", body[: self.topic_chars], t)
            step = record_summary(state, t, w, now)
            state, updates = step.state, [*updates, *step.updates]
        if updates:
            self._commit(cid, version, Writes(state, updates=tuple(updates)))
        topics = self.store.read_summaries(cid, "topic")
        groups = [topics[k : k + MERGE] for k in range(0, max(len(topics) - KEEP_TOPICS, 0), MERGE)]
        groups = [g for g in groups if len(g) == MERGE]
        version = state.version
        archives: list[NewSummary] = []
        links: list[SummaryUpdate] = []
        for k, group in enumerate(groups):
            text = "\n".join(t.content for t in group)[: self.archive_chars]
            step = record_archive(state, group, self._write("bulk", text, group[0], group[-1]), now)
            state = step.state
            archives.extend(step.summaries)
            # record_archive points at "the archive this commit inserts": the k-th one here.
            links.extend(_retarget(u, k) for u in step.updates)
        if archives:
            self._commit(cid, version, Writes(state, summaries=tuple(archives), updates=tuple(links)))
        old = self.store.read_summaries(cid, "bulk")[:-KEEP_ARCHIVES]
        if old:
            self._commit(cid, state.version, drop_archives(state, old, now))
        return len(archives)

    def _write(self, tier: str, text: str, first: Summary, last: Summary | None = None) -> SummaryWrite:
        last = last or first
        rendered = render_summary(
            tier, text, first.first_sequence, last.last_sequence, first.started_at, last.ended_at
        )
        return SummaryWrite(text, rendered, len(rendered) // 4, "final", "extractive")


def _retarget(u: SummaryUpdate, k: int) -> SummaryUpdate:
    return replace(u, values={**u.values, "parent_id": NewRef(k)})


def fill(store: SQLStore, n: int, join: int) -> Filled:
    out = Filled()
    filler = Filler(store)
    t0 = time.perf_counter()
    last_log = t0
    for cid, turns in conversations(n, join):
        filler.conversation(cid, turns, out)
        if time.perf_counter() - last_log > 30:
            last_log = time.perf_counter()
            log(f"  {out.messages:,} messages in {last_log - t0:.0f} s")
    out.seconds = time.perf_counter() - t0
    return out


# -- measuring --------------------------------------------------------------------------------------


@dataclass
class Space:
    """Bytes per part; each part is (table, btree indexes, full text)."""

    parts: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    tsv: dict[str, int] = field(default_factory=dict)
    """PostgreSQL: the stored ``tsv`` column's share of the full text (the rest is its GIN index)."""
    total: int = 0
    """The whole database (file, or pg_database_size)."""


def measure_sqlite(engine: sa.Engine) -> Space:
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        sizes: dict[str, int] = dict(
            conn.exec_driver_sql("SELECT name, pgsize FROM dbstat WHERE aggregate = TRUE").all()
        )
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
        page = conn.exec_driver_sql("PRAGMA page_size").scalar_one()
        indexes: dict[str, str] = dict(
            conn.exec_driver_sql("SELECT name, tbl_name FROM sqlite_schema WHERE type = 'index'").all()
        )
    space = Space(total=int(pages) * int(page))
    for t in ("messages", "summaries", "conversations"):
        idx = sum(v for k, v in sizes.items() if indexes.get(k) == t)
        fts = sum(v for k, v in sizes.items() if k.startswith(f"{t}_fts_"))
        space.parts[t] = (int(sizes.get(t, 0)), int(idx), int(fts))
    return space


def measure_pg(engine: sa.Engine) -> Space:
    with engine.connect() as raw:
        conn = raw.execution_options(isolation_level="AUTOCOMMIT")
        conn.exec_driver_sql("VACUUM ANALYZE")  # also moves GIN's pending list into the index

        def size(fn: str, rel: str) -> int:
            """``fn`` of ``rel``, summed over its partitions when it is partitioned."""
            value = conn.exec_driver_sql(
                f"SELECT coalesce((SELECT sum({fn}(relid)) FROM pg_partition_tree('{rel}') WHERE isleaf), "
                f"{fn}('{rel}'))"
            ).scalar_one()
            return int(value or 0)

        space = Space(
            total=int(conn.exec_driver_sql("SELECT pg_database_size(current_database())").scalar_one())
        )
        for t in ("messages", "summaries", "conversations"):
            heap = size("pg_table_size", t)
            names = conn.exec_driver_sql(
                "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = %(t)s::regclass",
                {"t": t},
            ).scalars()
            idx = fts = 0
            for name in list(names):
                if name.endswith("_tsv"):
                    fts += size("pg_relation_size", name)
                else:
                    idx += size("pg_relation_size", name)
            if t != "conversations":
                # The stored tsvector is in the heap: count it as full text, not as the table.
                tsv = int(
                    conn.exec_driver_sql(
                        f"SELECT coalesce(sum(pg_column_size(tsv)), 0) FROM {t}"
                    ).scalar_one()
                )
                heap, fts = heap - tsv, fts + tsv
                space.tsv[t] = tsv
            space.parts[t] = (heap, idx, fts)
    return space


# -- databases --------------------------------------------------------------------------------------


@dataclass
class Database:
    backend: str
    label: str
    url: str
    drop: Callable[[], None]


def make_database(backend: str, tmp: Path, partitions: int = 0) -> Database:
    if backend == "sqlite":
        path = tmp / f"storage-{uuid.uuid4().hex[:8]}.db"

        def rm() -> None:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)

        return Database("sqlite", "SQLite", f"sqlite:///{path}", rm)
    import psycopg

    name = f"th_storage_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    label = f"PostgreSQL, {partitions} hash partitions" if partitions else "PostgreSQL"
    return Database("postgresql", label, f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}", drop)


@dataclass
class Result:
    label: str
    filled: Filled
    space: Space
    context_ms: float = float("nan")
    add_ms: float = float("nan")


def probe(url: str, ids: list[str], calls: int) -> tuple[float, float]:
    """p50 of get_context (8,000 tokens) and add_message on random conversations of the full database."""
    rng = random.Random(3)
    ctx: list[float] = []
    add: list[float] = []
    with SyncHistoryCompressor.from_url(url) as hc:
        for cid in rng.sample(ids, min(20, len(ids))):  # connections, statement caches
            hc.get_context(cid, 8000)
        for k in range(calls):
            cid = rng.choice(ids)
            t = time.perf_counter()
            hc.get_context(cid, 8000)
            ctx.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            hc.add_message(
                cid, {"role": "user" if k % 2 else "assistant", "content": f"probe {k}: the budget?"}
            )
            add.append((time.perf_counter() - t) * 1000)
    return percentile(sorted(ctx), 50), percentile(sorted(add), 50)


def run(backend: str, n: int, tmp: Path, join: int, calls: int, partitions: int = 0) -> Result:
    db = make_database(backend, tmp, partitions)
    engine = create_engine(db.url)
    try:
        migrate.upgrade(engine, options={"partitions": partitions} if partitions else None)
        store = SQLStore(engine, migrate=False)
        log(f"{db.label}: filling {n:,} messages")
        filled = fill(store, n, join)
        log(f"{db.label}: filled in {filled.seconds:.0f} s; measuring")
        space = measure_sqlite(engine) if backend == "sqlite" else measure_pg(engine)
        result = Result(db.label, filled, space)
        if calls:
            result.context_ms, result.add_ms = probe(db.url, filled.ids, calls)
        return result
    finally:
        engine.dispose()
        db.drop()


# -- report -----------------------------------------------------------------------------------------


def per_message(value: int, n: int) -> str:
    return f"{value / n:,.0f}"


def render(results: list[Result], args: argparse.Namespace) -> str:
    rows = []
    for r in results:
        n = r.filled.messages
        m_table, m_idx, m_fts = r.space.parts["messages"]
        s = sum(sum(v) for v in [r.space.parts["summaries"]])
        c = sum(r.space.parts["conversations"])
        rows.append(
            [
                r.label,
                per_message(m_table, n),
                per_message(m_idx, n),
                per_message(m_fts, n),
                per_message(m_table + m_idx + m_fts, n),
                per_message(s, n),
                per_message(c, n),
                per_message(r.space.total, n),
                f"{r.space.total / 2**20 * 1_000_000 / n:,.0f}",
            ]
        )
    first = results[0].filled
    notes = []
    for r in results:
        if "messages" in r.space.tsv:
            n = r.filled.messages
            tsv = r.space.tsv["messages"]
            gin = r.space.parts["messages"][2] - tsv
            notes.append(
                f"- {r.label}: the messages' full text is the stored `tsv` column "
                f"({tsv / n:,.0f} bytes per message) and its GIN index ({gin / n:,.0f})."
            )
    detail = []
    for r in results:
        s_table, s_idx, s_fts = r.space.parts["summaries"]
        c_table, c_idx, _ = r.space.parts["conversations"]
        detail.append(
            [
                r.label,
                f"{s_table / r.filled.messages:,.1f} / {s_idx / r.filled.messages:,.1f} / "
                f"{s_fts / r.filled.messages:,.1f}",
                f"{(c_table + c_idx) / r.filled.conversations:,.0f}",
                f"{r.filled.seconds:.0f} ({r.filled.messages / r.filled.seconds:,.0f} msg/s)",
                f"{r.context_ms:.2f}",
                f"{r.add_ms:.2f}",
            ]
        )
    lines = [
        "## Storage: bytes per stored message",
        "",
        f"{first.messages:,} messages in {first.conversations:,} conversations (QMSum meeting turns, "
        f"mean {first.content_bytes / first.messages:,.0f} bytes of UTF-8 text each), with their "
        f"{first.topics:,} topic summaries and {first.archives:,} archives, written by the library's "
        "own transitions and store (see `bench/storage.py`). Bytes per message; `messages` split "
        "into its table (heap / b-tree of rows, TOAST included), its b-tree indexes (primary key, "
        "(conv, seq)) and its full-text index (SQLite: the FTS5 tables; PostgreSQL: the stored "
        "`tsv` column plus its GIN index). Summaries and conversations are shown per message too.",
        "",
        table(
            [
                "backend",
                "messages: table",
                "indexes",
                "full text",
                "messages total",
                "summaries",
                "conversations",
                "whole database",
                "MB per 1M messages",
            ],
            rows,
        ),
        "",
        table(
            [
                "backend",
                "summaries per message: table / indexes / full text",
                "bytes per conversation (row, state, indexes)",
                "fill time, s (rate)",
                "get_context p50, ms",
                "add_message p50, ms",
            ],
            detail,
        ),
        "",
        *notes,
        "- `get_context` (8,000 tokens) and `add_message` p50: one `SyncHistoryCompressor` on the full "
        f"database, {args.calls} calls each on random conversations (one client).",
        f"- Machine: {machine()}.",
        f"- Library: git {git_revision()}.",
        f"- Command: `python -m bench.storage --messages {args.messages} --backend {args.backend}"
        + (f" --pg-partitions {args.pg_partitions}" if args.pg_partitions else "")
        + (f" --join {args.join}" if args.join != 1 else "")
        + (f" --calls {args.calls}" if args.calls != 300 else "")
        + "`",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--backend", choices=("sqlite", "postgresql", "all"), default="all")
    p.add_argument("--pg-partitions", type=int, default=0, help="also measure this hash-partitioned layout")
    p.add_argument(
        "--join", type=int, default=1, help="consecutive QMSum turns per message (longer messages)"
    )
    p.add_argument("--calls", type=int, default=300, help="timed get_context/add_message calls (0: none)")
    p.add_argument("--out", type=Path, help="write the 'storage' section of this markdown file")
    args = p.parse_args(argv)
    backends = ["sqlite", "postgresql"] if args.backend == "all" else [args.backend]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for b in backends:
            results.append(run(b, args.messages, Path(tmp), args.join, args.calls))
            if b == "postgresql" and args.pg_partitions:
                results.append(run(b, args.messages, Path(tmp), args.join, args.calls, args.pg_partitions))
    body = render(results, args)
    if args.out:
        update_section(args.out, "storage", body)
        log(f"wrote the storage section of {args.out}")
    else:
        print(body)


if __name__ == "__main__":
    main()
