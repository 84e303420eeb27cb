"""``python -m bench.summaries``: how much query evidence the offline summaries keep, topic by topic.

A proxy for what the product is judged on. Every topic of a QMSum meeting (``topic_list``; a
topic's turns are the union of its spans) is sealed on its own: its turns go to the summariser as
``SummaryInput(role="user", name=<sanitised speaker>)`` and are summarised at each target. For every
specific query whose evidence overlaps the topic, retention is the share of the evidence's content
words (``bench.retention.data.content_words``, counting only the evidence turns inside the topic)
found in the summary text, speaker labels and date headers left out (so that a label such as
``User`` scores for no system). Archives merge the summaries of 3 consecutive topics at 1x and 2x
the topic target; roll-ups merge 3 consecutive archives at the archive's own target; their
retention counts the evidence turns inside all the topics they cover.

Systems: ``main`` (the summariser as it is on git ``main``, loaded from ``git show`` at run time),
``ours`` (the working tree's), ``ours+vocab`` (the same, given the conversation's document
frequencies up to the end of what it summarises, as the engine will pass them), ``lead`` (the first
sentence of each turn, then of each summary line, in order until the target) and ``random``
(random sentences, seeded, in source order). Tune on train/val; the figures to quote are test's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import subprocess
import sys
import time
import types
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from bench._common import REPO, log, table
from bench.retention.data import Meeting, Turn, content_words, load_meeting, meeting_paths
from tests._readable import merge_problems, summary_problems
from tiered_history.summarizers.base import SummaryInput, SummaryPiece
from tiered_history.summarizers.extractive import ExtractiveSummarizer, vocabulary_words
from tiered_history.tokens import TokenCounter

SYSTEMS = ("main", "ours", "ours+vocab", "lead", "random")
TARGETS = (40, 80, 160, 320)
LEVELS = ("topic", "archive 1x", "archive 2x", "roll-up 1x", "roll-up 2x")
#: Summaries merged into one archive, and archives into one roll-up.
FAN_IN = 3

_LABEL_RE = re.compile(
    r"^(?:(?:User|Assistant|System|Tool|Other)(?: \"[^\"\n]*\")?: |- |[\w-]{1,64}(?: \(\w+\))?: )"
)
_HEADER_RE = re.compile(r"^\[[^\]\n]*\]$")
_MARKUP_RE = re.compile(r"\{(?:disfmarker|vocalsound|nonvocalsound|gap|pause|comment)\}", re.I)
_DISFLUENCY_RE = re.compile(r"(?<!\S)(?:um+|uh+|uhm|erm|mm+(?:-?hmm)?|mhm|hm+)(?:\s*,)?(?!\S)", re.I)
_SENTENCE_RE = re.compile(r"(?<=[.!?])\s+")


def summary_words(text: str) -> set[str]:
    """Content words of a summary, its speaker labels and date headers left out."""
    lines = (_LABEL_RE.sub("", line) for line in text.splitlines() if not _HEADER_RE.match(line.strip()))
    return content_words("\n".join(lines))


# -- systems ----------------------------------------------------------------------------------------


class System(Protocol):
    async def summarize(
        self, messages: Sequence[SummaryInput], target: int, vocabulary: Mapping[str, int]
    ) -> str: ...

    async def merge(
        self, pieces: Sequence[SummaryPiece], target: int, vocabulary: Mapping[str, int]
    ) -> str: ...


def load_main_summarizer(rev: str = "main") -> Any:
    """``ExtractiveSummarizer`` as it is at git ``rev``, imported from ``git show`` (no copy kept)."""
    source = subprocess.run(
        ["git", "show", f"{rev}:tiered_history/summarizers/extractive.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    name = "tiered_history.summarizers._bench_main_extractive"
    module = types.ModuleType(name)
    module.__package__ = "tiered_history.summarizers"
    module.__file__ = f"<git show {rev}:tiered_history/summarizers/extractive.py>"
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module.ExtractiveSummarizer


class Main:
    def __init__(self, counter: TokenCounter) -> None:
        self.inner = load_main_summarizer()(counter)

    async def summarize(
        self, messages: Sequence[SummaryInput], target: int, vocabulary: Mapping[str, int]
    ) -> str:
        return str((await self.inner.summarize(messages, target)).text)

    async def merge(self, pieces: Sequence[SummaryPiece], target: int, vocabulary: Mapping[str, int]) -> str:
        return str((await self.inner.merge(pieces, target)).text)


class Ours:
    def __init__(self, counter: TokenCounter, use_vocabulary: bool) -> None:
        self.inner = ExtractiveSummarizer(counter)
        self.use_vocabulary = use_vocabulary

    async def summarize(
        self, messages: Sequence[SummaryInput], target: int, vocabulary: Mapping[str, int]
    ) -> str:
        vocab = vocabulary if self.use_vocabulary else None
        return (await self.inner.summarize(messages, target, vocabulary=vocab)).text

    async def merge(self, pieces: Sequence[SummaryPiece], target: int, vocabulary: Mapping[str, int]) -> str:
        vocab = vocabulary if self.use_vocabulary else None
        return (await self.inner.merge(pieces, target, vocabulary=vocab)).text


def _label(m: SummaryInput) -> str:
    return f'{m.role.capitalize()} "{m.name}": ' if m.name else f"{m.role.capitalize()}: "


def _sentences(text: str) -> list[str]:
    text = " ".join(_DISFLUENCY_RE.sub(" ", _MARKUP_RE.sub(" ", text)).split())
    return [s for s in _SENTENCE_RE.split(text) if any(c.isalnum() for c in s)]


class _Simple:
    """Baselines that pick (label, sentence) items by a fixed rule and keep them in source order."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter

    def pick(self, items: list[list[tuple[str, str]]], seed: str) -> list[tuple[int, int]]:
        raise NotImplementedError

    def fill(self, items: list[list[tuple[str, str]]], target: int, seed: str) -> str:
        chosen: set[tuple[int, int]] = set()
        used = 0
        for i, j in self.pick(items, seed):
            label, sentence = items[i][j]
            cost = self.counter.count(label + sentence) + 1
            if used + cost <= target:
                chosen.add((i, j))
                used += cost
        lines = [items[i][j][0] + items[i][j][1] for i, j in sorted(chosen)]
        text = "\n".join(lines)
        while lines and self.counter.count(text) > target:
            lines.pop()
            text = "\n".join(lines)
        return text

    async def summarize(
        self, messages: Sequence[SummaryInput], target: int, vocabulary: Mapping[str, int]
    ) -> str:
        items = [[(_label(m), s) for s in _sentences(m.content)] for m in messages]
        return self.fill(items, target, f"{messages[0].sequence}-{target}")

    async def merge(self, pieces: Sequence[SummaryPiece], target: int, vocabulary: Mapping[str, int]) -> str:
        items: list[list[tuple[str, str]]] = []
        for p in pieces:
            for line in p.text.splitlines():
                label = m.group(0) if (m := _LABEL_RE.match(line)) else ""
                items.append([(label, s) for s in _sentences(line[len(label) :])])
        return self.fill(items, target, f"{pieces[0].first_sequence}-{target}")


class Lead(_Simple):
    """The first sentence of every turn (or summary line), then the second of each, and so on."""

    def pick(self, items: list[list[tuple[str, str]]], seed: str) -> list[tuple[int, int]]:
        return sorted(
            ((i, j) for i, row in enumerate(items) for j in range(len(row))), key=lambda ij: ij[::-1]
        )


class Random(_Simple):
    def pick(self, items: list[list[tuple[str, str]]], seed: str) -> list[tuple[int, int]]:
        order = [(i, j) for i, row in enumerate(items) for j in range(len(row))]
        random.Random(seed).shuffle(order)
        return order


def make_system(name: str, counter: TokenCounter) -> System:
    if name == "main":
        return Main(counter)
    if name in ("ours", "ours+vocab"):
        return Ours(counter, name == "ours+vocab")
    if name == "lead":
        return Lead(counter)
    if name == "random":
        return Random(counter)
    raise SystemExit(f"unknown system {name!r}")


# -- one meeting ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Unit:
    """A topic, archive or roll-up: the turns it covers and its text."""

    turns: frozenset[int]
    text: str
    first: Turn
    last: Turn


@dataclass
class MeetingResult:
    scores: dict[tuple[str, str, int], list[float]]
    """(level, system, target) -> retention of each (query, unit) pair."""
    ms: dict[str, list[tuple[int, float]]]
    """system -> (source tokens, milliseconds) of each topic summary."""
    readable: dict[str, list[int]]
    """system -> [texts checked, texts failing the readability check of ``tests/_readable.py``]."""


def topics_of(path: Path, meeting: Meeting) -> list[list[Turn]]:
    """Each topic's stored turns, in order; topics ordered by their first turn."""
    data = json.loads(path.read_text(encoding="utf-8"))
    by_index = {t.index: t for t in meeting.turns}
    topics: list[list[Turn]] = []
    for topic in data.get("topic_list", []):
        indices = {k for a, b in topic["relevant_text_span"] for k in range(int(a), int(b) + 1)}
        turns = [by_index[k] for k in sorted(indices) if k in by_index]
        if turns:
            topics.append(turns)
    return sorted(topics, key=lambda ts: (ts[0].index, ts[-1].index))


def _scores(meeting: Meeting, unit: Unit, words_of: Mapping[int, set[str]]) -> list[float]:
    kept = summary_words(unit.text)
    out: list[float] = []
    for query in meeting.queries:
        evidence: set[str] = set()
        for k in query.turns:
            if k in unit.turns:
                evidence |= words_of.get(k, set())
        if evidence:
            out.append(len(evidence & kept) / len(evidence))
    return out


def _piece(unit: Unit) -> SummaryPiece:
    return SummaryPiece(
        text=unit.text,
        first_sequence=unit.first.sequence,
        last_sequence=unit.last.sequence,
        started_at=unit.first.timestamp,
        ended_at=unit.last.timestamp + timedelta(seconds=1),
    )


def _vocabularies(meeting: Meeting, ends: Sequence[int]) -> dict[int, dict[str, int]]:
    """Document frequencies of the turns up to each of ``ends`` (turn indices): what the engine knows then."""
    wanted = sorted(set(ends))
    df: Counter[str] = Counter()
    out: dict[int, dict[str, int]] = {}
    turns = iter(meeting.turns)
    docs = 0
    pending = next(turns, None)
    for end in wanted:
        while pending is not None and pending.index <= end:
            df.update(vocabulary_words(pending.content))
            docs += 1
            pending = next(turns, None)
        out[end] = {**df, "": docs}
    return out


async def _run_meeting(path: Path, systems: Sequence[str], targets: Sequence[int]) -> MeetingResult:
    counter = TokenCounter()
    meeting = load_meeting(path)
    topics = topics_of(path, meeting)
    words_of = {t.index: content_words(t.content) for t in meeting.turns}
    tokens_of = {t.index: counter.count(t.content) for t in meeting.turns}
    vocab = _vocabularies(meeting, [ts[-1].index for ts in topics])
    result = MeetingResult(defaultdict(list), defaultdict(list), defaultdict(lambda: [0, 0]))
    for name in systems:
        system = make_system(name, counter)
        for target in targets:
            summaries: list[Unit] = []
            for turns in topics:
                messages = [SummaryInput(t.sequence, "user", t.content, t.timestamp, t.name) for t in turns]
                started = time.perf_counter()
                text = await system.summarize(messages, target, vocab[turns[-1].index])
                elapsed = (time.perf_counter() - started) * 1000
                if target == targets[0]:
                    result.ms[name].append((sum(tokens_of[t.index] for t in turns), elapsed))
                unit = Unit(frozenset(t.index for t in turns), text, turns[0], turns[-1])
                summaries.append(unit)
                result.readable[name][0] += 1
                result.readable[name][1] += bool(summary_problems(text, messages))
                result.scores[("topic", name, target)] += _scores(meeting, unit, words_of)
            for factor in (1, 2):
                archives = await _merge_level(
                    system, summaries, target * factor, vocab, result.readable[name]
                )
                result.scores[(f"archive {factor}x", name, target)] += [
                    s for a in archives for s in _scores(meeting, a, words_of)
                ]
                rollups = await _merge_level(system, archives, target * factor, vocab, result.readable[name])
                result.scores[(f"roll-up {factor}x", name, target)] += [
                    s for r in rollups for s in _scores(meeting, r, words_of)
                ]
    return result


async def _merge_level(
    system: System,
    units: list[Unit],
    target: int,
    vocab: Mapping[int, Mapping[str, int]],
    readable: list[int],
) -> list[Unit]:
    """Merge consecutive ``units`` :data:`FAN_IN` at a time (a last group of one is not a merge)."""
    out: list[Unit] = []
    for i in range(0, len(units), FAN_IN):
        group = units[i : i + FAN_IN]
        if len(group) < 2:
            continue
        last = max(vocab)
        end = min((k for k in vocab if k >= group[-1].last.index), default=last)
        pieces = [_piece(u) for u in group]
        text = await system.merge(pieces, target, vocab[end])
        readable[0] += 1
        readable[1] += bool(merge_problems(text, pieces))
        out.append(Unit(frozenset().union(*(u.turns for u in group)), text, group[0].first, group[-1].last))
    return out


def run_meeting(path: Path, systems: Sequence[str], targets: Sequence[int]) -> MeetingResult:
    result = asyncio.run(_run_meeting(path, systems, targets))
    result.readable = dict(result.readable)  # picklable: no default factory
    return result


# -- report -----------------------------------------------------------------------------------------


def _mean(values: Sequence[float]) -> str:
    return f"{100 * statistics.fmean(values):.1f}" if values else "–"


def retention_table(
    results: Mapping[str, Mapping[tuple[str, str, int], list[float]]],
    systems: Sequence[str],
    targets: Sequence[int],
) -> str:
    splits = list(results)
    headers = ["level", "system"] + [f"{t} ({' / '.join(splits)})" for t in targets]
    rows = []
    for level in LEVELS:
        for name in systems:
            cells = [" / ".join(_mean(results[s].get((level, name, t), [])) for s in splits) for t in targets]
            rows.append([level, name, *cells])
    return table(headers, rows)


def timing_table(ms: Mapping[str, Mapping[str, list[tuple[int, float]]]], systems: Sequence[str]) -> str:
    rows = []
    for name in systems:
        calls = [c for split in ms.values() for c in split.get(name, [])]
        if not calls:
            continue
        near_3k = [m for tokens, m in calls if 2_500 <= tokens <= 3_500]
        per_1k = statistics.fmean(m / max(tokens, 1) * 1000 for tokens, m in calls)
        rows.append(
            [
                name,
                len(calls),
                f"{statistics.median(m for _, m in calls):.1f}",
                f"{statistics.fmean(near_3k):.1f} ({len(near_3k)})" if near_3k else "–",
                f"{max(m for _, m in calls):.0f}",
                f"{per_1k:.1f}",
            ]
        )
    headers = [
        "system",
        "topic summaries",
        "median ms",
        "mean ms, 2.5k-3.5k tokens (n)",
        "max ms",
        "ms / 1k tokens",
    ]
    return table(headers, rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Evidence retention of topic summaries, archives and roll-ups.")
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--split", default="val,test", help="comma-separated: train, val, test (side by side)")
    p.add_argument("--limit", type=int, default=0, help="meetings per split, spread over it (0 = all)")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--targets", default=",".join(map(str, TARGETS)))
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args(argv)
    systems = [s for s in args.systems.split(",") if s]
    targets = [int(t) for t in args.targets.split(",")]
    scores: dict[str, dict[tuple[str, str, int], list[float]]] = {}
    ms: dict[str, dict[str, list[tuple[int, float]]]] = {}
    readable: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    started = time.perf_counter()
    for split in args.split.split(","):
        paths = meeting_paths(args.data, split, args.limit or None)
        merged_scores: dict[tuple[str, str, int], list[float]] = defaultdict(list)
        merged_ms: dict[str, list[tuple[int, float]]] = defaultdict(list)
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(run_meeting, path, systems, targets) for path in paths]
            for done, future in enumerate(futures, 1):
                r = future.result()
                for level_key, values in r.scores.items():
                    merged_scores[level_key] += values
                for name, calls in r.ms.items():
                    merged_ms[name] += calls
                for name, (checked, failed) in r.readable.items():
                    readable[name][0] += checked
                    readable[name][1] += failed
                log(f"{split}: {done}/{len(paths)} meetings")
        scores[split], ms[split] = merged_scores, merged_ms
    pairs = {s: len(v.get(("topic", systems[0], targets[0]), [])) for s, v in scores.items()}
    print(f"Mean evidence retention (%), cells are {' / '.join(scores)}; (query, topic) pairs: {pairs}\n")
    print(retention_table(scores, systems, targets))
    print(
        "\nReadable (tests/_readable.py: true role labels, verbatim pieces), share of all summaries, "
        "archives and roll-ups: "
        + ", ".join(f"{n} {100 * (1 - readable[n][1] / max(readable[n][0], 1)):.1f}%" for n in systems)
    )
    print(f"\nTopic summary time (target {targets[0]}, {args.jobs} processes at once):\n")
    print(timing_table(ms, systems))
    log(f"done in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
