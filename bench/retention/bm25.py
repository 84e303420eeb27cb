"""The retrieval baseline: half the budget newest turns, half the turns that best match the query.

What a weekend RAG script over the chat log does. Ranking is Okapi BM25 (k1 = 1.2,
b = 0.75, idf = ln(1 + (N - df + 0.5) / (df + 0.5)), never negative) over the meeting's
turns, each turn's ``content`` being one document; terms are lower-cased ``\\w+``
tokens that are not in the fixed stopword list of :mod:`.data` (digits are kept: a
number in a question is a good key). Query terms count once each.

Context for one query within ``budget`` framed tokens (3 tokens reply priming):

1. the query (the newest user message) and then the newest turns, newest first, while
   they fit ``budget // 2``;
2. the older turns in BM25 order (score > 0; ties: newer first), each taken when its
   framed cost fits what is left of the whole budget, skipped otherwise;
3. with ``fill`` (a variant): room still left goes to further newest turns, as far back as
   they fit (when few older turns match at all, the plain baseline leaves it unused);
4. everything in chronological order, the query last.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from tiered_history.tokens import REPLY_PRIMING_TOKENS

from .data import STOPWORDS

K1 = 1.2
B = 0.75
_WORD_RE = re.compile(r"\w+")


def terms(text: str) -> list[str]:
    return [w for w in _WORD_RE.findall(text.lower()) if w not in STOPWORDS]


class BM25:
    """An index over a fixed list of documents."""

    def __init__(self, documents: Sequence[str], k1: float = K1, b: float = B) -> None:
        self.k1, self.b = k1, b
        self.tfs = [Counter(terms(d)) for d in documents]
        self.lengths = [sum(tf.values()) for tf in self.tfs]
        n = len(documents)
        self.avg = (sum(self.lengths) / n) if n else 0.0
        df: Counter[str] = Counter()
        for tf in self.tfs:
            df.update(tf.keys())
        self.idf = {t: math.log(1 + (n - d + 0.5) / (d + 0.5)) for t, d in df.items()}
        self.postings: dict[str, list[int]] = {}
        for i, tf in enumerate(self.tfs):
            for t in tf:
                self.postings.setdefault(t, []).append(i)

    def scores(self, query: str) -> dict[int, float]:
        """Score of every document sharing a term with ``query`` (the others score 0)."""
        out: dict[int, float] = {}
        for t in set(terms(query)):
            idf = self.idf.get(t)
            if idf is None:
                continue
            for i in self.postings[t]:
                f = self.tfs[i][t]
                norm = 1 - self.b + self.b * self.lengths[i] / self.avg if self.avg else 1.0
                out[i] = out.get(i, 0.0) + idf * f * (self.k1 + 1) / (f + self.k1 * norm)
        return out

    def ranking(self, query: str) -> list[int]:
        """Matching documents, best first; ties go to the newer (higher index) document."""
        s = self.scores(query)
        return sorted(s, key=lambda i: (-s[i], -i))


def retrieval_context(
    messages: Sequence[dict[str, Any]],
    costs: Sequence[int],
    index: BM25,
    query: dict[str, Any],
    query_cost: int,
    budget: int,
    fill: bool = False,
) -> list[dict[str, Any]]:
    """The baseline's context (see the module docstring); ``index`` covers ``messages`` in order."""
    used = REPLY_PRIMING_TOKENS + query_cost
    if used > budget:
        return []
    start = len(messages)
    while start > 0 and used + costs[start - 1] <= budget // 2:
        start -= 1
        used += costs[start]
    chosen = set(range(start, len(messages)))
    for i in index.ranking(str(query["content"])):
        if i in chosen or i >= len(messages):
            continue
        if used + costs[i] <= budget:
            chosen.add(i)
            used += costs[i]
    i = start - 1
    while fill and i >= 0:
        if i not in chosen:
            if used + costs[i] > budget:
                break
            chosen.add(i)
            used += costs[i]
        i -= 1
    return [*(messages[i] for i in sorted(chosen)), query]
