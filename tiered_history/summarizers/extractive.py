"""Offline, deterministic extractive summariser: the default, and the fallback when an LLM fails.

It keeps whole sentences verbatim (the user's own words first) and adds nothing of its own
except speaker prefixes, a ``Topic:`` keyword line, date headers and "…". Whatever the input,
the result fits ``target_tokens`` and is strictly smaller than what it replaces.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from ..tokens import TokenCounter
from .base import SummaryInput, SummaryPiece, SummaryResult

#: Longer sentences are cut to their head: one rambling sentence must not eat the budget.
MAX_SENTENCE_TOKENS = 60
ELLIPSIS = "…"
#: No cl100k/o200k token spans more than 128 bytes, hence more than 128 characters.
_MAX_CHARS_PER_TOKEN = 128

_ROLE_WEIGHT = {"user": 1.5, "assistant": 1.0, "system": 0.9, "tool": 0.5}

_FENCE_RE = re.compile(r"```[^\n]*\n?(.*?)(?:```|\Z)", re.S)
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])")
_WORD_RE = re.compile(r"\w+(?:['’]\w+)*")
_LINK_RE = re.compile(r"https?://\S+|www\.\S+\.\S+|[\w.+-]+@[\w-]+\.[\w.-]+")
_PATH_RE = re.compile(
    r"(?:^|[\s(\"'`])(?:~|\.{1,2})?/[\w.-]+/[\w./-]*|\b[A-Za-z]:\\\S+"
    r"|\b[\w-]+\.(?:py|js|ts|tsx|json|ya?ml|toml|md|txt|csv|sql|sh|go|rs|java|cpp|html|css|ini|cfg|log)\b"
)
_DATE_RE = re.compile(
    r"\b\d{4}-\d{1,2}-\d{1,2}\b|\b\d{1,2}:\d{2}\b|\b\d{1,2}\s*[ap]\.?m\b|\b\d{1,2}/\d{1,2}(?:/\d{2,4})?\b"
    r"|\b(?:mon|tues|wednes|thurs|fri|satur|sun)day\b"
    r"|\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?\s+\d{1,2}\b"
    r"|\b(?:today|tomorrow|tonight|yesterday|next (?:week|month|year))\b",
    re.I,
)
_IDENT_RE = re.compile(
    r"`[^`\n]+`|\b[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+\b|\b[a-z]+[A-Z]\w*|\b[A-Z][a-z0-9]+[A-Z]\w*"
    r"|\b[A-Za-z_]\w+(?:\.[A-Za-z_]\w*)+|\b\w+\(\)"
)
_CUE_RE = re.compile(
    r"\b(?:decid\w*|decision|we['’]ll|we will|agreed?|must|always|never|prefer\w*|please|don['’]t|do not"
    r"|todo|deadline|because|need to|needs to|should|important|remember|make sure|instead|require[sd]?)\b",
    re.I,
)
# Word lists kept as prose: easier to read and extend than a column of quoted strings.
_FILLER_WORDS = (
    "ok okay k kk thanks thank you thx ty lol lmao haha hah hehe sure cool great nice yes yeah yep yup no "
    "problem np hi hello hey got it sounds good alright right hmm welcome awesome perfect fine oh ah wow "
    "indeed of course will do bye cheers"
)
_STOP_WORDS = (
    "the and for that this with you your are was were have has had not but can could would will shall "
    "what when where which who how why its it's i'm i've i'll let's there their them they then than "
    "from into onto about just also some any all our ours out use using used very more most much "
    "been being does did doing done yes one two get got make made like want need should here now "
    "may might must let lets sure okay thanks please well still only even each other over under"
)
_FILLER = frozenset(_FILLER_WORDS.split())
_STOPWORDS = frozenset(_STOP_WORDS.split())
_LINE_PREFIX_RE = re.compile(
    r"^(?:[-*•]\s+|\d+[.)]\s+)?(?:(?:[\w-]{1,64} \((?:user|assistant|system|tool)\)|User|Assistant|System"
    r"|Tool|Topic):\s+)?"
)
_HEADER_LINE_RE = re.compile(r"^\[\d{4}-\d{2}-\d{2}[^\]]*\]$")


@dataclass(frozen=True, slots=True)
class _Unit:
    """One candidate sentence. Units sharing ``group`` are rendered on one line after ``prefix``."""

    order: int
    group: int
    block: int
    prefix: str
    text: str
    tokens: int
    score: float
    words: frozenset[str]

    @property
    def rank(self) -> float:
        # Mild length normalisation: of two equally informative sentences, keep the shorter.
        return self.score / math.pow(max(1.0, self.tokens / 20), 0.3)


_Render = Callable[[list[_Unit]], str]


def _budget(target_tokens: int, source_tokens: int) -> int:
    # Inflation guard: a summary must be strictly smaller than what it replaces.
    return max(0, min(target_tokens, source_tokens - 1))


def _split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` with whitespace collapsed; a fenced code block counts as one sentence."""
    pieces: list[str] = []
    pos = 0
    for fence in _FENCE_RE.finditer(text):
        pieces += _split_prose(text[pos : fence.start()])
        pieces.append(" ".join(fence.group(1).split()))
        pos = fence.end()
    pieces += _split_prose(text[pos:])
    return [p for p in pieces if any(c.isalnum() for c in p)]


def _split_prose(text: str) -> list[str]:
    return [" ".join(s.split()) for line in text.splitlines() for s in _SENTENCE_END_RE.split(line)]


def _content_words(text: str) -> list[str]:
    words = (w.lower() for w in _WORD_RE.findall(text))
    return [w for w in words if len(w) > 2 and w not in _STOPWORDS and not w.isdigit()]


def _words(text: str) -> frozenset[str]:
    return frozenset(_content_words(text))


def _repeats(unit: _Unit, chosen: Iterable[_Unit]) -> bool:
    """Near-duplicate of a chosen sentence: people restate things; saying them twice wastes budget."""
    if not unit.words:
        return False
    return any(
        unit.words <= other.words or len(unit.words & other.words) >= 0.6 * len(unit.words | other.words)
        for other in chosen
    )


def _is_filler(text: str) -> bool:
    words = [w.lower() for w in _WORD_RE.findall(text)]
    return all(w in _FILLER for w in words)


def _score(text: str, role: str, freq: Counter[str]) -> float:
    """How much a sentence is worth keeping: facts, decisions and recurring topic words."""
    info = 2.0 * min(len(_LINK_RE.findall(text)) + len(_PATH_RE.findall(text)), 2)
    info += 1.5 * bool(_DATE_RE.search(text)) + 1.0 * any(c.isdigit() for c in text)
    info += 1.5 * min(len(_IDENT_RE.findall(text)), 2)
    info += 1.5 * min(len(_CUE_RE.findall(text)), 2)
    words = _WORD_RE.findall(text)
    names = sum(1 for w in words[1:] if w[0].isupper() and w not in {"I", "I'm", "I'll", "I've", "I'd"})
    info += 0.75 * min(names, 2)
    content = set(_content_words(text))
    recurring = sum(min(freq[w], 6) - 1 for w in content if freq[w] > 1)
    info += 0.6 * min(recurring / math.sqrt(len(content) + 1), 3.0)
    filler_share = sum(w.lower() in _FILLER for w in words) / max(len(words), 1)
    if len(words) < 3 and info == 0:
        info -= 0.5
    return _ROLE_WEIGHT.get(role, 0.8) * max(0.05, 1.0 + info - filler_share)


def _stamp(moment: datetime) -> datetime:
    # Naive timestamps are taken to be UTC already.
    return moment.astimezone(UTC) if moment.tzinfo else moment


def _date_range(start: datetime, end: datetime) -> str:
    first, last = _stamp(start), _stamp(end)
    tail = last.strftime("%H:%M" if last.date() == first.date() else "%Y-%m-%d %H:%M")
    return f"[{first:%Y-%m-%d %H:%M}–{tail}]"


class ExtractiveSummarizer:
    """Keeps the most informative sentences verbatim: no model, no network, same input -> same output."""

    name: str = "extractive"

    def __init__(self, counter: TokenCounter | None = None) -> None:
        self.counter = counter if counter is not None else TokenCounter()

    async def summarize(self, messages: Sequence[SummaryInput], target_tokens: int) -> SummaryResult:
        started = time.perf_counter()
        source = sum(self.counter.count(m.content) for m in messages)
        return self._result(self._summarize_text(messages, _budget(target_tokens, source)), started)

    async def merge(self, pieces: Sequence[SummaryPiece], target_tokens: int) -> SummaryResult:
        started = time.perf_counter()
        source = sum(self.counter.count(p.text) for p in pieces)
        return self._result(self._merge_text(pieces, _budget(target_tokens, source)), started)

    # -- summarize ------------------------------------------------------------------------------

    def _summarize_text(self, messages: Sequence[SummaryInput], budget: int) -> str:
        if budget <= 0:
            return ""
        raw: list[tuple[int, str, str, str]] = []  # (group, prefix, role, sentence)
        group, last_label = -1, None
        for message in messages:
            sentences = _split_sentences(message.content)
            role = message.role or "unknown"
            label = f"{message.name} ({role})" if message.name else role.capitalize()
            if sentences and label != last_label:
                group, last_label = group + 1, label
            raw += [(group, f"{label}: ", message.role, s) for s in sentences]
        freq = Counter(w for *_, s in raw for w in _content_words(s))
        units: list[_Unit] = []
        seen: set[str] = set()
        opener_boosted = False
        for group, prefix, role, sentence in raw:
            if sentence.casefold() in seen:
                continue
            seen.add(sentence.casefold())
            unit = self._unit(len(units), group, 0, prefix, sentence, role, freq)
            if role == "user" and not opener_boosted and not _is_filler(sentence):
                # The first thing the user says usually states what the topic is about.
                unit, opener_boosted = replace(unit, score=unit.score + 0.75), True
            units.append(unit)
        units = self._drop_filler(units)
        if not units:
            return ""

        topic = self._topic_line(freq, [s for *_, s in raw], budget)
        reserved = self.counter.count(topic) + 1 if topic else 0
        chosen = self._greedy(units, budget - reserved, [])

        def render(selected: list[_Unit]) -> str:
            return "\n".join(([topic] if topic else []) + self._lines(selected))

        text = self._repair(chosen, render, budget)
        if not text.strip() and topic:
            topic = ""
            text = self._repair(self._greedy(units, budget, []), render, budget)
        if not text.strip():
            # Prefixes did not fit (tiny source or target): the single best sentence, bare.
            text = self._clip(max(units, key=lambda u: (u.rank, -u.order)).text, budget)
        return self._clip(text, budget)

    def _topic_line(self, freq: Counter[str], sentences: list[str], budget: int) -> str:
        keywords = [w for w, n in sorted(freq.items(), key=lambda kv: -kv[1]) if n > 1][:5]
        if len(keywords) < 3 or budget < 60:
            return ""
        # Spell each keyword as it first appeared, so the line only uses the input's words.
        spelled: dict[str, str] = {}
        for sentence in sentences:
            for word in _WORD_RE.findall(sentence):
                spelled.setdefault(word.lower(), word)
        line = "Topic: " + ", ".join(spelled[k] for k in keywords)
        return line if self.counter.count(line) <= budget // 6 else ""

    # -- merge ----------------------------------------------------------------------------------

    def _merge_text(self, pieces: Sequence[SummaryPiece], budget: int) -> str:
        if budget <= 0 or not pieces:
            return ""
        units: list[_Unit] = []
        raw: list[tuple[int, int, str, str, str]] = []  # (block, group, prefix, role, sentence)
        group = 0
        for block, piece in enumerate(pieces):
            for line in piece.text.splitlines():
                line = line.strip()
                if not line or _HEADER_LINE_RE.match(line):
                    continue  # an older archive's own date header: the new header supersedes it
                matched = _LINE_PREFIX_RE.match(line)
                prefix = matched.group(0) if matched else ""
                lowered = prefix.lower()
                role = next((r for r in _ROLE_WEIGHT if r in lowered), "topic" if "topic" in lowered else "")
                raw += [(block, group, prefix, role, s) for s in _split_sentences(line[len(prefix) :])]
                group += 1
        freq = Counter(w for *_, s in raw for w in _content_words(s))
        for block, group, prefix, role, sentence in raw:
            units.append(self._unit(len(units), group, block, prefix, sentence, role, freq))
        units = self._drop_filler(units)
        if not units:
            return ""

        headers = [_date_range(p.started_at, p.ended_at) for p in pieces]
        header_cost = sum(self.counter.count(h) + 1 for h in headers)
        overall = _date_range(pieces[0].started_at, pieces[-1].ended_at)
        if header_cost > budget // 2:
            # Too many pieces for a header each: one header for the whole span, if even that fits.
            headers = []
            header_cost = self.counter.count(overall) + 1
            if header_cost > budget // 4:
                overall, header_cost = "", 0
        else:
            overall = ""

        chosen = self._fair_share(pieces, units, budget - header_cost)

        def render(selected: list[_Unit]) -> str:
            lines = [overall] if overall else []
            for block in sorted({u.block for u in selected}):
                lines += [headers[block]] if headers else []
                lines += self._lines([u for u in selected if u.block == block])
            return "\n".join(lines)

        return self._clip(self._repair(chosen, render, budget), budget)

    def _fair_share(self, pieces: Sequence[SummaryPiece], units: list[_Unit], budget: int) -> list[_Unit]:
        """Each piece gets at least its best line (if possible) plus a share proportional to its size."""
        by_block = [[u for u in units if u.block == b] for b in range(len(pieces))]
        weights = [max(self.counter.count(p.text), 1) for p in pieces]
        best = [min((self._cost(u, set()) for u in bu), default=0) for bu in by_block]
        reserve = [min(b, budget // len(pieces)) for b in best]
        spare = max(budget - sum(reserve), 0)
        chosen: list[_Unit] = []
        for block, block_units in enumerate(by_block):
            share = reserve[block] + spare * weights[block] // sum(weights)
            picked = self._greedy(block_units, share, [])
            if not picked and block_units:
                # Even its best line is too long for its share: keep that line's head.
                top = max(block_units, key=lambda u: (u.rank, -u.order))
                room = share - self._cost(top, set()) + top.tokens
                if room >= 2:
                    text = self._clip(top.text, room)
                    picked = [replace(top, text=text, tokens=self.counter.count(text))]
            chosen += picked
        # Whatever a piece left unused goes to the best remaining lines anywhere.
        return self._greedy(units, budget, chosen)

    # -- shared machinery -----------------------------------------------------------------------

    def _unit(
        self, order: int, group: int, block: int, prefix: str, text: str, role: str, freq: Counter[str]
    ) -> _Unit:
        text = self._clip(text, MAX_SENTENCE_TOKENS)
        tokens = self.counter.count(text)
        return _Unit(order, group, block, prefix, text, tokens, _score(text, role, freq), _words(text))

    @staticmethod
    def _drop_filler(units: list[_Unit]) -> list[_Unit]:
        substantive = [u for u in units if not _is_filler(u.text)]
        return substantive or units

    def _cost(self, unit: _Unit, open_groups: set[int]) -> int:
        # A line's prefix and newline are paid by its first selected sentence; a joining space
        # usually merges into the next word's token, so continuing a line costs the text alone.
        return unit.tokens + (0 if unit.group in open_groups else self.counter.count(unit.prefix) + 1)

    def _greedy(self, units: Iterable[_Unit], budget: int, already: list[_Unit]) -> list[_Unit]:
        """Add the best-ranked units that still fit (estimated cost) to ``already``."""
        chosen = list(already)
        taken = {u.order for u in chosen}
        open_groups = {u.group for u in chosen}
        prefixes = {u.group: u.prefix for u in chosen}
        used = sum(u.tokens for u in chosen) + sum(self.counter.count(p) + 1 for p in prefixes.values())
        for unit in sorted(units, key=lambda u: (-u.rank, u.order)):
            if unit.order in taken or _repeats(unit, chosen):
                continue
            cost = self._cost(unit, open_groups)
            if used + cost <= budget:
                chosen.append(unit)
                taken.add(unit.order)
                open_groups.add(unit.group)
                used += cost
        return chosen

    def _repair(self, chosen: list[_Unit], render: _Render, budget: int) -> str:
        """Estimates can be off by a token or two: drop the weakest sentences until the text fits."""
        chosen = sorted(chosen, key=lambda u: u.order)
        text = render(chosen)
        while chosen and self.counter.count(text) > budget:
            blocks = Counter(u.block for u in chosen)
            # Never empty a merge piece while another piece still has lines to spare.
            weakest = min(chosen, key=lambda u: (blocks[u.block] == 1, u.rank, -u.order))
            chosen.remove(weakest)
            text = render(chosen)
        return text if chosen else ""

    @staticmethod
    def _lines(selected: list[_Unit]) -> list[str]:
        lines: list[str] = []
        group = None
        for unit in sorted(selected, key=lambda u: u.order):
            if unit.group == group:
                lines[-1] += " " + unit.text
            else:
                lines.append(unit.prefix + unit.text)
                group = unit.group
        return lines

    def _clip(self, text: str, limit: int) -> str:
        """``text`` if it fits in ``limit`` tokens, else its head (at a nearby word boundary) + "…"."""
        if limit <= 0:
            return ""
        if len(text) <= limit * _MAX_CHARS_PER_TOKEN and self.counter.count(text) <= limit:
            return text
        # Longer than this cannot fit anyway; encoding only the probe keeps huge inputs cheap.
        tokens = self.counter.encode(text[: limit * _MAX_CHARS_PER_TOKEN])
        keep = min(limit - 1, len(tokens))
        while keep > 0:
            head = self.counter.decode(tokens[:keep]).rstrip("\ufffd")  # drop a half-decoded character
            if not text.startswith(head):
                head = text[: len(head)]  # lone surrogates round-trip as U+FFFD
            if not text[len(head) : len(head) + 1].isspace():
                cut = max(head.rfind(" "), head.rfind("\n"))
                if cut > len(head) // 2:
                    head = head[:cut]  # avoid half a word when a word boundary is close
            head = head.rstrip()
            if head and self.counter.count(head + ELLIPSIS) <= limit:
                return head + ELLIPSIS
            keep -= max(1, keep // 10)
        return ""

    def _result(self, text: str, started: float) -> SummaryResult:
        return SummaryResult(
            text=text,
            summarizer=self.name,
            model=None,
            latency_ms=(time.perf_counter() - started) * 1000,
            provisional=False,
        )
