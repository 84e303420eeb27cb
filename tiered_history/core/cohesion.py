"""Content-based topic-shift detection: lexical novelty against the conversation's recent vocabulary.

Pure, deterministic, offline and cheap (about 20 µs a message of CPU): it runs inside
``add_message``. Its state is JSON kept in the conversation row, under 2 KB whatever the
conversation's length, and holds no word of the conversation (only 24-bit hashes).

How it decides
--------------
Each user or assistant message is reduced to its *content terms*: words of three letters
or more, lower-cased, lightly stemmed, minus stop words and markup such as
``{vocalsound}``; character pairs in scripts written without spaces. A shift is a run of
``window`` consecutive content messages whose opening message brings terms the
conversation has (almost) not used recently, and whose rest does not go back:

- a run opened by a statement: under ``novelty`` (20 %) of the opener's terms known, at
  least ``opener_min_terms`` (3) distinct terms in it (a short remark is weak evidence),
  and under ``confirm_novelty`` (70 %) of the rest of the run's new terms known (the
  confirmation: a reply that picks the old topic up again cancels the shift);
- a run opened by a question (the usual way to change the subject): under
  ``question_novelty`` (60 %) of the question's terms known, and under ``novelty`` of
  the rest of the run (under ``fresh_question_novelty``, 70 %, when none of the
  question's words is known). Judging the question and its follow-up apart matters: "and
  the sauce, eggs and pecorino, no cream?" is mostly new words, but its answer goes back
  to the pasta.

When a run is confirmed, the boundary goes where it began, not where it was noticed: the
caller moves the newest stored messages of the run into the new topic (``keep``).

"Used recently" is a memory of the conversation's vocabulary, not of the open topic
alone: two Bloom filters of 4,096 bits, the newer one taking each new term and handing
over to the older one every 400 terms, so the memory spans the last 400 to 800 distinct
terms. This is what lets one setting serve chit-chat and meetings: in a long discussion
the subject's words keep coming back and a run of nothing known is rare, while in a
short chat a new subject brings new words at once. (A memory of the open topic alone
fires again after every false alarm, since a fresh topic knows almost nothing: on QMSum
that tripled the false boundaries.)

A message that answers a question from the other side never opens a topic: a question
and its answer are one exchange (on TIAGE a boundary follows a question 9 % of the time,
against 26 % otherwise).

The state also keeps, for the newest stored messages, how good a place each would be
for a topic to start (for a size seal to cut where the talk turned rather than
mid-exchange; discourse markers such as "okay", "so", "now" count in favour), and the
recent terms of the open topic and of the topic sealed last, to tell when the messages
right after a seal continue the sealed topic (unseal).

Parameters were tuned on the TIAGE train/dev and QMSum train/val splits only
(``python -m bench.boundaries`` prints train beside test).
"""

from __future__ import annotations

import base64
import json
import re
import struct
import zlib
from binascii import b2a_base64 as _b2a  # base64.b64encode without its Python wrapper
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from json.encoder import encode_basestring as _encode_string

#: Bump when the JSON layout changes: an unknown version restarts the detector (it re-learns quickly).
STATE_VERSION = 1

_BITS = 4096  # per Bloom filter: 512 bytes, 684 characters of base64 when in use
_MASK = _BITS - 1
_SHIFT = _BITS.bit_length() - 1
_GENERATION = 400  # distinct terms a filter takes before it becomes the older one
_TOPIC_TERMS = 16  # recent terms kept for the open topic and for the topic sealed last
_GAPS = 24  # newest stored messages whose cut quality is kept (for size seals)
_TERMS_PER_MESSAGE = 24
_TEXT_CHARS = 1000  # a shift is announced early in a message; the rest only costs time
UNSEAL_MESSAGES = 3  # content messages after a seal during which it may be undone

_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)*")
#: ``_WORD`` on ASCII text after ``lower()``: the same words, found in half the time.
_ASCII_WORD = re.compile(r"[a-z]+(?:'[a-z]+)*")
_MARKUP = re.compile(r"\{\w+\}|<[^<>\n]{1,40}>|https?://\S+")
_UNSPACED_RUN = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]+")
_CUE = re.compile(
    r"^\W*(?:ok(?:ay)?|so|alright|all right|right|now|well|anyway|thanks|thank you|next)\b", re.IGNORECASE
)

# Function words and conversational fillers (English, plus the commonest of a few other
# languages): they say nothing about what is being talked about.
_STOP = frozenset(
    """
    about above after again against all also although always among and another any anybody anyone
    anything anyway anyways are aren around as ask asked asking at away back be became because become
    been before being below between both but by came can cannot cant could couldn did didn different
    does doesn doing don done down during each either else enough etc even ever every everybody
    everyone everything few for from further gave get gets getting give given gives go goes going gone
    good got gotta great had hadn has hasn have haven having he hello her here hers herself hey hi
    him himself his how however i'd i'll i'm i've if in into is isn it it's its itself just keep kind
    know knew lately least less let let's lets like liked likes little lol look looking lot lots made
    make makes making many may maybe me mean means might mine more most much must my myself need
    needs never new next nice no nobody none nor not nothing now of off oh ok okay on once one ones
    only onto or other others otherwise ought our ours ourselves out over own please pretty put quite
    rather really right said same say saying says see seem seemed seems seen she should shouldn since
    so some somebody someone something sometimes somewhat soon sorry still such sure take taken tell
    than thank thanks that that's the their theirs them themselves then there there's these they
    they're thing things think thinking this those though thought through thus to today together too
    took toward towards try trying um uh under until up upon us use used using very via want wanted
    wants was wasn way ways we we're well went were weren what what's whatever when where whether
    which while who whoever whole whom whose why will with within without won wonder would wouldn
    yeah yes yet you you're your yours yourself yourselves yep nope hmm mm mhm huh wow cool awesome
    haha hahaha lmao omg btw gonna wanna gotta kinda sorta ain dont didnt doesnt isnt wasnt cant wont
    im ive youre thats whats theres heres lets yup alright alrighty
    der die das und ist nicht ein eine einen dem den des ich sie wir ihr auch auf aus bei mit nach
    von vor zum zur wie was wenn aber oder doch noch schon sehr hier dort
    que los las del una uno por para con como pero más muy esto esta este eso esa ese
    les des une est pas pour avec dans sur mais comme plus tout cette sont
    che non una per con come sono della delle degli questo questa
    não uma com para como mais isso esta este
    het een van niet dat wat voor met zijn
    """.split()  # noqa: SIM905 (a word list reads better as text)
)


def terms(text: str) -> list[str]:
    """The distinct content terms of ``text``, in order of appearance (at most 32)."""
    out: dict[str, None] = {}
    for word in _WORD.findall(_clean(text)):
        if _UNSPACED_RUN.match(word):
            out.update(dict.fromkeys(_pairs(word)))
        elif len(word) >= 3 and word not in _STOP:
            out[_stem(word)[:16]] = None
        if len(out) >= _TERMS_PER_MESSAGE:
            break
    return list(out)[:_TERMS_PER_MESSAGE]


def term_ids(text: str) -> list[int]:
    """The content terms of ``text`` as stable 32-bit ids: the state holds ids, never the user's words."""
    out: dict[int, None] = {}
    cache = _IDS
    for key in _words(_clean(text)):
        h = cache.get(key)
        if h is None:
            word = key.decode("ascii") if isinstance(key, bytes) else key
            if _UNSPACED_RUN.match(word):
                out.update(dict.fromkeys(_term_id(p) for p in _pairs(word)))
                continue
            h = 0 if len(word) < 3 or word in _STOP else _term_id(_stem(word)[:16])
            if len(cache) >= 65536:
                cache.clear()
            cache[key] = h
        if h:
            out[h] = None
            if len(out) >= _TERMS_PER_MESSAGE:
                break
    return list(out)[:_TERMS_PER_MESSAGE]


# word -> its term id (0: not a content word); words recur, stemming and hashing them again costs.
# ASCII words are kept as bytes (see ``_words``).
_IDS: dict[str | bytes, int] = {}


def _term_id(term: str) -> int:
    # 24 bits of its CRC-32 (never 0): stable across processes, unlike hash(), and 3 bytes in the state.
    return (zlib.crc32(term.encode()) & 0xFFFFFF) or 1


def _words(cleaned: str) -> list[str] | list[bytes]:
    """The words of a ``_clean`` text (lower-cased already)."""
    if not cleaned.isascii():
        return _WORD.findall(cleaned)
    if "'" in cleaned:
        return _ASCII_WORD.findall(cleaned)
    # No apostrophe: ``_ASCII_WORD`` finds the runs of letters, which a cut at every other
    # character gives in a third less time; done on bytes, as bytes.translate maps each through
    # a 256-byte table where str.translate looks each up in a dict (half the time again).
    return cleaned.encode("ascii").translate(_NOT_LETTERS).split()


_NOT_LETTERS = bytes(c if 97 <= c <= 122 else 32 for c in range(256))  # all but a-z: spaces


def _clean(text: str) -> str:
    text = text[:_TEXT_CHARS].lower()
    if "{" in text or "<" in text or "http" in text:
        text = _MARKUP.sub(" ", text)
    return text


def _pairs(run: str) -> list[str]:
    """Character pairs of a run of a script written without spaces (a lone character stands alone)."""
    return [run[i : i + 2] for i in range(max(1, len(run) - 1))]


def _stem(word: str) -> str:
    if word.endswith("'s"):
        word = word[:-2]
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def is_question(text: str) -> bool:
    return "?" in text or "？" in text


def opens_with_cue(text: str) -> bool:
    """The message opens with a discourse marker ("okay", "so", "now"...), a classic segment cue."""
    return _CUE.match(text) is not None


# -- the vocabulary memory ------------------------------------------------------------------------------


# Bloom filter positions from a 24-bit term id: its two 12-bit halves and 12 bits of its
# product with a large odd constant.
_MIX = 0x9E3779B1
_TOP = 32 - _SHIFT


@lru_cache(maxsize=4096)
def _pack(ids: tuple[int, ...]) -> str:
    # Three bytes an id. Cached: a message's terms are packed on every write while it waits.
    big = 0
    for i in ids:
        big = big << 24 | i
    return _b2a(big.to_bytes(3 * len(ids), "big"), newline=False).decode("ascii")


def _unpack(text: str) -> tuple[int, ...]:
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    return tuple(int.from_bytes(raw[i : i + 3], "big") for i in range(0, len(raw) - 2, 3))


def _pack_gaps(gaps: list[int]) -> str:
    # (tokens, score) pairs: an unsigned 32-bit count and a signed byte.
    pairs = len(gaps) // 2
    layout = _gap_struct(pairs)
    try:
        raw = layout.pack(*(gaps if len(gaps) == 2 * pairs else gaps[: 2 * pairs]))
    except struct.error:  # a message of more than 4 billion tokens
        raw = layout.pack(*(min(g, 0xFFFFFFFF) for g in gaps[: 2 * pairs]))
    return _b2a(raw, newline=False).decode("ascii")


@lru_cache(maxsize=64)
def _gap_struct(pairs: int) -> struct.Struct:
    # Compiled once: struct.pack(format, ...) looks its compiled format up by the string every call.
    return struct.Struct(">" + "Ib" * pairs)


def _unpack_gaps(text: str) -> list[int]:
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    return list(struct.unpack(">" + "Ib" * (len(raw) // 5), raw[: len(raw) // 5 * 5]))


_EMPTY = bytes(_BITS // 8)


def _b64(bits: bytes | bytearray) -> str:
    return "" if bits == _EMPTY else _b2a(bits, newline=False).decode("ascii")


_ROLES = {r: f'"{r}"' for r in ("", "user", "assistant", "system", "tool")}


def _num(value: int | None) -> str:
    return "null" if value is None else str(int(value))


# The engine hands back the very JSON string ``to_json`` produced on the previous message
# (its cached conversation state holds it): keeping the parsed state of the newest ones
# skips parsing it again. Keyed by the string's identity, not its value: hashing 2 KB of
# JSON every message costs more than the rest of the lookup (the entry holds the string,
# so its id is not reused while there). An entry is handed out once (the reader owns it);
# any other string, equal or not, is parsed, so a miss only costs time.
_PARSED: dict[int, tuple[str, CohesionState]] = {}
_PARSED_MAX = 512


def _remember_parsed(text: str, state: CohesionState) -> None:
    if len(_PARSED) >= _PARSED_MAX:
        _PARSED.clear()
    _PARSED[id(text)] = (text, state)


# The text ``_format`` made last (in any thread): see ``json_string``.
_FORMATTED = ""


def json_string(text: str) -> str:
    """``text`` as a JSON string, as ``json.dumps(text, ensure_ascii=False)`` writes it.

    The state document embeds the detector's text as a string, on every write. Text ``_format``
    made holds numbers, base64, JSON punctuation and (through ``json.dumps``, ASCII only) a role:
    with no backslash in it, its double quotes are all there is to escape, and ``str.replace``
    does that in less than half the time of a scan for every character JSON escapes.
    """
    if text is _FORMATTED and "\\" not in text:
        return '"' + text.replace('"', '\\"') + '"'
    return _encode_string(text)


def _unb64(text: str) -> bytearray:
    if not text:
        return bytearray(_BITS // 8)
    raw = bytearray(base64.b64decode(text.encode("ascii"), validate=True))
    if len(raw) != _BITS // 8:
        raise ValueError("bad filter size")
    return raw


# -- state ------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Pending:
    """A content message of the confirmation window (with the empty ones stored after it)."""

    terms: tuple[int, ...]
    messages: int = 1
    question: bool = False
    answers: bool = False  # it answers a question from the other side: it cannot open a topic
    cue: bool = False  # it opens with a discourse marker ("okay", "so"...)
    packed: str = ""  # ``terms`` as the state's JSON holds them, once formatted (they never change)


@dataclass(slots=True)
class CohesionState:
    """Everything the detector remembers; ``to_json``/``from_json`` round-trip it exactly."""

    start: int | None = None  # the open topic's first sequence as last seen (to notice outside seals)
    recent: bytearray = field(default_factory=lambda: bytearray(_BITS // 8))
    older: bytes = _EMPTY  # never changed in place (replaced), so it may be shared and its text kept
    fill: int = 0  # distinct terms in ``recent``
    seen: int | None = None  # sequence of the newest message observed
    topic_terms: tuple[int, ...] = ()  # newest last
    topic_messages: int = 0  # content messages of the open topic before the window
    sealed_terms: tuple[int, ...] = ()  # recent terms of the topic sealed last
    unseal_left: int = 0  # content messages during which the last seal may be undone
    unseal_by_content: bool = False  # ...also because the talk goes back to it (else only by a reply)
    pending: list[Pending] = field(default_factory=list)
    gaps: list[int] = field(default_factory=list)  # per newest stored message: tokens, cut score
    last_question: bool = False
    last_role: str = ""
    older_text: str | None = ""  # ``older`` as base64 (``None``: not formatted yet)
    recent_text: str | None = ""  # ``recent`` as base64 (``None``: changed since last formatted)

    def to_json(self) -> str:
        text = self._format()
        _remember_parsed(text, self.copy())
        return text

    def dump(self) -> str:
        """``to_json`` for a caller that never touches this state again (it is cached as it is)."""
        text = self._format()
        _remember_parsed(text, self)
        return text

    def _format(self) -> str:
        # Formatted by hand: every field is a number, base64 or a role name, and json.dumps
        # would cost a quarter of the detector's time. ``from_json`` reads it back with json.loads.
        global _FORMATTED
        parts = []
        for p in self.pending:
            if not p.packed:
                p.packed = _pack(p.terms)
            parts.append(f'["{p.packed}",{p.messages},{p.question | p.answers << 1 | p.cue << 2}]')
        pending = ",".join(parts)
        older = self.older_text
        if older is None:
            older = self.older_text = _b64(self.older)
        recent = self.recent_text
        if recent is None:
            recent = self.recent_text = _b64(self.recent)
        text = (
            f'{{"v":{STATE_VERSION},"s":{_num(self.start)},"n":{_num(self.seen)},'
            f'"r":"{recent}","o":"{older}","f":{self.fill},'
            f'"t":"{_pack(self.topic_terms)}","m":{self.topic_messages},"x":"{_pack(self.sealed_terms)}",'
            f'"u":{self.unseal_left},"l":{int(self.unseal_by_content)},"p":[{pending}],"g":"{_pack_gaps(self.gaps)}",'
            f'"q":[{int(self.last_question)},{_ROLES.get(self.last_role) or json.dumps(self.last_role)}]}}'
        )
        _FORMATTED = text
        return text

    @classmethod
    def from_json(cls, text: str | None) -> CohesionState:
        """The state ``text`` holds; a fresh state for ``None``, a foreign version or a damaged value."""
        if not text:
            return cls()
        cached = _PARSED.pop(id(text), None)  # taken, not copied: nothing else holds it
        if cached is not None and cached[0] is text:
            return cached[1]
        try:
            obj = json.loads(text)
            if obj.get("v") != STATE_VERSION:
                return cls()
            last_q, last_role = obj["q"]
            return cls(
                start=None if obj["s"] is None else int(obj["s"]),
                seen=None if obj["n"] is None else int(obj["n"]),
                recent=_unb64(obj["r"]),
                older=bytes(_unb64(obj["o"])),
                older_text=str(obj["o"]),
                recent_text=str(obj["r"]),
                fill=int(obj["f"]),
                topic_terms=_unpack(obj["t"]),
                topic_messages=int(obj["m"]),
                sealed_terms=_unpack(obj["x"]),
                unseal_left=int(obj["u"]),
                unseal_by_content=bool(obj["l"]),
                pending=[
                    Pending(
                        _unpack(p[0]), int(p[1]), bool(p[2] & 1), bool(p[2] & 2), bool(p[2] & 4), str(p[0])
                    )
                    for p in obj["p"]
                ],
                gaps=_unpack_gaps(obj["g"]),
                last_question=bool(last_q),
                last_role=str(last_role),
            )
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, struct.error):
            return cls()  # a damaged state costs a few messages of re-learning, never an error

    def copy(self) -> CohesionState:
        # ``older`` is replaced, never changed in place, so it may be shared.
        return CohesionState(
            self.start,
            bytearray(self.recent),
            self.older,
            self.fill,
            self.seen,
            self.topic_terms,
            self.topic_messages,
            self.sealed_terms,
            self.unseal_left,
            self.unseal_by_content,
            [Pending(p.terms, p.messages, p.question, p.answers, p.cue, p.packed) for p in self.pending],
            list(self.gaps),
            self.last_question,
            self.last_role,
            self.older_text,
            self.recent_text,
        )

    # -- memory ----------------------------------------------------------------------------------------

    def known(self, term: int) -> bool:
        return self.novelty_share([term]) > 0

    def remember(self, words: Sequence[int]) -> None:
        recent = self.recent
        slots = _SLOTS
        for h in words:
            slot = slots.get(h) or _slot(h)
            ia, ma, ib, mb, ic, mc = slot
            if recent[ia] & ma and recent[ib] & mb and recent[ic] & mc:
                continue
            recent[ia] |= ma
            recent[ib] |= mb
            recent[ic] |= mc
            self.recent_text = None
            self.fill += 1
            if self.fill >= _GENERATION:
                self.older, self.older_text = bytes(recent), None
                self.recent, self.fill = bytearray(_BITS // 8), 0
                recent = self.recent
        self.topic_terms = _recent_terms(self.topic_terms, words)

    def known_counts(self, words: Sequence[int], split: int) -> tuple[int, int]:
        """How many of ``words[:split]`` and of ``words[split:]`` the memory knows."""
        recent, older, slots = self.recent, self.older, _SLOTS
        known = [0, 0]
        for i, h in enumerate(words):
            ia, ma, ib, mb, ic, mc = slots.get(h) or _slot(h)
            if (recent[ia] & ma and recent[ib] & mb and recent[ic] & mc) or (
                older[ia] & ma and older[ib] & mb and older[ic] & mc
            ):
                known[i >= split] += 1
        return known[0], known[1]

    def novelty_share(self, words: Sequence[int]) -> float:
        """Share of ``words`` the memory knows (0 when it knows none of them)."""
        if not words:
            return 1.0
        recent, older, slots = self.recent, self.older, _SLOTS
        known = 0
        for h in words:
            ia, ma, ib, mb, ic, mc = slots.get(h) or _slot(h)
            if (recent[ia] & ma and recent[ib] & mb and recent[ic] & mc) or (
                older[ia] & ma and older[ib] & mb and older[ic] & mc
            ):
                known += 1
        return known / len(words)


# term id -> its three Bloom positions as (byte, bit mask) pairs: terms recur, the arithmetic need not.
_SLOTS: dict[int, tuple[int, int, int, int, int, int]] = {}


def _slot(h: int) -> tuple[int, int, int, int, int, int]:
    a, b, c = h & _MASK, (h >> _SHIFT) & _MASK, ((h * _MIX) & 0xFFFFFFFF) >> _TOP
    slot = (a >> 3, 1 << (a & 7), b >> 3, 1 << (b & 7), c >> 3, 1 << (c & 7))
    if len(_SLOTS) >= 65536:
        _SLOTS.clear()
    _SLOTS[h] = slot
    return slot


def _recent_terms(current: Sequence[int], words: Sequence[int]) -> tuple[int, ...]:
    fresh = dict.fromkeys(words)  # the order to append them in, and the set to drop from ``current``
    if len(fresh) >= _TOPIC_TERMS:  # a long message: the newest terms are all its own
        return tuple(fresh)[-_TOPIC_TERMS:]
    out = [t for t in current if t not in fresh]
    out.extend(fresh)
    return tuple(out[-_TOPIC_TERMS:])


@dataclass(frozen=True, slots=True)
class CohesionParams:
    """The detector's knobs (defaults tuned on TIAGE train/dev and QMSum train/val)."""

    window: int = 2
    """Content messages that must all be new before a shift is confirmed (1 = no confirmation)."""
    novelty: float = 0.2
    """A window is new when the share of its terms the memory knows stays below this
    (0.2: one coincidental known word in a long window is fine, one in a short remark is not)."""
    question_novelty: float = 0.6
    """The same for the question that opens a window (see ``question_split``)."""
    min_messages: int = 2
    """Content messages the open topic needs before the detector may end it."""
    min_terms: int = 5
    """Distinct terms a window not opened by a question needs: two short remarks are weak evidence."""
    question_min_terms: int = 0
    """The same for a window opened by a question."""
    fresh_question_novelty: float = 0.7
    """What follows a question none of whose words is known may keep up to this share (as a
    statement's confirmation, ``confirm_novelty``: its answer only has to not go back)."""
    opener_min_terms: int = 3
    """For a window opened by a statement, the opener decides and the window confirms: the
    opening message must be new on its own (at least this many distinct terms, under
    ``novelty`` of them known) and the rest of the window must not go back to the old topic
    (under ``confirm_novelty`` of its terms known). 0: judge the window's terms together
    (``min_terms``), which also fires on two short remarks neither of which says much (TIAGE
    train/dev, F1 and Pk: 0.596/0.594 and 0.437/0.428 that way, 0.601/0.600 and
    0.428/0.411 with 3; QMSum train/val about even)."""
    confirm_novelty: float = 0.7
    """See ``opener_min_terms``: the largest share (exclusive) of known terms in what follows the opener."""
    question_split: bool = True
    """Apply ``question_novelty`` to the question alone; what follows it in the window must be new
    (``novelty``): a follow-up question keeps some words, and its answer keeps the topic's."""


#: Cut scores kept per stored message (lower: a better place for a topic to start).
NO_CUT = -1  # a topic never starts there (a tool result, an answer to a question)
EMPTY = 101  # no content terms: a possible but poor place
_CUE_BONUS = 25


@dataclass(slots=True)  # not frozen: a frozen dataclass costs three times as much to build, every message
class Observation:
    """What the detector made of one incoming message."""

    words: tuple[int, ...]
    shift_keep: int | None
    """A confirmed shift: how many of the newest stored messages belong to the new topic."""


def observe(
    state: CohesionState, params: CohesionParams, *, role: str, text: str, tokens: int, may_open: bool
) -> Observation:
    """Feed one incoming message (before it is stored); mutates ``state``.

    ``may_open`` is False where no topic may start at this message (a tool result, an
    assistant turn inside an open tool call): the detector never places a shift there.
    """
    content = (role == "user" or role == "assistant") and bool(text)
    words = tuple(term_ids(text)) if content else ()
    answers = content and state.last_question and role != state.last_role
    question = content and ("?" in text or "？" in text)
    if content:
        state.last_question, state.last_role = question, role
    pending = state.pending
    if not words:
        if pending:
            pending[-1].messages += 1
        _push_gap(state, tokens, EMPTY if may_open else NO_CUT)
        return Observation(words, None)
    cue = opens_with_cue(text)
    blocked = answers or not may_open
    pending.append(Pending(words, 1, question, blocked, cue))
    while len(pending) > params.window:
        state.topic_messages += 1
        state.remember(pending.pop(0).terms)
    _push_gap(state, tokens, NO_CUT if blocked else 100 - _CUE_BONUS * cue)
    if len(pending) < params.window or state.topic_messages < params.min_messages:
        return Observation(words, None)
    first = pending[0]
    span = sum([p.messages for p in pending])
    joined = list(dict.fromkeys(chain.from_iterable([p.terms for p in pending])))
    # ``joined`` begins with the opener's terms (a message's terms are distinct): one pass
    # counts the known ones of the opener and of the rest of the window.
    opener = len(first.terms)
    rest = len(joined) - opener
    known_opener, known_rest = state.known_counts(joined, opener)
    share = (known_opener + known_rest) / len(joined)
    if first.answers:
        return Observation(words, None)
    _set_gap_score(state, span, round(100 * share) - _CUE_BONUS * first.cue)
    alone = known_opener / opener
    if params.opener_min_terms and not first.question:
        # The opener decides, the window confirms (see ``CohesionParams.opener_min_terms``).
        opens = (
            alone < params.novelty
            and opener >= params.opener_min_terms
            and (not rest or known_rest / rest < params.confirm_novelty)
        )
        return Observation(words, span - 1 if opens else None)
    if first.question and params.question_split:
        # A question may keep a few known words ("and the sauce for the pasta?" keeps many),
        # but what follows it must be new: the answer talks about the question, not the old topic.
        # The newer the question, the less its answer must prove: a question with no known
        # word at all is confirmed by an answer that is mostly new.
        follow = params.fresh_question_novelty if alone == 0 else params.novelty
        shift = (
            alone < params.question_novelty
            and (not rest or known_rest / rest < follow)
            and len(joined) >= params.question_min_terms
        )
    else:
        limit = params.question_novelty if first.question else params.novelty
        enough = len(joined) >= (params.question_min_terms if first.question else params.min_terms)
        shift = share < limit and enough
    return Observation(words, span - 1 if shift else None)


def _push_gap(state: CohesionState, tokens: int, score: int) -> None:
    state.gaps.extend((tokens, score))
    if len(state.gaps) > 2 * _GAPS:
        del state.gaps[: len(state.gaps) - 2 * _GAPS]


def _set_gap_score(state: CohesionState, back: int, score: int) -> None:
    """Score the message ``back`` places from the newest (1: the incoming one) if still kept."""
    i = len(state.gaps) - 2 * back + 1
    if 0 < i < len(state.gaps) and state.gaps[i] != NO_CUT:
        state.gaps[i] = max(0, min(100, score))


def begin_topic(
    state: CohesionState, messages: int, start: int | None, *, unsealable: bool, by_content: bool = False
) -> None:
    """The open topic was sealed before the newest ``messages`` messages (the incoming one included)."""
    kept: list[Pending] = []
    left = messages
    for p in reversed(state.pending):
        if p.messages > left:
            break
        kept.append(p)
        left -= p.messages
    kept.reverse()
    for p in state.pending[: len(state.pending) - len(kept)]:
        state.remember(p.terms)
    state.sealed_terms = state.topic_terms
    state.unseal_left = UNSEAL_MESSAGES if unsealable else 0
    state.unseal_by_content = unsealable and by_content
    state.pending = kept
    del state.gaps[: max(0, len(state.gaps) - 2 * messages)]
    state.topic_messages = max(0, messages - sum(p.messages for p in kept))
    state.topic_terms = tuple(dict.fromkeys(t for p in kept for t in p.terms))[-_TOPIC_TERMS:]
    state.start = start


UNSEAL_SHARE = 0.5  # of the message's terms from the topic sealed last...
UNSEAL_TERMS = 2  # ...and at least this many: one shared word is too often a coincidence


def continues_sealed(state: CohesionState, words: Sequence[int]) -> bool:
    """The message (observed last) talks about the topic sealed last rather than about the open one."""
    if state.unseal_left <= 0 or not state.unseal_by_content or not state.sealed_terms or not words:
        return False
    sealed = set(state.sealed_terms)
    current = set(state.topic_terms).union(*(p.terms for p in state.pending[:-1]))
    back = sum(1 for t in words if t in sealed)
    here = sum(1 for t in words if t in current and t not in sealed)
    return back >= max(UNSEAL_TERMS, UNSEAL_SHARE * len(words)) and back > here


def reopen(state: CohesionState, start: int | None) -> None:
    """The topic sealed last was reopened: the open one is merged back into it."""
    state.topic_terms = _recent_terms(state.sealed_terms, state.topic_terms)
    state.sealed_terms = ()
    state.unseal_left = 0
    state.unseal_by_content = False
    state.topic_messages += len(state.pending) + 1
    state.start = start


def size_keep(
    state: CohesionState, *, incoming_tokens: int, topic_tokens: int, limit: int, floor: int
) -> int:
    """Where a size seal should cut: how many of the newest stored messages to move to the new topic.

    Among the newest stored messages, the best-scored place a topic may start (lowest
    score: the talk turned there), as long as the new topic stays within half the limit
    and the sealed one keeps at least ``floor`` tokens; 0 (cut at the incoming message)
    when no stored place scores better than the incoming message itself.
    """
    pairs = len(state.gaps) // 2
    if pairs == 0:
        return 0
    best_keep, best = 0, state.gaps[-1] if state.gaps[-1] != NO_CUT else EMPTY
    moved = incoming_tokens
    for back in range(2, pairs + 1):
        tokens, score = state.gaps[-2 * back], state.gaps[-2 * back + 1]
        moved += tokens
        if moved > limit // 2 or topic_tokens - (moved - incoming_tokens) < floor:
            break
        if score != NO_CUT and score < best:
            best_keep, best = back - 1, score
    return best_keep
