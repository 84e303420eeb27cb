"""Topic-boundary rules: pure functions over the conversation's state and the incoming message.

The engine calls :func:`decide` before each message is stored. It combines, in this order:

1. **Never** a seal on a tool result, on an assistant turn while a tool call is open, or
   of an empty topic.
2. **Unseal** (``"unseal"``): within the first few content messages after a seal made by
   the content detector or by silence, a message that replies to a message of the sealed
   topic (``Incoming.reply_to``, from the message's ``metadata["reply_to"]``) reopens it;
   after a silence seal, so does a message that talks about the sealed topic rather than
   the new one (after a detector seal too with ``unseal_after_cohesion``). Seals the user
   asked for (a phrase, ``seal_current_topic``) and size seals are never undone, and a
   message carrying a trigger phrase never unseals.
3. **Explicit** (``"explicit"``): an anchored trigger phrase (:mod:`.phrases`) in a
   message from one of ``trigger_roles``; never from an assistant or a tool.
4. **Silence** (``"silence"``): more than ``silence`` since the previous message.
5. **Size** (``"size"``): the message would push the topic past ``size_limit`` tokens.
   The cut goes to the newest place where the talk turned, if the detector saw one
   within reach (``keep`` > 0), else before the incoming message.
6. **Cohesion** (``"cohesion"``): the content detector (:mod:`.cohesion`) confirmed a
   shift; the cut goes where the shift began (``keep`` > 0 when it began before the
   incoming message).

Phrases and silence wait for ``min_tokens`` (a smaller topic could not be summarised
smaller); the detector has its own guard (``cohesion_min_messages``).

Pluggable detectors (an embedding or an LLM one) implement :class:`BoundaryDetector`.
They run in a background worker, never on the reply path, and only *propose*: see
:func:`choose_proposal` for how their proposals are combined with these rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal, Protocol, overload, runtime_checkable

from .cohesion import (
    CohesionParams,
    CohesionState,
    begin_topic,
    continues_sealed,
    observe,
    reopen,
    size_keep,
)
from .phrases import PhraseMatcher, anchored_phrase, matches, phrase_pattern
from .units import RESULT_ROLES

__all__ = [
    "COHESION",
    "DETECTOR",
    "EXPLICIT",
    "MANUAL",
    "SIZE",
    "TEMPORAL",
    "UNSEAL",
    "BoundaryDetector",
    "BoundaryRules",
    "Decision",
    "Incoming",
    "OpenTopic",
    "PhraseMatcher",
    "Proposal",
    "Turn",
    "choose_proposal",
    "decide",
    "decide_live",
    "explicit_boundary",
    "phrase_pattern",
    "proposer",
    "reply_sequence",
    "silence_elapsed",
    "size_boundary",
    "temporal_boundary",
]

#: Why a topic was sealed (or reopened).
EXPLICIT = "explicit"
TEMPORAL = "silence"
SIZE = "size"
MANUAL = "manual"
COHESION = "cohesion"
UNSEAL = "unseal"

#: Reasons whose seal the detector may undo when the next messages continue the sealed topic.
_UNSEALABLE = frozenset({COHESION, TEMPORAL})


@dataclass(frozen=True, slots=True)
class Incoming:
    """The message being added."""

    role: str  # system | user | assistant | tool
    text: str  # its text (text parts joined); may be empty for a bare tool call
    timestamp: datetime  # aware
    tokens: int  # framed token count
    tool_call: bool  # it is an assistant message carrying tool_calls
    pinned: bool
    reply_to: int | None = None  # sequence of the earlier message this one replies to, if known


#: The metadata key naming the sequence of the earlier message a message replies to.
REPLY_TO = "reply_to"


def reply_sequence(metadata: Mapping[str, object] | None) -> int | None:
    """The sequence ``metadata["reply_to"]`` names (a platform adapter sets it for a threaded
    reply or a quote); ``None`` when absent or not a whole number."""
    value = metadata.get(REPLY_TO) if metadata else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenTopic:
    """What the boundary rules need to know about the open topic."""

    messages: int
    tokens: int
    last_timestamp: datetime | None
    tool_call_open: bool
    start: int = 0
    """Sequence of the open topic's first message (of the incoming one when the topic is empty)."""
    detector: str | None = None
    """The detector state JSON as persisted (``None``: fresh)."""
    last_seal_start: int | None = None
    """First sequence of the most recently sealed topic, if any (what an unseal reopens)."""
    held: int = 0
    """Messages of the open topic since its last place where no call awaited its result (an open
    tool unit: the call and the results so far)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BoundaryRules:
    """Built by the engine from settings (per platform)."""

    explicit: bool
    temporal: bool
    size: bool
    cohesion: bool = True
    phrases: tuple[str, ...]
    trigger_roles: tuple[str, ...]
    silence: timedelta
    size_limit: int
    min_tokens: int = 0
    """Phrases and silence do not seal a topic smaller than this: it could not be summarised smaller."""
    unseal: bool = True
    """Reopen a topic sealed by the detector or by silence when the next message replies to it,
    or (a silence seal) talks about it again."""
    unseal_after_cohesion: bool = False
    """Also reopen a topic the detector sealed when the next message talks about it again. Off:
    on TIAGE it undoes right seals more often than wrong ones (F1 0.600 -> 0.594 on train+dev)."""
    size_cut_at_shift: bool = True
    """A size seal cuts where the talk turned among the newest messages, not just before the incoming one."""
    cohesion_window: int = 2
    """Content messages that must all be new before the detector confirms a shift."""
    cohesion_novelty: float = 0.2
    """Largest share (exclusive) of a window's terms the conversation has used recently."""
    cohesion_question_novelty: float = 0.6
    """The same for the question opening a window (what follows it must still be new)."""
    cohesion_min_messages: int = 2
    """Content messages the open topic needs before the detector may end it."""
    cohesion_min_terms: int = 5
    """Distinct terms a window needs unless a question opens it."""
    cohesion_question_min_terms: int = 0
    cohesion_question_split: bool = True
    cohesion_fresh_question_novelty: float = 0.7
    cohesion_opener_min_terms: int = 3
    """Distinct terms a statement opening a window needs on its own (0: the window's terms are
    judged together, see :class:`~.cohesion.CohesionParams`)."""
    cohesion_confirm_novelty: float = 0.7
    """What follows the opening statement confirms the shift unless this share of its terms is known."""
    detect_every: int = 0
    """Pluggable detectors are configured: the open topic is due for them (maintenance is asked
    for) once it holds this many messages they have not seen (0: no pluggable detectors)."""

    @property
    def cohesion_params(self) -> CohesionParams:
        return CohesionParams(
            window=self.cohesion_window,
            novelty=self.cohesion_novelty,
            question_novelty=self.cohesion_question_novelty,
            min_messages=self.cohesion_min_messages,
            min_terms=self.cohesion_min_terms,
            question_min_terms=self.cohesion_question_min_terms,
            question_split=self.cohesion_question_split,
            fresh_question_novelty=self.cohesion_fresh_question_novelty,
            opener_min_terms=self.cohesion_opener_min_terms,
            confirm_novelty=self.cohesion_confirm_novelty,
        )

    @property
    def tracks_content(self) -> bool:
        return self.cohesion or self.unseal or (self.size and self.size_cut_at_shift)


@dataclass(frozen=True, slots=True)
class Decision:
    reason: str | None  # "explicit" | "silence" | "size" | "cohesion" | "unseal" | None
    keep: int = 0
    """For a seal: how many of the newest already stored messages move into the new topic
    together with the incoming one (0: the incoming message starts the new topic)."""
    detector: str | None = None
    """The new detector state JSON to persist (always returned; ``None`` only when no rule needs one)."""


# -- the single rules ---------------------------------------------------------------------------------


def explicit_boundary(content: str, phrases: Sequence[str]) -> bool:
    """True when the message opens a sentence with a trigger phrase ("New topic: billing")."""
    return anchored_phrase(content, tuple(phrases))


def temporal_boundary(previous: datetime | None, current: datetime, silence: timedelta) -> bool:
    """True when more than ``silence`` passed since the previous message (never for out-of-order ones)."""
    return previous is not None and current - previous > silence


def size_boundary(open_tokens: int, open_messages: int, incoming_tokens: int, limit: int) -> bool:
    """True when adding the message would push a non-empty open topic past ``limit`` tokens."""
    return open_messages > 0 and open_tokens + incoming_tokens > limit


def silence_elapsed(last_timestamp: datetime | None, now: datetime, silence: timedelta) -> bool:
    """True when an open topic has been quiet long enough for ``maintain()`` to seal it."""
    return last_timestamp is not None and now - last_timestamp > silence


def may_open_topic(topic: OpenTopic, incoming: Incoming) -> bool:
    """A topic may start at this message: not a tool result, not an assistant turn or a legacy
    function result inside an open call."""
    return incoming.role != "tool" and not (
        topic.tool_call_open and incoming.role in ("assistant", "function")
    )


# -- the combined decision ----------------------------------------------------------------------------


@overload
def decide(rules: BoundaryRules, topic: OpenTopic, incoming: Incoming, /) -> Decision: ...


@overload
def decide(
    rules: BoundaryRules, topic: OpenTopic, role: str, content: str, timestamp: datetime, tokens: int, /
) -> str | None: ...


def decide(
    rules: BoundaryRules,
    topic: OpenTopic,
    incoming: Incoming | str,
    content: str | None = None,
    timestamp: datetime | None = None,
    tokens: int | None = None,
    /,
) -> Decision | str | None:
    """Should the open topic be sealed (or the last one reopened) before this message?

    ``decide(rules, topic, incoming)`` returns a :class:`Decision`. The older form
    ``decide(rules, topic, role, content, timestamp, tokens)`` returns only the reason and
    runs no content detector (it has no state to keep); it stays until the engine
    persists :attr:`Decision.detector`.
    """
    if isinstance(incoming, Incoming):
        return decide_live(rules, topic, incoming, None, dump=True)[0]
    if content is None or timestamp is None or tokens is None:
        raise TypeError("decide(rules, topic, role, content, timestamp, tokens) needs all six arguments")
    legacy = Incoming(incoming, content, timestamp, tokens, tool_call=False, pinned=False)
    plain = BoundaryRules(
        explicit=rules.explicit,
        temporal=rules.temporal,
        size=rules.size,
        cohesion=False,
        phrases=rules.phrases,
        trigger_roles=rules.trigger_roles,
        silence=rules.silence,
        size_limit=rules.size_limit,
        min_tokens=rules.min_tokens,
        unseal=False,
        size_cut_at_shift=False,
    )
    return decide_live(plain, topic, legacy, None, dump=True)[0].reason


def decide_live(
    rules: BoundaryRules,
    topic: OpenTopic,
    incoming: Incoming,
    detector: CohesionState | None,
    *,
    dump: bool,
) -> tuple[Decision, CohesionState | None]:
    """:func:`decide` for a batch of messages, one after another: the detector's state is taken from
    ``detector`` (the one the previous message's decision returned) instead of being read back from
    ``topic.detector``, and with ``dump`` False it is not formatted to JSON (the decision's
    ``detector`` is then None): only the batch's last decision needs its text. Returns the decision
    and the detector's state after it (None when the rules track no content)."""
    sequence = topic.start + topic.messages  # the incoming message's
    may_open = may_open_topic(topic, incoming)
    params, matcher = _compiled(rules)
    state: CohesionState | None = None
    words: tuple[int, ...] = ()
    shift: int | None = None
    if rules.tracks_content:
        # What from_json returns for the text the previous decision dumped: that very object.
        state = detector if detector is not None else CohesionState.from_json(topic.detector)
        _reconcile(state, rules, topic, incoming)
        seen = observe(
            state,
            params,
            role=incoming.role,
            text=incoming.text,
            tokens=incoming.tokens,
            may_open=may_open,
        )
        state.seen = sequence
        words, shift = seen.words, seen.shift_keep

    def verdict(reason: str | None, keep: int = 0) -> tuple[Decision, CohesionState | None]:
        if state is None:
            return Decision(reason, keep, topic.detector), None
        if reason is None:
            state.start = topic.start if topic.messages else sequence
        elif reason != UNSEAL:
            begin_topic(
                state,
                keep + 1,
                sequence - keep,
                unsealable=reason in _UNSEALABLE,
                by_content=reason == TEMPORAL or rules.unseal_after_cohesion,
            )
        return Decision(reason, keep, state.dump() if dump else None), state

    phrase = (
        rules.explicit
        and incoming.role in rules.trigger_roles
        and incoming.role not in ("assistant", "tool")
        and matches(matcher, incoming.text)
    )
    talks = incoming.role in ("user", "assistant")
    if state is not None and rules.unseal and state.unseal_left > 0 and talks and not phrase:
        if _replies_to_sealed(topic, incoming) or continues_sealed(state, words):
            reopen(state, topic.last_seal_start)
            return verdict(UNSEAL)
        state.unseal_left -= bool(words)
    if topic.messages == 0:
        return verdict(None)
    if not may_open:
        # A tool result (or an assistant turn inside an open call) starts no topic. Past the size
        # limit the topic is still sealed, before the call, which goes whole into the next one:
        # else a large result outgrows the window with no event (a rewrite of the cached prefix,
        # and messages left neither in the window nor in a summary until the next seal).
        if (
            rules.size
            and topic.tool_call_open
            and 0 < topic.held < topic.messages
            and size_boundary(topic.tokens, topic.messages, incoming.tokens, rules.size_limit)
        ):
            return verdict(SIZE, topic.held)
        return verdict(None)
    big_enough = topic.tokens >= rules.min_tokens
    if big_enough and phrase:
        return verdict(EXPLICIT)
    quiet = temporal_boundary(topic.last_timestamp, incoming.timestamp, rules.silence)
    if big_enough and rules.temporal and quiet:
        return verdict(TEMPORAL)
    if rules.size and size_boundary(topic.tokens, topic.messages, incoming.tokens, rules.size_limit):
        keep = 0
        if state is not None and rules.size_cut_at_shift:
            keep = size_keep(
                state,
                incoming_tokens=incoming.tokens,
                topic_tokens=topic.tokens,
                limit=rules.size_limit,
                floor=rules.min_tokens,
            )
        return verdict(SIZE, min(keep, topic.messages - 1))
    if rules.cohesion and shift is not None and shift < topic.messages:
        return verdict(COHESION, shift)
    return verdict(None)


# Rules are built once per platform and budget and reused: so are their detector parameters
# and phrase matcher (looking the matcher up by its phrases hashes ~90 strings every message).
_COMPILED: dict[int, tuple[BoundaryRules, CohesionParams, PhraseMatcher | None]] = {}


def _compiled(rules: BoundaryRules) -> tuple[CohesionParams, PhraseMatcher | None]:
    found = _COMPILED.get(id(rules))
    if found is not None and found[0] is rules:  # the entry keeps ``rules`` alive: its id is not reused
        return found[1], found[2]
    if len(_COMPILED) >= 64:
        _COMPILED.clear()
    params, matcher = rules.cohesion_params, phrase_pattern(tuple(rules.phrases))
    _COMPILED[id(rules)] = (rules, params, matcher)
    return params, matcher


def _replies_to_sealed(topic: OpenTopic, incoming: Incoming) -> bool:
    return (
        incoming.reply_to is not None
        and topic.last_seal_start is not None
        and topic.last_seal_start <= incoming.reply_to < topic.start
    )


def _reconcile(state: CohesionState, rules: BoundaryRules, topic: OpenTopic, incoming: Incoming) -> None:
    """Bring the state in line with seals made outside ``decide`` (by ``maintain()``, by hand)."""
    if state.seen is None:
        state.start = topic.start
    elif topic.start > state.seen:
        # Everything the detector saw was sealed: by silence if the gap says so (undoable), else by hand.
        quiet = temporal_boundary(topic.last_timestamp, incoming.timestamp, rules.silence)
        begin_topic(state, 0, topic.start, unsealable=quiet, by_content=quiet)
    elif topic.start != state.start:
        state.start = topic.start  # the engine moved a cut (to keep a tool call whole) or reopened a topic


# -- pluggable detectors ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Turn:
    """A stored message as a pluggable detector sees it."""

    sequence: int
    role: str
    text: str
    timestamp: datetime
    tokens: int


@dataclass(frozen=True, slots=True)
class Proposal:
    """A pluggable detector's verdict on the open topic."""

    sequence: int
    """Split: the first message of the new topic. Merge: any message of the open topic."""
    confidence: float
    """0..1; proposals under :data:`PROPOSAL_CONFIDENCE` are ignored."""
    kind: Literal["split", "merge"] = "split"
    """``merge``: the open topic continues the one sealed last (undo that seal)."""
    note: str = field(default="", compare=False)
    """Free text for logs ("cosine 0.21 between windows")."""


#: Proposals below this confidence are ignored.
PROPOSAL_CONFIDENCE = 0.5


@runtime_checkable
class BoundaryDetector(Protocol):
    """A topic-boundary detector too slow for the reply path (embeddings, an LLM).

    The engine's background worker calls :meth:`propose` with the newest messages of
    an open topic (at most :attr:`window` of them, oldest first) now and then, and applies
    the proposal :func:`choose_proposal` picks. Detectors are stateless between calls
    (or keep their own caches); they never write to the store.

    Example, embeddings with litellm (sketch)::

        class EmbeddingDetector:
            name = "embedding"
            window = 12

            async def propose(self, turns: Sequence[Turn]) -> Sequence[Proposal]:
                vecs = (await litellm.aembedding(model="text-embedding-3-small",
                                                  input=[t.text for t in turns])).data
                out = []
                for i in range(2, len(turns) - 1):
                    left, right = mean(vecs[:i]), mean(vecs[i:])
                    if cosine(left, right) < 0.35:
                        out.append(Proposal(turns[i].sequence, 1 - cosine(left, right)))
                return out
    """

    name: str
    """Short and stable: a topic it seals is recorded with reason ``"detector:<name>"``."""
    window: int
    """How many of the newest messages it wants to see."""

    async def propose(self, turns: Sequence[Turn]) -> Sequence[Proposal]:
        """Boundaries (or a merge) it sees among ``turns``; empty when it sees none."""
        ...


def choose_proposal(
    proposals: Sequence[Proposal], rules: BoundaryRules, topic: OpenTopic, turns: Sequence[Turn]
) -> Proposal | None:
    """The documented policy for pluggable detectors: which proposal, if any, the engine applies.

    - Proposals are advisory and late: the built-in rules have already run on every
      message, and what they sealed stands (a detector cannot undo a phrase or a size
      seal; it can merge only what :func:`decide` could unseal, see ``merge`` below).
    - A split must fall strictly inside the open topic (``topic.start`` < sequence) and
      among ``turns`` (the open topic's newest messages, as the detectors saw them), not on
      a tool result, and leave at least ``rules.min_tokens`` tokens before it (the engine
      still moves the cut so that no tool call is split from its results).
    - A merge asks to reopen the topic sealed last; the engine applies it only if that
      seal was by silence or by the content detector, as for an unseal.
    - Confidence must reach :data:`PROPOSAL_CONFIDENCE`. Proposals for the same sequence
      and kind from several detectors combine as independent evidence
      (``1 - prod(1 - c)``). The best combined one wins; ties go to the earliest split,
      so what is cut off is the smallest.
    """
    by_seq = {t.sequence: t for t in turns}
    combined: dict[tuple[str, int], float] = {}
    for p in proposals:
        if not 0.0 <= p.confidence <= 1.0:
            continue
        if p.kind == "split":
            turn = by_seq.get(p.sequence)
            if turn is None or p.sequence <= topic.start or turn.role in RESULT_ROLES:
                continue
            # ``turns`` end with the topic but may begin after it: count back from its total.
            before = topic.tokens - sum(t.tokens for t in turns if t.sequence >= p.sequence)
            if before < rules.min_tokens:
                continue
        elif topic.last_seal_start is None:
            continue
        key = (p.kind, p.sequence)
        combined[key] = 1.0 - (1.0 - combined.get(key, 0.0)) * (1.0 - p.confidence)
    best: tuple[float, int, str] | None = None
    for (kind, seq), conf in combined.items():
        if conf < PROPOSAL_CONFIDENCE:
            continue
        rank = (conf, -seq, kind)
        if best is None or rank > best:
            best = rank
    if best is None:
        return None
    conf, neg_seq, kind = best
    return Proposal(-neg_seq, conf, "merge" if kind == "merge" else "split")


#: A topic a pluggable detector sealed is recorded with reason ``"detector:<name>"``.
DETECTOR = "detector:"
#: Longest detector name (the reason column holds 32 characters).
DETECTOR_NAME_CHARS = 32 - len(DETECTOR)


def proposer(proposals: Sequence[tuple[str, Proposal]], chosen: Proposal) -> str:
    """The detector behind ``chosen``: of those that proposed its kind and sequence, the most
    confident (the first listed on a tie)."""
    best: tuple[float, str] | None = None
    for name, p in proposals:
        if (
            p.kind == chosen.kind
            and p.sequence == chosen.sequence
            and (best is None or p.confidence > best[0])
        ):
            best = (p.confidence, name)
    return best[1] if best is not None else ""
