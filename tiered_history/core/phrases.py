"""Anchored trigger phrases: "New topic: billing" opens a topic, "the new topic model we trained" does not.

A configured phrase counts only when it is said as a discourse marker:

- at the start of the message or of a sentence (after ``. ! ? … ; :``, a dash or a line
  break), optionally after bullets or emphasis and after a few lead-in words
  ("ok,", "thanks!", "so", "bueno,", "では"...): "ok, new topic." counts, "it keeps
  moving on its own" does not;
- as whole words (except in scripts written without spaces, where words have no boundary);
- followed by punctuation, a line break, the end of the text, or a word that cannot
  continue a noun phrase ("please", "to", "what"...): "New topic: billing" and "Moving
  on to the budget" count, "New topic model we trained" does not. A phrase that ends in
  punctuation or in such a word ("unrelated, but") needs nothing after it;
- not inside quotes (``"..."``, ``'...'``, ``“...”``, ``«...»``...), code (```` `inline` ````
  or fenced blocks) or a quoted line (``> ...``).

Phrases are literal (not regular expressions) and case-insensitive; curly apostrophes
match straight ones. :data:`DEFAULT_PHRASES` lists defaults per language; the rules
take one flat tuple (see :func:`phrases_for`), so a multilingual deployment can simply
join the languages it serves. Deliberately absent: "anyway", "by the way", "btw",
"one more thing": people use them as often to come back to a subject or to add to it as
to leave it ("anyway, the results are in"), so they are left to the content detector.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from types import MappingProxyType

DEFAULT_PHRASES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "en": (
            "new topic",
            "new subject",
            "different topic",
            "different subject",
            "different question",
            "another topic",
            "another subject",
            "change of topic",
            "change of subject",
            "topic change",
            "change the subject",
            "changing the subject",
            "change topics",
            "changing topics",
            "switch topics",
            "switching topics",
            "let's change the subject",
            "let's change topics",
            "let's switch topics",
            "let's talk about something else",
            "let's move on",
            "lets move on",
            "let us move on",
            "moving on",
            "on another note",
            "on a different note",
            "on an unrelated note",
            "on a separate note",
            "on another topic",
            "on a different topic",
            "unrelated question",
            "unrelated,",
            "unrelated:",
            "unrelated, but",
            "unrelated but",
            "totally unrelated",
            "completely unrelated",
            "off topic",
            "off-topic",
            "switching gears",
            "switch gears",
            "shifting gears",
            "changing gears",
            "next topic",
            "next item",
            "separate question",
            "now for something completely different",
        ),
        "de": (
            "neues Thema",
            "anderes Thema",
            "ganz anderes Thema",
            "Themenwechsel",
            "lass uns das Thema wechseln",
            "um das Thema zu wechseln",
            "was anderes",
        ),
        "es": (
            "nuevo tema",
            "otro tema",
            "cambio de tema",
            "cambiando de tema",
            "cambiemos de tema",
            "pasemos a otro tema",
            "hablando de otra cosa",
        ),
        "fr": (
            "nouveau sujet",
            "autre sujet",
            "changement de sujet",
            "pour changer de sujet",
            "changeons de sujet",
            "passons à autre chose",
            "rien à voir, mais",
        ),
        "it": (
            "nuovo argomento",
            "altro argomento",
            "cambio argomento",
            "cambiando argomento",
            "cambiamo argomento",
            "passiamo ad altro",
        ),
        "pt": (
            "novo assunto",
            "outro assunto",
            "mudando de assunto",
            "mudando de tema",
            "vamos mudar de assunto",
        ),
        "nl": (
            "nieuw onderwerp",
            "ander onderwerp",
            "om van onderwerp te veranderen",
        ),
        "ja": ("話題を変え", "話は変わりますが", "別の話"),
        "zh": ("换个话题", "换一个话题", "说点别的", "新话题"),
    }
)

#: Words that may come before a phrase at the start of a sentence ("ok, thanks! new topic").
LEAD_INS: tuple[str, ...] = (
    # en
    "ok", "okay", "k", "kk", "so", "alright", "all right", "right", "well", "now", "then", "um",
    "umm", "uh", "hmm", "oh", "and", "also", "but", "anyway", "anyways", "cool", "great", "thanks",
    "thank you", "thx", "ty", "perfect", "got it", "nice", "sure", "yes", "yeah", "yep", "no", "nope",
    "hey", "hi", "fine", "good", "awesome", "excellent", "understood", "lol", "haha", "btw",
    "by the way", "ok then", "alright then", "in that case",
    # de, es, fr, it, pt, nl
    "also", "gut", "danke", "na", "nun", "jetzt", "übrigens", "ja", "nein", "prima", "super",
    "bueno", "vale", "pues", "bien", "gracias", "oye", "sí", "genial", "perfecto",
    "bon", "alors", "merci", "bref", "donc", "oui", "non", "parfait",
    "bene", "allora", "grazie", "dunque", "perfetto",
    "bom", "então", "obrigado", "obrigada", "beleza", "sim", "não", "certo",
    "oké", "goed", "dus", "bedankt", "nee",
    # ja, zh: no spaces, so no separator needed
    "では", "じゃあ", "さて", "それでは", "ところで", "好", "好的", "那么", "对了",
)  # fmt: skip

#: Words that may follow a phrase directly: they cannot continue a noun phrase, so
#: "new topic please" counts where "new topic model" does not.
FOLLOWERS: tuple[str, ...] = (
    # en
    "please", "pls", "plz", "now", "then", "here", "guys", "folks", "everyone", "everybody",
    "all", "y'all", "though", "but", "and", "so", "or", "ok", "okay", "i", "i'm", "i'd", "i'll",
    "we", "we're", "you", "let's", "lets", "what", "what's", "how", "how's", "why", "who", "where",
    "when", "which", "do", "does", "did", "can", "could", "would", "should",
    "will", "to", "about", "from", "with", "for", "if", "this", "that", "since", "because",
    # de, es, fr, it, pt, nl
    "bitte", "jetzt", "dann", "zu", "über", "für", "und", "aber", "also", "ich", "wir",
    "wie", "warum", "wo", "wann",
    "por", "favor", "ahora", "pues", "sobre", "para", "y", "pero", "qué", "cómo", "yo",
    "s'il", "svp", "maintenant", "alors", "pour", "sur", "et", "mais", "je", "nous", "que",
    "quoi", "comment",
    "per", "ora", "adesso", "su", "e", "ma", "io", "che", "come",
    "agora", "mas", "eu", "como",
    "alsjeblieft", "nu", "over", "en", "maar", "ik", "wat", "hoe",
)  # fmt: skip

_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'"})
# Scripts written without spaces between words: no word boundary there.
_UNSPACED = re.compile("[\u0e00-\u0eff\u1000-\u109f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_MASK = "\x00"  # neither a word nor a space: what is masked neither opens nor continues a sentence

# Spans that quote or show text rather than say it. Fenced code may be unclosed (to the end).
_QUOTED = re.compile(
    r"```.*?(?:```|\Z)"
    r"|~~~.*?(?:~~~|\Z)"
    r"|``[^`]*``|`[^`\n]*`"
    r"|^[ \t]*>[^\n]*"  # a quoted line (markdown, e-mail)
    r"|\"[^\"\n]{0,2000}\""
    r"|“[^”\n]{0,2000}”|„[^“”\n]{0,2000}[“”]|«[^»\n]{0,2000}»|»[^«\n]{0,2000}«"
    r"|「[^」]{0,2000}」|『[^』]{0,2000}』"
    r"|‘[^’\n]{0,2000}’(?!\w)"
    r"|(?<!\w)'[^'\n]{0,2000}'(?!\w)",  # not an apostrophe: "let's", "dogs'" are no quotes
    re.S | re.M,
)
_END_PUNCT = re.compile(r"[.!?…。！？]+$")
_SENTENCE_STARTERS = ".!?…。！？;；:：\n—–"


def _masked(match: re.Match[str]) -> str:
    # Keep a quote's final punctuation: in 'He said "stop." New topic' a sentence still ends.
    inner = match.group(0).rstrip("\"'”“»«」』’`~ \t")
    end = _END_PUNCT.search(inner)
    return _MASK + (end.group(0) if end else "")


def strip_quotes_and_code(text: str) -> str:
    """The text with quoted spans, code and quoted lines each replaced by one mask character."""
    if not any(c in text for c in "\"'`“„«»「『‘>~"):
        return text
    return _QUOTED.sub(_masked, text)


def normalize(text: str) -> str:
    return text.translate(_APOSTROPHES)


def _words_pattern(words: Iterable[str]) -> str:
    alts = []
    for w in sorted({normalize(w).strip().lower() for w in words if w.strip()}, key=len, reverse=True):
        escaped = re.escape(w).replace(r"\ ", r"\s+")
        alts.append(escaped if _UNSPACED.match(w[-1]) else escaped + r"(?!\w)")
    return "|".join(alts)


_LEAD = r"(?:(?:" + _words_pattern(LEAD_INS) + r")[\s,.!;:…\-–—，、。！：；]*)*"
_FOLLOW_WORDS = frozenset(normalize(w).lower() for w in FOLLOWERS)
_FOLLOW = r"(?=[ \t]*(?:$|[^\w\s]|\n|(?:" + _words_pattern(FOLLOWERS) + r")))"
_PREFIX = r"[\s*_#>(\[\-•]*"
_STARTS = re.compile("[" + re.escape(_SENTENCE_STARTERS) + "]")
_SPLIT = re.compile(r"[^\w]+")


def _needs_follower(phrase: str) -> bool:
    last = phrase[-1]
    if not (last.isalnum() or last == "_") or _UNSPACED.match(last):
        return False
    return phrase.split()[-1] not in _FOLLOW_WORDS


def _keys(phrases: Sequence[str]) -> tuple[str, ...]:
    """Substrings one of which every text holding a phrase contains: a cheap pre-filter.

    Greedy: the word shared by most phrases not yet covered ("topic" covers a dozen), so
    that few substring searches rule out most messages.
    """
    words = {p: {w for w in _SPLIT.split(p) if len(w) >= 3} or {p} for p in phrases}
    for p in phrases:
        if _UNSPACED.search(p):
            words[p] = {p[:2]}
    keys: list[str] = []
    left = set(phrases)
    while left:
        counts: dict[str, int] = {}
        for p in left:
            for w in words[p]:
                counts[w] = counts.get(w, 0) + 1
        best = max(sorted(counts), key=lambda w: (counts[w], len(w)))
        keys.append(best)
        left = {p for p in left if best not in words[p]}
    return tuple(sorted(keys))


class PhraseMatcher:
    """Finds an anchored phrase: a substring pre-filter, then one match per sentence start."""

    __slots__ = ("_apostrophe", "_body", "_keys")

    def __init__(self, phrases: Sequence[str]) -> None:
        alternatives = []
        for p in phrases:
            body = re.escape(p).replace(r"\ ", r"\s+")
            head = "" if _UNSPACED.match(p[0]) or not (p[0].isalnum() or p[0] == "_") else r"(?<!\w)"
            if _needs_follower(p):
                alternatives.append(f"{head}{body}(?!\\w){_FOLLOW}")
            elif _UNSPACED.match(p[-1]) or not (p[-1].isalnum() or p[-1] == "_"):
                alternatives.append(f"{head}{body}")
            else:
                alternatives.append(f"{head}{body}(?!\\w)")
        self._keys = _keys(phrases)
        self._apostrophe = any("'" in k for k in self._keys)  # then only a normalised text may be searched
        self._body = re.compile(f"{_PREFIX}{_LEAD}(?:{'|'.join(alternatives)})", re.IGNORECASE)

    def could_match(self, text: str) -> bool:
        """A cheap test ruling most texts out, normalised or not (``normalize`` only maps apostrophes)."""
        low = normalize(text).lower() if self._apostrophe else text.lower()
        # A plain loop: any() over a generator costs twice as much here.
        for k in self._keys:  # noqa: SIM110
            if k in low:
                return True
        return False

    def search(self, text: str) -> bool:
        """True when ``text`` (already normalised, quotes masked) opens a sentence with a phrase."""
        match = self._body.match
        if match(text):
            return True
        return any(match(text, m.end()) for m in _STARTS.finditer(text))


@lru_cache(maxsize=32)
def phrase_pattern(phrases: tuple[str, ...]) -> PhraseMatcher | None:
    """The matcher for ``phrases`` (``None`` when none is left once blanks are dropped)."""
    cleaned = sorted(
        {" ".join(normalize(p).lower().split()) for p in phrases if p.strip()}, key=len, reverse=True
    )
    return PhraseMatcher(cleaned) if cleaned else None


def anchored_phrase(text: str, phrases: tuple[str, ...]) -> bool:
    """True when ``text`` opens a sentence with one of ``phrases`` (see the module docstring)."""
    return matches(phrase_pattern(phrases), text)


def matches(matcher: PhraseMatcher | None, text: str) -> bool:
    """``anchored_phrase`` with the matcher already looked up (``phrase_pattern``)."""
    if matcher is None or not text:
        return False
    return matcher.could_match(text) and matcher.search(strip_quotes_and_code(normalize(text)))


def phrases_for(languages: Iterable[str] | None = None, extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The default phrases of ``languages`` (all of :data:`DEFAULT_PHRASES` when ``None``) plus ``extra``.

    Raises ``KeyError`` for a language without defaults (give its phrases in ``extra``).
    """
    chosen = DEFAULT_PHRASES.keys() if languages is None else list(languages)
    out: list[str] = []
    for lang in chosen:
        out.extend(DEFAULT_PHRASES[lang])
    out.extend(extra)
    return tuple(dict.fromkeys(out))
