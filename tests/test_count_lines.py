"""``TokenCounter.count_lines``: a text counted as the sum of its lines' counts (each remembered),
cut only where every tiktoken pattern ends a piece. It must equal ``count`` exactly, or a context
could be measured short and go over ``max_tokens``."""

from __future__ import annotations

import random
import string

import pytest

import tiered_history.tokens as tokens
from tiered_history import SyncHistoryCompressor
from tiered_history.tokens import TokenCounter

#: Everything a pattern treats apart: letters, digits, punctuation (``/`` too), spaces, tabs,
#: carriage returns, letters beyond ASCII, CJK, an emoji, no-break and line separators, a
#: combining mark, a superscript digit, and the delimiters the renderer writes.
ALPHABET = (
    string.ascii_letters
    + string.digits
    + string.punctuation
    + " \t\n\r"
    + "éü–—’“”•…ß中文😀\u00a0\u2028\u0300²‹›"
)


def texts(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        lines = []
        for _ in range(rng.randint(1, 12)):
            line = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 30)))
            if rng.random() < 0.4:  # a summary's line: its dates, then its text
                line = "[2026-01-01 10:00–11:00 UTC]\n" + line.strip()
            lines.append(line)
        out.append("\n".join(lines))
    return out


@pytest.mark.parametrize("model", ["cl100k_base", "o200k_base", "p50k_base", "gpt-4o", "claude-3-5-sonnet"])
def test_counting_line_by_line_is_exact(model: str) -> None:
    counter = TokenCounter(model)
    for text in texts(7, 3000):
        assert counter.count_lines(text) == counter.count(text), repr(text)
        assert counter.count_lines(text) == counter.count(text), repr(text)  # remembered lines


def test_the_fuzzing_finds_a_cut_that_is_not_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """The texts above are hard enough: cutting next to a space or a slash is caught."""
    monkeypatch.setattr(tokens, "_EDGE", frozenset(string.punctuation + " \t"))
    wrong = 0
    for model in ("cl100k_base", "o200k_base"):
        counter = TokenCounter(model)
        wrong += sum(counter.count_lines(t) != counter.count(t) for t in texts(7, 3000))
    assert wrong > 0


def test_other_encodings_are_counted_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens, "_LINE_SPLIT_ENCODINGS", frozenset())
    counter = TokenCounter("cl100k_base")
    calls: list[str] = []
    original = counter.count

    def count(text: str) -> int:
        calls.append(text)
        return original(text)

    monkeypatch.setattr(counter, "count", count)
    text = "[a]\nb\n[c]\nd" * 3
    assert counter.count_lines(text) == original(text) and calls == [text]


def test_a_reply_measures_its_blocks_and_note_as_messages_are_counted() -> None:
    """What the reply path measures (framing included) is ``message_tokens`` of a user message."""
    with SyncHistoryCompressor("memory://") as h:
        reply = h.reply
        for text in texts(11, 300):
            assert reply._measure(text) == reply.counter.message_tokens({"role": "user", "content": text})
