"""Topic-boundary detection quality on TIAGE (topic-shift labels) and QMSum (topic spans).

    python -m bench.boundaries [--data ../shared/data] [--out docs/benchmarks.md]

Each conversation is replayed turn by turn, as ``add_message`` would see it: a rule
decides, before turn ``i`` is stored, whether the open topic ends there. Predicted
boundaries are compared with the gold ones:

- TIAGE: a gold boundary is a turn labelled ``"1"`` (the first turn is never one);
  precision / recall / F1 are micro-averaged over all turns. Thresholds are tuned on
  train + dev, and the test split is reported.
- QMSum: gold boundaries are the start turns of the topic spans, except the earliest.
  Reported exactly and with a tolerance of ±5 turns (one-to-one greedy matching), tuned
  on train + val (for F1 at ±5 turns), reported on test.

Rules: the library's explicit phrases (``explicit_boundary`` with
``DEFAULT_TRIGGER_PHRASES``; by default only user messages trigger, TIAGE turns
alternate user/assistant and every QMSum turn is a user message), the size rule
(``size_boundary`` with exact framed token counts and the default limit of
``topic_size_limit(8000, 0.5, 0.6)`` tokens; also with a tuned limit), the library's
combined ``decide`` (explicit + temporal + size, default settings), baselines, and an
optional lexical detector implemented here (see :class:`Lexical`). The temporal rule
is not evaluated: neither dataset has timestamps.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import REPO, git_revision, log, machine, table, update_section
from tiered_history import HistoryCompressor
from tiered_history.core.boundaries import (
    BoundaryRules,
    OpenTopic,
    decide,
    explicit_boundary,
    size_boundary,
)
from tiered_history.core.budget import topic_size_limit
from tiered_history.settings import DEFAULT_TRIGGER_PHRASES
from tiered_history.tokens import TokenCounter

TOLERANCE = 5


@dataclass(frozen=True, slots=True)
class Dialog:
    turns: list[str]
    roles: list[str]
    tokens: list[int]
    gold: frozenset[int]
    """Indices of turns that start a new topic (never 0)."""


# -- loading ------------------------------------------------------------------------------------------


def load_tiage(path: Path, counter: TokenCounter) -> list[Dialog]:
    data = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for turns in data.values():
        texts = [t[0] for t in turns]
        gold = frozenset(i for i, t in enumerate(turns) if i > 0 and str(t[1]) == "1")
        roles = ["user" if i % 2 == 0 else "assistant" for i in range(len(texts))]
        out.append(Dialog(texts, roles, _tokens(counter, texts, roles), gold))
    return out


def load_qmsum(folder: Path, counter: TokenCounter) -> list[Dialog]:
    out = []
    for f in sorted(folder.glob("*.json")):
        m = json.loads(f.read_text(encoding="utf-8"))
        texts = [str(t.get("content", "")) for t in m["meeting_transcripts"]]
        starts = sorted({int(a) for t in m["topic_list"] for a, _b in t["relevant_text_span"]})
        gold = frozenset(s for s in starts[1:] if 0 < s < len(texts))
        roles = ["user"] * len(texts)
        out.append(Dialog(texts, roles, _tokens(counter, texts, roles), gold))
    return out


def _tokens(counter: TokenCounter, texts: Sequence[str], roles: Sequence[str]) -> list[int]:
    return [counter.message_tokens({"role": r, "content": t}) for t, r in zip(texts, roles, strict=True)]


# -- scoring ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Score:
    tp: int
    fp: int
    fn: int

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 0.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    def __add__(self, other: Score) -> Score:
        return Score(self.tp + other.tp, self.fp + other.fp, self.fn + other.fn)


def match(pred: Iterable[int], gold: Iterable[int], tolerance: int) -> Score:
    """One-to-one greedy matching of predicted to gold boundaries within ``tolerance`` turns."""
    free = sorted(gold)
    tp = fp = 0
    for p in sorted(pred):
        best = None
        for g in free:
            if abs(g - p) <= tolerance and (best is None or abs(g - p) < abs(best - p)):
                best = g
        if best is None:
            fp += 1
        else:
            tp += 1
            free.remove(best)
    return Score(tp, fp, len(free))


def score(dialogs: Sequence[Dialog], preds: Sequence[set[int]], tolerance: int = 0) -> Score:
    total = Score(0, 0, 0)
    for d, p in zip(dialogs, preds, strict=True):
        total = total + match(p, d.gold, tolerance)
    return total


# -- rules ----------------------------------------------------------------------------------------------

Detector = Callable[[Dialog], set[int]]


def never(_d: Dialog) -> set[int]:
    return set()


def every_k(k: int) -> Detector:
    def run(d: Dialog) -> set[int]:
        return set(range(k, len(d.turns), k))

    return run


def explicit(any_role: bool) -> Detector:
    phrases = DEFAULT_TRIGGER_PHRASES

    def run(d: Dialog) -> set[int]:
        return {
            i
            for i in range(1, len(d.turns))
            if (any_role or d.roles[i] == "user") and explicit_boundary(d.turns[i], phrases)
        }

    return run


def size_rule(limit: int) -> Detector:
    def run(d: Dialog) -> set[int]:
        out: set[int] = set()
        open_tokens, open_msgs = 0, 0
        for i, n in enumerate(d.tokens):
            if size_boundary(open_tokens, open_msgs, n, limit):
                out.add(i)
                open_tokens, open_msgs = 0, 0
            open_tokens += n
            open_msgs += 1
        return out

    return run


def library_rules(extra: Detector | None = None) -> Detector:
    """The library's ``decide`` with default settings, turns a few seconds apart (optionally OR ``extra``)."""
    rules: BoundaryRules = HistoryCompressor("memory://")._rules  # exactly what add_message applies
    t0 = datetime(2024, 1, 1, tzinfo=UTC)

    def run(d: Dialog) -> set[int]:
        also = extra(d) if extra is not None else set()
        out: set[int] = set()
        open_tokens, open_msgs, last = 0, 0, None
        for i, (text, role, n) in enumerate(zip(d.turns, d.roles, d.tokens, strict=True)):
            ts = t0 + timedelta(seconds=5 * i)
            reason = decide(rules, OpenTopic(open_msgs, open_tokens, last, False), role, text, ts, n)
            if reason is not None or (i in also and open_msgs > 0):
                out.add(i)
                open_tokens, open_msgs = 0, 0
            open_tokens += n
            open_msgs += 1
            last = ts
        return out

    return run


# -- the optional lexical detector ---------------------------------------------------------------------

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_STOP_TEXT = (
    "a an the and or but if so of to in on at by for with from as is are was were be been being "
    "am do does did have has had i you he she it we they me him her us them my your his its our "
    "their this that these those there here what which who whom whose when where why how not no "
    "yes yeah ok okay um uh mm hmm oh just like really very so too also then than can could "
    "would should will shall may might must about into over out up down off all any some more "
    "most much many such only own same other well get got go going know think mean say said "
    "right lot thing things one two vocalsound disfmarker gap laugh cough 's 'm 're 've 'll 'd "
    "n't s t don didn doesn isn aren wasn"
)
_STOP = frozenset(_STOP_TEXT.split())


def _terms(text: str) -> Counter[str]:
    return Counter(w for w in _WORD.findall(text.lower()) if w not in _STOP and len(w) > 1)


@dataclass(frozen=True, slots=True)
class Lexical:
    """Online TF-IDF cosine detector (uses only the new turn and earlier turns).

    Before turn ``i`` is stored: take the content words of turn ``i`` (lowercased,
    stop words removed) and of the previous ``window`` turns pooled together;
    weight each term by ``1 + log(tf)`` times an IDF estimated online from the turns
    of this conversation seen so far (``log((1 + n) / (1 + df)) + 1``); declare a
    boundary when the cosine is below ``threshold``, turn ``i`` has at least
    ``min_terms`` content words, and at least ``min_gap`` turns have passed since the
    last boundary (or the start).
    """

    window: int
    threshold: float
    min_gap: int
    min_terms: int = 1

    def label(self) -> str:
        return (
            f"lexical TF-IDF (w={self.window}, th={self.threshold:.2f}, "
            f"gap={self.min_gap}, terms={self.min_terms})"
        )

    def similarities(self, d: Dialog) -> list[float | None]:
        return _similarities(d, self.window)

    def __call__(self, d: Dialog) -> set[int]:
        return apply_threshold(_similarities(d, self.window), d, self.threshold, self.min_gap, self.min_terms)


_SIM_CACHE: dict[tuple[int, int], tuple[Dialog, list[float | None]]] = {}


def _similarities(d: Dialog, window: int) -> list[float | None]:
    key = (id(d), window)
    cached = _SIM_CACHE.get(key)
    if cached is not None and cached[0] is d:
        return cached[1]
    bags = [_terms(t) for t in d.turns]
    df: Counter[str] = Counter()
    sims: list[float | None] = []
    for i, bag in enumerate(bags):
        if i == 0 or not bag:
            sims.append(None)
        else:
            n = i
            ctx: Counter[str] = Counter()
            for prev in bags[max(0, i - window) : i]:
                ctx.update(prev)

            def w(term: str, tf: int, n: int = n) -> float:
                return (1 + math.log(tf)) * (math.log((1 + n) / (1 + df[term])) + 1)

            a = {t: w(t, c) for t, c in bag.items()}
            b = {t: w(t, c) for t, c in ctx.items()}
            dot = sum(v * b.get(t, 0.0) for t, v in a.items())
            na = math.sqrt(sum(v * v for v in a.values()))
            nb = math.sqrt(sum(v * v for v in b.values()))
            sims.append(dot / (na * nb) if na and nb else 0.0)
        df.update(bag.keys())
    _SIM_CACHE[key] = (d, sims)
    return sims


_NTERMS: dict[int, tuple[Dialog, list[int]]] = {}


def _term_counts(d: Dialog) -> list[int]:
    cached = _NTERMS.get(id(d))
    if cached is None or cached[0] is not d:
        cached = _NTERMS[id(d)] = (d, [sum(_terms(t).values()) for t in d.turns])
    return cached[1]


def apply_threshold(
    sims: Sequence[float | None], d: Dialog, threshold: float, min_gap: int, min_terms: int
) -> set[int]:
    nterms = _term_counts(d)
    out: set[int] = set()
    last = 0
    for i in [i for i, s in enumerate(sims) if s is not None and s < threshold and nterms[i] >= min_terms]:
        if i - last >= min_gap:
            out.add(i)
            last = i
    return out


# -- tuning ---------------------------------------------------------------------------------------------


def tune_k(dialogs: Sequence[Dialog], ks: Iterable[int], tol: int) -> tuple[int, Score]:
    return max(
        ((k, score(dialogs, [every_k(k)(d) for d in dialogs], tol)) for k in ks), key=lambda x: x[1].f1
    )


def tune_size(dialogs: Sequence[Dialog], limits: Iterable[int], tol: int) -> tuple[int, Score]:
    return max(
        ((lim, score(dialogs, [size_rule(lim)(d) for d in dialogs], tol)) for lim in limits),
        key=lambda x: x[1].f1,
    )


def tune_lexical(
    dialogs: Sequence[Dialog],
    windows: Iterable[int],
    thresholds: Iterable[float],
    gaps: Iterable[int],
    min_terms: Iterable[int],
    tol: int,
) -> tuple[tuple[Lexical, Score], tuple[Lexical, Score]]:
    """Best F1 overall, and best F1 among settings predicting no more boundaries than the gold count."""
    best: tuple[Lexical, Score] | None = None
    capped: tuple[Lexical, Score] | None = None
    gold = sum(len(d.gold) for d in dialogs)
    thresholds, gaps, min_terms = list(thresholds), list(gaps), list(min_terms)
    for w in windows:
        sims = [_similarities(d, w) for d in dialogs]
        for th in thresholds:
            for g in gaps:
                for mt in min_terms:
                    preds = [apply_threshold(s, d, th, g, mt) for s, d in zip(sims, dialogs, strict=True)]
                    sc = score(dialogs, preds, tol)
                    if best is None or sc.f1 > best[1].f1:
                        best = (Lexical(w, th, g, mt), sc)
                    if sum(len(p) for p in preds) <= gold and (capped is None or sc.f1 > capped[1].f1):
                        capped = (Lexical(w, th, g, mt), sc)
    assert best is not None and capped is not None
    return best, capped


# -- report ---------------------------------------------------------------------------------------------


def row(name: str, sc: Score, note: str = "") -> list[str]:
    return [name, f"{sc.precision:.3f}", f"{sc.recall:.3f}", f"{sc.f1:.3f}", str(sc.tp + sc.fp), note]


def evaluate_tiage(data: Path, counter: TokenCounter) -> tuple[str, Lexical]:
    tune = load_tiage(data / "tiage" / "anno_train.json", counter) + load_tiage(
        data / "tiage" / "anno_dev.json", counter
    )
    test = load_tiage(data / "tiage" / "anno_test.json", counter)
    gold_n = sum(len(d.gold) for d in test)
    turns = sum(len(d.turns) - 1 for d in test)
    default_limit = topic_size_limit(8000, 0.5, 0.6)
    k, _ = tune_k(tune, range(1, 16), 0)
    lim, _ = tune_size(tune, [50, 75, 100, 125, 150, 200, 250, 300, 400, 600, 800], 0)
    (lex, lex_tune), (cap, cap_tune) = tune_lexical(
        tune,
        windows=[1, 2, 3, 4],
        thresholds=[x / 100 for x in range(0, 41, 2)],
        gaps=[1, 2, 3, 4],
        min_terms=[1, 2, 3],
        tol=0,
    )
    rows = [
        row("never split", score(test, [never(d) for d in test])),
        row(f"every k turns (k={k}, tuned)", score(test, [every_k(k)(d) for d in test])),
        row(
            "explicit phrases (user turns, library default)", score(test, [explicit(False)(d) for d in test])
        ),
        row("explicit phrases (any speaker)", score(test, [explicit(True)(d) for d in test])),
        row(
            f"size rule, default limit ({default_limit} tokens)",
            score(test, [size_rule(default_limit)(d) for d in test]),
        ),
        row(f"size rule, tuned limit ({lim} tokens)", score(test, [size_rule(lim)(d) for d in test])),
        ["temporal rule", "-", "-", "-", "-", "not evaluable: no timestamps"],
        row(
            "library `decide` (explicit + temporal + size, defaults)",
            score(test, [library_rules()(d) for d in test]),
        ),
        row(
            lex.label(),
            score(test, [lex(d) for d in test]),
            f"best F1 on train+dev ({lex_tune.f1:.3f})",
        ),
        row(
            cap.label(),
            score(test, [cap(d) for d in test]),
            f"best F1 on train+dev predicting <= gold count ({cap_tune.f1:.3f})",
        ),
        row("library `decide` + lexical (best F1)", score(test, [library_rules(lex)(d) for d in test])),
    ]
    head = (
        f"TIAGE test: {len(test)} dialogs, {turns} scorable turns, {gold_n} gold shifts "
        f"({gold_n / turns:.1%}). Exact turn match; tuned on train + dev ({len(tune)} dialogs)."
    )
    body = table(["rule", "precision", "recall", "F1", "predicted", "note"], rows)
    return f"{head}\n\n{body}\n", cap


def evaluate_qmsum(data: Path, counter: TokenCounter) -> tuple[str, Lexical]:
    tune = load_qmsum(data / "qmsum" / "train", counter) + load_qmsum(data / "qmsum" / "val", counter)
    test = load_qmsum(data / "qmsum" / "test", counter)
    gold_n = sum(len(d.gold) for d in test)
    turns = sum(len(d.turns) for d in test)
    default_limit = topic_size_limit(8000, 0.5, 0.6)
    tol = TOLERANCE
    k, _ = tune_k(tune, [5, 10, 20, 40, 60, 80, 100, 120, 140, 160, 200, 250, 300, 400], tol)
    lim, _ = tune_size(tune, [500, 1000, 1500, 2000, 2399, 3000, 4000, 5000, 6000, 8000], tol)
    (lex, lex_tune), (cap, cap_tune) = tune_lexical(
        tune,
        windows=[3, 5, 10, 20],
        thresholds=[x / 100 for x in range(0, 31, 2)],
        gaps=[10, 20, 40, 60, 80, 120],
        min_terms=[1, 3, 5, 8],
        tol=tol,
    )
    detectors: list[tuple[str, Detector, str]] = [
        ("never split", never, ""),
        (f"every k turns (k={k}, tuned)", every_k(k), ""),
        ("explicit phrases (every turn is a user turn)", explicit(True), ""),
        (f"size rule, default limit ({default_limit} tokens)", size_rule(default_limit), ""),
        (f"size rule, tuned limit ({lim} tokens)", size_rule(lim), ""),
        ("library `decide` (explicit + temporal + size, defaults)", library_rules(), ""),
        (
            lex.label(),
            lex,
            f"best F1±{tol} on train+val ({lex_tune.f1:.3f})",
        ),
        (cap.label(), cap, f"best F1±{tol} on train+val predicting <= gold count ({cap_tune.f1:.3f})"),
        ("library `decide` + lexical (best F1)", library_rules(lex), ""),
    ]
    rows = []
    for name, det, note in detectors:
        preds = [det(d) for d in test]
        exact = score(test, preds, 0)
        near = score(test, preds, tol)
        rows.append(
            [
                name,
                f"{near.precision:.3f}",
                f"{near.recall:.3f}",
                f"{near.f1:.3f}",
                f"{exact.f1:.3f}",
                str(near.tp + near.fp),
                note,
            ]
        )
    rows.insert(6, ["temporal rule", "-", "-", "-", "-", "-", "not evaluable: no timestamps in transcripts"])
    head = (
        f"QMSum test: {len(test)} meetings, {turns} turns, {gold_n} gold boundaries "
        f"(topic-span starts after the first; {gold_n / len(test):.1f} per meeting). Tuned on train + val "
        f"({len(tune)} meetings) for F1 within ±{tol} turns."
    )
    body = table(
        ["rule", f"P (±{tol})", f"R (±{tol})", f"F1 (±{tol})", "F1 (exact)", "predicted", "note"], rows
    )
    return f"{head}\n\n{body}\n", cap


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="topic-boundary detection quality")
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--out", type=Path, help="update the boundaries section of this markdown file")
    args = p.parse_args(argv)
    counter = TokenCounter("cl100k_base")
    t = time.perf_counter()
    log("TIAGE ...")
    tiage, _ = evaluate_tiage(args.data, counter)
    log(f"QMSum ... ({time.perf_counter() - t:.0f}s so far)")
    qmsum, _ = evaluate_qmsum(args.data, counter)
    log(f"done in {time.perf_counter() - t:.0f}s")
    md = "\n".join(
        [
            "### Run",
            "",
            f"- Machine: {machine()}; library: git {git_revision()}",
            "- Command: `python -m bench.boundaries`",
            "",
            "### TIAGE (PersonaChat dialogs, human topic-shift labels)",
            "",
            tiage,
            "### QMSum (meeting transcripts, topic spans)",
            "",
            qmsum,
        ]
    )
    if args.out:
        update_section(args.out, "boundaries", md)
        log(f"updated {args.out}")
    else:
        print(md)


if __name__ == "__main__":
    main()
