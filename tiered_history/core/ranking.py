"""Words, queries and BM25: how text is matched and ranked, the same way on every backend.

A word is a run of letters and digits, lowercased (``NEEDLE-4711`` is ``needle`` ``4711``;
diacritics are kept: ``zürich`` is not ``zurich``). SQLite's FTS5 (``unicode61
remove_diacritics 0``) and PostgreSQL's ``simple`` configuration over the text with every
other character made a space produce exactly these words, so the in-memory store, SQLite and
PostgreSQL match the same messages.

User text becomes a :class:`Query`: each whitespace-separated piece is a word, or a phrase
when it holds several (``a_b``, ``NEEDLE-4711``); a message matches when it holds any of them,
and ranks by Okapi BM25 (k1 = 1.2, b = 0.75), newest first on equal scores. Text with no word
at all (``%``) is searched literally. Query syntax of the engines never reaches them: every
word is quoted, so operators, quotes, ``NEAR``, ``*`` and ``-`` are just text.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

_WORD_RE = re.compile(r"[^\W_]+")
K1 = 1.2
B = 0.75
#: Words in one query at most: a recall query keeps the first ones, the newest message's before the
#: open topic's (keeping the longest 12 or 24 instead measured the same on QMSum).
MAX_QUERY_WORDS = 24

# Words that say nothing about what a message is about (a recall query drops them).
_STOPWORD_TEXT = """
a about above after again against all am an and any are as at be because been before being below between
both but by can could did do does doing don done down during each few for from further had has have having
he her here hers herself him himself his how i if in into is it its itself just let me more most my myself
no nor not now of off on once only or other our ours ourselves out over own same she should so some such
than that the their theirs them themselves then there these they this those through to too under until up
very was we were what when where which while who whom why will with would you your yours yourself
yourselves s t d ll m o re ve y ok okay yes yeah yep nope hi hello hey thanks thank please um uh oh ah
hmm mm mhm like well really also get got go going know think want need say said tell told see
"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())
# Interjections, backchannels and laughter drawn out to any length ("mmm", "hmmm", "uhhh", "ooh",
# "hahaha", "lol"): as rare as they are in a conversation's index, a query made of them matched
# other "Mmm ." messages and sent them as recalled conversation. Two-letter forms are stopwords
# above; "mm" alone stays there only, as "er" is left to mean something.
_FILLER_RE = re.compile(
    r"m{3,}|h+m+|m+h+m+|u+h{2,}|u+m{2,}|a+h{2,}|o+h{2,}|o{2,}h+|h+u+h+|e+r{2,}|e+r+m+|a+w{2,}"
    r"|u+g+h+|s+h{2,}|y+a+y+|ye+a+h{2,}|yu+p+|o+k{2,}|o+k+a+y{2,}|k{2,}|a?(?:h+a+){2,}h*|(?:h+e+){2,}h*"
    r"|l+o+l+(?:o+l+)*|l+m+f*a+o+"
)


def is_filler(word: str) -> bool:
    """Whether ``word`` (lowercased) says nothing about what a message is about: a stopword or an
    interjection, backchannel or laugh (see ``_FILLER_RE``)."""
    return word in STOPWORDS or _FILLER_RE.fullmatch(word) is not None


def words(text: str) -> list[str]:
    """The words of ``text``, in order (letters and digits, lowercased)."""
    return _WORD_RE.findall(text.lower())


def word_count(text: str) -> int:
    """``len(words(text))``, without lower-casing ASCII text (counted on every stored message)."""
    # ASCII: ``_WORD_RE`` finds the runs of letters and digits (lower-casing moves no boundary
    # there). With each of those bytes made "a" and every other one a space, a run starts at each
    # " a": one C search over bytes, a third of the cost of splitting the text (str.translate
    # looks each character up in a dict).
    if text.isascii():
        return (b" " + text.encode("ascii").translate(_ALNUM_AS_A)).count(b" a")
    return len(words(text))


_ALNUM_AS_A = bytes(ord("a") if chr(c).isalnum() and c < 128 else ord(" ") for c in range(256))


@dataclass(frozen=True, slots=True)
class Query:
    """What to look for: word groups (each a word or a phrase) or, failing any word, literal text."""

    groups: tuple[tuple[str, ...], ...] = ()
    literal: str | None = None
    weights: tuple[float, ...] = ()
    """Per group (same order), how much a match counts; empty: all 1."""

    @property
    def terms(self) -> tuple[str, ...]:
        """Every distinct word of the query, in order."""
        return tuple(dict.fromkeys(w for g in self.groups for w in g))

    @property
    def empty(self) -> bool:
        return not self.groups and not self.literal

    def weight(self, i: int) -> float:
        return self.weights[i] if i < len(self.weights) else 1.0

    def group_weights(self) -> dict[tuple[str, ...], float]:
        """Each distinct group with the sum of its weights (a group given twice counts twice)."""
        out: dict[tuple[str, ...], float] = {}
        for i, g in enumerate(self.groups):
            out[g] = out.get(g, 0.0) + self.weight(i)
        return out


def parse_query(text: str) -> Query:
    """User text as a query (see the module docstring)."""
    groups: list[tuple[str, ...]] = []
    for piece in text.split():
        found = tuple(words(piece))
        if found and found not in groups:
            groups.append(found)
    if not groups:
        literal = text.strip()
        return Query(literal=literal) if literal else Query()
    return Query(tuple(groups[:MAX_QUERY_WORDS]))


def recall_query(newest: str, context: Iterable[str] = (), context_weight: float = 0.35) -> Query:
    """The query a context recalls for: the newest user message's words, then (weighted less) the
    recent words of the open topic. Stopwords, interjections and one-letter words are left out."""
    groups: list[tuple[str, ...]] = []
    weights: list[float] = []
    for text, weight in [(newest, 1.0)] + [(t, context_weight) for t in context]:
        for w in words(text):
            if len(w) < 2 or (w,) in groups or is_filler(w):
                continue
            groups.append((w,))
            weights.append(weight)
            if len(groups) >= MAX_QUERY_WORDS:
                return Query(tuple(groups), weights=tuple(weights))
    return Query(tuple(groups), weights=tuple(weights))


#: Runs of letters in scripts written without spaces between words (Han, kana, Thai, Lao, Khmer,
#: Myanmar): one such run is a whole phrase or sentence, not one word.
_UNSPACED_RE = re.compile(
    r"[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]"
)


def recall_terms(text: str) -> frozenset[str]:
    """The words :func:`recall_query` looks for in ``text`` (each of its groups is one word)."""
    return frozenset(w for (w,) in recall_query(text).groups)


def query_words(text: str) -> int:
    """About how many words ``text`` gives recall to look for: the words of :func:`recall_terms`,
    a run of a script written without spaces counted as one word per two of its characters (a
    Chinese sentence is one run: it asks as much as an English one)."""
    return sum(max(len(w) // 2, 1) if _UNSPACED_RE.search(w) else 1 for w in recall_terms(text))


#: Floor of a word's inverse document frequency (SQLite FTS5's): a word in half the documents or
#: more says next to nothing about which one is meant.
IDF_FLOOR = 1e-6


def idf(n_docs: int, df: int) -> float:
    """BM25's inverse document frequency, as SQLite FTS5 computes it (so every backend ranks alike):
    ``ln((N - n + 0.5) / (n + 0.5))``, at least ``IDF_FLOOR``."""
    return max(math.log((n_docs - df + 0.5) / (df + 0.5)), IDF_FLOOR)


def bm25_term(tf: int, df: int, n_docs: int, length: float, avg_length: float) -> float:
    """One word's contribution to a document's score."""
    if tf <= 0:
        return 0.0
    norm = K1 * (1.0 - B + B * length / max(avg_length, 1e-9))
    return idf(n_docs, df) * tf * (K1 + 1.0) / (tf + norm)


def phrase_count(doc: Sequence[str], phrase: Sequence[str]) -> int:
    """How often ``phrase`` occurs in ``doc`` (a list of words) as adjacent words."""
    if len(phrase) == 1:
        return doc.count(phrase[0])
    n = len(phrase)
    return sum(1 for i in range(len(doc) - n + 1) if tuple(doc[i : i + n]) == tuple(phrase))


def occurrences(text: str) -> Callable[[Sequence[str]], int]:
    """How often each group (a word or a phrase) occurs in ``text``: ``phrase_count(words(text), g)``.

    A single word is found in the lowercased text by ``str.find`` and kept where neither
    neighbour is a letter or digit (``[^\\W_]`` is ``str.isalnum``): that is exactly a token of
    :func:`words` equal to it, at a fifth of the cost of splitting the text into words
    (recall counts a few dozen texts per search). A phrase splits the text, once."""
    low = text.lower()
    doc: list[str] | None = None

    def count(group: Sequence[str]) -> int:
        nonlocal doc
        word = group[0] if len(group) == 1 else ""
        if not word.isalnum():  # a phrase (or not a word at all): counted over the words
            if doc is None:
                doc = words(text)
            return phrase_count(doc, group)
        n, size, end = 0, len(word), len(low)
        at = low.find(word)
        while at >= 0:
            after = at + size
            if (at == 0 or not low[at - 1].isalnum()) and (after == end or not low[after].isalnum()):
                n += 1
            at = low.find(word, at + 1)
        return n

    return count


@dataclass(frozen=True, slots=True)
class Scored:
    key: int
    """The document's key (a message's sequence or a summary's id)."""
    score: float
    recency: int
    """Higher is newer (the tie-break)."""


def rank(docs: Sequence[tuple[int, int, Sequence[str]]], query: Query, limit: int) -> list[Scored]:
    """BM25 over ``docs`` = (key, recency, words), best first; a phrase counts as one term.

    Statistics (number of documents, average length, document frequencies) are those of ``docs``.
    """
    if not docs or not query.groups:
        return []
    avg = sum(len(d) for _, _, d in docs) / len(docs)
    counts = [[phrase_count(d, g) for g in query.groups] for _, _, d in docs]
    df = [sum(1 for row in counts if row[i]) for i in range(len(query.groups))]
    out = []
    for (key, recency, doc), row in zip(docs, counts, strict=True):
        if not any(row):
            continue
        score = sum(
            query.weight(i) * bm25_term(tf, df[i], len(docs), len(doc), avg) for i, tf in enumerate(row) if tf
        )
        out.append(Scored(key, score, recency))
    out.sort(key=lambda s: (-s.score, -s.recency))
    return out[:limit]


def term_frequencies(doc: Sequence[str]) -> Counter[str]:
    return Counter(doc)
