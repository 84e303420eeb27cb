"""Roll-ups choose from the messages their archives stand for, not from summaries of summaries.

Each level of summarising a summary loses more (QMSum, static retention at 1k / 2k: +1.9 / +1.4
points on the test split with roll-ups chosen from the messages). Only a summariser that says
its ``merge`` takes them is handed the messages (the offline one): a model would be paid for
every token, so it keeps merging texts. The work is bounded and runs off the event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests._readable import rollup_problems
from tiered_history import HistoryCompressor, Message
from tiered_history import maintenance as maintenance_module
from tiered_history.summarizers import extractive as extractive_module
from tiered_history.summarizers.base import SummaryInput, SummaryPiece, SummaryResult
from tiered_history.summarizers.extractive import ExtractiveSummarizer

CID = "c"
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
WORDS = [
    *("harbour", "lantern", "copper", "violet", "granite", "meadow", "falcon", "saffron", "quartz"),
    *("tundra", "cobalt", "orchard", "glacier", "pepper", "walnut", "cedar", "marble", "thistle"),
    *("lagoon", "ember"),
]


def sentence(topic: int, k: int) -> str:
    a, b, c = WORDS[topic % 20], WORDS[(topic * 7 + k) % 20], WORDS[(topic * 3 + 2 * k + 1) % 20]
    return f"In topic {topic} the {a} plan needs {b} crates and {c} permits by day {topic * 10 + k}."


class Recording:
    """Notes what each merge of the offline summariser is handed (with the offline summariser
    configured, the pipeline runs its own instance of it, so the class is watched)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.merges: list[tuple[list[SummaryPiece], list[list[int] | None] | None, str]] = []
        original = ExtractiveSummarizer.merge

        async def merge(
            summarizer: ExtractiveSummarizer,
            pieces: Sequence[SummaryPiece],
            target_tokens: int,
            *,
            vocabulary: Any = None,
            sources: Sequence[Sequence[SummaryInput] | None] | None = None,
            **more: Any,
        ) -> SummaryResult:
            result = await original(
                summarizer, pieces, target_tokens, vocabulary=vocabulary, sources=sources, **more
            )
            seqs = None if sources is None else [[m.sequence for m in s] if s else None for s in sources]
            self.merges.append((list(pieces), seqs, result.text))
            return result

        monkeypatch.setattr(ExtractiveSummarizer, "merge", merge)


class ModelLike:
    """A summariser behind the protocol only (as an LLM's is): no ``reads_sources``."""

    name = "model-like"

    def __init__(self) -> None:
        self.inner = ExtractiveSummarizer()
        self.merge_calls: list[dict[str, Any]] = []

    async def summarize(self, messages: Sequence[SummaryInput], target_tokens: int) -> SummaryResult:
        return await self.inner.summarize(messages, target_tokens)

    async def merge(self, pieces: Sequence[SummaryPiece], target_tokens: int, **kw: Any) -> SummaryResult:
        self.merge_calls.append(kw)
        return await self.inner.merge(pieces, target_tokens)


async def feed(hc: HistoryCompressor, topics: int, *, pinned_every: int = 0) -> int:
    """``topics`` sealed topics of four messages each, maintained as they come; returns the roll-ups."""
    rolled = 0
    n = 0
    for t in range(topics):
        for k in range(4):
            n += 1
            role = "user" if k % 2 == 0 else "assistant"
            pin = bool(pinned_every) and n % pinned_every == 0
            at = T0 + timedelta(minutes=n)
            await hc.add_message(CID, Message(role=role, content=sentence(t, k), timestamp=at, pinned=pin))
        await hc.seal_current_topic(CID)
        rolled += (await hc.maintain(CID, now=T0 + timedelta(minutes=n + 1))).rolled_up
    return rolled


async def test_a_rollup_is_handed_the_unpinned_messages_of_each_archive_and_quotes_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rec = Recording(monkeypatch)
    async with HistoryCompressor.from_url("memory://", context_budget=600) as hc:
        rolled = await feed(hc, 24, pinned_every=7)
        assert rolled >= 2
        history = await hc.get_history(CID)
        by_seq = {m.sequence: m for m in history.messages}
        archives = {(a.first_sequence, a.last_sequence): a for a in history.archives}
        rollups = [(p, s, text) for p, s, text in rec.merges if s is not None]
        assert len(rollups) == rolled
        for pieces, seqs, text in rollups:
            assert seqs is not None and len(seqs) == len(pieces)
            messages: list[SummaryInput] = []
            for piece, seq in zip(pieces, seqs, strict=True):
                assert (piece.first_sequence, piece.last_sequence) in archives  # pieces are archives
                expected = [
                    s
                    for s in range(piece.first_sequence, piece.last_sequence + 1)
                    if not by_seq[s].pinned  # pinned messages are sent verbatim anyway
                ]
                assert seq == expected
                messages += [
                    SummaryInput(s, by_seq[s].role, by_seq[s].content, by_seq[s].timestamp) for s in seq
                ]
            assert text and rollup_problems(text, [], messages) == [], text
        # Merges of topic summaries into an archive keep merging texts.
        assert any(s is None for _, s, _ in rec.merges)
        # The coarsest archive still starts with the conversation.
        live = [a for a in history.archives if a.merged_into is None]
        assert min(a.first_sequence for a in live) == 1


async def test_a_summariser_that_does_not_read_sources_is_never_handed_them() -> None:
    model = ModelLike()
    async with HistoryCompressor.from_url("memory://", summarizer=model, context_budget=600) as hc:
        assert await feed(hc, 24) >= 2
    assert model.merge_calls and all(kw == {} for kw in model.merge_calls)


# Archives of three topics stand for about 280 tokens: a cap of 400 tokens, or of 4 per token of
# the roll-up's target (the bulk share at 600 tokens: 87), reads the newest one's messages and
# gives the older (the previous roll-up, larger each time) as its text.
@pytest.mark.parametrize(("cap", "value"), [("ROLLUP_SOURCE_TOKENS", 400), ("ROLLUP_SOURCE_RATIO", 4)])
async def test_older_archives_beyond_the_source_cap_take_part_through_their_text(
    cap: str, value: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(maintenance_module, cap, value)
    rec = Recording(monkeypatch)
    async with HistoryCompressor.from_url("memory://", context_budget=600) as hc:
        assert await feed(hc, 24) >= 2
    rollups = [s for _, s, _ in rec.merges if s is not None]
    assert len(rollups) >= 2
    for seqs in rollups:
        assert seqs[0] is None  # the previous roll-up: its range is over the cap
        assert any(s is not None for s in seqs)  # the newest archives still read their messages
        # Read newest first: once one archive is given as text, every older one is too.
        first_read = next(i for i, s in enumerate(seqs) if s is not None)
        assert all(s is not None for s in seqs[first_read:])


def test_a_merge_of_many_source_messages_runs_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[str] = []
    original = ExtractiveSummarizer._merge_sources

    def noting(self: ExtractiveSummarizer, *args: Any) -> str:
        threads.append(threading.current_thread().name)
        return original(self, *args)

    monkeypatch.setattr(ExtractiveSummarizer, "_merge_sources", noting)
    messages = [SummaryInput(i, "user", sentence(i, 0), T0 + timedelta(minutes=i)) for i in range(40)]
    pieces = [
        SummaryPiece("User: the harbour plan.", 0, 19, T0, T0 + timedelta(minutes=19)),
        SummaryPiece("User: the lantern plan.", 20, 39, T0 + timedelta(minutes=20), T0 + timedelta(hours=1)),
    ]
    summarizer = ExtractiveSummarizer()
    for limit in (1000, 10):
        monkeypatch.setattr(extractive_module, "THREAD_MESSAGES", limit)
        asyncio.run(summarizer.merge(pieces, 12, sources=[messages[:20], messages[20:]]))
    main = threading.main_thread().name
    assert threads[0] == main and threads[1] != main


def test_room_follows_what_each_piece_stands_for() -> None:
    # The first archive stands for 30 messages, the second for 2: given their messages, most of
    # the roll-up's lines come from the first (by their texts alone, both looked the same size).
    old = [SummaryInput(i, "user", sentence(i, 1), T0 + timedelta(minutes=i)) for i in range(30)]
    new = [SummaryInput(30 + i, "assistant", sentence(40 + i, 2), T0 + timedelta(hours=2)) for i in range(2)]
    # Texts of the same size (a roll-up must be smaller than the archives it replaces).
    old_text = "User: " + " ".join(m.content for m in old[:4])
    new_text = "Assistant: " + " ".join(m.content for m in new) * 2
    pieces = [
        SummaryPiece(old_text, 0, 29, T0, T0 + timedelta(minutes=29)),
        SummaryPiece(new_text, 30, 31, T0 + timedelta(hours=2), T0 + timedelta(hours=2)),
    ]
    text = asyncio.run(ExtractiveSummarizer().merge(pieces, 90, sources=[old, new])).text
    lines = [line for line in text.splitlines() if not line.startswith("[")]
    assert rollup_problems(text, [], old + new) == [], text
    from_old = sum(line.count("In topic") for line in lines if line.startswith("User"))
    from_new = sum(line.count("In topic") for line in lines if line.startswith("Assistant"))
    assert from_old >= 2 and from_old > from_new


def test_an_older_archive_given_as_its_text_weighs_what_it_stands_for() -> None:
    # Past the source cap the previous roll-up comes as its text: it stands for the whole earlier
    # timeline (its source_tokens), not for its few lines, and keeps its share of the new roll-up
    # (weighed by its text it got a sliver at every roll-up, and old facts wore away).
    old_lines = [sentence(i, 1) for i in range(12)]
    old_text = "User: " + " ".join(old_lines)
    new = [
        SummaryInput(100 + i, "assistant", sentence(40 + i, 2), T0 + timedelta(hours=2)) for i in range(30)
    ]
    pieces = [
        SummaryPiece(old_text, 0, 99, T0, T0 + timedelta(hours=1), source_tokens=40_000),
        SummaryPiece("Assistant: the new plans.", 100, 129, T0 + timedelta(hours=2), T0 + timedelta(hours=3)),
    ]
    text = asyncio.run(ExtractiveSummarizer().merge(pieces, 120, sources=[None, new])).text
    lines = [line for line in text.splitlines() if not line.startswith("[")]
    from_old = sum(line.count("In topic") for line in lines if line.startswith("User"))
    from_new = sum(line.count("In topic") for line in lines if line.startswith("Assistant"))
    assert from_old > from_new, text
