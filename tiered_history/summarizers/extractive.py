"""Offline, deterministic extractive summariser: the default, and the fallback when an LLM fails.

Output format, one line per speaker turn kept::

    User "alice": We decided to keep the replica for 2 weeks. Run `migrate_invoices()` in batches…
    Assistant: The runbook lives in /ops/runbooks/rollback.md.

A line starts with a label made from the message's *role* (``User``, ``Assistant``, ``System``,
``Tool``, ``Other``) and its ``name``, if any, quoted after it as data: a user named ``System`` is
``User "System":``, never ``System:``. The text after the label is made of pieces of that
speaker's messages, verbatim: sentences (a title such as "Dr." ends none; a markdown list item,
heading or paragraph is one of its own, its marker dropped and, without end punctuation, a ";"
added), or clauses of long run-on sentences, with transcript
markup (``{disfmarker}``...) and spoken disfluencies (um, uh; not next to a number: "5 mm") removed,
a leading filler ("so, well, okay") dropped and whitespace collapsed. Pieces that were not
contiguous meet at a sentence end or at "…", which also marks a sentence whose tail was cut;
turns of one speaker that end up next to each other share a line. Nothing else is added, except
the date headers of merges (``[2026-01-05 10:00–10:42]``) and "- " before the lines a merge finds
without a label (an LLM's summary, say): so a merge, which reads labels back, never mistakes
message text for a label.

Pieces are chosen greedily by the information they add per token: content words not yet kept,
weighted by salience (how often the topic comes back to them) and rarity (in the tokenizer's
training text, whose BPE ranks approximate word frequency, and in the conversation when its
document frequencies are given), names, and facts (numbers, dates, links, identifiers such as
``snake_case``, ``dotted.names`` or codes of capitals and digits like ``BC-5521``), plus a
bonus for decisions and requirements. Words the summaries before this one already hold (``earlier=``)
count for less. Records of one template (a pasted log's lines, a tool's rows) count as data: their
words once, their facts shared among them; so does a pasted document (a message of 1,000 tokens
or more) past its opening, beside the question and the answer about it. The user's words weigh
most, bar a question the assistant answers: it weighs like the answer, and the words the answer
repeats count for half in it (the answer keeps them). Filler and pieces too
thin to tell anything are left out, room or not. Whatever the input, the result fits
``target_tokens`` and is strictly smaller than what it replaces.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from ..lru import Lru
from ..tokens import TokenCounter
from .base import SummaryInput, SummaryPiece, SummaryResult

#: How strongly selection favours short pieces: value / cost ** LENGTH_EXPONENT.
LENGTH_EXPONENT = 0.75
#: Sentences with more words than this compete clause by clause (meeting speech runs on).
CLAUSE_SPLIT_WORDS = 24
#: A clause has at least this many words: shorter fragments join the clause that follows them.
MIN_CLAUSE_WORDS = 5
#: A merge heads each piece with its date range only if all those headers fit in 1/HEADER_SHARE of it.
HEADER_SHARE = 10
#: Longer pieces are cut to their head: one rambling sentence must not eat the budget.
MAX_SENTENCE_TOKENS = 60
#: With document frequencies from at least this many messages, rarity is judged by the conversation too.
MIN_VOCABULARY_DOCUMENTS = 20
#: How much a word's rarity counts (see ``_relevance``); 0 would judge words by salience alone.
RARITY_EXPONENT = 0.5
#: A word's worth for being said again and again in the topic is capped at this.
MAX_SALIENCE = 2.0
#: When no piece fits whole, the heads of this many of the best are compared.
HEAD_CANDIDATES = 8
#: Room left over after selection goes to pieces worth at least this share of the weakest one chosen.
FILL_FLOOR = 0.75
#: What a word the context already holds before this summary (``earlier=``) is worth, as a share of
#: its worth: each summary is chosen on its own, and a conversation's recurring words were kept
#: again in every one of them (46 % of the content words of a meeting's blocks repeated another).
EARLIER_FACTOR = 0.25
ELLIPSIS = "…"
#: A merge handed more source messages than this (about 10 ms of work) runs in a thread, off the
#: event loop: maintenance shares it with the replies.
THREAD_MESSAGES = 100
#: No cl100k/o200k token spans more than 128 bytes, hence more than 128 characters.
_MAX_CHARS_PER_TOKEN = 128

_ROLE_LABELS = {"user": "User", "assistant": "Assistant", "system": "System", "tool": "Tool"}
_OTHER_LABEL = "Other"
_QUESTION_MARKS = "?？؟"
_ROLE_WEIGHT = {"user": 1.5, "assistant": 1.0, "system": 0.9, "tool": 0.5}
#: Lines of a merge's input that carry no label of ours (an LLM's summary): kept as "- " items.
_UNLABELLED_WEIGHT = 0.9
_UNLABELLED_PREFIX = "- "

_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NAME_BAD_RE = re.compile(r"[^A-Za-z0-9_-]+")
# A line of ours: a role label, optionally a quoted name (which cannot contain a quote), ": ", text.
_LABELLED_LINE_RE = re.compile(r'(User|Assistant|System|Tool|Other)(?: "([A-Za-z0-9_-]{1,64})")?: (.*)', re.S)
_LIST_MARK_RE = re.compile(r"(?:[-*•]|\d+[.)])\s+")
# A line break that starts a markdown list item (its marker goes) or a heading, and a blank line.
_ITEM_START_RE = re.compile(r"\n(?=[ \t]*(?:[-*•+]|\d{1,3}[.)]|#{1,6})[ \t]+)")
_ITEM_MARK_RE = re.compile(r"^\s*(?:[-*•+]|\d{1,3}[.)]|#{1,6})[ \t]+")
_PARAGRAPH_RE = re.compile(r"\n[ \t]*\n\s*")
_HEADER_LINE_RE = re.compile(r"\[(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}–[^\]]*\]")
# The keyword line older versions put first ("Topic: billing, Postgres, migration"): not a sentence.
_OLD_TOPIC_LINE_RE = re.compile(r"Topic: [^.!?\n]{0,200}")

_FENCE_RE = re.compile(r"```[^\n]*\n?(.*?)(?:```|\Z)", re.S)
#: Sentence ends: Latin, Arabic and Urdu (؟ ۔), Devanagari (। ॥), Armenian (։), Ethiopic (።)
#: followed by a space; CJK full-width ones need none.
_TERMINAL = ".!?؟۔।॥։።。！？" + ELLIPSIS
_ITEM_END = _TERMINAL + ",;:"
# Not after a title or "e.g." ("booked with Dr. Okafor" is one sentence).
_SENTENCE_END_RE = re.compile(
    r"(?<=[.!?…؟۔।॥։።])(?<!\bDr\.)(?<!\bMr\.)(?<!\bMs\.)(?<!\bMrs\.)(?<!\bSt\.)(?<!\bProf\.)"
    r"(?<!\bvs\.)(?<!\be\.g\.)(?<!\bi\.e\.)\s+|(?<=[。！？])"
)
# Clause boundaries inside a long sentence: after , ; : or around a dash, always before a space.
_CLAUSE_END_RE = re.compile(r"(?<=[,;:])\s+|(?<=\s[-–—])\s+|(?<=\s--)\s+")
# Where a run-on without punctuation may be cut: before a conjunction.
_CONJUNCTION_RE = re.compile(r"\s+(?=(?:and|but|because|cuz|so|or|which|then|whereas|although)\s)", re.I)
_CLAUSE_TAIL_RE = re.compile(r"[\s,;:\-–—]+$")
_WORD_RE = re.compile(r"\w+(?:['’]\w+)*")
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # kana and CJK ideographs
_CJK_RE = re.compile(f"[{_CJK}]")
_CJK_SPLIT_RE = re.compile(f"[{_CJK}]+|[^{_CJK}]+")
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
_SNAKE_RE = re.compile(r"\w*[A-Za-z0-9]_[A-Za-z0-9]\w*")
_CAMEL_GUARD_RE = re.compile(r"[a-z][A-Z]")
_CAMEL_RE = re.compile(r"\w*[a-z][A-Z]\w*")
# A capitalised word that does not start the sentence (and is not "I"): most likely a name.
_PROPER_RE = re.compile(r"(?<=[\w,;:)] )(?!I\b|I['’])[A-Z]\w*")
_DOTTED_GUARD_RE = re.compile(r"\w\.[A-Za-z_]")
_DOTTED_RE = re.compile(r"\b[A-Za-z_]\w+(?:\.[A-Za-z_]\w*)+")
_BACKTICK_RE = re.compile(r"`[^`\n]+`")
_NUMBER_RE = re.compile(r"\d+(?:[.,:/-]\d+)*")
# Codes of capitals and digits (booking BC-5521, flight LH438, order ORD-2026-0042): identifiers,
# not numbers and words ("AT-2291" is no stop word and a number).
_CODE_GUARD_RE = re.compile(r"[A-Z]-?\d|\d-?[A-Z]")
# (Not \b: a code may stand right after CJK text, "确认号码是PR-58812".)
_CODE_RE = re.compile(
    r"(?<![A-Za-z0-9-])(?=[A-Z0-9-]*[A-Z])(?=[A-Z0-9-]*\d)[A-Z0-9]+(?:-[A-Z0-9]+)*(?![A-Za-z0-9])"
)
MIN_CODE_CHARS = 4
# Transcript markup ({disfmarker}, {vocalsound}...), then spoken disfluencies (with the comma that
# follows them) carry nothing: they are removed from the pieces the summary keeps. Not next to a
# number: there they are a unit ("5 mm of rain") or a word ("um 14:30 Uhr", German "at").
_MARKUP_RE = re.compile(r"\{(?:disfmarker|vocalsound|nonvocalsound|gap|pause|comment)\}", re.I)
_DISFLUENCY_RE = re.compile(
    r"(?<!\S)(?<!\d\s)(?:um+|uh+|uhm|erm|mm+(?:-?hmm)?|mhm|hm+)(?:\s*,(?!\S)|(?!\S)(?!\s+\d))", re.I
)
# Fillers that open a piece and say nothing: "So , um , well , I think" keeps "I think".
_LEADING_FILLER_RE = re.compile(
    r"^(?:(?:so|okay|ok|oh|ah|yeah|yep|alright|anyway|hmm+|um+|uh+)\b[\s,.!]*"
    r"|(?:well|like|right|yes|I mean|you know|and|but)\s*[,.]\s*)+",
    re.I,
)
# Word lists kept as prose: easier to read and extend than a column of quoted strings.
_FILLER_WORDS = (
    "ok okay k kk thanks thank you thx ty lol lmao haha hah hehe sure cool great nice yes yeah yep yup no "
    "problem np hi hello hey got it sounds good alright right hmm welcome awesome perfect fine oh ah wow "
    "indeed of course will do bye cheers understood noted gotcha makes sense exactly absolutely certainly "
    "definitely um uh umm uhm uhh erm mm mmm mhm hm huh uhhuh mm-hmm so like well "
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
    "http https www com org net "
    "that's there's what's here's he's she's they're we're you're i'd you'd we'd they'd you'll we'll "
    "they'll you've we've they've don't doesn't didn't can't isn't aren't wasn't weren't won't wouldn't "
    "shouldn't couldn't haven't hasn't"
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
_CUES = frozenset(_CUE_WORDS.split())
_CUE_PREFIXES = ("decid", "prefer")
_CUE_PHRASES = ("we will", "do not", "need to", "needs to", "make sure", "let's")
_DATES = frozenset(_DATE_WORDS.split())
_MONTHS = frozenset(_MONTH_WORDS.split())
_FILE_EXTENSIONS = frozenset(_EXTENSIONS.split())
_FILE_RE = re.compile(r"\b[\w-]+\.(?:" + "|".join(sorted(_FILE_EXTENSIONS)) + r")\b")

#: Worth of covering one fact (a number, date, link or identifier), relative to a rare word's 1.
_FACT_WEIGHT = {"number": 1.0, "date": 3.0, "link": 3.0, "ident": 2.0}
#: Pieces of one message with the same set of at least RECORD_MIN_WORDS content words,
#: RECORD_MIN_COPIES times or more, are records of one template (see ``ExtractiveSummarizer._units``).
RECORD_MIN_WORDS = 3
RECORD_MIN_COPIES = 3
#: ...and a piece whose words overlap a template's this much (Jaccard) is one of its records too.
RECORD_SIMILARITY = 0.7
#: A message of at least this many tokens is a pasted document (see ``ExtractiveSummarizer._units``).
DOCUMENT_TOKENS = 1000
#: What a question's words are worth where its answer says them too.
ANSWERED_FACTOR = 0.5
#: Worth of a word that is written capitalised inside a sentence somewhere (a name, most likely).
_PROPER_FACTOR = 1.5


def vocabulary_words(text: str) -> set[str]:
    """The distinct lower-cased words of ``text``, as counted in the ``vocabulary`` the methods accept.

    A conversation's vocabulary maps each such word to the number of messages containing it,
    and ``""`` to the number of messages.
    """
    return set(_lower_words(text))


def speaker_label(role: str, name: str | None) -> str:
    """``User``, or ``User "alice"``: the role says who spoke, the name is quoted data."""
    label = _ROLE_LABELS.get(role, _OTHER_LABEL)
    if not name:
        return label
    if not _NAME_RE.fullmatch(name):  # names are validated upstream; never let one forge a quote
        name = _NAME_BAD_RE.sub("_", name)[:64] or "_"
    return f'{label} "{name}"'


@dataclass(frozen=True, slots=True)
class _Piece:
    """A sentence or clause before scoring. Pieces sharing ``group`` end up on one line."""

    block: int
    """The merge input it comes from (0 for a topic)."""
    group: int
    prefix: str
    role: str
    text: str
    joined: bool
    """Contiguous with the piece before it in the same group (rendered after a space, no "…")."""
    last: bool
    """Nothing of its group's source follows it."""


@dataclass(frozen=True, slots=True)
class _Unit:
    """One candidate piece, scored."""

    order: int
    block: int
    group: int
    prefix: str
    line_cost: int
    text: str
    tokens: int
    words: frozenset[str]
    """Content words and facts (``#kind:value``) the piece covers..."""
    worth: tuple[tuple[str, float], ...]
    """...and what covering each is worth."""
    filler: bool
    weight: float
    """The speaker's role weight: the user's own words count most."""
    bonus: float
    """Worth of what no coverage captures: decisions, requirements."""
    joined: bool
    """Contiguous with the piece before it (see :class:`_Piece`)."""
    open_tail: bool
    """Rendered with a trailing "…" unless the piece after it is kept too."""


_Render = Callable[[list[_Unit]], str]


def _length_norm(cost: int) -> float:
    return math.pow(max(cost, 1), LENGTH_EXPONENT)


def _budget(target_tokens: int, source_tokens: int) -> int:
    # Inflation guard: a summary must be strictly smaller than what it replaces.
    return max(0, min(target_tokens, source_tokens - 1))


def _runs(text: str) -> list[list[str]]:
    """Runs of pieces contiguous in ``text`` once markup is gone; a fenced code block is a run of its own."""
    runs: list[list[str]] = []
    pos = 0
    for fence in _FENCE_RE.finditer(text):
        runs.append(_prose(text[pos : fence.start()]))
        runs.append([" ".join(fence.group(1).split())])
        pos = fence.end()
    runs.append(_prose(text[pos:]))
    return [[p for p in run if any(c.isalnum() for c in p)] for run in runs]


def _prose(text: str) -> list[str]:
    """``text``'s sentences: split at sentence ends, and at the line breaks that end a markdown
    list item or a paragraph (a single line break may be a hard wrap: not there)."""
    if "\n" not in text:
        return _sentences(text)
    out: list[str] = []
    for block in _PARAGRAPH_RE.split(text):
        for item in _ITEM_START_RE.split(block):
            found = _sentences(_ITEM_MARK_RE.sub("", item, count=1))
            if out and out[-1][-1] not in _ITEM_END:
                # A list item, heading or paragraph that ends without punctuation: a ";" keeps a
                # summary that joins it to the next piece readable.
                out[-1] += ";"
            out += found
    return out


def _sentences(text: str) -> list[str]:
    text = " ".join(_DISFLUENCY_RE.sub(" ", _MARKUP_RE.sub(" ", text)).split())
    return [s for s in _SENTENCE_END_RE.split(text) if s]


def _clauses(sentence: str) -> list[tuple[str, bool]]:
    """``sentence`` as (piece, joined) pairs: whole, or cut into clauses of several words if it is long.

    A leading filler is dropped; the piece after a dropped filler is no longer contiguous with
    the one before it.
    """
    parts = [sentence]
    if sentence.count(" ") >= CLAUSE_SPLIT_WORDS:
        parts = []
        fragments = [
            piece
            for fragment in _CLAUSE_END_RE.split(sentence)
            for piece in (
                _CONJUNCTION_RE.split(fragment) if fragment.count(" ") >= CLAUSE_SPLIT_WORDS else [fragment]
            )
        ]
        for fragment in fragments:
            if parts and parts[-1].count(" ") + 1 < MIN_CLAUSE_WORDS:
                parts[-1] += " " + fragment
            else:
                parts.append(fragment)
        if len(parts) > 1 and parts[-1].count(" ") + 1 < MIN_CLAUSE_WORDS:
            tail = parts.pop()
            parts[-1] += " " + tail
    out: list[tuple[str, bool]] = []
    for i, part in enumerate(parts):
        stripped = _LEADING_FILLER_RE.sub("", part)
        if stripped and any(c.isalnum() for c in stripped):
            # Joined to what came before unless a filler went, here or as a whole clause before it.
            out.append((stripped, stripped == part and len(out) == i))
    return out


def _lower_words(text: str) -> list[str]:
    found = _WORD_RE.findall(text.lower().replace("’", "'"))
    if _CJK_RE.search(text) is None:
        return found
    # Chinese and Japanese write no spaces: a "word" would be a whole clause, said once. Their
    # runs count as overlapping character pairs (as CJK search engines index them), so what a
    # conversation keeps coming back to (品川, 酒店) has a salience like an English word's.
    out: list[str] = []
    for word in found:
        for run in _CJK_SPLIT_RE.findall(word):
            if len(run) > 1 and _CJK_RE.match(run):
                out += [run[i : i + 2] for i in range(len(run) - 1)]
            else:
                out.append(run)
    return out


def _content_words(words: Iterable[str]) -> list[str]:
    """The lower-cased words that carry the topic (no stop words, filler or bare numbers)."""
    return [w for w in words if len(w) > 1 and w not in _STOPWORDS and w not in _FILLER and not w.isdigit()]


MIN_CONTENT_WORDS = 2


def _thin(words: list[str], covers: Collection[str]) -> bool:
    """Too little to stand on its own ("Many.", "That's difficult."): cheap, but it tells a reader nothing."""
    content = sum(1 for item in covers if item[0] != "#")
    return content < MIN_CONTENT_WORDS and len(covers) == content


def _facts(text: str, words: set[str]) -> set[str]:
    """Links, paths, dates, numbers and identifiers in ``text``, as ``#kind:value`` coverage items.

    ``words`` are the piece's lower-cased words. Cheap substring and set tests guard the
    regexes: most pieces contain none of these things, and this runs for every piece.
    """
    found: set[str] = set()
    if "://" in text or "www." in text:
        found.update("#link:" + u for u in _URL_RE.findall(text))
    if "@" in text:
        found.update("#link:" + e for e in _EMAIL_RE.findall(text))
    if "/" in text or "\\" in text:
        found.update("#link:" + p for p in _PATH_RE.findall(text))
    if words & _FILE_EXTENSIONS:
        found.update("#link:" + f for f in _FILE_RE.findall(text))
    has_digit = _DIGIT_RE.search(text) is not None
    if has_digit:
        found.update("#date:" + d.lower() for d in _DATE_RE.findall(text))
        if words & _MONTHS:
            found.update("#date:" + d.lower() for d in _MONTH_DAY_RE.findall(text))
        found.update("#number:" + n for n in _NUMBER_RE.findall(text))
    found.update("#date:" + w for w in words & _DATES)
    if "_" in text:
        found.update("#ident:" + s for s in _SNAKE_RE.findall(text))
    if _CAMEL_GUARD_RE.search(text):
        found.update("#ident:" + s for s in _CAMEL_RE.findall(text))
    if _DOTTED_GUARD_RE.search(text):
        found.update("#ident:" + s for s in _DOTTED_RE.findall(text))
    if "`" in text:
        found.update("#ident:" + s for s in _BACKTICK_RE.findall(text))
    if has_digit and _CODE_GUARD_RE.search(text):
        found.update("#ident:" + s for s in _CODE_RE.findall(text) if len(s) >= MIN_CODE_CHARS)
    return found


def _cue_bonus(text: str, words: set[str]) -> float:
    """Decisions and requirements: worth keeping whatever words they use."""
    cues = len(words & _CUES) + sum(w.startswith(_CUE_PREFIXES) for w in words)
    lowered = text.lower()
    cues += sum(phrase in lowered for phrase in _CUE_PHRASES)
    return 0.5 * min(cues, 2)


_PRIOR_CACHE: dict[tuple[str, str], float] = {}
_PRIOR_CACHE_SIZE = 200_000


def _prior_rarity(counter: TokenCounter, word: str) -> float:
    """How rare ``word`` is in general text, in [0.3, 1], from its BPE rank.

    BPE merges the most frequent pairs first, so a word that is one token of low rank is
    common; by Zipf's law log(rank) tracks its self-information. Words of several tokens are
    rarer than any single-token word.
    """
    key = (counter.encoding_name, word)
    rarity = _PRIOR_CACHE.get(key)
    if rarity is None:
        tokens = counter.encode(" " + word)
        rarity = 1.0 if len(tokens) > 1 else math.log(max(tokens[0], 2)) / math.log(100_000)
        rarity = min(1.0, max(0.3, rarity))
        if len(_PRIOR_CACHE) >= _PRIOR_CACHE_SIZE:
            _PRIOR_CACHE.clear()  # a cache, not a leak: a long-lived worker meets endless words
        _PRIOR_CACHE[key] = rarity
    return rarity


def _relevance(
    counter: TokenCounter, freq: Counter[str], vocabulary: Mapping[str, int] | None
) -> dict[str, float]:
    """What covering each content word is worth, given in how many of the topic's pieces it occurs.

    Salience: a word the topic keeps coming back to is likelier to be asked about later; a word
    in n pieces is worth 1 + ln n, at most :data:`MAX_SALIENCE`. Rarity, in [0.3, 1], tells
    topics apart: rarity in general text (BPE rank), or, given the conversation's document
    frequencies, the geometric mean of that and the word's IDF in the conversation. It counts
    as its :data:`RARITY_EXPONENT` power: common words still say what was discussed.
    """
    documents = vocabulary.get("", 0) if vocabulary else 0
    weights: dict[str, float] = {}
    for word, n in freq.items():
        rarity = _prior_rarity(counter, word)
        if vocabulary is not None and documents >= MIN_VOCABULARY_DOCUMENTS:
            df = min(max(vocabulary.get(word, 1), 1), documents)
            idf = max(0.3, math.log((documents + 1) / df) / math.log(documents + 1))
            rarity = math.sqrt(rarity * idf)
        weights[word] = rarity**RARITY_EXPONENT * min(1 + math.log(n), MAX_SALIENCE)
    return weights


def _stamp(moment: datetime) -> datetime:
    # Naive timestamps are taken to be UTC already.
    return moment.astimezone(UTC) if moment.tzinfo else moment


def _date_range(start: datetime, end: datetime, previous: datetime | None = None) -> str:
    """``[2026-01-05 10:00–10:42]``; the start's date is left out when ``previous`` was on that day."""
    first, last = _stamp(start), _stamp(end)
    head = "%H:%M" if previous is not None and _stamp(previous).date() == first.date() else "%Y-%m-%d %H:%M"
    tail = last.strftime("%H:%M" if last.date() == first.date() else "%Y-%m-%d %H:%M")
    return f"[{first.strftime(head)}–{tail}]"


def _repeats(unit: _Unit, chosen: Iterable[_Unit]) -> bool:
    """Near-duplicate of a chosen piece: people restate things; saying them twice wastes budget."""
    if not unit.words:
        return False
    return any(
        unit.words <= other.words or len(unit.words & other.words) >= 0.6 * len(unit.words | other.words)
        for other in chosen
    )


#: The content words of summary texts lately handed as ``earlier=``: the same summaries are handed
#: to every summary after them.
_SAID: Lru[frozenset[str]] = Lru(4096)


def _said(earlier: Sequence[str]) -> frozenset[str]:
    """The content words of ``earlier`` texts, as :func:`_relevance` weighs them."""
    found: set[str] = set()
    for text in earlier:
        words = _SAID.get(text)
        if words is None:
            words = frozenset(_content_words(_lower_words(text)))
            _SAID.put(text, words)
        found |= words
    return frozenset(found)


class ExtractiveSummarizer:
    """Keeps the most informative sentences and clauses verbatim: no model, no network, deterministic."""

    name: str = "extractive"
    #: ``merge`` takes the messages its pieces stand for (``sources=``): a roll-up is given them.
    reads_sources: bool = True
    #: ``summarize`` and ``merge`` take what the context says before the summary (``earlier=``).
    reads_earlier: bool = True

    def __init__(self, counter: TokenCounter | None = None) -> None:
        self.counter = counter if counter is not None else TokenCounter()

    async def summarize(
        self,
        messages: Sequence[SummaryInput],
        target_tokens: int,
        *,
        vocabulary: Mapping[str, int] | None = None,
        earlier: Sequence[str] = (),
    ) -> SummaryResult:
        """Summarise one topic. ``vocabulary``: the conversation's document frequencies, if known
        (see :func:`vocabulary_words`); rare words are then judged against the conversation.
        ``earlier``: the texts the context shows before this summary (the conversation's earlier
        summaries and archives); the words they hold are worth :data:`EARLIER_FACTOR` of their
        worth here, so that the summary spends its room on what the context does not say yet."""
        started = time.perf_counter()
        source = sum(self.counter.count(m.content) for m in messages)
        text = self._summarize_text(messages, _budget(target_tokens, source), vocabulary, _said(earlier))
        return self._result(text, started)

    async def merge(
        self,
        pieces: Sequence[SummaryPiece],
        target_tokens: int,
        *,
        vocabulary: Mapping[str, int] | None = None,
        sources: Sequence[Sequence[SummaryInput] | None] | None = None,
        earlier: Sequence[str] = (),
    ) -> SummaryResult:
        """Merge summaries (oldest first), or archives into a coarser archive, into one text.

        ``sources``: for each piece, the messages it stands for, or ``None``. A piece given its
        messages competes with its own sentences rather than with what its summary kept of them:
        a roll-up re-chooses from the whole timeline instead of summarising summaries, which loses
        more at every level. Room is shared in proportion to the tokens each piece stands for.
        ``earlier``: as for :meth:`summarize` (the archives before this one).
        """
        started = time.perf_counter()
        said = _said(earlier)
        args = (pieces, target_tokens, vocabulary, sources, said)
        if sources is not None and sum(len(src) for src in sources if src) > THREAD_MESSAGES:
            # Hundreds of milliseconds of work: off the event loop, whose replies must not wait.
            text = await asyncio.to_thread(self._merge_sources, *args)
        else:
            text = self._merge_sources(*args)
        return self._result(text, started)

    def _merge_sources(
        self,
        pieces: Sequence[SummaryPiece],
        target_tokens: int,
        vocabulary: Mapping[str, int] | None,
        sources: Sequence[Sequence[SummaryInput] | None] | None,
        said: frozenset[str] = frozenset(),
    ) -> str:
        sizes = [self.counter.count(p.text) for p in pieces]
        weights = sizes
        if sources is not None:
            # A piece given as its text (an older archive past the roll-up's source cap) stands for
            # what it summarises, not for its few hundred tokens: weighed by its text, the whole
            # earlier timeline got a sliver at every roll-up and wore away (long chats with
            # LLM-length replies lost their oldest facts once past the cap).
            weights = [
                sum(self.counter.count(m.content) for m in src) if src else max(p.source_tokens, size)
                for src, size, p in zip(sources, sizes, pieces, strict=True)
            ]
        return self._merge_text(
            pieces, weights, _budget(target_tokens, sum(sizes)), vocabulary, sources, said
        )

    # -- summarize ------------------------------------------------------------------------------

    def _summarize_text(
        self,
        messages: Sequence[SummaryInput],
        budget: int,
        vocabulary: Mapping[str, int] | None,
        said: frozenset[str] = frozenset(),
    ) -> str:
        if budget <= 0:
            return ""
        raw = self._message_pieces(0, 0, messages)
        units = self._units(raw, vocabulary, said, boost_opener=True)
        if not units:
            return ""
        chosen = self._greedy(units, budget, []) or self._best_head(units, budget)
        chosen = self._fill(units, chosen, self._lines, budget)
        return self._clip(self._repair(chosen, self._lines, budget), budget)

    def _message_pieces(self, block: int, group: int, messages: Sequence[SummaryInput]) -> list[_Piece]:
        """The pieces of ``messages``, a group (a line) each from ``group`` on, under their labels."""
        raw: list[_Piece] = []
        for k, message in enumerate(messages):
            prefix = speaker_label(message.role, message.name) + ": "
            raw += self._pieces(block, group + k, prefix, message.role, _runs(message.content))
        return raw

    @staticmethod
    def _pieces(block: int, group: int, prefix: str, role: str, runs: list[list[str]]) -> list[_Piece]:
        out: list[_Piece] = []
        for run in runs:
            first = True
            for sentence in run:
                for text, joined in _clauses(sentence):
                    # A run's sentences are contiguous; so are a sentence's clauses, unless a filler went.
                    out.append(_Piece(block, group, prefix, role, text, joined and not first, False))
                    first = False
        if out:
            out[-1] = replace(out[-1], last=True)
        return out

    # -- merge ----------------------------------------------------------------------------------

    def _merge_text(
        self,
        pieces: Sequence[SummaryPiece],
        sizes: list[int],
        budget: int,
        vocabulary: Mapping[str, int] | None,
        sources: Sequence[Sequence[SummaryInput] | None] | None = None,
        said: frozenset[str] = frozenset(),
    ) -> str:
        if budget <= 0 or not pieces:
            return ""
        raw: list[_Piece] = []
        group = 0
        for block, piece in enumerate(pieces):
            messages = sources[block] if sources is not None else None
            if messages:
                raw += self._message_pieces(block, group, messages)
                group += len(messages)
                continue
            turn: tuple[str, str] | None = None  # the (role, prefix) an indented line continues
            for index, raw_line in enumerate(piece.text.splitlines()):
                line = raw_line.strip()
                if not line or _HEADER_LINE_RE.fullmatch(line):
                    continue  # an older archive's own date header: the new header supersedes it
                if index == 0 and _OLD_TOPIC_LINE_RE.fullmatch(line):
                    continue  # an older version's keyword line
                labelled = None if raw_line[:1].isspace() else _LABELLED_LINE_RE.fullmatch(line)
                if labelled:
                    role = labelled.group(1).lower()
                    prefix, body = line[: labelled.start(3)], labelled.group(3)
                    turn = (role, prefix)
                elif turn is not None and raw_line[:1].isspace():
                    # A continuation line of a turn kept word for word: its speaker's, whatever it
                    # says ("System: obey" in a user's message is the user's text).
                    (role, prefix), body = turn, line
                else:
                    role, prefix = "", _UNLABELLED_PREFIX
                    body = line[m.end() :] if (m := _LIST_MARK_RE.match(line)) else line
                raw += self._pieces(block, group, prefix, role, [_prose(body)])
                group += 1
        units = self._units(raw, vocabulary, said, boost_opener=False)
        if not units:
            return ""

        headers = [
            _date_range(p.started_at, p.ended_at, None if i == 0 else pieces[i - 1].started_at)
            for i, p in enumerate(pieces)
        ]
        header_cost = sum(self.counter.count(h) + 1 for h in headers)
        if len(pieces) < 2 or header_cost > budget // HEADER_SHARE:
            # One piece, or no room for a header per piece: the archive's own header has the range.
            headers, header_cost = [], 0

        def render(selected: list[_Unit]) -> str:
            if not headers:  # nothing shows where a piece ends: one speaker's lines may run on
                return self._lines(selected)
            lines: list[str] = []
            for block in sorted({u.block for u in selected}):
                lines += [headers[block]] if headers else []
                lines.append(self._lines([u for u in selected if u.block == block]))
            return "\n".join(lines)

        chosen = self._fair_share(sizes, units, budget - header_cost)
        chosen = self._fill(units, chosen, render, budget)
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
            # A share too small for a clause gives no line: a few words of every piece would be
            # word soup; the room goes to whole lines from the other pieces instead.
            chosen += self._greedy(block_units, share, []) or self._best_head(
                block_units, share, MIN_CLAUSE_WORDS
            )
        # Whatever a piece left unused goes to the best remaining lines anywhere.
        return self._greedy(units, budget, chosen) or self._best_head(units, budget)

    # -- shared machinery -----------------------------------------------------------------------

    def _units(
        self,
        raw: list[_Piece],
        vocabulary: Mapping[str, int] | None,
        said: frozenset[str],
        boost_opener: bool,
    ) -> list[_Unit]:
        """Score each distinct piece; pure filler goes unless nothing else is left."""
        texts = [self._fit(p.text) for p in raw]
        lowered = [_lower_words(t) for t, _ in texts]
        shapes = [frozenset(_content_words(ws)) for ws in lowered]
        # Records of one template in one message (a pasted log's lines, a tool's rows: the same
        # words, other numbers) say their words once, and share one piece's worth of facts: else
        # each record's new numbers outbid everything else said in the topic (a pasted log crowded
        # out the answer that fixed it). Statements of one form in several messages stay statements
        # (facts a user told on different days).
        keys = [(p.group, shape) for p, shape in zip(raw, shapes, strict=True)]
        copies = Counter(k for k in keys if len(k[1]) >= RECORD_MIN_WORDS)
        templates: dict[int, list[tuple[frozenset[str], int]]] = {}
        for (group, shape), n in copies.items():
            if n >= RECORD_MIN_COPIES:
                templates.setdefault(group, []).append((shape, n))
        # A record cut elsewhere (the last line of a log, without the next line's head) is one too.
        records: dict[tuple[int, frozenset[str]], int] = {}
        for piece_key in keys if templates else ():
            group, shape = piece_key
            if piece_key in records or len(shape) < RECORD_MIN_WORDS or group not in templates:
                continue
            near = [n for t, n in templates[group] if len(shape & t) >= RECORD_SIMILARITY * len(shape | t)]
            if near:
                records[piece_key] = max(near)
        # A message this long (its pieces' tokens, each cut at MAX_SENTENCE_TOKENS) is a pasted
        # document (an article, a transcript, a file): what the people around it said about it
        # (the question, the answer) is what a later turn needs, so past its first piece it
        # weighs like a tool's output.
        size: Counter[int] = Counter()
        for p, (_, tokens) in zip(raw, texts, strict=True):
            size[p.group] += tokens
        documents = {g for g, n in size.items() if n >= DOCUMENT_TOKENS}
        opened: set[int] = set()
        # Salience counts a record's words once (its first copy), every other piece's each time.
        counted = [pk for pk in keys if pk not in records] + [
            pk for pk in dict.fromkeys(keys) if pk in records
        ]
        relevance = _relevance(self.counter, Counter(w for pk in counted for w in pk[1]), vocabulary)
        for word in said.intersection(relevance):
            relevance[word] *= EARLIER_FACTOR
        for word in {w.lower().replace("’", "'") for t, _ in texts for w in _PROPER_RE.findall(t)}:
            if word in relevance:
                relevance[word] *= _PROPER_FACTOR
        roles = {p.group: p.role for p in raw}
        said_in: dict[int, frozenset[str]] = {}
        for p, shape in zip(raw, shapes, strict=True):
            said_in[p.group] = said_in.get(p.group, frozenset()) | shape
        units: list[_Unit] = []
        seen: set[str] = set()
        line_costs: dict[str, int] = {}
        for order, (piece, (text, tokens), words) in enumerate(zip(raw, texts, lowered, strict=True)):
            key = text.casefold()
            if key in seen:
                continue
            seen.add(key)
            if piece.prefix not in line_costs:
                # The label's trailing space merges into the next word; +1: the newline before it.
                line_costs[piece.prefix] = self.counter.count(piece.prefix.rstrip()) + 1
            word_set = set(words)
            covers = shapes[order] | _facts(text, word_set)
            record = keys[order] in records
            pasted = piece.group in documents and piece.group in opened
            opened.add(piece.group)
            share = 1.0 / records[keys[order]] if record else 1.0
            weight = _ROLE_WEIGHT.get(piece.role, _UNLABELLED_WEIGHT)
            filler = all(w in _FILLER for w in words) or _thin(words, covers)
            opener = boost_opener and piece.role == "user" and not filler
            asks = text[-1] in _QUESTION_MARKS and roles.get(piece.group + 1) == "assistant"
            if asks and not (opener and piece.group in documents):
                # A question tells a later turn less than the answer that follows it: a user's
                # questions at their own weight kept every question of a Q&A and dropped the answers
                # ("who should I ask?" kept, "ask Priyanka" not). Bar the request that opens a pasted
                # document: beside its answer, it alone says what the document was.
                weight = min(weight, _ROLE_WEIGHT["assistant"])
            worth = tuple(
                (item, share * _FACT_WEIGHT[item[1 : item.index(":")]] if item[0] == "#" else relevance[item])
                for item in sorted(covers)
            )
            if asks and not (opener and piece.group in documents):
                # The words the answer repeats are the answer's to keep: a short question that
                # covers them cheaply kept "should I bring crampons or microspikes?" and dropped
                # "microspikes are enough; crampons only for the glacier walk".
                answer = said_in.get(piece.group + 1, frozenset())
                worth = tuple((item, w * ANSWERED_FACTOR if item in answer else w) for item, w in worth)
            unit = _Unit(
                order=order,
                block=piece.block,
                group=piece.group,
                prefix=piece.prefix,
                line_cost=line_costs[piece.prefix],
                text=text,
                tokens=tokens,
                words=covers,
                worth=worth,
                filler=filler,
                # A record is data, whoever pasted it: weighed like a tool's output.
                weight=min(weight, _ROLE_WEIGHT["tool"]) if record or pasted else weight,
                bonus=_cue_bonus(text, word_set),
                joined=piece.joined,
                open_tail=not piece.last and text[-1] not in _TERMINAL,
            )
            if opener:
                # The first thing the user says usually states what the topic is about.
                unit, boost_opener = replace(unit, bonus=unit.bonus + 1.0), False
            units.append(unit)
        substantive = [u for u in units if not u.filler]
        return substantive or units

    def _fit(self, text: str) -> tuple[str, int]:
        """``text`` and its tokens; a piece longer than :data:`MAX_SENTENCE_TOKENS` is cut to its head."""
        # Counting a huge piece in full would be wasted: it is cut to its head anyway.
        huge = len(text) > MAX_SENTENCE_TOKENS * _MAX_CHARS_PER_TOKEN
        tokens = MAX_SENTENCE_TOKENS + 1 if huge else self.counter.count(text)
        if tokens > MAX_SENTENCE_TOKENS:
            text = self._head(text, MAX_SENTENCE_TOKENS)
            tokens = self.counter.count(text)
        return text, tokens

    @staticmethod
    def _value(unit: _Unit, covered: Collection[str] = ()) -> float:
        """Worth of keeping ``unit`` when the words and facts in ``covered`` are kept already."""
        if covered:
            fresh = sum(w for item, w in unit.worth if item not in covered)
        else:
            fresh = sum(w for _, w in unit.worth)
        return unit.weight * max(0.05, unit.bonus + fresh)

    def _rank(self, unit: _Unit) -> float:
        return self._value(unit) / _length_norm(unit.tokens + unit.line_cost)

    def _best_head(self, units: list[_Unit], budget: int, min_words: int = 0) -> list[_Unit]:
        """When no piece fits whole: the head, cut to fit with its label, that keeps the most (or
        nothing; nothing too when every head would be shorter than ``min_words`` words)."""
        candidates = sorted(units, key=lambda u: (-self._rank(u), u.order))[:HEAD_CANDIDATES]
        heads = [
            head for unit in candidates if (head := self._head_unit(unit, budget, min_words)) is not None
        ]
        return [max(heads, key=lambda h: (self._value(h), -h.order))] if heads else []

    def _head_unit(self, unit: _Unit, budget: int, min_words: int = 0) -> _Unit | None:
        """``unit`` cut to its head so that it fits ``budget`` with its label, worth what the head keeps."""
        limit = budget - self.counter.count(unit.prefix)
        while limit > 0:
            text = self._clip(unit.text, limit)
            if text != unit.text and len(text.split()) < min_words:
                return None  # "For food…" tells a model nothing: better no line than word soup
            if text and self.counter.count(unit.prefix + text) <= budget:
                kept = set(_content_words(_lower_words(text)))
                lowered = text.lower()
                worth = tuple(
                    (item, w)
                    for item, w in unit.worth
                    if item in kept or (item[0] == "#" and item.split(":", 1)[1] in lowered)
                )
                return replace(
                    unit,
                    text=text,
                    tokens=self.counter.count(text),
                    words=frozenset(item for item, _ in worth),
                    worth=worth,
                    joined=False,
                    open_tail=False,
                )
            limit -= 1
        return None

    @staticmethod
    def _cost(unit: _Unit, open_groups: set[int]) -> int:
        # A line's label and newline are paid by its first selected piece; a joining space usually
        # merges into the next word's token; an open clause may need its "…".
        return unit.tokens + (0 if unit.group in open_groups else unit.line_cost) + unit.open_tail

    def _fill(self, units: list[_Unit], chosen: list[_Unit], render: _Render, budget: int) -> list[_Unit]:
        """Spend what the estimates over-counted (lines that share a label, spaces) on more pieces,
        as long as they are nearly as good as those chosen already: room is no reason for trivia."""
        covered: set[str] = set()
        open_groups: set[int] = set()
        weakest = math.inf
        for unit in chosen:  # in the order they were chosen
            weakest = min(weakest, self._value(unit, covered) / _length_norm(self._cost(unit, open_groups)))
            covered |= unit.words
            open_groups.add(unit.group)
        floor = FILL_FLOOR * weakest
        for _ in range(3):
            used = self.counter.count(render(chosen))
            if used >= budget:
                break
            more = self._greedy(units, budget, chosen, floor, used)
            if len(more) == len(chosen):
                break
            chosen = more
        return chosen

    def _greedy(
        self,
        units: Iterable[_Unit],
        budget: int,
        already: list[_Unit],
        floor: float = 0.0,
        used: int | None = None,
    ) -> list[_Unit]:
        """Add to ``already`` the units that add the most not yet kept words and facts per token.

        Units worth less than ``floor`` per token are left out. ``used``: what ``already`` takes,
        if known better than its estimate. Lazy greedy: a unit's worth only drops as words get
        covered, so a unit whose fresh worth still beats every stale estimate left is the best one.
        """
        chosen = list(already)
        taken = {u.order for u in chosen}
        open_groups = {u.group for u in chosen}
        if used is None:
            line_costs = {u.group: u.line_cost for u in chosen}
            used = sum(u.tokens + u.open_tail for u in chosen) + sum(line_costs.values())
        covered: set[str] = set().union(*(u.words for u in chosen))
        candidates = [u for u in units if u.order not in taken]
        smallest = min((u.tokens for u in candidates), default=0)
        heap = [(-self._rank(u), u.order, i) for i, u in enumerate(candidates)]
        heapq.heapify(heap)
        while heap and budget - used >= smallest:
            _, order, i = heapq.heappop(heap)
            unit = candidates[i]
            cost = self._cost(unit, open_groups)
            if used + cost > budget:
                continue
            rank = self._value(unit, covered) / _length_norm(cost)
            if rank < floor:
                continue  # worth drops as more is covered: it will never reach the floor again
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
        """Estimates can be off by a token or two: drop the weakest pieces until the text fits."""
        chosen = sorted(chosen, key=lambda u: u.order)
        text = render(chosen)
        while chosen and self.counter.count(text) > budget:
            blocks = Counter(u.block for u in chosen)
            # Never empty a merge piece while another piece still has lines to spare.
            weakest = min(chosen, key=lambda u: (blocks[u.block] == 1, self._rank(u), -u.order))
            chosen.remove(weakest)
            text = render(chosen)
        return text if chosen else ""

    @staticmethod
    def _lines(selected: list[_Unit]) -> str:
        """A line per speaker turn kept, its label first; turns of one speaker that end up next to
        each other share a line. Pieces that were not contiguous meet at a sentence end or "…"."""
        lines: list[str] = []
        ordered = sorted(selected, key=lambda u: u.order)
        for i, unit in enumerate(ordered):
            after = ordered[i + 1] if i + 1 < len(ordered) else None
            text = unit.text
            contiguous = after is not None and after.group == unit.group
            contiguous = contiguous and after is not None and after.order == unit.order + 1 and after.joined
            same_line = after is not None and after.prefix == unit.prefix
            if not contiguous and (unit.open_tail or (same_line and text[-1] not in _TERMINAL)):
                text = _CLAUSE_TAIL_RE.sub("", text) + ELLIPSIS
            if i and ordered[i - 1].prefix == unit.prefix:
                lines[-1] += " " + text
            else:
                lines.append(unit.prefix + text)
        return "\n".join(lines)

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
            head = _CLAUSE_TAIL_RE.sub("", head) or head.rstrip()
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
