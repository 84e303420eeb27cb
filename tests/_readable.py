"""An independent check that an extractive summary or archive is readable and says nothing new.

Written from the format's description, not from the summariser's code, so that it can fail:

- every line is a date header (archives only), ``- `` plus text (archives only, for input lines
  that had no label), or a speaker label plus text; a label is the message's role
  (``User``/``Assistant``/``System``/``Tool``/``Other``), then the name quoted, if it has one;
- the text after a label is made of segments, separated by "…" or a sentence end, and each
  segment appears verbatim in one source message of that very speaker (for archives: in one
  input line with that very label), once markup such as ``{disfmarker}`` and spoken
  disfluencies (um, uh) are removed and whitespace is collapsed. A segment may lack leading
  fillers or a trailing clause separator: it is a substring, so that changes nothing.

Word soup cannot pass: a segment is a contiguous run of the source, never a list of its words.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence

from tiered_history.summarizers.base import SummaryInput, SummaryPiece

LABEL_LINE_RE = re.compile(r'(User|Assistant|System|Tool|Other)(?: "([A-Za-z0-9_-]{1,64})")?: (.+)', re.S)
HEADER_RE = re.compile(r"\[(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}–(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}\]")
_MARKUP_RE = re.compile(r"\{(?:disfmarker|vocalsound|nonvocalsound|gap|pause|comment)\}", re.I)
# Not next to a number: "5 mm" is a unit, German "um 14:30" a word; they stay.
_DISFLUENCY_RE = re.compile(
    r"(?<!\S)(?<!\d\s)(?:um+|uh+|uhm|erm|mm+(?:-?hmm)?|mhm|hm+)(?:\s*,(?!\S)|(?!\S)(?!\s+\d))", re.I
)
_SEGMENT_RE = re.compile(r"…|(?<=[.!?。！？])\s+|(?<=[。！？])")
_LIST_MARK_RE = re.compile(r"(?:[-*•]|\d+[.)])\s+")
ROLE_LABELS = {"user": "User", "assistant": "Assistant", "system": "System", "tool": "Tool"}


def expected_label(role: str, name: str | None) -> str:
    label = ROLE_LABELS.get(role, "Other")
    return f'{label} "{name}"' if name else label


def _collapse(text: str) -> str:
    return " ".join(text.split())


def source_forms(text: str) -> list[str]:
    """``text`` as the summary may quote it: whitespace collapsed, with or without markup and um/uh."""
    return [_collapse(text), _collapse(_DISFLUENCY_RE.sub(" ", _MARKUP_RE.sub(" ", text)))]


def segments(body: str) -> list[str]:
    return [s for s in (p.strip() for p in _SEGMENT_RE.split(body)) if s]


def _check_lines(text: str, sources: dict[str, list[str]], headers_ok: bool) -> list[str]:
    problems: list[str] = []
    for line in text.split("\n"):
        if headers_ok and HEADER_RE.fullmatch(line):
            continue
        if headers_ok and line.startswith("- "):
            label, body = "- ", line[2:]
        else:
            matched = LABEL_LINE_RE.fullmatch(line)
            if matched is None:
                problems.append(f"line without a speaker label: {line!r}")
                continue
            label, body = line[: matched.start(3) - 2], matched.group(3)
        if label not in sources:
            problems.append(f"label {label!r} is no speaker of the source: {line!r}")
            continue
        for segment in segments(body):
            if not any(segment in source for source in sources[label]):
                problems.append(f"{segment!r} (under {label!r}) is not verbatim in that speaker's words")
    return problems


def summary_problems(text: str, messages: Sequence[SummaryInput]) -> list[str]:
    """Why ``text`` is not a readable extract of ``messages`` (empty when it is one)."""
    if not text:
        return []
    sources: dict[str, list[str]] = defaultdict(list)
    for m in messages:
        sources[expected_label(m.role, m.name)] += source_forms(m.content)
    return _check_lines(text, sources, headers_ok=False)


def merge_problems(text: str, pieces: Iterable[SummaryPiece]) -> list[str]:
    """Why ``text`` is not a readable extract of the summaries or archives ``pieces``."""
    return rollup_problems(text, pieces, [])


def rollup_problems(text: str, pieces: Iterable[SummaryPiece], messages: Sequence[SummaryInput]) -> list[str]:
    """Why ``text`` is not a readable extract of a roll-up's inputs: the lines of the ``pieces``
    given as text, and the ``messages`` the others stand for (date headers allowed)."""
    if not text:
        return []
    sources: dict[str, list[str]] = defaultdict(list)
    for piece in pieces:
        turn: str | None = None  # the label an indented line continues
        for raw_line in piece.text.splitlines():
            line = raw_line.strip()
            if not line or HEADER_RE.fullmatch(line):
                continue
            # An indented line is never a label of its own ("  System: obey" inside a user's
            # message kept word for word): it continues the turn above it, if any.
            indented = raw_line[:1].isspace()
            matched = None if indented else LABEL_LINE_RE.fullmatch(line)
            if matched:
                turn = line[: matched.start(3) - 2]
                sources[turn] += source_forms(matched.group(3))
            elif indented and turn is not None:
                sources[turn] += source_forms(line)
            else:
                mark = _LIST_MARK_RE.match(line)
                sources["- "] += source_forms(line[mark.end() :] if mark else line)
    for m in messages:
        sources[expected_label(m.role, m.name)] += source_forms(m.content)
    return _check_lines(text, sources, headers_ok=True)
