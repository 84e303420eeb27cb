"""Crash safety: processes SIGKILLed while summarising, while merging, and while appending.

After a restart (short leases), ``maintain()`` completes and every invariant holds: nothing lost,
no summary written twice, no summary covering messages that do not exist, topic ranges disjoint
and contiguous, sequences gap-free and every stored message whole.

Child processes use the ``spawn`` start method, so everything they run lives at module level here.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import multiprocessing
import os
import random
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tiered_history import HistoryCompressor, Settings
from tiered_history.summarizers.base import SummaryInput, SummaryPiece, SummaryResult

from ._procs import maintain_until_quiet, wait_out_leases

pytestmark = pytest.mark.slow

SPAWN = multiprocessing.get_context("spawn")
FILLER = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar"

#: Short leases so a dead worker's conversations are taken over quickly; summaries big enough
#: that three of them overflow the topic share and get merged.
CRASH_SETTINGS: dict[str, Any] = {
    "context_budget": 800,
    "topic_summary_tokens": 60,
    "bulk_merge_size": 3,
    "lease_seconds": 2,
    "summarize_inline": False,
    "summarizer": {"timeout": 600},
    "boundaries": {"temporal": False},
}


def crash_settings() -> Settings:
    return Settings.load(**CRASH_SETTINGS)


# -- invariants (shared with test_concurrency) ------------------------------------------------


async def check_invariants(
    hc: HistoryCompressor, cid: str, sent: Sequence[str] | None = None, *, ordered: bool = True
) -> dict[str, int]:
    """Every invariant of a conversation whose maintenance is finished; returns its counts."""
    h = await hc.get_history(cid)
    n = len(h.messages)
    assert [m.sequence for m in h.messages] == list(range(1, n + 1)), f"{cid}: sequences not gap-free"
    if sent is not None:
        stored = [m.content for m in h.messages]
        if ordered:
            assert stored == list(sent), f"{cid}: messages lost, duplicated or reordered"
        else:
            assert Counter(stored) == Counter(sent), f"{cid}: messages lost or duplicated"
    topics = sorted(h.topics, key=lambda t: t.sequence)
    assert [t.sequence for t in topics] == list(range(1, len(topics) + 1)), f"{cid}: topic ordinals"
    expected = 1
    for t in topics:
        assert t.first_sequence == expected, f"{cid}: topic {t.sequence} range gap or overlap"
        assert t.first_sequence <= t.last_sequence <= n, f"{cid}: topic {t.sequence} covers missing messages"
        expected = t.last_sequence + 1
        assert t.status == "final", f"{cid}: topic {t.sequence} is {t.status}"
        assert t.attempts == 1, f"{cid}: topic {t.sequence} summarised {t.attempts} times"
    assert h.open_topic_start == expected
    archives = sorted(h.archives, key=lambda a: a.sequence)
    assert [a.sequence for a in archives] == list(range(1, len(archives) + 1)), f"{cid}: archive ordinals"
    merged = [t for t in topics if t.merged_into is not None]
    assert merged == topics[: len(merged)], f"{cid}: only the oldest topics are merged"
    # Each archive merges adjacent topics or rolls up adjacent archives (one level above them)
    # and covers exactly what its members cover; the live archives tile the merged topics.
    for a in archives:
        members = sorted(
            (x for x in (*topics, *archives) if x.merged_into == a.id), key=lambda x: x.first_sequence
        )
        assert members, f"{cid}: archive {a.sequence} merges nothing (written twice?)"
        assert a.level == max(x.level for x in members) + 1, f"{cid}: archive {a.sequence} level"
        for x, y in itertools.pairwise(members):
            assert y.first_sequence == x.last_sequence + 1, f"{cid}: archive {a.sequence} has a gap"
        assert (a.first_sequence, a.last_sequence) == (members[0].first_sequence, members[-1].last_sequence)
        assert a.last_sequence <= n, f"{cid}: archive {a.sequence} covers missing messages"
    expected = 1
    for a in sorted((a for a in archives if a.merged_into is None), key=lambda a: a.first_sequence):
        assert a.first_sequence == expected, f"{cid}: archive {a.sequence} range gap or overlap"
        expected = a.last_sequence + 1
    assert expected == (merged[-1].last_sequence + 1 if merged else 1)
    assert {t.merged_into for t in merged} <= {a.id for a in archives}
    [stats] = await hc.stats(cid)
    assert stats.messages == n and stats.topics_pending == 0
    assert stats.compressions == len(topics) + len(archives), f"{cid}: a summary was written twice"
    state = await hc.store.state(cid)
    assert state is not None
    assert state.last_sequence == n
    assert state.lease_owner is None and not state.needs_maintenance, f"{cid}: lease or flag left behind"
    assert state.summarized_upto == (topics[-1].last_sequence if topics else 0)
    return {"messages": n, "topics": len(topics), "archives": len(archives)}


def check_context(ctx: Any, budget: int) -> None:
    """Within budget, and nothing represented twice: every message sequence is covered at most once
    by a shown archive, topic summary or message."""
    assert ctx.total_tokens <= budget, (budget, ctx.total_tokens)
    covered: list[int] = []
    for s in [*ctx.bulk_archives, *ctx.historical_topics]:
        covered.extend(range(s.first_sequence, s.last_sequence + 1))
    shown = [m.sequence for m in [*getattr(ctx, "recent_topics", []), *ctx.current_topic]]
    assert shown == sorted(shown), "messages out of order"
    pinned = {m.sequence for m in ctx.pinned}
    everything = [*covered, *shown]
    dupes = [q for q, n in Counter(everything).items() if n > 1 and q not in pinned]
    assert not dupes, f"sequences represented twice in one context: {dupes[:10]}"


async def wait_for_file(path: Path, proc: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.is_alive(), f"the child died before {path.name} (exit code {proc.exitcode})"
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        await asyncio.sleep(0.02)


def sigkill(proc: Any) -> None:
    proc.kill()
    proc.join(10)
    assert proc.exitcode == -9, f"the child was not killed by SIGKILL (exit code {proc.exitcode})"


# -- children ---------------------------------------------------------------------------------


class StallingSummarizer:
    """Summarises normally except in ``stall`` ("summarize" or "merge"): announces itself, then blocks."""

    name = "stalling"

    def __init__(self, stall: str, marker: str, delay: float = 0.0) -> None:
        self.stall = stall
        self.marker = marker
        self.delay = delay

    async def _block(self) -> None:
        Path(self.marker).write_text(str(os.getpid()))
        while True:
            await asyncio.sleep(3600)

    async def summarize(self, messages: Sequence[SummaryInput], target_tokens: int) -> SummaryResult:
        if self.stall == "summarize":
            await self._block()
        if self.delay:
            Path(self.marker).touch()
            await asyncio.sleep(self.delay)
        words = " ".join(m.content for m in messages).split()[: max(target_tokens // 2, 8)]
        return SummaryResult(text=" ".join(words), summarizer=self.name)

    async def merge(self, pieces: Sequence[SummaryPiece], target_tokens: int) -> SummaryResult:
        if self.stall == "merge":
            await self._block()
        words = " ".join(p.text for p in pieces).split()[: max(target_tokens // 3, 8)]
        return SummaryResult(text=" ".join(words), summarizer=self.name)


def _stalling_worker_main(url: str, stall: str, marker: str) -> None:
    async def main() -> None:
        summ = StallingSummarizer(stall, marker)
        async with HistoryCompressor(url, settings=crash_settings(), summarizer=summ) as hc:
            await hc.maintain()

    asyncio.run(main())


def _looping_worker_main(url: str, marker: str) -> None:
    """maintain() over and over with a slowish summariser, until killed."""

    async def main() -> None:
        summ = StallingSummarizer("never", marker, delay=0.03)
        async with HistoryCompressor(url, settings=crash_settings(), summarizer=summ) as hc:
            while True:
                await hc.maintain()
                await asyncio.sleep(0.01)

    asyncio.run(main())


def message_text(cid: str, i: int) -> str:
    """A deterministic message whose length varies (some above max_message_chars) with a checksum."""
    body = f"{cid} message {i}. " + " ".join([FILLER] * (1 + (i * 7) % 11))
    if i % 13 == 5:
        body += " " + "long " * 600  # above max_message_chars: stored whole
    if i % 9 == 8:
        body = "New topic: " + body
    digest = hashlib.sha256(body.encode()).hexdigest()[:16]
    return f"{body} [sha {digest}]"


def is_whole(text: str) -> bool:
    body, _, tail = text.rpartition(" [sha ")
    return tail.endswith("]") and hashlib.sha256(body.encode()).hexdigest()[:16] == tail[:-1]


def _appender_main(url: str, cids: list[str], started: str) -> None:
    """Appends to each conversation in its own task until killed; messages are numbered per conversation."""

    async def one(hc: HistoryCompressor, cid: str) -> None:
        i = 0
        while True:
            role = "user" if i % 2 == 0 else "assistant"
            await hc.add_message(cid, {"role": role, "content": message_text(cid, i)})
            if i == 3 and cid == cids[0]:
                Path(started).write_text("go")
            if i % 10 == 9:
                await hc.get_context(cid, 500)
            i += 1

    async def main() -> None:
        async with HistoryCompressor(url, settings=crash_settings()) as hc:
            await asyncio.gather(*(one(hc, cid) for cid in cids))

    asyncio.run(main())


# -- tests ------------------------------------------------------------------------------------


async def _build_topics(hc: HistoryCompressor, cids: Sequence[str], topics: int) -> dict[str, list[str]]:
    sent: dict[str, list[str]] = {}
    for cid in cids:
        mine = sent.setdefault(cid, [])
        for t in range(topics + 1):
            for k in range(4 if t < topics else 1):
                role = "user" if k % 2 == 0 else "assistant"
                prefix = "New topic: " if k == 0 and t > 0 else ""
                text = f"{prefix}{cid} topic {t} turn {k}: {FILLER}. More on {t}.{k}: {FILLER}."
                await hc.add_message(cid, {"role": role, "content": text})
                mine.append(text)
        assert len((await hc.get_history(cid)).topics) >= topics
    return sent


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stall", ["summarize", "merge"])
async def test_worker_killed_mid_summary_or_merge(sql_url: str, tmp_path: Path, stall: str) -> None:
    cids = ["crash-a", "crash-b"]
    marker = tmp_path / "stalled"
    child = SPAWN.Process(target=_stalling_worker_main, args=(sql_url, stall, str(marker)))
    async with HistoryCompressor(sql_url, settings=crash_settings()) as hc:
        sent = await _build_topics(hc, cids, topics=5)
        child.start()
        try:
            await wait_for_file(marker, child)
            held = [await hc.store.state(cid) for cid in cids]
            assert any(s is not None and s.lease_owner for s in held), "the child holds no lease"
            sigkill(child)
        finally:
            if child.is_alive():
                child.kill()
                child.join(5)
        before = await hc.get_history(cids[0])
        if stall == "merge":
            # Killed between summarising and merging: summaries saved, no archive yet.
            assert before.topics[0].status == "final" and before.archives == []
        else:
            assert all(t.status == "pending" for t in before.topics)
        # While the dead worker's lease lasts, the conversation still answers within budget.
        ctx = await hc.get_context(cids[0], 300)
        assert ctx.total_tokens <= 300
        await wait_out_leases(hc, cids)
        reports = await maintain_until_quiet(hc)
        assert sum(r.lease_lost for r in reports) == 0
        totals = Counter[str]()
        for cid in cids:
            totals.update(await check_invariants(hc, cid, sent[cid]))
            for budget in (100, 400, 800, 3000):
                check_context(await hc.get_context(cid, budget), budget)
        assert totals["topics"] >= 10
        assert totals["archives"] >= 2, "no merges: the test did not exercise escalation"


@pytest.mark.timeout(120)
async def test_appender_killed_at_a_random_point(sql_url: str, tmp_path: Path) -> None:
    cids = ["append-a", "append-b", "append-c"]
    started = tmp_path / "started"
    child = SPAWN.Process(target=_appender_main, args=(sql_url, cids, str(started)))
    child.start()
    try:
        await wait_for_file(started, child)
        await asyncio.sleep(random.uniform(0.3, 2.0))
        sigkill(child)
    finally:
        if child.is_alive():
            child.kill()
            child.join(5)
    async with HistoryCompressor(sql_url, settings=crash_settings()) as hc:
        for cid in cids:
            h = await hc.get_history(cid)
            n = len(h.messages)
            assert n >= 1 if cid != cids[0] else n >= 4
            assert [m.sequence for m in h.messages] == list(range(1, n + 1)), f"{cid}: sequence gap"
            for m in h.messages:
                assert m.content == message_text(cid, m.sequence - 1), f"{cid}: message {m.sequence} corrupt"
                assert is_whole(m.content)
                # Stored whole and counted whole, however long (cut only under budget pressure).
                assert m.truncated_content is None and m.token_count == m.full_token_count
            state = await hc.store.state(cid)
            assert state is not None and state.last_sequence == n
            # The conversation carries on where it stopped.
            nxt = await hc.add_message(cid, {"role": "user", "content": message_text(cid, n)})
            assert nxt.sequence == n + 1
        await maintain_until_quiet(hc)
        for cid in cids:
            expected = [message_text(cid, i) for i in range(len((await hc.get_history(cid)).messages))]
            await check_invariants(hc, cid, expected)
            for budget in (500, 5000):
                check_context(await hc.get_context(cid, budget), budget)


@pytest.mark.timeout(180)
async def test_worker_killed_at_random_points_during_maintenance(sql_url: str, tmp_path: Path) -> None:
    """Three workers in a row are killed wherever they are: in a transaction, between two, summarising."""
    cids = ["random-a", "random-b", "random-c"]
    rng = random.Random()
    async with HistoryCompressor(sql_url, settings=crash_settings()) as hc:
        sent = await _build_topics(hc, cids, topics=8)
        for round_ in range(3):
            marker = tmp_path / f"busy{round_}"
            child = SPAWN.Process(target=_looping_worker_main, args=(sql_url, str(marker)))
            child.start()
            try:
                await wait_for_file(marker, child)
                await asyncio.sleep(rng.uniform(0.05, 0.6))
                sigkill(child)
            finally:
                if child.is_alive():
                    child.kill()
                    child.join(5)
            # Between kills nothing may be half-written.
            for cid in cids:
                h = await hc.get_history(cid)
                assert [m.content for m in h.messages] == sent[cid]
                assert (await hc.get_context(cid, 300)).total_tokens <= 300
        await wait_out_leases(hc, cids)
        await maintain_until_quiet(hc)
        totals = Counter[str]()
        for cid in cids:
            totals.update(await check_invariants(hc, cid, sent[cid]))
            for budget in (150, 600, 3000):
                check_context(await hc.get_context(cid, budget), budget)
        assert totals["archives"] >= 3


async def test_a_pass_gives_its_lease_back_with_its_last_commit(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed right after its pass's last commit leaves no lease behind: the ``finish``
    commit releases it in the same transaction (the separate release that follows never runs
    here). Before, the lease stayed in the row, and a conversation that is not due is never
    claimed again to clear it."""
    async with HistoryCompressor(db_url, settings=crash_settings()) as hc:
        sent = await _build_topics(hc, ["solo"], topics=4)
        calls: list[str] = []

        async def killed_before_release(owner: str, conversation_id: str) -> None:
            calls.append(conversation_id)

        monkeypatch.setattr(hc.store, "release", killed_before_release)
        report = await hc.maintain()
        assert report.summarized > 0 and not report.errors
        assert calls == ["solo"]  # the separate release was reached (and did nothing here)
        state = await hc.store.state("solo")
        assert state is not None and state.lease_owner is None and state.lease_expires_at is None
        await check_invariants(hc, "solo", sent["solo"])
