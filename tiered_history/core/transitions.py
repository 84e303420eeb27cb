"""State transitions: given a conversation's state (and the rows a step works on), the writes to make.

Every rule about what sealing, summarising, merging and dropping do to a conversation lives
here, as pure functions. Stores only apply the returned :class:`~.state.Writes` atomically,
under the guard the caller passes (the state version it started from, and for maintenance the
lease), so a backend needs to know no domain rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from ..errors import InvalidMessageError
from ..models import StoredMessage, Summary
from .boundaries import COHESION, UNSEAL, BoundaryRules, OpenTopic, Proposal, decide_live, reply_sequence
from .boundaries import Incoming as Seen
from .cohesion import CohesionState
from .ranking import words
from .state import (
    EMPTY,
    MAX_USERS,
    RECENT,
    ConversationState,
    NewMessage,
    NewRef,
    NewSummary,
    Recent,
    SealInfo,
    Span,
    SummaryUpdate,
    Writes,
)
from .units import answers, calls_of

MANUAL = "manual"
SILENCE = "silence"


@dataclass(frozen=True, slots=True)
class Incoming:
    """A validated message with its token counts, ready to be appended."""

    role: str
    content: str
    """Its text (string content, or the text of its content parts)."""
    wire: dict[str, Any] | None
    """The message as sent to the model, minus ``role`` and a string ``content``."""
    timestamp: datetime
    token_count: int
    full_token_count: int
    pinned: bool = False
    pin_key: str | None = None
    tool_call_ids: tuple[str, ...] = ()
    tool_call_id: str | None = None
    metadata: dict[str, Any] | None = None
    reply_to: int | None = None
    """Sequence of the earlier message this one replies to, when the platform says so."""
    words: int = 0
    """How many words its text has (for search statistics)."""


@dataclass(frozen=True, slots=True)
class Appended:
    writes: Writes
    sequence: int
    sealed: NewSummary | None
    detector: CohesionState | None = None
    """The content detector's state after the message (None when the rules track no content)."""


# -- sealing ---------------------------------------------------------------------------------------


def _rebase(recent: Sequence[Recent], cut: int) -> tuple[Recent, ...]:
    """The remembered messages after ``cut``, their running spans restarted at the new topic."""
    out: list[Recent] = []
    running = EMPTY
    for r in recent:
        if r.sequence <= cut:
            continue
        running = running.plus(r.own)
        out.append(replace(r, upto=running))
    return tuple(out)


def _span_after(recent: Sequence[Recent], after: int, upto: int | None = None) -> Span:
    """The remembered messages with ``after < sequence <= upto``, added up."""
    total = EMPTY
    for r in recent:
        if r.sequence > after and (upto is None or r.sequence <= upto):
            total = total.plus(r.own)
    return total


def _pending_topic(
    state: ConversationState,
    span: tuple[int, int, datetime, datetime],
    source: int,
    reason: str,
    now: datetime,
) -> NewSummary:
    """The row of a topic sealed now over ``span`` (first and last message, their times),
    awaiting its summary."""
    first, cut, started, ended = span
    return NewSummary(
        kind="topic",
        ordinal=state.topic_count + 1,
        first_sequence=first,
        last_sequence=cut,
        started_at=started,
        ended_at=ended,
        status="pending",
        created_at=now,
        source_tokens=source,
        sealed_at=now,
        sealed_reason=reason,
    )


def seal(
    state: ConversationState, reason: str, now: datetime, keep: int = 0
) -> tuple[ConversationState, NewSummary | None]:
    """Close the open topic, leaving its ``keep`` newest messages open (they begin the next topic).

    The cut never falls between a tool call and its results: it moves to the nearest earlier
    place where no call awaits its result. Constant time: the open topic's size and time span
    are kept in the state, and the newest messages one by one. The new topic is pending
    (summarised later); the returned state is not yet bumped (callers bump once per write).
    """
    cut, sealed = state.last_clean_seq, state.clean
    if not state.open_tool_calls:
        cut, sealed = state.last_sequence, state.open
    if keep > 0:
        # A cut a few messages back (where the talk turned): at a remembered clean message.
        wanted = state.last_sequence - keep
        spot = next((r for r in reversed(state.recent) if r.sequence <= wanted and r.clean), None)
        if spot is not None and spot.sequence >= state.topic_start_seq:
            cut, sealed = spot.sequence, spot.upto
    if cut < state.topic_start_seq or sealed.first_at is None or sealed.last_at is None:
        return state, None
    span = (state.topic_start_seq, cut, sealed.first_at, sealed.last_at)
    topic = _pending_topic(state, span, sealed.source, reason, now)
    if cut == state.last_sequence:
        rest, clean, tail = EMPTY, EMPTY, EMPTY
    elif cut == state.last_clean_seq:
        rest, clean, tail = state.tail, EMPTY, state.tail
    else:
        rest = _span_after(state.recent, cut)
        if state.open_tool_calls:
            clean, tail = _span_after(state.recent, cut, state.last_clean_seq), state.tail
        else:
            clean, tail = rest, EMPTY
    after = replace(
        state,
        topic_count=topic.ordinal,
        topic_start_seq=cut + 1,
        open=rest,
        clean=clean,
        tail=tail,
        last_clean_seq=max(cut, state.last_clean_seq) if cut != state.last_sequence else cut,
        recent=_rebase(state.recent, cut),
        needs_maintenance=True,
        next_retry_at=None,
        updated_at=now,
        last_seal=SealInfo(topic.ordinal, topic.first_sequence, cut, sealed, reason),
    )
    return after, topic


def unseal(state: ConversationState, now: datetime) -> tuple[ConversationState, SummaryUpdate | None]:
    """Reopen the topic sealed last (the talk went back to it): its messages join the open topic.

    Its row stays, marked ``superseded`` (its summary too, if it has one: nothing is lost); a
    topic already merged into an archive is not reopened.
    """
    last = state.last_seal
    if last is None or last.ordinal <= state.topics_merged_upto or last.last != state.topic_start_seq - 1:
        return state, None
    opened = last.span.plus(state.open)
    if state.open_tool_calls:
        clean, tail = last.span.plus(state.clean), state.tail
    else:
        clean, tail = opened, EMPTY
    after = replace(
        state,
        topic_start_seq=last.first,
        open=opened,
        clean=clean,
        tail=tail,
        recent=tuple(replace(r, upto=last.span.plus(r.upto)) for r in state.recent),
        summarized_upto=min(state.summarized_upto, last.first - 1),
        last_seal=None,
        updated_at=now,
    )
    update = SummaryUpdate(0, {"status": "superseded"}, ordinal=last.ordinal, required=False)
    return after, update


def _open_topic(state: ConversationState) -> OpenTopic:
    return OpenTopic(
        messages=state.open.messages,
        tokens=state.open.tokens,
        last_timestamp=state.last_message_at,
        tool_call_open=bool(state.open_tool_calls),
        start=state.topic_start_seq,
        detector=state.detector,
        last_seal_start=state.last_seal.first if state.last_seal is not None else None,
        held=state.tail.messages if state.open_tool_calls else 0,
    )


def silence_deadline(state: ConversationState, rules: BoundaryRules) -> datetime | None:
    """When maintenance may seal the open topic for silence (None: it may not)."""
    return _silence_deadline(state.open, state.last_message_at, rules)


def _silence_deadline(open: Span, last_message_at: datetime | None, rules: BoundaryRules) -> datetime | None:
    if not rules.temporal or not open.messages or last_message_at is None:
        return None
    if open.tokens < rules.min_tokens:
        return None
    try:
        return last_message_at + rules.silence
    except OverflowError:  # a message stamped in the last minutes of year 9999: never silent
        return None


# -- appending -------------------------------------------------------------------------------------


def new_state(conversation_id: str, platform: str | None, encoding: str, now: datetime) -> ConversationState:
    return ConversationState(
        id=conversation_id,
        version=0,
        platform=platform,
        encoding=encoding,
        created_at=now,
        updated_at=now,
    )


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a message comes from on its platform (recorded on the conversation)."""

    platform: str | None = None
    channel: str | None = None
    user_id: str | None = None

    def applied(self, state: ConversationState) -> ConversationState:
        """``state`` with what it did not know yet (the first platform and channel given win)."""
        return replace(state, **self.changes(state))

    def changes(self, state: ConversationState) -> dict[str, Any]:
        """The fields :meth:`applied` sets."""
        users = state.users
        if self.user_id is not None and self.user_id not in users and len(users) < MAX_USERS:
            users = (*users, self.user_id)
        return {
            "platform": state.platform or self.platform,
            "channel": state.channel or self.channel,
            "users": users,
        }


def window_size_limit(rules: BoundaryRules, state: ConversationState) -> BoundaryRules:
    """``rules`` with the size limit lowered to where the window recorded at the last event no
    longer fits (:attr:`WindowMark.seal_at`): the open topic is sealed there, an event at which the
    window may move, instead of the window moving between events (a rewrite of the cached prefix)
    or keeping the whole size limit free at every event (a short window, moved often). Only a mark
    recorded since the last event counts: the window of the budget the conversation is read with,
    and those of the other budgets it is read with in turn (the first of them to stop fitting)."""
    if not rules.size:
        return rules
    window = state.window
    marks = (window,) if window is not None and window.budget == state.budget else ()
    seals = [
        m.seal_at for m in (*marks, *state.other_windows) if m.seal_at is not None and m.epoch == state.epoch
    ]
    if not seals or min(seals) >= rules.size_limit:
        return rules
    # The same lowered rules for every message until the next event: one object, so that what
    # is derived from rules once (their compiled phrases, detector parameters) stays derived.
    limit = max(min(seals), 1)
    found = _LOWERED.get((id(rules), limit))
    if found is not None and found[0] is rules:  # the entry keeps ``rules`` alive: its id is not reused
        return found[1]
    if len(_LOWERED) >= 256:
        _LOWERED.clear()
    lowered = replace(rules, size_limit=limit)
    _LOWERED[(id(rules), limit)] = (rules, lowered)
    return lowered


_LOWERED: dict[tuple[int, int], tuple[BoundaryRules, BoundaryRules]] = {}


def append(
    state: ConversationState | None,
    conversation_id: str,
    message: Incoming,
    rules: BoundaryRules,
    *,
    platform: str | None,
    encoding: str,
    now: datetime,
    origin: Origin | None = None,
    detector: CohesionState | None = None,
    dump: bool = True,
) -> Appended:
    """Store ``message`` with the next sequence, sealing the open topic first if a rule says so.

    Raises :class:`InvalidMessageError` for a tool result that answers no open call. A batch passes
    the ``detector`` the previous message's :class:`Appended` returned, and ``dump`` False for all
    but its last message: the states in between then hold no detector text (they are never stored
    nor read; see :func:`~.boundaries.decide_live`).
    """
    create = state is None
    before = new_state(conversation_id, platform, encoding, now) if state is None else state
    calls = list(before.open_tool_calls)
    if message.role == "tool" and message.tool_call_id not in calls:
        raise InvalidMessageError(
            f"tool result {message.tool_call_id!r} answers no open tool call in this conversation "
            "(add the assistant message with the matching tool_calls first)"
        )
    m = message
    verdict, live = decide_live(
        window_size_limit(rules, before),
        _open_topic(before),
        Seen(
            role=m.role,
            text=m.content,
            timestamp=m.timestamp,
            tokens=m.token_count,
            tool_call=bool(m.tool_call_ids),
            pinned=m.pinned,
            reply_to=m.reply_to,
        ),
        detector,
        dump=dump,
    )
    updates: tuple[SummaryUpdate, ...] = ()
    sealed: NewSummary | None = None
    if verdict.reason == UNSEAL:
        cur, reopened = unseal(before, now)
        updates = (reopened,) if reopened is not None else ()
    elif verdict.reason is not None:
        cur, sealed = seal(before, verdict.reason, now, verdict.keep)
    else:
        cur = before

    seq = cur.last_sequence + 1
    grown = (m.token_count, m.full_token_count, m.pinned, m.timestamp)
    own = EMPTY.add(*grown)
    opened = cur.open.add(*grown)  # = cur.open.plus(own), without a Span in between
    if m.tool_call_ids:
        calls = list(m.tool_call_ids)
    elif m.tool_call_id is not None and m.tool_call_id in calls:  # a tool's (or function's) result
        calls.remove(m.tool_call_id)
    elif not m.pinned:
        calls = []  # a new turn abandons calls that never got results; a pinned instruction is no turn
    if not calls:
        last_clean, clean, tail = seq, opened, EMPTY
    elif m.tool_call_ids:
        # The call opens a unit that must stay whole: a seal may end just before it.
        last_clean, clean, tail = seq - 1, cur.open, own
    else:
        last_clean, clean, tail = cur.last_clean_seq, cur.clean, cur.tail.add(*grown)
    recent = (*cur.recent, Recent(seq, own, opened, not calls))[-RECENT:]
    pins = cur.pins
    if m.pinned:
        key = m.pin_key or f"#{seq}"
        pins = (*((k, s) for k, s in pins if k != key), (key, seq))
    last_at = cur.last_message_at
    last_at = m.timestamp if last_at is None or m.timestamp > last_at else last_at
    # One copy of the state for the whole step (it has many fields: each copy costs).
    changes = origin.changes(cur) if origin is not None else {}
    changes["platform"] = changes.get("platform", cur.platform) or platform
    if sealed is not None or updates or m.pinned:
        changes["epoch"] = cur.epoch + 1  # an event: the context's start may change now
    seen = max(cur.detected_upto, cur.topic_start_seq - 1)
    if rules.detect_every and seq - seen >= rules.detect_every:
        changes["needs_maintenance"] = True  # the pluggable detectors run in maintenance
    after = cur.bumped(
        **changes,
        detector=verdict.detector,
        updated_at=now,
        last_sequence=seq,
        last_message_at=last_at,
        open=opened,
        open_tool_calls=tuple(calls),
        last_clean_seq=last_clean,
        clean=clean,
        tail=tail,
        recent=recent,
        pins=pins,
        context_tokens=cur.context_tokens + (0 if m.pinned else m.token_count),
        words=cur.words + m.words,
        silence_due_at=_silence_deadline(opened, last_at, rules),
    )
    row = NewMessage(
        sequence=seq,
        role=m.role,
        content=m.content,
        wire=m.wire,
        timestamp=m.timestamp,
        token_count=m.token_count,
        full_token_count=m.full_token_count,
        pinned=m.pinned,
        pin_key=(m.pin_key or f"#{seq}") if m.pinned else None,
        metadata=m.metadata or None,
    )
    return Appended(
        Writes(after, messages=(row,), summaries=(sealed,) if sealed else (), updates=updates, create=create),
        seq,
        sealed,
        live,
    )


def append_all(
    state: ConversationState | None,
    conversation_id: str,
    messages: Sequence[Incoming],
    rules: BoundaryRules,
    *,
    platform: str | None,
    encoding: str,
    now: datetime,
    origin: Origin | None = None,
) -> Writes:
    """Every message appended in order, as one write (all or nothing); seals happen as they would one
    by one. Raises :class:`InvalidMessageError` naming the first message that cannot be stored."""
    rows: list[NewMessage] = []
    sealed: list[NewSummary] = []
    updates: list[SummaryUpdate] = []
    cur = state
    live: CohesionState | None = None
    last = len(messages) - 1
    for i, m in enumerate(messages):
        try:
            # The detector's state goes from one message to the next as it is; only the last
            # message's is formatted (what is stored), as it would be appended alone.
            done = append(
                cur,
                conversation_id,
                m,
                rules,
                platform=platform,
                encoding=encoding,
                now=now,
                origin=origin,
                detector=live,
                dump=i == last,
            )
        except InvalidMessageError as exc:
            error = InvalidMessageError(f"message {i} of the batch: {exc}")
            error.index = i
            raise error from None
        if last == 0:
            return done.writes  # one message: its write is the batch's, at the next version already
        rows.extend(done.writes.messages)
        sealed.extend(done.writes.summaries)
        updates.extend(done.writes.updates)
        cur = done.writes.state
        live = done.detector
    assert cur is not None
    base = 0 if state is None else state.version
    if cur.version != base + 1:  # one write, one version (each append bumped it)
        cur = cur.with_changes({"version": base + 1})
    return Writes(cur, tuple(rows), tuple(sealed), tuple(updates), create=state is None)


def unpin(state: ConversationState, key: str, now: datetime) -> Writes | None:
    """Take the pinned message under ``key`` out of the context (it stays stored); None if none is."""
    pins = tuple((k, s) for k, s in state.pins if k != key)
    if len(pins) == len(state.pins):
        return None
    return Writes(state.bumped(pins=pins, epoch=state.epoch + 1, updated_at=now))


def seal_now(
    state: ConversationState, rules: BoundaryRules, reason: str, now: datetime
) -> tuple[Writes, NewSummary] | None:
    """Close the open topic on request (``manual``) or for silence; None when nothing can be sealed."""
    after, topic = seal(state, reason, now)
    if topic is None:
        return None
    after = replace(after.bumped(epoch=after.epoch + 1), silence_due_at=silence_deadline(after, rules))
    return Writes(after, summaries=(topic,)), topic


def seal_if_silent(
    state: ConversationState, rules: BoundaryRules, now: datetime
) -> tuple[Writes, NewSummary] | None:
    """Seal the open topic when its newest message is older than the silence rule allows."""
    if not rules.temporal or not state.open.messages or state.last_message_at is None:
        return None
    if state.open.tokens < rules.min_tokens or state.last_message_at >= now - rules.silence:
        return None
    return seal_now(state, rules, SILENCE, now)


# -- pluggable detectors ---------------------------------------------------------------------------


def open_topic(state: ConversationState) -> OpenTopic:
    """The open topic as the boundary rules (and :func:`~.boundaries.choose_proposal`) see it."""
    return _open_topic(state)


def detection_due(state: ConversationState, every: int) -> bool:
    """The open topic holds at least ``every`` messages the pluggable detectors have not been asked about."""
    seen = max(state.detected_upto, state.topic_start_seq - 1)
    return state.open.messages > 0 and state.last_sequence - seen >= every


@dataclass(frozen=True, slots=True)
class Detected:
    """What applying the detectors' verdict writes, and what it did."""

    writes: Writes
    outcome: str
    """``"split"``, ``"merge"`` or ``"none"`` (only the detectors' progress is recorded)."""


def apply_proposal(
    state: ConversationState,
    chosen: Proposal | None,
    reason: str,
    messages: Sequence[StoredMessage],
    rules: BoundaryRules,
    now: datetime,
    *,
    start: int,
    upto: int,
) -> Detected:
    """Apply the proposal :func:`~.boundaries.choose_proposal` picked for the open topic as it was
    when the detectors were asked (it began at ``start``; they saw it up to ``upto``).

    A split seals the open topic before ``chosen.sequence`` (moved earlier, as every seal is, so
    that no tool call is split from its results) with ``reason``; ``messages`` must be the open
    topic's stored messages, every one of them. A merge reopens the topic sealed last if silence
    or the content detector sealed it (as an unseal would). Whatever happens, the detectors are
    not asked about messages up to ``upto`` again: a proposal that no longer fits (the topic
    was sealed meanwhile, a reply arrived since the messages were read) is dropped, never retried.
    """
    marked = state.bumped(detected_upto=max(state.detected_upto, upto), updated_at=now)
    if chosen is None or state.topic_start_seq != start:
        return Detected(Writes(marked), "none")
    if chosen.kind == "merge":
        last = state.last_seal
        if last is None or last.reason not in (COHESION, SILENCE):
            return Detected(Writes(marked), "none")
        after, update = unseal(marked, now)
        if update is None:
            return Detected(Writes(marked), "none")
        after = replace(after, epoch=after.epoch + 1, silence_due_at=silence_deadline(after, rules))
        return Detected(Writes(after, updates=(update,)), "merge")
    split = seal_at(marked, messages, chosen.sequence, reason, rules, now)
    if split is None:
        return Detected(Writes(marked), "none")
    after, topic = split
    return Detected(Writes(after, summaries=(topic,)), "split")


def seal_at(
    state: ConversationState,
    messages: Sequence[StoredMessage],
    sequence: int,
    reason: str,
    rules: BoundaryRules,
    now: datetime,
) -> tuple[ConversationState, NewSummary] | None:
    """Seal the open topic so that the next one begins at ``sequence`` (or earlier: never between
    a tool call and its results); None when no such cut is left inside the topic, when the part
    sealed would hold fewer than ``rules.min_tokens`` tokens, or when ``messages`` (the open
    topic's stored messages) do not match the state. Unlike :func:`seal`, the cut may lie
    anywhere in the topic: the spans are added up from ``messages``. The state is not bumped.
    """
    first, last = state.topic_start_seq, state.last_sequence
    rows = [m for m in messages if first <= m.sequence <= last]
    if [m.sequence for m in rows] != list(range(first, last + 1)) or not first < sequence <= last:
        return None
    # After which messages no tool call awaits its result (as append() tracks it).
    calls: set[str] = set()
    clean: list[bool] = []
    for m in rows:
        made, key = calls_of(m), answers(m)
        if made:
            calls = made
        elif key is not None and key in calls:
            calls.discard(key)
        elif m.role != "tool" and not m.pinned:
            calls = set()
        clean.append(not calls)
    cut = sequence - 1
    while cut >= first and not clean[cut - first]:
        cut -= 1
    if cut < first:
        return None
    sealed, rest, rest_clean = EMPTY, EMPTY, EMPTY
    for m in rows:
        own = EMPTY.add(m.token_count, m.full_token_count, m.pinned, m.timestamp)
        if m.sequence <= cut:
            sealed = sealed.plus(own)
        else:
            rest = rest.plus(own)
            if m.sequence <= state.last_clean_seq:
                rest_clean = rest_clean.plus(own)
    if sealed.first_at is None or sealed.last_at is None or sealed.tokens < rules.min_tokens:
        return None
    if sealed.messages + rest.messages != state.open.messages:
        return None  # the state and the rows disagree: better no seal than a wrong one
    topic = _pending_topic(state, (first, cut, sealed.first_at, sealed.last_at), sealed.source, reason, now)
    clean_span, tail = (rest_clean, state.tail) if state.open_tool_calls else (rest, EMPTY)
    after = replace(
        state,
        topic_count=topic.ordinal,
        topic_start_seq=cut + 1,
        open=rest,
        clean=clean_span,
        tail=tail,
        recent=_rebase(state.recent, cut),
        detector=_no_unseal(state.detector),
        needs_maintenance=True,
        next_retry_at=None,
        epoch=state.epoch + 1,
        updated_at=now,
        last_seal=SealInfo(topic.ordinal, first, cut, sealed, reason),
    )
    return replace(after, silence_due_at=silence_deadline(after, rules)), topic


def _no_unseal(detector: str | None) -> str | None:
    """The content detector's state, without an unseal pending from an earlier seal: what a
    detector sealed is not for the reply path to reopen."""
    if detector is None:
        return None
    state = CohesionState.from_json(detector)
    if not state.unseal_left:
        return detector
    state.unseal_left = 0
    return state.dump()


# -- maintenance -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SummaryWrite:
    """The outcome of summarising one topic or merging several summaries into an archive."""

    content: str
    rendered: str
    token_count: int
    status: str
    summarizer: str
    model: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    latency_ms: float = 0.0
    next_attempt_at: datetime | None = None
    last_error: str | None = None
    extra: dict[str, object] | None = None


def due_topics(topics: Sequence[Summary], now: datetime, max_attempts: int) -> list[Summary]:
    """Pending topics, and provisional ones due for another attempt, oldest first."""
    return [
        t
        for t in topics
        if t.merged_into is None
        and (
            t.status == "pending"
            or (
                t.status == "provisional"
                and t.attempts < max_attempts
                and (t.next_attempt_at is None or t.next_attempt_at <= now)
            )
        )
    ]


def next_retry(topics: Sequence[Summary], max_attempts: int) -> datetime | None:
    """When the earliest provisional summary is due for another attempt."""
    times = [
        t.next_attempt_at
        for t in topics
        if t.status == "provisional"
        and t.merged_into is None
        and t.attempts < max_attempts
        and t.next_attempt_at is not None
    ]
    return min(times) if times else None


def active_topics(topics: Sequence[Summary]) -> list[Summary]:
    """Summarised topics not merged into an archive (nor reopened), oldest first."""
    return [t for t in topics if t.merged_into is None and t.status not in ("pending", "superseded")]


def active_archives(archives: Sequence[Summary]) -> list[Summary]:
    """Archives not rolled up into a coarser one, in timeline order (a roll-up, written later,
    covers earlier messages than the archives written before it)."""
    live = [a for a in archives if a.dropped_at is None and a.merged_into is None]
    return sorted(live, key=lambda a: a.first_sequence)


def earlier_texts(first_sequence: int, *summaries: Sequence[Summary], limit: int | None = None) -> list[str]:
    """What the context says before ``first_sequence``: the texts of the live summaries and
    archives among ``summaries`` that end before it, in timeline order; the nearest ones only, as
    many as ``limit`` tokens hold (what the tiers can show: a backlog of topics summarised in one
    pass would otherwise hand each summary all those before it). A summariser told them spends its
    room on what they do not say (each summary is otherwise chosen on its own, and keeps a
    conversation's recurring words again)."""
    before = sorted(
        (
            x
            for group in summaries
            for x in (active_archives(group) if group and group[0].tier != "topic" else active_topics(group))
            if x.last_sequence < first_sequence and x.content
        ),
        key=lambda x: x.first_sequence,
    )
    if limit is not None:
        kept, total = 0, 0
        for x in reversed(before):
            total += x.token_count
            if total > limit:
                break
            kept += 1
        before = before[len(before) - kept :]
    return [x.content for x in before]


def record_summary(state: ConversationState, topic: Summary, write: SummaryWrite, now: datetime) -> Writes:
    """Save ``write`` as ``topic``'s summary, once (the row must still be as it was read)."""
    update = SummaryUpdate(
        topic.id,
        {
            "content": write.content,
            "rendered": write.rendered,
            "token_count": write.token_count,
            "status": write.status,
            "summarizer": write.summarizer,
            "model": write.model,
            "prompt_tokens": write.prompt_tokens,
            "completion_tokens": write.completion_tokens,
            "cost": write.cost,
            "latency_ms": write.latency_ms,
            "attempts": topic.attempts + 1,
            "next_attempt_at": write.next_attempt_at,
            "last_error": write.last_error,
        },
        expect_status=topic.status,
        expect_attempts=topic.attempts,
        expect_unmerged=True,
    )
    # Advance only over a contiguous prefix, so no range is ever skipped.
    upto = topic.last_sequence if state.summarized_upto == topic.first_sequence - 1 else state.summarized_upto
    after = state.bumped(
        summarized_upto=upto,
        compressions=state.compressions + (topic.status == "pending"),
        epoch=state.epoch + 1,
        updated_at=now,
    )
    return Writes(after, updates=(update,))


def record_archive(
    state: ConversationState, topics: Sequence[Summary], write: SummaryWrite, now: datetime
) -> Writes:
    """Merge ``topics`` (or archives: a roll-up), oldest first and consecutive, into a new archive;
    each must still be unmerged."""
    archive = NewSummary(
        kind="bulk",
        ordinal=state.archive_count + 1,
        first_sequence=topics[0].first_sequence,
        last_sequence=topics[-1].last_sequence,
        started_at=min(t.started_at for t in topics),
        ended_at=max(t.ended_at for t in topics),
        status=write.status,
        created_at=now,
        source_tokens=sum(t.source_tokens for t in topics),
        level=1 + max(t.level for t in topics),
        content=write.content,
        rendered=write.rendered,
        token_count=write.token_count,
        sealed_at=now,
        summarizer=write.summarizer,
        model=write.model,
        prompt_tokens=write.prompt_tokens,
        completion_tokens=write.completion_tokens,
        cost=write.cost,
        latency_ms=write.latency_ms,
        attempts=1,
    )
    updates = tuple(
        SummaryUpdate(t.id, {"parent_id": NewRef(0)}, expect_unmerged=True, expect_not_pending=True)
        for t in topics
    )
    merged_topics = [t.sequence for t in topics if t.tier == "topic"]
    after = state.bumped(
        archive_count=archive.ordinal,
        topics_merged_upto=max([state.topics_merged_upto, *merged_topics]),
        compressions=state.compressions + 1,
        epoch=state.epoch + 1,
        updated_at=now,
    )
    return Writes(after, summaries=(archive,), updates=updates)


def drop_archives(state: ConversationState, archives: Sequence[Summary], now: datetime) -> Writes:
    """Take the given (oldest) archives out of the context; they stay stored."""
    updates = tuple(
        SummaryUpdate(a.id, {"dropped_at": now}, expect_undropped=True, required=False) for a in archives
    )
    after = state.bumped(
        archives_dropped_upto=max(a.sequence for a in archives),
        updated_at=now,
    )
    return Writes(after, updates=updates)


def finish(
    state: ConversationState, rules: BoundaryRules, retry_at: datetime | None, now: datetime
) -> ConversationState:
    """The state after a maintenance pass: work left (a topic sealed meanwhile, a retry) stays due."""
    pending = state.summarized_upto < state.topic_start_seq - 1
    return replace(
        state.bumped(
            needs_maintenance=pending or retry_at is not None,
            next_retry_at=None if pending else retry_at,
            updated_at=now,
        ),
        silence_due_at=silence_deadline(state, rules),
    )


def retry_later(
    state: ConversationState, rules: BoundaryRules, delay: timedelta, now: datetime
) -> ConversationState:
    """The state after a failed maintenance pass: everything is retried after ``delay``."""
    return replace(
        state.bumped(needs_maintenance=True, next_retry_at=now + delay, updated_at=now),
        silence_due_at=silence_deadline(state, rules),
    )


# -- branching -------------------------------------------------------------------------------------


def fork(
    source: ConversationState,
    new_id: str,
    messages: Sequence[StoredMessage],
    summaries: Sequence[Summary],
    at: int,
    rules: BoundaryRules,
    now: datetime,
    *,
    keep_spend: bool = False,
) -> Writes:
    """A new conversation holding ``source``'s messages up to ``at`` and the summaries of the topics
    (and archives) that end by then: a branch for retry and edit flows. Nothing of ``source`` changes.

    ``messages`` are the source's messages up to ``at`` (pinned ones included); ``summaries`` every
    topic and archive of the source. ``keep_spend``: the summaries keep what they cost (a restored
    conversation is the same one; a branch starts with no spend of its own).
    """
    kept = [s for s in summaries if s.last_sequence <= at]
    topics = sorted((s for s in kept if s.tier == "topic"), key=lambda s: s.sequence)
    archives = sorted((s for s in kept if s.tier != "topic"), key=lambda s: (-s.level, s.sequence))
    # Parents first, so every child can name the row its archive became.
    order = archives + topics
    index = {s.id: i for i, s in enumerate(order)}
    rows = tuple(
        NewSummary(
            kind="topic" if s.tier == "topic" else "bulk",
            ordinal=s.sequence,
            first_sequence=s.first_sequence,
            last_sequence=s.last_sequence,
            started_at=s.started_at,
            ended_at=s.ended_at,
            status=s.status,
            created_at=s.created_at or now,
            source_tokens=s.source_tokens,
            level=s.level,
            content=s.content,
            rendered=s.rendered,
            token_count=s.token_count,
            sealed_at=s.sealed_at,
            sealed_reason=s.sealed_reason,
            summarizer=s.summarizer,
            model=s.model,
            prompt_tokens=s.prompt_tokens if keep_spend else 0,
            completion_tokens=s.completion_tokens if keep_spend else 0,
            cost=s.cost if keep_spend else 0.0,
            latency_ms=s.latency_ms if keep_spend else 0.0,
            attempts=s.attempts,
            next_attempt_at=s.next_attempt_at,
            last_error=s.last_error,
            parent=NewRef(index[s.merged_into]) if s.merged_into in index else None,
            dropped_at=s.dropped_at,
        )
        for s in order
    )
    start = max((t.last_sequence for t in topics), default=0) + 1
    summarized = 0
    for t in topics:  # the contiguous prefix of summarised topics (a reopened one is no part of it)
        if t.status == "superseded":
            continue
        if t.status == "pending" or t.first_sequence != summarized + 1:
            break
        summarized = t.last_sequence
    state = replace(
        new_state(new_id, source.platform, source.encoding, now),
        channel=source.channel,
        users=source.users,
        last_sequence=start - 1,
        topic_start_seq=start,
        last_clean_seq=start - 1,
        topic_count=len(topics),
        archive_count=len(archives),
        summarized_upto=summarized,
        topics_merged_upto=max((t.sequence for t in topics if t.merged_into is not None), default=0),
        archives_dropped_upto=max((a.sequence for a in archives if a.dropped_at is not None), default=0),
        compressions=sum(t.status != "pending" for t in topics) + len(archives),
        pins=tuple((k, q) for k, q in source.pins if q <= at),
        needs_maintenance=any(t.status == "pending" for t in topics),
    )
    # The open topic is rebuilt by appending its messages again (no rule runs: no seal).
    quiet = replace(rules, explicit=False, temporal=False, size=False, cohesion=False, unseal=False)
    cur = state
    for m in messages:
        if m.sequence < start:
            cur = replace(cur, last_message_at=max(cur.last_message_at or m.timestamp, m.timestamp))
            continue
        incoming = _incoming_of(m)
        cur = append(
            cur, new_id, incoming, quiet, platform=None, encoding=source.encoding, now=now
        ).writes.state
    rows_messages = tuple(
        NewMessage(
            sequence=m.sequence,
            role=m.role,
            content=m.content,
            wire=_wire_of(m),
            timestamp=m.timestamp,
            token_count=m.token_count,
            full_token_count=m.full_token_count,
            pinned=m.pinned,
            pin_key=m.pin_key,
            metadata=dict(m.metadata) or None,
        )
        for m in messages
    )
    # Counted over every message, as appending them one by one would have (the replay saw only
    # the open topic's, and without their words).
    final = replace(
        cur,
        version=1,
        pins=state.pins,
        silence_due_at=silence_deadline(cur, rules),
        context_tokens=sum(m.token_count for m in messages if not m.pinned),
        words=sum(len(words(m.content)) for m in messages),
    )
    return Writes(final, rows_messages, rows, create=True)


def _incoming_of(m: StoredMessage) -> Incoming:
    """A stored message as it would be appended again (fork's replay, restore's batch)."""
    return Incoming(
        role=m.role,
        content=m.content,
        wire=_wire_of(m),
        timestamp=m.timestamp,
        token_count=m.token_count,
        full_token_count=m.full_token_count,
        pinned=m.pinned,
        pin_key=m.pin_key,
        tool_call_ids=tuple(str(c.get("id")) for c in m.tool_calls or ()) or tuple(calls_of(m)),
        tool_call_id=answers(m),
        metadata=dict(m.metadata) or None,
        reply_to=reply_sequence(m.metadata),
        words=len(words(m.content)),
    )


def _wire_of(m: StoredMessage) -> dict[str, Any] | None:
    wire: dict[str, Any] = dict(m.extra or {})
    if m.name is not None:
        wire["name"] = m.name
    if m.tool_calls is not None:
        wire["tool_calls"] = m.tool_calls
    if m.tool_call_id is not None:
        wire["tool_call_id"] = m.tool_call_id
    return wire or None


def restore(
    seed: ConversationState,
    messages: Sequence[StoredMessage],
    summaries: Sequence[Summary],
    rules: BoundaryRules,
    now: datetime,
) -> Writes:
    """A conversation rebuilt from its messages (every one, oldest first) and its summaries.

    ``seed`` carries what is kept as given: id, platform, channel, users, creation time, encoding
    and the active pins. With summaries the topics are exactly theirs (as :func:`fork` does);
    without, the messages are appended as one batch and the boundary rules find the topics again.
    """
    if summaries:
        writes = fork(seed, seed.id, messages, summaries, len(messages), rules, now, keep_spend=True)
    else:
        batch = [_incoming_of(m) for m in messages]
        origin = Origin(seed.platform, seed.channel)
        writes = append_all(
            None,
            seed.id,
            batch,
            rules,
            platform=seed.platform,
            encoding=seed.encoding,
            now=now,
            origin=origin,
        )
    state = replace(writes.state, created_at=seed.created_at or now, users=seed.users, pins=seed.pins)
    return replace(writes, state=state)
