"""A conversation's persisted state, and the writes a transition asks a store to make. Pure data.

The state is what every rule needs to decide the next step without reading history: the open
topic's size and time span (kept incrementally, so a seal costs the same whatever the topic's
length), the tool calls still awaiting results, counters, pins and the boundary detector's
memory. Stores keep it as one opaque JSON document next to a few columns they index
(``due_at`` and the lease), so a new rule never needs a schema change.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from enum import Enum
from json.encoder import encode_basestring as _encode_string
from typing import Any

from .cohesion import json_string

#: ``due_at`` of a conversation whose maintenance work is due now, whatever clock asks.
DUE_NOW = datetime(1970, 1, 1, tzinfo=UTC)
#: How many of the newest messages the state remembers one by one (for cuts a few messages back).
RECENT = 8
#: Window marks kept for budgets other than the one read last (a bot reading for a second or third model).
OTHER_WINDOWS = 2
#: Platform user ids remembered per conversation.
MAX_USERS = 64


def _ts(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def _dt(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


@dataclass(frozen=True, slots=True)
class Span:
    """Aggregate of a run of consecutive messages.

    ``tokens`` and ``source`` count unpinned messages only (pinned ones are always sent on
    their own); ``messages`` and the time span count every message.
    """

    messages: int = 0
    tokens: int = 0
    """Framed tokens as the messages appear in a context."""
    source: int = 0
    """Framed tokens of the full original messages."""
    first_at: datetime | None = None
    last_at: datetime | None = None

    def add(self, tokens: int, source: int, pinned: bool, at: datetime) -> Span:
        return Span(
            self.messages + 1,
            self.tokens + (0 if pinned else tokens),
            self.source + (0 if pinned else source),
            at if self.first_at is None or at < self.first_at else self.first_at,
            at if self.last_at is None or at > self.last_at else self.last_at,
        )

    def plus(self, other: Span) -> Span:
        # The earlier first and the later last (None: unknown), as min()/max() pick: ours on a tie.
        a, b = self.first_at, other.first_at
        first = b if a is None or (b is not None and b < a) else a
        a, b = self.last_at, other.last_at
        last = b if a is None or (b is not None and b > a) else a
        messages, tokens = self.messages + other.messages, self.tokens + other.tokens
        return Span(messages, tokens, self.source + other.source, first, last)

    def to_json(self) -> list[Any]:
        return [self.messages, self.tokens, self.source, _ts(self.first_at), _ts(self.last_at)]

    @classmethod
    def from_json(cls, v: Sequence[Any]) -> Span:
        return cls(int(v[0]), int(v[1]), int(v[2]), _dt(v[3]), _dt(v[4]))


EMPTY = Span()


@dataclass(frozen=True, slots=True)
class Recent:
    """One of the newest messages of the open topic."""

    sequence: int
    own: Span
    """This message alone."""
    upto: Span
    """The open topic from its start up to and including this message."""
    clean: bool
    """No tool call is awaiting its result after this message: a topic may end here."""

    def to_json(self) -> list[Any]:
        return [self.sequence, self.own.to_json(), self.upto.to_json(), self.clean]

    @classmethod
    def from_json(cls, v: Sequence[Any]) -> Recent:
        return cls(int(v[0]), Span.from_json(v[1]), Span.from_json(v[2]), bool(v[3]))


def _quoted(text: str) -> str:
    # What json.dumps(text, ensure_ascii=False) returns for a string, without building an encoder
    # first (half the cost of the detector's 1-2 KB document, quoted on every write).
    return _encode_string(text)


def _opt(text: str | None) -> str:
    return "null" if text is None else _encode_string(text)


def _int(value: int | None) -> str:
    return "null" if value is None else str(int(value))


def _stamp(value: datetime | None) -> str:
    if value is None:
        return "null"
    # The same few times recur in every document (the open topic's bounds, the newest message):
    # an equal instant formats to the same UTC text, so remember the text of recent ones.
    found = _STAMPS.get(value)
    if found is None:
        if len(_STAMPS) >= 4096:
            _STAMPS.clear()
        found = _STAMPS[value] = f'"{value.astimezone(UTC).isoformat()}"'
    return found


_STAMPS: dict[datetime, str] = {}
_LAST_SPAN: tuple[Span | None, str] = (None, "")


def _span(s: Span) -> str:
    """``json.dumps(s.to_json())``, compact. The open topic's span is usually its clean part's
    too (the same object): the last one formatted is remembered."""
    global _LAST_SPAN
    last = _LAST_SPAN
    if last[0] is s:
        return last[1]
    if s is EMPTY:  # the tail, most of the time
        return "[0,0,0,null,null]"
    text = f"[{s.messages},{s.tokens},{s.source},{_stamp(s.first_at)},{_stamp(s.last_at)}]"
    _LAST_SPAN = (s, text)
    return text


def _seal(x: SealInfo) -> str:
    return f"[{x.ordinal},{x.first},{x.last},{_span(x.span)},{_quoted(x.reason)}]"


def _window(w: WindowMark) -> str:
    seal_at = "null" if w.seal_at is None else int(w.seal_at)
    return f"[{w.start},{w.budget},{w.epoch},[{','.join([str(int(i)) for i in w.shown])}],{seal_at}]"


#: Per conversation id, the parts of its document that only events change, with the values
#: they were formatted from (see ``ConversationState.body``).
_EVENT_PARTS: dict[str, tuple[tuple[object, ...], tuple[str, str, str]]] = {}
_EVENT_PARTS_MAX = 4096

#: Encoded :class:`Recent` entries by identity (a state keeps each for its next RECENT writes).
_ENCODED: dict[int, tuple[Recent, str]] = {}
_ENCODED_MAX = 8192


def _encoded(r: Recent) -> str:
    """``r`` as JSON, memoised by identity (entries are immutable; the entry keeps ``r`` alive,
    so its id cannot be reused while cached)."""
    hit = _ENCODED.get(id(r))
    if hit is not None and hit[0] is r:
        return hit[1]
    # ``upto`` first: the newest entry's is the open topic's span, formatted just before (remembered).
    upto = _span(r.upto)
    text = f"[{r.sequence},{_span(r.own)},{upto},{'true' if r.clean else 'false'}]"
    if len(_ENCODED) >= _ENCODED_MAX:
        _ENCODED.clear()
    _ENCODED[id(r)] = (r, text)
    return text


@dataclass(frozen=True, slots=True)
class SealInfo:
    """The topic sealed last, remembered so the next messages can reopen it."""

    ordinal: int
    first: int
    last: int
    span: Span
    reason: str

    def to_json(self) -> list[Any]:
        return [self.ordinal, self.first, self.last, self.span.to_json(), self.reason]

    @classmethod
    def from_json(cls, v: Sequence[Any] | None) -> SealInfo | None:
        return None if v is None else cls(int(v[0]), int(v[1]), int(v[2]), Span.from_json(v[3]), str(v[4]))


@dataclass(frozen=True, slots=True)
class WindowMark:
    """Where the verbatim window starts, as chosen at the conversation's last event.

    The start of a context only changes at an event (a seal, a summary, a merge or a roll-up, a
    pin), so a provider's prompt cache keeps hitting between events.
    """

    start: int
    """Sequence of the window's first message."""
    budget: int
    """The ``max_tokens`` it was chosen for."""
    epoch: int
    """The conversation's event count when it was chosen."""
    shown: tuple[int, ...] = ()
    """Ids of the archives and topic summaries shown beside it: they stay until the start moves
    (a summary merged meanwhile still says what it said; the archive replacing it waits)."""
    seal_at: int | None = None
    """The open topic's size at which the window no longer fits beside the blocks (its tokens
    then, plus the room the context left). The size rule seals there, an event, so the window
    never has to move between events and need not keep the size limit's growth free at each one
    (see :func:`window_size_limit`). None: only the size limit applies."""

    def to_json(self) -> list[Any]:
        return [self.start, self.budget, self.epoch, list(self.shown), self.seal_at]

    @classmethod
    def from_json(cls, v: Sequence[Any] | None) -> WindowMark | None:
        if v is None:
            return None
        shown = tuple(int(i) for i in (v[3] if len(v) > 3 else ()))
        seal_at = int(v[4]) if len(v) > 4 and v[4] is not None else None
        return cls(int(v[0]), int(v[1]), int(v[2]), shown, seal_at)


def search_key(body: Mapping[str, Any]) -> tuple[int, ...]:
    """:attr:`ConversationState.search_key` read from a state's parsed document."""
    return (
        int(body.get("epoch", 0)) - int(body.get("topics", 0)),
        *(int(body.get(k, 0)) for k in ("archives", "summarized", "merged", "dropped", "compressions")),
    )


@dataclass(frozen=True, slots=True)
class ConversationState:
    """Everything a rule needs to know about one conversation, as of ``version``."""

    id: str
    version: int = 0
    """Bumped by every write; stores apply a write only if the version is still the one it read."""
    platform: str | None = None
    encoding: str = ""
    """Tokenizer encoding every stored token count of this conversation was made with."""
    created_at: datetime | None = None
    updated_at: datetime | None = None
    last_sequence: int = 0
    last_message_at: datetime | None = None
    topic_start_seq: int = 1
    open: Span = EMPTY
    """The open topic: messages ``topic_start_seq..last_sequence``."""
    open_tool_calls: tuple[str, ...] = ()
    last_clean_seq: int = 0
    """The last sequence a seal may end at: never between a tool call and its results."""
    clean: Span = EMPTY
    """The open topic up to ``last_clean_seq``."""
    tail: Span = EMPTY
    """The open topic after ``last_clean_seq``."""
    recent: tuple[Recent, ...] = ()
    detector: str | None = None
    """The boundary detector's memory (its own JSON)."""
    last_seal: SealInfo | None = None
    topic_count: int = 0
    archive_count: int = 0
    summarized_upto: int = 0
    """Messages up to here are represented by summaries (a contiguous prefix)."""
    topics_merged_upto: int = 0
    """Topic ordinals up to here are merged into archives (merges take the oldest first)."""
    archives_dropped_upto: int = 0
    compressions: int = 0
    pins: tuple[tuple[str, int], ...] = ()
    """Active pinned messages: (key, sequence), in pinning order."""
    budget: int | None = None
    """The ``max_tokens`` this conversation was last read with."""
    epoch: int = 0
    """Events so far (seals, summaries, merges, roll-ups, pins): what may change a context's start."""
    window: WindowMark | None = None
    """Where the window starts for :attr:`budget` (the budget read last)."""
    other_windows: tuple[WindowMark, ...] = ()
    """The marks of the other budgets read lately, newest first (at most :data:`OTHER_WINDOWS`): a
    bot reading one conversation for two models keeps each one's prefix (one mark made every read
    at the other budget choose its window afresh, a rewrite of its cached prefix at every read)."""
    context_tokens: int = 0
    """Context tokens of every unpinned message so far: a message's position is what came before it."""
    words: int = 0
    """Words (:func:`~tiered_history.core.ranking.words`) of every message so far, for BM25's average."""
    channel: str | None = None
    """Where the conversation happens on its platform (a channel, thread or chat id)."""
    users: tuple[str, ...] = ()
    """Ids of the platform users who wrote in it, first seen first (at most :data:`MAX_USERS`)."""
    detected_upto: int = 0
    """The newest sequence the pluggable boundary detectors have been asked about (0: never)."""
    needs_maintenance: bool = False
    next_retry_at: datetime | None = None
    silence_due_at: datetime | None = None
    """When the open topic becomes silent enough for maintenance to seal it (None: never)."""
    # Lease columns: written by claim/renew/release only, never by a transition.
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None

    # -- names kept from the first schema (tests and tools read them) --------------------------

    @property
    def open_topic_messages(self) -> int:
        return self.open.messages

    @property
    def open_topic_tokens(self) -> int:
        return self.open.tokens

    @property
    def pinned_sequences(self) -> tuple[int, ...]:
        return tuple(seq for _, seq in self.pins)

    @property
    def due_at(self) -> datetime | None:
        """When maintenance has work here: now, a retry time, or the silence deadline."""
        times = []
        if self.needs_maintenance:
            times.append(self.next_retry_at or DUE_NOW)
        if self.silence_due_at is not None:
            times.append(self.silence_due_at)
        return min(times) if times else None

    @property
    def search_key(self) -> tuple[int, ...]:
        """What every change to the summary rows a search finds or returns moves (a summary written
        or replaced in place, an archive made, a summarised topic reopened, a merge, a drop), but
        not a seal: a sealed topic is pending (no text, not searchable) until it is summarised, so
        recall's kept summary lists and rows outlive seals (about one reply in fifteen).

        Every event moves the epoch by one, and a seal (of any kind) is the only one that also
        moves the topic count, by one: ``epoch - topic_count`` moves at every event but a seal,
        the in-place replacement of a provisional summary included (which moves nothing else),
        and never goes back. Derived from fields every writer keeps, so a write by any process,
        of any version, moves it. A fork or a restore starts at the pins of its open topic less its
        topics (a conversation made by messages starts at 0)."""
        return (
            self.epoch - self.topic_count,
            self.archive_count,
            self.summarized_upto,
            self.topics_merged_upto,
            self.archives_dropped_upto,
            self.compressions,
        )

    def mark_for(self, budget: int) -> WindowMark | None:
        """The window mark recorded for reads at ``budget``, if any."""
        if self.window is not None and self.window.budget == budget:
            return self.window
        return next((m for m in self.other_windows if m.budget == budget), None)

    def with_mark(
        self, mark: WindowMark | None, budget: int
    ) -> tuple[WindowMark | None, tuple[WindowMark, ...]]:
        """The (window, other_windows) pair after a read at ``budget`` chose ``mark``: it becomes the
        window, the previous window (of another budget) the newest of the others."""
        others = [m for m in (self.window, *self.other_windows) if m is not None and m.budget != budget]
        return mark, tuple(others[:OTHER_WINDOWS])

    # -- persistence ---------------------------------------------------------------------------

    def body(self) -> str:
        """The JSON document a store keeps for this state (everything but the columns)."""
        # Written on every message, so formatted by hand (json.dumps of the same structure gives
        # the same text, a test checks it): numbers and timestamps need no escaping, the strings
        # a caller chose do; the remembered messages (most of it) are encoded once each.
        # What only events change (seals, summaries, pins, reads at a new budget, users) is
        # formatted once per conversation until it changes: equal values, equal text.
        q = _quoted
        window = self.window
        seal = self.last_seal
        key = (
            seal,
            self.topic_count,
            self.archive_count,
            self.summarized_upto,
            self.topics_merged_upto,
            self.archives_dropped_upto,
            self.compressions,
            self.pins,
            self.budget,
            self.epoch,
            window,
            self.other_windows,
            self.channel,
            self.users,
            self.detected_upto,
            self.needs_maintenance,
            self.next_retry_at,
        )
        found = _EVENT_PARTS.get(self.id)
        if found is not None and found[0] == key:
            events, windows, rest = found[1]
        else:
            events = (
                f'"last_seal":{"null" if seal is None else _seal(seal)},'
                f'"topics":{self.topic_count},"archives":{self.archive_count},'
                f'"summarized":{self.summarized_upto},"merged":{self.topics_merged_upto},'
                f'"dropped":{self.archives_dropped_upto},"compressions":{self.compressions},'
                f'"pins":[{",".join([f"[{q(k)},{n}]" for k, n in self.pins])}],'
                f'"budget":{_int(self.budget)},'
            )
            windows = (
                f'"epoch":{self.epoch},"window":{"null" if window is None else _window(window)},'
                f'"windows":[{",".join(map(_window, self.other_windows))}],'
            )
            rest = (
                f'"channel":{_opt(self.channel)},"users":[{",".join(map(q, self.users))}],'
                f'"detected":{self.detected_upto},"maint":{"true" if self.needs_maintenance else "false"},'
                f'"retry_at":{_stamp(self.next_retry_at)},'
            )
            if len(_EVENT_PARTS) >= _EVENT_PARTS_MAX:
                _EVENT_PARTS.clear()
            _EVENT_PARTS[self.id] = (key, (events, windows, rest))
        return (
            f'{{"last":{self.last_sequence},"last_at":{_stamp(self.last_message_at)},'
            f'"start":{self.topic_start_seq},"open":{_span(self.open)},'
            f'"calls":[{",".join(map(q, self.open_tool_calls))}],'
            f'"clean_seq":{self.last_clean_seq},"clean":{_span(self.clean)},"tail":{_span(self.tail)},'
            f'"recent":[{",".join(map(_encoded, self.recent))}],'
            f'"detector":{"null" if self.detector is None else json_string(self.detector)},'
            f'{events}"ctx_tokens":{self.context_tokens},{windows}"words":{self.words},'
            f'{rest}"silence_at":{_stamp(self.silence_due_at)}}}'
        )

    @classmethod
    def from_row(
        cls,
        *,
        id: str,
        version: int,
        platform: str | None,
        encoding: str,
        created_at: datetime | None,
        updated_at: datetime | None,
        body: str | Mapping[str, Any],
        lease_owner: str | None = None,
        lease_expires_at: datetime | None = None,
    ) -> ConversationState:
        d: Mapping[str, Any] = json.loads(body) if isinstance(body, str) else body
        return cls(
            id=id,
            version=version,
            platform=platform,
            encoding=encoding,
            created_at=created_at,
            updated_at=updated_at,
            last_sequence=d["last"],
            last_message_at=_dt(d["last_at"]),
            topic_start_seq=d["start"],
            open=Span.from_json(d["open"]),
            open_tool_calls=tuple(d["calls"]),
            last_clean_seq=d["clean_seq"],
            clean=Span.from_json(d["clean"]),
            tail=Span.from_json(d["tail"]),
            recent=tuple(Recent.from_json(r) for r in d["recent"]),
            detector=d["detector"],
            last_seal=SealInfo.from_json(d.get("last_seal")),
            topic_count=d["topics"],
            archive_count=d["archives"],
            summarized_upto=d["summarized"],
            topics_merged_upto=d["merged"],
            archives_dropped_upto=d["dropped"],
            compressions=d["compressions"],
            pins=tuple((str(k), int(s)) for k, s in d["pins"]),
            budget=d["budget"],
            context_tokens=d.get("ctx_tokens", 0),
            epoch=d.get("epoch", 0),
            window=WindowMark.from_json(d.get("window")),
            other_windows=tuple(
                m for m in (WindowMark.from_json(v) for v in d.get("windows", ())) if m is not None
            ),
            words=d.get("words", 0),
            channel=d.get("channel"),
            users=tuple(d.get("users", ())),
            detected_upto=d.get("detected", 0),
            needs_maintenance=d["maint"],
            next_retry_at=_dt(d["retry_at"]),
            silence_due_at=_dt(d["silence_at"]),
            lease_owner=lease_owner,
            lease_expires_at=lease_expires_at,
        )

    def bumped(self, **changes: Any) -> ConversationState:
        """This state with ``changes`` and the next version."""
        if "version" in changes:
            raise TypeError("bumped() sets the version itself")
        changes["version"] = self.version + 1
        return self.with_changes(changes)

    def with_changes(self, changes: Mapping[str, Any]) -> ConversationState:
        """``dataclasses.replace(self, **changes)``, three times faster (every message makes one)."""
        if not changes.keys() <= _STATE_FIELDS:
            raise TypeError(f"unknown ConversationState fields: {sorted(set(changes) - _STATE_FIELDS)}")
        return _copy_state(self, changes)


#: The fields of a state (all set by ``__init__``; it has no ``__post_init__``).
_STATE_FIELDS = frozenset(f.name for f in fields(ConversationState))


def _state_copier() -> Callable[[ConversationState, Mapping[str, Any]], ConversationState]:
    """A function copying a state field by field into a new instance, then setting ``changes``.

    What ``dataclasses.replace`` does, minus its generic work: it walks the fields, builds
    keyword arguments and calls ``__init__``, which sets each slot through
    ``object.__setattr__`` (the class is frozen). Generated once, as dataclasses generates
    ``__init__``: one line a field, each through its slot's own setter (what
    ``object.__setattr__`` ends up calling, after finding it by name: a third of the cost).
    """
    names = sorted(_STATE_FIELDS)
    lines = [f"    set_{n}(new, state.{n})" for n in names]
    source = (
        "def copy(state, changes):\n"
        "    new = new_(cls)\n" + "\n".join(lines) + "\n"
        "    for name, value in changes.items():\n"
        "        set_(new, name, value)\n"
        "    return new\n"
    )
    scope: dict[str, Any] = {"new_": object.__new__, "set_": object.__setattr__, "cls": ConversationState}
    scope.update({f"set_{n}": ConversationState.__dict__[n].__set__ for n in names})
    exec(source, scope)  # the source is built above from the class's own field names
    copy: Callable[[ConversationState, Mapping[str, Any]], ConversationState] = scope["copy"]
    return copy


_copy_state = _state_copier()


# -- writes ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message row to insert. ``wire`` is the message as sent to the model minus ``content``
    when that is a plain string (kept in ``content``); None when only ``role`` is left."""

    sequence: int
    role: str
    content: str
    """The message text: its string content, or the text of its content parts (for search)."""
    wire: dict[str, Any] | None
    timestamp: datetime
    token_count: int
    full_token_count: int
    pinned: bool = False
    pin_key: str | None = None
    metadata: dict[str, Any] | None = None


SummaryKind = str  # "topic" | "bulk"


@dataclass(frozen=True, slots=True)
class NewSummary:
    """A topic (pending until summarised) or an archive to insert."""

    kind: SummaryKind
    ordinal: int
    first_sequence: int
    last_sequence: int
    started_at: datetime
    ended_at: datetime
    status: str
    created_at: datetime
    source_tokens: int
    level: int = 0
    content: str = ""
    rendered: str = ""
    token_count: int = 0
    sealed_at: datetime | None = None
    sealed_reason: str | None = None
    summarizer: str | None = None
    model: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    latency_ms: float = 0.0
    attempts: int = 0
    next_attempt_at: datetime | None = None
    last_error: str | None = None
    parent: NewRef | int | None = None
    """The archive that merged it: an existing row, or one inserted earlier in the same commit."""
    dropped_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class NewRef:
    """The id of the ``index``-th summary inserted by the same commit (known only once inserted)."""

    index: int


@dataclass(frozen=True, slots=True)
class SummaryUpdate:
    """Change one summary row, only if it still matches the guard.

    ``required``: when the guard does not match, the whole commit is abandoned (another worker
    got there first); otherwise the update is skipped quietly.
    """

    id: int
    """The row's id (0 when ``ordinal`` names it instead)."""
    values: Mapping[str, Any]
    """Columns to set. ``parent_id`` may be a :class:`NewRef`. ``prompt_tokens``,
    ``completion_tokens`` and ``cost`` are *added* to what the row holds (spend accumulates)."""
    expect_status: str | None = None
    expect_attempts: int | None = None
    expect_unmerged: bool = False
    expect_not_pending: bool = False
    expect_undropped: bool = False
    required: bool = True
    ordinal: int | None = None
    """Name the row by its topic ordinal instead of its id (a topic sealed before its id was known)."""


@dataclass(frozen=True, slots=True)
class Writes:
    """Everything one transition writes, applied atomically with the new state."""

    state: ConversationState
    messages: tuple[NewMessage, ...] = ()
    summaries: tuple[NewSummary, ...] = ()
    updates: tuple[SummaryUpdate, ...] = ()
    create: bool = False
    """Insert the conversation row (the first message of a new conversation)."""
    release: bool = False
    """Give the guard's lease back in the same transaction (a maintenance pass's last commit: a
    worker killed right after it leaves no lease behind)."""


@dataclass(frozen=True, slots=True)
class Guard:
    """What must still hold when a commit is applied."""

    version: int | None
    """The state version the transition was computed from (None: the row must not exist yet)."""
    lease_owner: str | None = None
    """Maintenance writes: this worker must still hold the conversation's lease."""


class Outcome(Enum):
    COMMITTED = "committed"
    VERSION_CONFLICT = "version"
    """The state changed since it was read: read it again and recompute."""
    ROW_CONFLICT = "row"
    """A guarded summary row changed (another worker wrote it): the transition is moot."""


@dataclass(frozen=True, slots=True)
class Committed:
    outcome: Outcome
    summary_ids: tuple[int, ...] = field(default=())
    """Ids of the inserted summaries, in ``Writes.summaries`` order."""
    writes: Writes | None = None
    """What was written (None: nothing, because the plan had nothing to do or a guard failed)."""

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.COMMITTED
