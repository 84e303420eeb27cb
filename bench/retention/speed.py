"""Per-call latency of building a context at 1k / 10k / 100k messages, and add_message throughput.

Messages are ``bench.latency.generate``'s synthetic conversation (alternating user and
assistant, 20-600 characters, a topic-change phrase every ~30 messages). For
tiered_history the conversation is stored in a SQLite file exactly as
``bench.latency`` does it (bulk rows as ``add_message`` writes them, then
``maintain()``), and ``get_context(conv, max_tokens=8000)`` is timed. Each peer is
called on the full message list every time, with a tiktoken counter that counts every
message it is asked about (no memo), which is how they are used without a store.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._common import log, percentile
from bench.latency import MAX_TOKENS, bulk_fill, generate, make_database, run_throughput
from tiered_history import HistoryCompressor
from tiered_history.tokens import TokenCounter

from . import peers
from .systems import LANGCHAIN, RECENCY, SLIDING, SUMMARIZATION

#: Speed is measured with default settings, whatever they are.
OURS = "tiered_history"

BUDGET = MAX_TOKENS


@dataclass
class Timing:
    system: str
    size: int
    samples: list[float]
    """Wall-clock milliseconds per call."""
    cpu: list[float]
    """CPU milliseconds of this process per call (robust when other jobs share the cores)."""
    note: str = ""

    @property
    def p50(self) -> float:
        return percentile(sorted(self.samples), 50)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)

    @property
    def cpu_p50(self) -> float:
        return percentile(sorted(self.cpu), 50)


@dataclass
class OursSetup:
    size: int
    fill_seconds: float
    maintain_seconds: float
    shape: str


async def _timed(
    fn: Callable[[], Awaitable[Any]], calls: int, warmup: int, max_seconds: float
) -> tuple[list[float], list[float]]:
    """Up to ``calls`` timed calls after ``warmup``; stops early once ``max_seconds`` are spent."""
    spent = 0.0
    for _ in range(warmup):
        t = time.perf_counter()
        await fn()
        spent += time.perf_counter() - t
        if spent > max_seconds / 4:
            break
    wall: list[float] = []
    cpu: list[float] = []
    spent = 0.0
    for _ in range(calls):
        t, c = time.perf_counter(), time.process_time()
        await fn()
        dt = time.perf_counter() - t
        cpu.append((time.process_time() - c) * 1000)
        wall.append(dt * 1000)
        spent += dt
        if spent > max_seconds:
            break
    return wall, cpu


async def ours(size: int, tmp: Path, calls: int, max_seconds: float) -> tuple[Timing, OursSetup]:
    db = make_database("sqlite", tmp)
    try:
        msgs = generate(size, seed=size)
        cid = "bench-conversation"
        h = HistoryCompressor(db.url)
        await h.initialize()
        t0 = time.perf_counter()
        await bulk_fill(h, cid, msgs)
        t1 = time.perf_counter()
        report = await h.maintain(cid)
        t2 = time.perf_counter()
        log(f"  {OURS} N={size}: fill {t1 - t0:.1f}s, maintain {t2 - t1:.1f}s ({report.summarized} topics)")
        ctx = await h.get_context(cid, BUDGET)
        shape = (
            f"{len(ctx.current_topic)} msgs + {len(ctx.historical_topics)} summaries + "
            f"{len(ctx.bulk_archives)} archives = {ctx.total_tokens} tokens"
        )
        wall, cpu = await _timed(lambda: h.get_context(cid, BUDGET), calls, max(3, calls // 10), max_seconds)
        await h.close()
        return Timing(OURS, size, wall, cpu), OursSetup(size, t1 - t0, t2 - t1, shape)
    finally:
        db.cleanup()


async def peer_timings(size: int, calls: int, max_seconds: float) -> list[Timing]:
    counter = TokenCounter()
    framed = peers.Framed(counter, memo=False)
    dicts = [{"role": m.role, "content": m.content} for m in generate(size, seed=size)]
    lc = peers.langchain_generated(dicts)
    pd = peers.pydantic_generated(dicts)
    lc_counter = peers.langchain_counter(framed)
    pd_counter = peers.pydantic_counter(framed)
    window = peers.sliding_window(BUDGET, pd_counter)
    model = peers.ExtractiveModel(counter, peers.summary_target(BUDGET))
    summarizer = peers.summarization(BUDGET, pd_counter, model.model())

    async def recency() -> Any:
        return peers.recency_call(framed, dicts, BUDGET)

    async def langchain() -> Any:
        return peers.langchain_trim(lc, BUDGET, lc_counter)

    async def sliding() -> Any:
        return await window(pd)

    async def summarization() -> Any:
        return await summarizer.process(pd)

    out: list[Timing] = []
    systems = ((RECENCY, recency), (LANGCHAIN, langchain), (SLIDING, sliding), (SUMMARIZATION, summarization))
    for name, fn in systems:
        wall, cpu = await _timed(fn, calls, 1, max_seconds)
        out.append(Timing(name, size, wall, cpu))
        log(f"  {name} N={size}: p50 {out[-1].p50:.1f} ms over {len(wall)} calls")
    return out


@dataclass
class SpeedResults:
    timings: list[Timing]
    setups: list[OursSetup]
    throughput_single: float
    throughput_multi: float
    throughput_messages: int


async def run(sizes: Sequence[int], calls: int, max_seconds: float, throughput: int) -> SpeedResults:
    timings: list[Timing] = []
    setups: list[OursSetup] = []
    with tempfile.TemporaryDirectory(prefix="th-retention-") as tmpdir:
        tmp = Path(tmpdir)
        log(f"add_message throughput on SQLite ({throughput} messages)")
        thr = await run_throughput("sqlite", tmp, throughput)
        for size in sizes:
            log(f"speed N={size}")
            timing, setup = await ours(size, tmp, calls, max_seconds)
            timings.append(timing)
            setups.append(setup)
            timings += await peer_timings(size, calls, max_seconds)
    return SpeedResults(timings, setups, thr.single, thr.multi, thr.messages)


def run_sync(sizes: Sequence[int], calls: int, max_seconds: float, throughput: int) -> SpeedResults:
    return asyncio.run(run(sizes, calls, max_seconds, throughput))
