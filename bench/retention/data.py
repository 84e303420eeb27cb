"""QMSum meetings as conversations, and the retention metric.

A meeting is replayed as one conversation: one ``user`` message per transcript turn,
in order, with ``name`` set to the speaker sanitised to OpenAI's name pattern
(``[A-Za-z0-9_-]{1,64}``) and timestamps :data:`TURN_SECONDS` apart from
:data:`START`. Turns whose content is empty (a handful in QMSum) cannot be stored
(the library rejects empty messages) and are skipped; their evidence words are none.

Retention of one query at one budget: the share of the distinct content words of the
query's evidence span (every turn of every ``relevant_text_span``, inclusive) that
occur anywhere in the text of the context sent to the model (the ``content`` and
``name`` of every message). Content words: lower-cased ``\\w+`` tokens that are not in
:data:`STOPWORDS` and not pure digits.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

#: Replay clock: the first turn of every meeting, and the gap between turns.
START = datetime(2024, 1, 15, 9, 0, tzinfo=UTC)
TURN_SECONDS = 5

_WORD_RE = re.compile(r"\w+")
_NAME_BAD_RE = re.compile(r"[^A-Za-z0-9_-]+")

# A fixed English stopword list (the classic NLTK English list, spelled out here so the
# metric never changes with a package version), plus QMSum's transcript markup
# ({disfmarker}, {vocalsound}...) and spoken fillers, which carry no evidence.
_ENGLISH = """
i me my myself we our ours ourselves you your yours yourself yourselves he him his himself
she her hers herself it its itself they them their theirs themselves what which who whom
this that these those am is are was were be been being have has had having do does did
doing a an the and but if or because as until while of at by for with about against
between into through during before after above below to from up down in out on off over
under again further then once here there when where why how all any both each few more
most other some such no nor not only own same so than too very s t can will just don
should now d ll m o re ve y ain aren couldn didn doesn hadn hasn haven isn ma mightn
mustn needn shan shouldn wasn weren won wouldn
"""
_MARKUP_AND_FILLERS = """
disfmarker vocalsound nonvocalsound pause gap comment um uh umm uhm mm mmm hmm hm huh mhm
uhhuh oh ah yeah yep yes okay ok
"""
STOPWORDS: frozenset[str] = frozenset((_ENGLISH + _MARKUP_AND_FILLERS).split())


def content_words(text: str) -> set[str]:
    """Distinct content words of ``text`` (see the module docstring)."""
    return {w for w in _WORD_RE.findall(text.lower()) if w not in STOPWORDS and not w.isdigit()}


def retention(evidence: set[str], context_words: set[str]) -> float:
    return len(evidence & context_words) / len(evidence)


def sanitise_name(speaker: str) -> str:
    """``speaker`` as an OpenAI ``name``: runs of other characters become ``_``, at most 64."""
    name = _NAME_BAD_RE.sub("_", speaker).strip("_")[:64].strip("_")
    return name or "speaker"


def domain_of(meeting_id: str) -> str:
    if meeting_id[:2] in {"ES", "IS", "TS"}:
        return "AMI"
    if meeting_id.startswith("B"):
        return "ICSI"
    return "committee"


DOMAINS = ("AMI", "ICSI", "committee")


@dataclass(frozen=True, slots=True)
class Turn:
    index: int
    """Position in ``meeting_transcripts`` (QMSum's turn id)."""
    sequence: int
    """Sequence number the library gives the message (1, 2, ... over stored turns)."""
    speaker: str
    name: str
    content: str
    timestamp: datetime
    role: str = "user"
    """``user`` for a meeting's turns; a two-party chat's alternate with ``assistant``."""

    def openai(self) -> dict[str, Any]:
        """The turn as an OpenAI message (``name`` only when it has one)."""
        return {"role": self.role, "content": self.content, **({"name": self.name} if self.name else {})}


@dataclass(frozen=True, slots=True)
class Query:
    text: str
    turns: tuple[int, ...]
    """Turn indices (QMSum ids) of the evidence span."""
    words: frozenset[str]


@dataclass(frozen=True, slots=True)
class Meeting:
    id: str
    domain: str
    turns: tuple[Turn, ...]
    """Stored turns only (empty ones skipped)."""
    queries: tuple[Query, ...]
    """Queries with at least one evidence content word."""
    skipped_turns: int
    dropped_queries: int


def load_meeting(path: Path) -> Meeting:
    data = json.loads(path.read_text(encoding="utf-8"))
    raw = data["meeting_transcripts"]
    turns: list[Turn] = []
    skipped = 0
    for i, t in enumerate(raw):
        content = str(t.get("content") or "")
        if not content.strip():
            skipped += 1
            continue
        speaker = str(t.get("speaker") or "")
        turns.append(
            Turn(
                index=i,
                sequence=len(turns) + 1,
                speaker=speaker,
                name=sanitise_name(speaker),
                content=content,
                timestamp=START + timedelta(seconds=TURN_SECONDS * i),
            )
        )
    queries: list[Query] = []
    dropped = 0
    for q in data.get("specific_query_list", []):
        idx = sorted(
            {
                k
                for start, end in q["relevant_text_span"]
                for k in range(int(start), min(int(end), len(raw) - 1) + 1)
            }
        )
        words = set().union(*(content_words(str(raw[k].get("content") or "")) for k in idx)) if idx else set()
        if not words:
            dropped += 1
            continue
        queries.append(Query(str(q["query"]), tuple(idx), frozenset(words)))
    return Meeting(path.stem, domain_of(path.stem), tuple(turns), tuple(queries), skipped, dropped)


def meeting_paths(data_dir: Path, split: str, limit: int | None) -> list[Path]:
    """Meetings of ``split`` in name order; with ``limit``, spread over the list (every domain shows)."""
    paths = sorted((data_dir / "qmsum" / split).glob("*.json"))
    if not paths:
        raise SystemExit(f"no QMSum meetings under {data_dir / 'qmsum' / split}")
    if limit is None or limit >= len(paths):
        return paths
    step = len(paths) / limit
    return [paths[int(i * step)] for i in range(limit)]


def context_text(messages: Iterable[Mapping[str, Any]]) -> str:
    """What the metric reads from a context: every message's content and name."""
    parts: list[str] = []
    for m in messages:
        parts.append(str(m.get("content") or ""))
        if m.get("name"):
            parts.append(str(m["name"]))
    return "\n".join(parts)
