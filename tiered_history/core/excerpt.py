"""A long text cut to the sentences that best match a query: what recall shows of a message too long
to show whole (in the context and in the recall tool's answer). No I/O.

The sentences kept are those holding the most query words (earlier first on a tie), shown in
their order; each stretch left out is marked ``[…]``, so the excerpt never reads as the whole
message. It is chosen by an estimate of each sentence's tokens (the message's own tokens per
character: any script) and then measured exactly, dropping the last sentence taken while it is
over: a few exact counts, not one per sentence.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from .ranking import words

ELLIPSIS = "[…]"
"""Where sentences were left out: before, between or after those shown."""

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])|\n+")
#: Tokens an omission mark costs with its space, at most (estimate only: the result is measured).
_MARK_TOKENS = 3


def sentences(text: str) -> list[str]:
    """The sentences (or lines) of ``text``, stripped, empty ones left out."""
    return [text[a:b] for a, b in spans(text)]


def spans(text: str) -> list[tuple[int, int]]:
    """Where each sentence of :func:`sentences` lies in ``text`` (start, end)."""
    out: list[tuple[int, int]] = []
    start = 0
    for cut in [*_SENTENCE_END.finditer(text), None]:
        end = len(text) if cut is None else cut.start()
        piece = text[start:end]
        if piece.strip():
            lead = len(piece) - len(piece.lstrip())
            out.append((start + lead, start + len(piece.rstrip())))
        if cut is not None:
            start = cut.end()
    return out


def joined(text: str, where: Sequence[tuple[int, int]], shown: Sequence[int]) -> str:
    """The sentences of ``text`` at the indices ``shown`` (ascending) of ``where``: a run of
    neighbours as the text has it (its line breaks kept), each gap marked with :data:`ELLIPSIS`."""
    out: list[str] = [] if shown[0] == 0 else [ELLIPSIS]
    run = shown[0]
    for k, i in enumerate(shown):
        nxt = shown[k + 1] if k + 1 < len(shown) else None
        if nxt != i + 1:  # the run from ``run`` ends at ``i``
            out.append(text[where[run][0] : where[i][1]])
            if nxt is not None:
                out.append(ELLIPSIS)
                run = nxt
    if shown[-1] != len(where) - 1:
        out.append(ELLIPSIS)
    return " ".join(out)


def matching_sentences(
    text: str, terms: frozenset[str], cost: Callable[[str], int], room: int, per_char: float
) -> tuple[str, int] | None:
    """``text`` cut to its best-matching sentences, with its ``cost`` (exact, as ``cost`` measures
    a candidate excerpt), within ``room``; ``None`` when it has a single sentence, none holds a
    query word, or not even one fits. ``per_char``: the text's tokens per character."""
    where = spans(text)
    if len(where) < 2 or not terms:
        return None
    parts = [text[a:b] for a, b in where]
    hits = [len(terms.intersection(words(p))) for p in parts]
    order = sorted((i for i in range(len(parts)) if hits[i]), key=lambda i: (-hits[i], i))
    if not order:
        return None
    base = cost(ELLIPSIS)
    taken: list[int] = []  # in the order taken: the last is the first to go when over
    estimate = base
    for i in order:
        extra = int(len(parts[i]) * per_char) + 1 + _MARK_TOKENS
        if estimate + extra <= room:
            taken.append(i)
            estimate += extra
    if len(taken) == len(parts):
        taken.pop()  # every sentence is the whole text (but for spaces at its ends): an excerpt omits
    while taken:
        shown = joined(text, where, sorted(taken))
        exact = cost(shown)
        if exact <= room:
            return shown, exact
        taken.pop()
    return None
