"""Offline, deterministic extractive summariser: the default, and the fallback when an LLM fails.

It keeps whole sentences verbatim (the user's own words first) and adds nothing of its own
except short speaker prefixes (``Name:``, or ``User:``/``Assistant:``...), a ``Topic:`` keyword
line at large budgets, date headers when a merge has room for them, and "…". It may remove
transcript markup (``{disfmarker}``...) and spoken disfluencies (um, uh). Sentences are chosen
greedily by how many not-yet-kept informative words and facts they add per token. Whatever the
input, the result fits ``target_tokens`` and is strictly smaller than what it replaces.
"""

from __future__ import annotations

import heapq
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from ..tokens import TokenCounter
from .base import SummaryInput, SummaryPiece, SummaryResult

#: How strongly selection favours short sentences: value / cost ** LENGTH_EXPONENT.
LENGTH_EXPONENT = 0.75
#: Below this budget a summary has no ``Topic:`` keyword line: the sentences carry those words anyway.
TOPIC_LINE_MIN_BUDGET = 300
#: A merge heads each piece with its date range only if all those headers fit in 1/HEADER_SHARE of it.
HEADER_SHARE = 10
#: Longer sentences are cut to their head: one rambling sentence must not eat the budget.
MAX_SENTENCE_TOKENS = 60
ELLIPSIS = "…"
#: No cl100k/o200k token spans more than 128 bytes, hence more than 128 characters.
_MAX_CHARS_PER_TOKEN = 128

_ROLE_WEIGHT = {"user": 1.5, "assistant": 1.0, "system": 0.9, "tool": 0.5}

_FENCE_RE = re.compile(r"```[^\n]*\n?(.*?)(?:```|\Z)", re.S)
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])")
_WORD_RE = re.compile(r"\w+(?:['’]\w+)*")
_DIGIT_RE = re.compile(r"\d")
_URL_RE = re.compile(r"https?://\S+|www\.\S+\.\S+")
_EMAIL_RE = re.compile(r"[\w.+-]+@[\w-]+\.\w[\w.-]*")
_PATH_RE = re.compile(r"(?:~|\.{1,2})?/[\w.-]+/[\w./-]*|\b[A-Za-z]:\\\S+")
_DATE_RE = re.compile(
    r"\d{4}-\d{1,2}-\d{1,2}|\b\d{1,2}:\d{2}\b|\b\d{1,2}\s*[ap]\.?m\b|\b\d{1,2}/\d{1,2}\b", re.I
)
_MONTH_DAY_RE = re.compile(
    r"\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?\s+\d{1,2}\b", re.I
)
_SNAKE_RE = re.compile(r"[A-Za-z0-9]_[A-Za-z0-9]")
_CAMEL_GUARD_RE = re.compile(r"[a-z][A-Z]")
_CAMEL_RE = re.compile(r"\w*[a-z][A-Z]\w*")
# A capitalised word that does not start the sentence (and is not "I"): most likely a name.
_NAME_RE = re.compile(r"(?<=[\w,;:)] )(?!I\b|I['’])[A-Z]")
_DOTTED_GUARD_RE = re.compile(r"\w\.[A-Za-z_]")
_DOTTED_RE = re.compile(r"\b[A-Za-z_]\w+(?:\.[A-Za-z_]\w*)+")
_BACKTICK_RE = re.compile(r"`[^`\n]+`")
# Word lists kept as prose: easier to read and extend than a column of quoted strings.
_FILLER_WORDS = (
    "ok okay k kk thanks thank you thx ty lol lmao haha hah hehe sure cool great nice yes yeah yep yup no "
    "problem np hi hello hey got it sounds good alright right hmm welcome awesome perfect fine oh ah wow "
    "indeed of course will do bye cheers um uh umm uhm uhh erm mm mmm mhm hm huh uhhuh mm-hmm so like well "
    "i mean know anyway you're happy glad help to"
)
_STOP_WORDS = (
    "a an i me my myself we us our ours ourselves you your yours yourself he him his himself she her hers "
    "herself it itself they them their theirs themselves whom these those am is be do if or because as "
    "until while of at by against between through during before after above below to up down in on off "
    "again further once both few no nor own same so too s t d ll m o re ve y don ain aren couldn didn "
    "doesn hadn hasn haven isn ma mightn mustn needn shan shouldn wasn weren won wouldn "
    "disfmarker vocalsound nonvocalsound gap pause comment um uh umm uhm uhh erm mm mmm mhm hm huh uhhuh "
    "oh ah yeah yep yes okay ok "
    "the and for that this with you your are was were have has had not but can could would will shall "
    "what when where which who how why its it's i'm i've i'll let's there their them they then than "
    "from into onto about just also some any all our ours out use using used very more most much "
    "been being does did doing done yes one two get got make made like want need should here now "
    "may might must let lets sure okay thanks please well still only even each other over under "
    "http https www com org net"
)
# Very common words: they count for little, since almost any sentence says them.
_COMMON_WORDS = (
    "think know going go goes went gone want get gets got getting like well really thing things kind sort "
    "actually mean means good right lot lots way say says said see look looks something anything nothing "
    "everything maybe probably pretty little bit quite stuff gonna wanna gotta let put take come came sure "
    "also even still much many guess seems seem need time people idea different fine nice great yes just "
    "okay alright basically definitely exactly absolutely certainly obviously totally course fact point "
    "first second next last new old big small sorry thank thanks please hello hi anyway maybe perhaps "
    "talk talking said tell told try trying work working yeah yep um uh i'd i'll i'm i've you're you've "
    "we're we've that's there's it's what's don't doesn't didn't can't isn't wasn't won't wouldn't "
    "shouldn't couldn't let's gonna one two three year years day days today make makes made making "
    "able another back bit around whatever whether though although always never sometimes often "
    "ever every else enough far long lot others part place same several since things thought "
    "together use used using wait want wanted whole yet"
)
_CUE_WORDS = (
    "decided decide decision we'll agreed agree must always never please don't todo deadline because should "
    "important remember instead require required requires won't can't"
)
_EXTENSIONS = "py js ts tsx json yaml yml toml md txt csv sql sh go rs java cpp html css ini cfg log"
_DATE_WORDS = "monday tuesday wednesday thursday friday saturday sunday today tomorrow tonight yesterday"
_MONTH_WORDS = (
    "jan feb mar apr may jun jul aug sep sept oct nov dec "
    "january february march april june july august september october november december"
)
_FILLER = frozenset(_FILLER_WORDS.split())
_STOPWORDS = frozenset(_STOP_WORDS.split())
_COMMON = frozenset(_COMMON_WORDS.split()) - _STOPWORDS
_CUES = frozenset(_CUE_WORDS.split())
_CUE_PREFIXES = ("decid", "prefer")
_CUE_PHRASES = ("we will", "do not", "need to", "needs to", "make sure", "let's")
_DATES = frozenset(_DATE_WORDS.split())
_MONTHS = frozenset(_MONTH_WORDS.split())
_FILE_EXTENSIONS = frozenset(_EXTENSIONS.split())
_FILE_RE = re.compile(r"\b[\w-]+\.(?:" + "|".join(sorted(_FILE_EXTENSIONS)) + r")\b")
_PRONOUNS = frozenset({"I", "I'm", "I'll", "I've", "I'd", "I’m", "I’ll", "I’ve", "I’d"})
_LINE_PREFIX_RE = re.compile(
    r"^(?:[-*•]\s+|\d+[.)]\s+)?(?:(?:[\w-]{1,64}(?: \((?:user|assistant|system|tool)\))?):\s+)?"
)
_HEADER_LINE_RE = re.compile(r"^\[(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}–[^\]]*\]$")
# Transcript markup ({disfmarker}, {vocalsound}...) and spoken disfluencies (with the comma that
# follows them) carry nothing: they are removed from the sentences the summary keeps.
_NOISE_RE = re.compile(
    r"\{(?:disfmarker|vocalsound|nonvocalsound|gap|pause|comment)\}"
    r"|(?<!\S)(?:um+|uh+|uhm|erm|mm+-?hmm|mhm|hmm+)(?:\s*,)?(?!\S)",
    re.I,
)


@dataclass(frozen=True, slots=True)
class _Unit:
    """One candidate sentence. Units sharing ``group`` are rendered on one line after ``prefix``."""

    order: int
    group: int
    block: int
    prefix: str
    line_cost: int
    text: str
    tokens: int
    words: frozenset[str]
    filler: bool
    weight: float
    """The speaker's role weight: the user's own words count most."""
    bonus: float
    """Worth of the facts (links, dates, numbers, identifiers, names, decisions) in the sentence."""

    def value(self, covered: Collection[str] = ()) -> float:
        """Worth of keeping the sentence when the words in ``covered`` are kept already."""
        fresh = sum(_weight(w) for w in self.words if w not in covered)
        return self.weight * max(0.05, self.bonus + fresh)

    @property
    def score(self) -> float:
        return self.value()

    @property
    def rank(self) -> float:
        return self.score / _length_norm(self.tokens + self.line_cost)


#: (block, group, prefix, role, sentence): a sentence before scoring; ``block`` is the merge piece.
_Raw = tuple[int, int, str, str, str]
_Render = Callable[[list[_Unit]], str]


def _length_norm(cost: int) -> float:
    return math.pow(max(cost, 1), LENGTH_EXPONENT)


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
    text = _NOISE_RE.sub(" ", text)
    return [" ".join(s.split()) for line in text.splitlines() for s in _SENTENCE_END_RE.split(line)]


def _lower_words(text: str) -> list[str]:
    return _WORD_RE.findall(text.lower().replace("’", "'"))


def _content_words(words: Iterable[str]) -> list[str]:
    """The lower-cased words that carry the topic (no stop words, filler or bare numbers)."""
    return [w for w in words if len(w) > 1 and w not in _STOPWORDS and w not in _FILLER and not w.isdigit()]


def _weight(word: str) -> float:
    """What covering ``word`` is worth: rare words tell topics apart, very common ones hardly do."""
    return 0.6 if word in _COMMON else 1.0


def _repeats(unit: _Unit, chosen: Iterable[_Unit]) -> bool:
    """Near-duplicate of a chosen sentence: people restate things; saying them twice wastes budget."""
    if not unit.words:
        return False
    return any(
        unit.words <= other.words or len(unit.words & other.words) >= 0.6 * len(unit.words | other.words)
        for other in chosen
    )


def _info(text: str, words: set[str]) -> float:
    """Bonus for what a summary must not lose: links, paths, dates, numbers, identifiers, names, decisions.

    ``words`` are the sentence's lower-cased words. Cheap substring and set tests guard the
    regexes: most sentences contain none of these things, and this runs for every sentence.
    """
    has_digit = _DIGIT_RE.search(text) is not None
    links = len(_URL_RE.findall(text)) if "://" in text or "www." in text else 0
    links += len(_EMAIL_RE.findall(text)) if "@" in text else 0
    links += len(_PATH_RE.findall(text)) if "/" in text or "\\" in text else 0
    links += len(_FILE_RE.findall(text)) if words & _FILE_EXTENSIONS else 0
    dated = bool(words & _DATES) or (
        has_digit
        and (_DATE_RE.search(text) is not None or bool(words & _MONTHS and _MONTH_DAY_RE.search(text)))
    )
    idents = len(_SNAKE_RE.findall(text)) if "_" in text else 0
    idents += len(_CAMEL_RE.findall(text)) if _CAMEL_GUARD_RE.search(text) else 0
    idents += len(_DOTTED_RE.findall(text)) if _DOTTED_GUARD_RE.search(text) else 0
    idents += len(_BACKTICK_RE.findall(text)) if "`" in text else 0
    idents += text.count("()")
    cues = len(words & _CUES) + sum(w.startswith(_CUE_PREFIXES) for w in words)
    lowered = text.lower()
    cues += sum(phrase in lowered for phrase in _CUE_PHRASES)
    names = len(_NAME_RE.findall(text))
    return (
        2.0 * min(links, 2)
        + 3.0 * dated
        + 1.0 * has_digit
        + 1.5 * min(idents, 2)
        + 0.5 * min(cues, 2)
        + 0.5 * min(names, 2)
    )


def _stamp(moment: datetime) -> datetime:
    # Naive timestamps are taken to be UTC already.
    return moment.astimezone(UTC) if moment.tzinfo else moment


def _date_range(start: datetime, end: datetime, previous: datetime | None = None) -> str:
    """``[2026-01-05 10:00–10:42]``; the start's date is left out when ``previous`` was on that day."""
    first, last = _stamp(start), _stamp(end)
    head = "%H:%M" if previous is not None and _stamp(previous).date() == first.date() else "%Y-%m-%d %H:%M"
    tail = last.strftime("%H:%M" if last.date() == first.date() else "%Y-%m-%d %H:%M")
    return f"[{first.strftime(head)}–{tail}]"


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
        sizes = [self.counter.count(p.text) for p in pieces]
        return self._result(self._merge_text(pieces, sizes, _budget(target_tokens, sum(sizes))), started)

    # -- summarize ------------------------------------------------------------------------------

    def _summarize_text(self, messages: Sequence[SummaryInput], budget: int) -> str:
        if budget <= 0:
            return ""
        raw: list[_Raw] = []
        group, last_label = -1, None
        for message in messages:
            sentences = _split_sentences(message.content)
            role = message.role or "unknown"
            label = message.name or role.capitalize()
            if sentences and label != last_label:
                group, last_label = group + 1, label
            raw += [(0, group, f"{label}: ", message.role, s) for s in sentences]
        units, freq = self._units(raw, boost_opener=True)
        if not units:
            return ""

        topic = self._topic_line(freq, [s for *_, s in raw], budget)
        reserved = self.counter.count(topic) + 1 if topic else 0
        room = budget - reserved
        chosen = self._greedy(units, room, []) or self._best_head(units, room)

        def render(selected: list[_Unit]) -> str:
            return "\n".join(([topic] if topic else []) + self._lines(selected))

        text = self._repair(chosen, render, budget)
        if not text.strip() and topic:
            topic = ""
            chosen = self._greedy(units, budget, []) or self._best_head(units, budget)
            text = self._repair(chosen, render, budget)
        if not text.strip():
            # Not even a prefix fits (tiny source or target): the head of the best sentence, bare.
            text = self._clip(max(units, key=lambda u: (u.rank, -u.order)).text, budget)
        return self._clip(text, budget)

    def _topic_line(self, freq: Counter[str], sentences: list[str], budget: int) -> str:
        if budget < TOPIC_LINE_MIN_BUDGET:
            return ""
        ranked = sorted(freq.items(), key=lambda kv: (-kv[1] * _weight(kv[0]), kv[0]))
        keywords = [w for w, n in ranked if n > 1 and w not in _COMMON][:5]
        if len(keywords) < 3:
            return ""
        # Spell each keyword as it first appeared, so the line only uses the input's words.
        spelled: dict[str, str] = {}
        for sentence in sentences:
            for word in _WORD_RE.findall(sentence):
                spelled.setdefault(word.lower().replace("’", "'"), word)
        line = "Topic: " + ", ".join(spelled[k] for k in keywords if k in spelled)
        return line if self.counter.count(line) <= budget // 6 else ""

    # -- merge ----------------------------------------------------------------------------------

    def _merge_text(self, pieces: Sequence[SummaryPiece], sizes: list[int], budget: int) -> str:
        if budget <= 0 or not pieces:
            return ""
        raw: list[_Raw] = []
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
                role = role or ("user" if prefix.rstrip().endswith(":") else "")  # a speaker's name
                raw += [(block, group, prefix, role, s) for s in _split_sentences(line[len(prefix) :])]
                group += 1
        units, _ = self._units(raw, boost_opener=False)
        if not units:
            return ""

        headers = [
            _date_range(p.started_at, p.ended_at, None if i == 0 else pieces[i - 1].started_at)
            for i, p in enumerate(pieces)
        ]
        header_cost = sum(self.counter.count(h) + 1 for h in headers)
        if header_cost > budget // HEADER_SHARE:
            # No room for a header per piece: the archive's own header carries the overall range.
            headers, header_cost = [], 0

        chosen = self._fair_share(sizes, units, budget - header_cost)

        def render(selected: list[_Unit]) -> str:
            lines: list[str] = []
            for block in sorted({u.block for u in selected}):
                lines += [headers[block]] if headers else []
                lines += self._lines([u for u in selected if u.block == block])
            return "\n".join(lines)

        return self._clip(self._repair(chosen, render, budget), budget)

    def _fair_share(self, sizes: list[int], units: list[_Unit], budget: int) -> list[_Unit]:
        """Each piece gets room for a line (if at all possible) plus a share proportional to its size."""
        by_block = [[u for u in units if u.block == b] for b in range(len(sizes))]
        weights = [max(size, 1) for size in sizes]
        cheapest = [min((self._cost(u, set()) for u in bu), default=0) for bu in by_block]
        reserve = [min(c, budget // len(sizes)) for c in cheapest]
        spare = max(budget - sum(reserve), 0)
        chosen: list[_Unit] = []
        for block, block_units in enumerate(by_block):
            share = reserve[block] + spare * weights[block] // sum(weights)
            chosen += self._greedy(block_units, share, []) or self._best_head(block_units, share)
        # Whatever a piece left unused goes to the best remaining lines anywhere.
        return self._greedy(units, budget, chosen)

    # -- shared machinery -----------------------------------------------------------------------

    def _units(self, raw: list[_Raw], boost_opener: bool) -> tuple[list[_Unit], Counter[str]]:
        """Score each distinct sentence; pure filler goes unless nothing else is left."""
        freq = Counter(w for *_, sentence in raw for w in _content_words(_lower_words(sentence)))
        units: list[_Unit] = []
        seen: set[str] = set()
        line_costs: dict[str, int] = {}
        for block, group, prefix, role, sentence in raw:
            if sentence.casefold() in seen:
                continue
            seen.add(sentence.casefold())
            if prefix not in line_costs:
                line_costs[prefix] = self.counter.count(prefix) + 1  # +1: the newline before it
            unit = self._unit(len(units), group, block, prefix, line_costs[prefix], sentence, role)
            if boost_opener and role == "user" and not unit.filler:
                # The first thing the user says usually states what the topic is about.
                unit, boost_opener = replace(unit, bonus=unit.bonus + 1.0), False
            units.append(unit)
        substantive = [u for u in units if not u.filler]
        return substantive or units, freq

    def _unit(
        self,
        order: int,
        group: int,
        block: int,
        prefix: str,
        line_cost: int,
        text: str,
        role: str,
    ) -> _Unit:
        # Counting a huge sentence in full would be wasted: it is cut to its head anyway.
        huge = len(text) > MAX_SENTENCE_TOKENS * _MAX_CHARS_PER_TOKEN
        tokens = MAX_SENTENCE_TOKENS + 1 if huge else self.counter.count(text)
        if tokens > MAX_SENTENCE_TOKENS:
            text = self._head(text, MAX_SENTENCE_TOKENS)
            tokens = self.counter.count(text)
        words = _lower_words(text)
        content = frozenset(_content_words(words))
        filler = all(w in _FILLER for w in words)
        bonus = _info(text, set(words))
        return _Unit(
            order,
            group,
            block,
            prefix,
            line_cost,
            text,
            tokens,
            content,
            filler,
            _ROLE_WEIGHT.get(role, 0.8),
            bonus,
        )

    def _best_head(self, units: list[_Unit], budget: int) -> list[_Unit]:
        """When no sentence fits whole: the best one cut down to fit, prefix included (or nothing)."""
        if not units:
            return []
        top = max(units, key=lambda u: (u.rank, -u.order))
        text = self._clip(top.text, budget - top.line_cost)
        return [replace(top, text=text, tokens=self.counter.count(text))] if text else []

    def _cost(self, unit: _Unit, open_groups: set[int]) -> int:
        # A line's prefix and newline are paid by its first selected sentence; a joining space
        # usually merges into the next word's token, so continuing a line costs the text alone.
        return unit.tokens + (0 if unit.group in open_groups else unit.line_cost)

    def _greedy(self, units: Iterable[_Unit], budget: int, already: list[_Unit]) -> list[_Unit]:
        """Add to ``already`` the units that add the most not yet kept words and facts per token.

        Lazy greedy: a unit's worth only drops as words get covered, so a unit whose fresh
        worth still beats every stale estimate left is the best one.
        """
        chosen = list(already)
        taken = {u.order for u in chosen}
        open_groups = {u.group for u in chosen}
        line_costs = {u.group: u.line_cost for u in chosen}
        used = sum(u.tokens for u in chosen) + sum(line_costs.values())
        covered: set[str] = set().union(*(u.words for u in chosen))
        candidates = [u for u in units if u.order not in taken]
        smallest = min((u.tokens for u in candidates), default=0)
        heap = [(-u.rank, u.order, i) for i, u in enumerate(candidates)]
        heapq.heapify(heap)
        while heap and budget - used >= smallest:
            _, order, i = heapq.heappop(heap)
            unit = candidates[i]
            cost = self._cost(unit, open_groups)
            if used + cost > budget:
                continue
            rank = unit.value(covered) / _length_norm(cost)
            if heap and rank < -heap[0][0]:
                heapq.heappush(heap, (-rank, order, i))
                continue
            # The near-duplicate test is the costly one, so it comes last.
            if not _repeats(unit, chosen):
                chosen.append(unit)
                open_groups.add(unit.group)
                covered |= unit.words
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
        return self._head(text, limit)

    def _head(self, text: str, limit: int) -> str:
        """The head of a ``text`` known not to fit, plus "…", within ``limit`` tokens ("" if none fits)."""
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
