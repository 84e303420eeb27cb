"""The reply path: the logic of every call a bot makes while replying.

:class:`ReplyPath` validates, counts tokens, plans with the pure core and reads or commits
through the store. It is synchronous: the blocking twin
(:class:`~tiered_history.SyncHistoryCompressor`) calls it directly, and
:class:`~tiered_history.HistoryCompressor` runs it on the event loop when the store never
waits, or on the store's thread pool when it may. One source, two faces. Background work
lives in :mod:`.maintenance`, summarising in :mod:`.summarizers.pipeline`.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime, timedelta
from operator import is_
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from .core.assembly import Recalled, Rows, Shares, assemble, returned_topic
from .core.boundaries import BoundaryRules, reply_sequence
from .core.budget import (
    MIN_MAX_TOKENS,
    EscalationBudget,
    check_max_tokens,
    escalation_budget,
    topic_size_limit,
)
from .core.phrases import phrases_for
from .core.ranking import parse_query, recall_query, word_count
from .core.recollection import Recollection, recollect
from .core.render import item_line
from .core.state import ConversationState, Guard, NewMessage, Outcome, WindowMark, Writes
from .core.transitions import MANUAL, Incoming, Origin, append_all, fork, restore, seal_now, unpin
from .core.units import MAX_UNIT, RESULT_ROLES, group_units, in_unit, legacy_call, legacy_call_id, unit_of
from .errors import (
    BudgetTooSmallError,
    ConfigurationError,
    ConversationNotFoundError,
    InvalidMessageError,
    StoreError,
    TransientStoreError,
)
from .exchange import check_tool_units, export_lines, pin_key, read_export, summaries_of
from .lru import Lru
from .messages import normalize_message
from .models import (
    MAX_CONVERSATION_ID_LENGTH,
    NO_CONTENT,
    CompressedContext,
    ConversationInfo,
    ConversationStats,
    History,
    SearchHit,
    StoredMessage,
    Summary,
    has_media,
    text_problem,
    validate_conversation_id,
    validate_text_argument,
)
from .settings import Settings
from .store.base import ContextRequest, Snapshot, Store, SummaryWindow, Window, newest_window
from .store.memory import to_stored
from .summarizers import ExtractiveSummarizer, Summarizer, build_summarizer
from .summarizers.pipeline import transcript_line
from .tokens import TokenCounter, counter_for_encoding

if TYPE_CHECKING:
    import sqlalchemy as sa

P = ParamSpec("P")
T = TypeVar("T")

#: Optimistic attempts at a write before planning it under the conversation's lock instead.
OPTIMISTIC_ATTEMPTS = 3
#: Reading a context whose state keeps changing under it gives up after this many seconds.
REPLAN_SECONDS = 30.0
#: Threads (and pooled connections) of a SQL store: enough for a bot's concurrent replies.
STORE_THREADS = 8
#: Reads of a conversation an export makes before giving up because writers keep changing it.
EXPORT_ATTEMPTS = 10
#: Conversation states remembered per compressor (the most recently used).
STATE_CACHE = 4096
#: Contexts remembered per compressor (one per conversation, the most recently read).
CONTEXT_CACHE = 256

log = logging.getLogger(__name__)


#: BM25 score below which a hit is not recalled: matching only words that most messages share
#: (about one moderately rare word is needed) says nothing about what the newest message is about.
RECALL_MIN_SCORE = 1.0


#: The origin of a message given none (immutable: one for every such call).
_NOWHERE = Origin()


class StateCache:
    """The newest state this process saw of each recent conversation.

    Only a hint: every write is guarded by the version it was planned from, so a state another
    process changed meanwhile costs one failed guard and a fresh read, never a wrong write.
    """

    def __init__(self, size: int = STATE_CACHE) -> None:
        self._states: Lru[ConversationState] = Lru(size)

    def get(self, conversation_id: str) -> ConversationState | None:
        return self._states.get(conversation_id)

    def put(self, state: ConversationState) -> None:
        # A newer one known already stays.
        self._states.put(state.id, state, keep_old=lambda old: old.version > state.version)

    def forget(self, conversation_id: str) -> None:
        self._states.pop(conversation_id)


#: Summary windows and summaries by id, as one ``read_context`` returned them.
SummaryRead = tuple[list[list[Summary]], list[Summary]]


#: Tries at recording a read's window mark while other writers keep moving the state's version.
REMEMBER_ATTEMPTS = 3


class ContextCache:
    """The newest context built here for each recent conversation, with the state it was built from.

    A context is a function of the conversation's stored rows, the budget, the query and this
    compressor's settings; the rows change only with the state's version (every write and every
    maintenance step moves it, in whichever process), so an equal state read back means an equal
    context. One entry per conversation: the latest (budget, query, record) asked for; and the
    recent window of messages it was built from, which the next read extends (see ``snapshot``).
    """

    def __init__(self, size: int = CONTEXT_CACHE) -> None:
        self._entries: Lru[tuple[object, ConversationState, CompressedContext]] = Lru(size)
        # Each kept with the state version it was read at: versions only grow within one life of a
        # conversation, so a lower one is another life (deleted and restored elsewhere).
        self._windows: Lru[tuple[int, int, list[StoredMessage]]] = Lru(size)
        self._summaries: Lru[tuple[object, int, SummaryRead]] = Lru(size)

    def get(self, conversation_id: str, asked: object) -> tuple[ConversationState, CompressedContext] | None:
        entry = self._entries.get(conversation_id, accept=lambda e: e[0] == asked)
        return None if entry is None else (entry[1], entry[2])

    def put(
        self, conversation_id: str, asked: object, state: ConversationState, ctx: CompressedContext
    ) -> None:
        self._entries.put(conversation_id, (asked, state, ctx))

    def forget(self, conversation_id: str) -> None:
        self._entries.pop(conversation_id)
        self._windows.pop(conversation_id)
        self._summaries.pop(conversation_id)

    def window(self, conversation_id: str, token_cap: int, version: int) -> list[StoredMessage] | None:
        """The recent window last read for this conversation with ``token_cap``, oldest first,
        at a version up to ``version``."""
        found = self._windows.get(conversation_id, accept=lambda w: w[0] == token_cap and w[1] <= version)
        return None if found is None else found[2]

    def keep_window(
        self, conversation_id: str, token_cap: int, version: int, window: list[StoredMessage]
    ) -> None:
        self._windows.put(conversation_id, (token_cap, version, window))

    def summaries(self, conversation_id: str, key: object, version: int) -> SummaryRead | None:
        """The summary windows and summaries by id last read for ``key`` (see ``snapshot``), at a
        version up to ``version``."""
        found = self._summaries.get(conversation_id, accept=lambda e: e[0] == key and e[1] <= version)
        return None if found is None else found[2]

    def keep_summaries(self, conversation_id: str, key: object, version: int, read: SummaryRead) -> None:
        self._summaries.put(conversation_id, (key, version, read))


def _copied(ctx: CompressedContext, max_tokens: int) -> CompressedContext:
    """``ctx`` for ``max_tokens`` with lists and dicts of its own: a caller may change what it got,
    never what is cached."""
    own: dict[str, Any] = {}
    for f in fields(ctx):
        value = getattr(ctx, f.name)
        if isinstance(value, list | dict):
            own[f.name] = value.copy()
    return replace(ctx, max_tokens=max_tokens, **own)


def open_store(target: str | sa.Engine | Store) -> Store:
    """The store for a URL (``memory://``, ``sqlite:///...``, ``postgresql://...``), an Engine or a store."""
    if isinstance(target, str) and target.startswith("memory://"):
        from .store.memory import MemoryStore

        return MemoryStore()
    if isinstance(target, Store):
        return target
    if type(target).__name__ == "AsyncEngine":  # not imported: sqlalchemy.ext.asyncio is slow to load
        raise ConfigurationError(
            "pass a URL or a synchronous sqlalchemy Engine (the store runs its queries on a thread pool); "
            "for an AsyncEngine pass its .sync_engine's URL instead"
        )
    from .store.sql import SQLStore

    return SQLStore(target)


@dataclass(frozen=True, slots=True)
class Parts:
    settings: Settings
    counter: TokenCounter
    store: Store
    summarizer: Summarizer
    fallback: ExtractiveSummarizer


def build(
    target: str | sa.Engine | Store | None,
    settings: Settings | None,
    summarizer: Summarizer | Mapping[str, Any] | None,
    overrides: dict[str, Any],
) -> Parts:
    if isinstance(summarizer, Mapping):
        # ``summarizer={"kind": "litellm", ...}`` is the setting, not a summariser object.
        overrides["summarizer"] = dict(summarizer)
        summarizer = None
    elif summarizer is not None and not isinstance(summarizer, Summarizer):
        raise ConfigurationError(
            "summarizer must implement tiered_history.Summarizer (name, summarize, merge) "
            "or be a mapping of summariser settings"
        )
    if settings is None:
        settings = Settings.load(**overrides)
    elif overrides:
        settings = Settings.load(**{**settings.model_dump(), **overrides})
    counter = TokenCounter(settings.model)
    url = target if target is not None else settings.database_url or "sqlite:///tiered_history.db"
    store = open_store(url)
    return Parts(
        settings,
        counter,
        store,
        summarizer or build_summarizer(settings.summarizer, counter),
        ExtractiveSummarizer(counter),
    )


class ReplyPath:
    """Every call of the reply path, synchronous: validate, plan with the core, read or commit."""

    def __init__(
        self, settings: Settings, counter: TokenCounter, store: Store, *, detect_every: int = 0
    ) -> None:
        s = settings
        self.detect_every = detect_every
        """Pluggable detectors are configured (maintenance runs them): see ``BoundaryRules.detect_every``."""
        self.settings = settings
        self.counter = counter
        self.store = store
        self.shares = Shares(
            s.tiers.current_topic,
            s.tiers.topic_summaries,
            s.tiers.bulk_archives,
            s.redistribute_unused,
            recall=s.recall.share if s.recall.enabled else 0.0,
            anchor=s.window_step,
            cache_min=s.cache_min_tokens,
        )
        self._measured: dict[str, int] = {}
        self._frame = counter.message_tokens({"role": "user", "content": ""})
        self.states = StateCache()
        self.contexts = ContextCache()
        self._rules: dict[tuple[str | None, int | None], BoundaryRules] = {}

    def read_state(self, conversation_id: str) -> ConversationState | None:
        """The conversation's state, read from the store (and remembered)."""
        state = self.store.read_state(conversation_id)
        if state is None:
            self.states.forget(conversation_id)
        else:
            self.states.put(state)
        return state

    def known_state(self, conversation_id: str) -> ConversationState | None:
        """The state as last seen here, else as read now."""
        return self.states.get(conversation_id) or self.read_state(conversation_id)

    def rules(self, platform: str | None, budget: int | None) -> BoundaryRules:
        """The boundary rules of a conversation on ``platform`` read with ``budget`` tokens."""
        found = self._rules.get((platform, budget))
        if found is None:
            if len(self._rules) >= 256:
                self._rules.pop(next(iter(self._rules)))
            found = self._rules[(platform, budget)] = self._build_rules(platform, budget)
        return found

    def _build_rules(self, platform: str | None, budget: int | None) -> BoundaryRules:
        s = self.settings
        b = s.boundaries
        p = s.platforms.get(platform) if platform is not None else None

        def pick(value: Any, default: Any) -> Any:
            return default if value is None else value

        languages = pick(p.languages if p else None, b.languages)
        extra = [*b.trigger_phrases, *((p.trigger_phrases or []) if p else [])]
        return BoundaryRules(
            explicit=pick(p.explicit if p else None, b.explicit),
            temporal=pick(p.temporal if p else None, b.temporal),
            size=pick(p.size if p else None, b.size),
            cohesion=pick(p.cohesion if p else None, b.cohesion),
            unseal=b.unseal,
            phrases=phrases_for(languages, extra),
            trigger_roles=tuple(b.trigger_roles),
            silence=timedelta(minutes=pick(p.silence_minutes if p else None, s.silence_minutes)),
            # The size rule follows the budget the conversation is read with (issue 14).
            size_limit=topic_size_limit(
                budget or s.context_budget, s.tiers.current_topic, s.token_threshold, s.max_topic_tokens
            ),
            min_tokens=b.min_topic_tokens,
            detect_every=self.detect_every,
        )

    def plan_for(self, state: ConversationState) -> EscalationBudget:
        """What maintenance plans against for this conversation: its budget's shares and targets."""
        return self.plan_at(state.budget or self.settings.context_budget)

    def plan_at(self, budget: int) -> EscalationBudget:
        """What maintenance plans against for contexts of ``budget`` tokens."""
        # The shares its contexts are laid out with: below cache_min_tokens the archives may hold
        # the topic tier's room (core.budget.summary_shares).
        shares = self.shares.at(budget)
        plan = self._plan(budget, shares)
        if shares is not self.shares:
            # A topic's summary is sized by the topic tier's configured room all the same: where the
            # archives hold that room, topic summaries are the parts of an archive, shown in its
            # place when there is room (a target sized by the room left would be the floor).
            topic_target = self._plan(budget, self.shares).topic_target
            plan = replace(plan, topic_target=topic_target)
            if budget >= self.shares.cache_min:
                # In the cached layout an archive stands for the summaries the topic tier's stable
                # part would have shown: where the roll-ups choose again from the messages of the
                # whole timeline (the offline summariser), a merge keeps about what its summaries
                # say (up to half the archives' room) and the roll-ups do the compressing. Merged
                # down to ``bulk_summary_tokens``, each merge dropped a third of its summaries
                # (docs/architecture.md, "Archives in the topic tier's room"; below cache_min it
                # did not pay). A model's roll-ups read texts, and a merge near its source's size
                # is a paid restatement that may come back no smaller: it keeps the target.
                merged = min(topic_target * self.settings.bulk_merge_size, plan.bulk_share // 2)
                plan = replace(plan, sourced_merge_target=merged)
        if budget < self.shares.cache_min:
            plan = replace(plan, timeline=False)
        return plan

    def _plan(self, budget: int, shares: Shares) -> EscalationBudget:
        s = self.settings
        return escalation_budget(
            budget,
            shares.topics,
            shares.bulk,
            s.topic_summary_tokens,
            s.bulk_summary_tokens,
            s.bulk_merge_size,
            recall_share=shares.recall,
            reference_budget=s.context_budget,
            current_share=shares.current,
        )

    def rules_for(self, state: ConversationState | None, platform: str | None = None) -> BoundaryRules:
        """The boundary rules of a conversation (of a new one on ``platform`` when ``state`` is None)."""
        if state is None:
            return self.rules(platform, None)
        return self.rules(state.platform or platform, state.budget)

    # -- writing -------------------------------------------------------------------------------

    def prepare(self, message: object) -> Incoming:
        """Validate a message and count its tokens (once, before it is stored)."""
        n = normalize_message(message, now=datetime.now(UTC))
        if len(n.text) > self.settings.max_content_chars:
            raise InvalidMessageError(
                f"content is {len(n.text)} characters long; the maximum is "
                f"{self.settings.max_content_chars} (setting max_content_chars)"
            )
        payload = n.payload
        full = self.counter.message_tokens(payload)
        content = payload.get("content")
        if isinstance(content, str):
            # The content is kept in its own column, exactly as given (a refusal or an audio
            # transcript beside it stays in the rest of the message); the rest as given.
            wire = {k: v for k, v in payload.items() if k not in ("role", "content")}
            text = content
        else:
            # Parts (or none): the column holds their text, for search and summaries; the message
            # is sent back from the parts as given.
            wire = {k: v for k, v in payload.items() if k != "role"}
            if "content" not in payload:
                wire[NO_CONTENT] = True
            text = n.text
        # A legacy function call and its result are tracked as a tool call and its result.
        calls, answered = n.tool_call_ids, n.tool_call_id
        if n.role == "function":
            answered = legacy_call_id(n.name)
        elif not calls and n.role == "assistant" and (call := legacy_call(payload)) is not None:
            calls = (call,)
        return Incoming(
            role=n.role,
            content=text,
            wire=wire or None,
            timestamp=n.timestamp,
            token_count=full,
            full_token_count=full,
            pinned=n.pinned,
            tool_call_ids=calls,
            tool_call_id=answered,
            metadata=n.metadata or None,
            reply_to=reply_sequence(n.metadata),
            words=word_count(text),
        )

    def _commit_planned(
        self, conversation_id: str, plan: Callable[[ConversationState | None], Writes | None]
    ) -> Writes | None:
        """Plan from the known state and commit it, guarded by its version (one short transaction).

        When other writers keep getting there first, fall back to planning under the conversation's
        lock, which cannot lose: optimistic when quiet, fair when contended.
        """
        state = self.known_state(conversation_id)
        for _ in range(OPTIMISTIC_ATTEMPTS):
            try:
                writes = plan(state)
            except InvalidMessageError:
                # Judged against the state this process knew: another process may have moved it
                # on (the tool call a result answers, written elsewhere). Judge it again on the
                # stored state before refusing.
                fresh = self.read_state(conversation_id)
                if (fresh.version if fresh else None) == (state.version if state else None):
                    raise
                state = fresh
                continue
            if writes is None:
                return None
            done = self.store.commit(conversation_id, Guard(None if state is None else state.version), writes)
            if done.outcome is Outcome.COMMITTED:
                self.states.put(writes.state)
                return writes
            state = self.read_state(conversation_id)
        for _ in range(OPTIMISTIC_ATTEMPTS):
            done = self.store.update(conversation_id, plan)
            if done.outcome is Outcome.COMMITTED:
                if done.writes is not None:
                    self.states.put(done.writes.state)
                return done.writes
            # Only a concurrent creation of the same new conversation gets here: plan again.
        raise StoreError(
            f"could not save to conversation {conversation_id!r}: other writers kept changing it"
        )

    def _origin(self, platform: str | None, channel: str | None, user_id: str | None) -> Origin:
        if platform is None and channel is None and user_id is None:
            return _NOWHERE
        if platform is not None:
            validate_text_argument(platform, "platform", 64)
        if channel is not None:
            validate_text_argument(channel, "channel", 255)
        if user_id is not None:
            validate_text_argument(user_id, "user_id", 255)
        return Origin(platform, channel, user_id)

    def _append(
        self, conversation_id: str, messages: Sequence[Incoming], origin: Origin
    ) -> tuple[list[StoredMessage], bool]:
        """Store ``messages`` in order, in one write; returns them and whether a topic was sealed."""
        now = datetime.now(UTC)

        def plan(state: ConversationState | None) -> Writes:
            foreign = (
                state is not None and bool(state.encoding) and state.encoding != self.counter.encoding_name
            )
            return append_all(
                state,
                conversation_id,
                [self._in_encoding(m, state.encoding) for m in messages] if foreign and state else messages,
                self.rules_for(state, origin.platform),
                platform=origin.platform,
                encoding=state.encoding if state is not None else self.counter.encoding_name,
                now=now,
                origin=origin,
            )

        writes = self._commit_planned(conversation_id, plan)
        assert writes is not None
        stored = [self._shown(to_stored(conversation_id, m)) for m in writes.messages]
        return stored, bool(writes.summaries)

    @staticmethod
    def _in_encoding(m: Incoming, encoding: str) -> Incoming:
        """``m`` counted with ``encoding``: a conversation created by a worker with another ``model``
        keeps every count in its own encoding, so that the readers that share it stay in budget."""
        payload: dict[str, Any] = {"role": m.role, "content": m.content, **(m.wire or {})}
        if payload.pop(NO_CONTENT, False):
            del payload["content"]
        n = counter_for_encoding(encoding).message_tokens(payload)
        return replace(m, token_count=n, full_token_count=n)

    def add_message(
        self,
        conversation_id: str,
        message: object,
        *,
        platform: str | None = None,
        channel: str | None = None,
        user_id: str | None = None,
    ) -> tuple[StoredMessage, bool]:
        """Store one message; returns it and whether the open topic was sealed before it."""
        validate_conversation_id(conversation_id)
        origin = self._origin(platform, channel, user_id)
        try:
            stored, sealed = self._append(conversation_id, [self.prepare(message)], origin)
        except InvalidMessageError as exc:
            if exc.index is None:
                raise
            # Planned as a batch of one: the caller gave one message, not a batch to point into.
            raise InvalidMessageError(str(exc).removeprefix(f"message {exc.index} of the batch: ")) from None
        return stored[0], sealed

    def add_messages(
        self,
        conversation_id: str,
        messages: Sequence[object],
        *,
        platform: str | None = None,
        channel: str | None = None,
        user_id: str | None = None,
    ) -> tuple[list[StoredMessage], bool]:
        """Store a batch in one transaction, all or nothing; returns them and whether a topic was sealed."""
        validate_conversation_id(conversation_id)
        origin = self._origin(platform, channel, user_id)
        prepared = self._prepare_batch(messages)
        if not prepared:
            return [], False
        return self._append(conversation_id, prepared, origin)

    def _prepare_batch(self, messages: Sequence[object]) -> list[Incoming]:
        if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
            raise InvalidMessageError(f"messages must be a list of messages, not {type(messages).__name__}")
        prepared = []
        for i, m in enumerate(messages):
            try:
                prepared.append(self.prepare(m))
            except InvalidMessageError as exc:
                error = InvalidMessageError(f"message {i} of the batch: {exc}")
                error.index = i
                raise error from None
        return prepared

    def check_messages(
        self, conversation_id: str, messages: Sequence[object], platform: str | None = None
    ) -> None:
        """Raise what ``add_messages(conversation_id, messages)`` would raise now, storing nothing
        (an import validates a whole file before it stores any of it)."""
        validate_conversation_id(conversation_id)
        origin = self._origin(platform, None, None)
        prepared = self._prepare_batch(messages)
        state = self.read_state(conversation_id)
        append_all(
            state,
            conversation_id,
            prepared,
            self.rules_for(state, origin.platform),
            platform=origin.platform,
            encoding=state.encoding if state is not None else self.counter.encoding_name,
            now=datetime.now(UTC),
            origin=origin,
        )

    def pin(
        self,
        conversation_id: str,
        message: object,
        *,
        key: str | None = None,
        platform: str | None = None,
        channel: str | None = None,
    ) -> StoredMessage:
        """Store ``message`` pinned: always sent, never cut or summarised. A ``key`` names the pin:
        pinning again under the same key replaces it in the context (the old message stays stored)."""
        validate_conversation_id(conversation_id)
        if key is not None:
            validate_text_argument(key, "pin key", 255)
        if isinstance(message, str):
            message = {"role": "system", "content": message}
        incoming = replace(self.prepare(message), pinned=True, pin_key=key)
        if incoming.tool_call_ids or incoming.role in RESULT_ROLES:
            raise InvalidMessageError("tool calls and tool results cannot be pinned")
        stored, _ = self._append(conversation_id, [incoming], self._origin(platform, channel, None))
        return stored[0]

    def unpin(self, conversation_id: str, key: str) -> bool:
        """Take the pin ``key`` out of the context (its message stays stored); False if there is none."""
        validate_conversation_id(conversation_id)
        validate_text_argument(key, "pin key", 255)
        now = datetime.now(UTC)
        self.require(conversation_id)

        def plan(state: ConversationState | None) -> Writes | None:
            if state is None:
                raise ConversationNotFoundError(f"no conversation {conversation_id!r}")
            return unpin(state, key, now)

        return self._commit_planned(conversation_id, plan) is not None

    def delete_conversation(self, conversation_id: str) -> bool:
        """Remove every row of a conversation (messages, summaries, archives, index entries, lease)
        in one transaction, for privacy requests. False if it did not exist."""
        validate_conversation_id(conversation_id)
        gone = self.store.delete(conversation_id)
        self.states.forget(conversation_id)
        self.contexts.forget(conversation_id)
        return gone

    def fork(self, conversation_id: str, new_id: str, at_sequence: int | None = None) -> ConversationInfo:
        """A new conversation ``new_id`` with this one's messages up to ``at_sequence`` (default: all)
        and the summaries of the topics that end by then (for retry and edit flows)."""
        validate_conversation_id(conversation_id)
        validate_conversation_id(new_id)
        source = self.read_state(conversation_id)
        if source is None:
            raise ConversationNotFoundError(f"no conversation {conversation_id!r}")
        at = source.last_sequence if at_sequence is None else at_sequence
        if isinstance(at, bool) or not isinstance(at, int) or not 1 <= at <= source.last_sequence:
            raise InvalidMessageError(f"at_sequence must be between 1 and {source.last_sequence}, not {at!r}")
        messages = self.store.read_messages(conversation_id, 1, at)
        summaries = [
            *self.store.read_summaries(conversation_id, "topic"),
            *self.store.read_summaries(conversation_id, "bulk"),
        ]
        writes = fork(source, new_id, messages, summaries, at, self.rules_for(source), datetime.now(UTC))
        if not self.store.commit(new_id, Guard(None), writes).ok:
            raise InvalidMessageError(f"conversation {new_id!r} exists already")
        self.states.put(writes.state)
        return _info(writes.state)

    # -- export and import ---------------------------------------------------------------------

    def export_conversation(self, conversation_id: str, summaries: bool = True) -> str:
        """The conversation as JSONL (:mod:`tiered_history.exchange`): every message exactly as
        stored, its pins, metadata and timestamps, and (``summaries``) its topic summaries and archives."""
        validate_conversation_id(conversation_id)
        for _ in range(EXPORT_ATTEMPTS):
            state = self.read_state(conversation_id)
            if state is None:
                raise ConversationNotFoundError(f"no conversation {conversation_id!r}")
            messages = self.store.read_messages(conversation_id, 1, state.last_sequence)
            rows = []
            if summaries:
                rows = [
                    *self.store.read_summaries(conversation_id, "topic"),
                    *self.store.read_summaries(conversation_id, "bulk"),
                ]
            # The reads above are several: keep them only if nothing they show changed meanwhile
            # (a context read changes the version but none of this).
            again = self.store.read_state(conversation_id)
            if again is not None and _exported_part(again) == _exported_part(state):
                return "".join(export_lines(state, messages, rows))
        raise StoreError(f"could not export conversation {conversation_id!r}: it kept changing")

    def import_conversation(
        self, data: str | Iterable[str], conversation_id: str | None = None
    ) -> tuple[ConversationInfo, bool]:
        """Store an exported conversation (under ``conversation_id`` if given), all or nothing;
        returns it and whether it has topics left to summarise. Importing the same file again
        changes nothing; a conversation of that id holding anything else is refused."""
        exported = read_export(data)
        cid = (
            exported.conversation_id if conversation_id is None else validate_conversation_id(conversation_id)
        )
        prepared: list[Incoming] = []
        for m in exported.messages:
            try:
                incoming = self.prepare(
                    {**m.message, "timestamp": m.timestamp, "metadata": m.metadata, "pinned": m.pinned}
                )
            except InvalidMessageError as exc:
                raise InvalidMessageError(f"message {m.sequence} of the file: {exc}") from None
            prepared.append(replace(incoming, pin_key=pin_key(m)))
        check_tool_units(prepared)
        messages = [
            to_stored(
                cid,
                NewMessage(
                    m.sequence,
                    n.role,
                    n.content,
                    n.wire,
                    n.timestamp,
                    n.token_count,
                    n.full_token_count,
                    n.pinned,
                    n.pin_key,
                    n.metadata,
                ),
            )
            for m, n in zip(exported.messages, prepared, strict=True)
        ]
        summaries = summaries_of(exported, cid, messages, self.counter.count)
        seed = ConversationState(
            id=cid,
            platform=exported.platform,
            encoding=self.counter.encoding_name,
            created_at=exported.created_at,
            channel=exported.channel,
            users=exported.users,
            pins=exported.pins,
        )
        writes = restore(
            seed, messages, summaries, self.rules_for(None, exported.platform), datetime.now(UTC)
        )
        pending = writes.state.needs_maintenance
        if not self.store.commit(cid, Guard(None), writes).ok:
            existing = self.read_state(cid)
            planned = "".join(export_lines(writes.state, messages, summaries))
            if existing is not None and self.export_conversation(cid, bool(summaries)) == planned:
                return _info(existing), False  # imported before: nothing to do
            raise InvalidMessageError(
                f"conversation {cid!r} exists already and holds something else: delete it first, "
                "or import under another id"
            )
        self.states.put(writes.state)
        return _info(writes.state), pending

    def get_messages(
        self, conversation_id: str, first: int = 1, last: int | None = None
    ) -> list[StoredMessage]:
        """Stored messages with ``first <= sequence <= last`` (default: to the newest), oldest first."""
        validate_conversation_id(conversation_id)
        state = self.read_state(conversation_id)
        if state is None:
            raise ConversationNotFoundError(f"no conversation {conversation_id!r}")
        for value, what in ((first, "first"), (last, "last")):
            if (value is not None or what == "first") and (
                isinstance(value, bool) or not isinstance(value, int)
            ):
                raise InvalidMessageError(f"{what} must be an integer, not {type(value).__name__}")
        end = state.last_sequence if last is None else last
        # Sequences are 1 to last_sequence: outside that, nothing (a database's integers end).
        lo, hi = max(first, 0), min(end, state.last_sequence)
        if lo > hi:
            return self._active_pins(state, [])
        return self._active_pins(state, self.store.read_messages(conversation_id, lo, hi))

    def _active_pins(self, state: ConversationState, messages: list[StoredMessage]) -> list[StoredMessage]:
        """``messages`` as shown: pinned only while their pin is active (a replaced pin is history)."""
        active = set(state.pinned_sequences)
        return [
            self._shown(m if not m.pinned or m.sequence in active else replace(m, pinned=False))
            for m in messages
        ]

    def list_conversations(
        self,
        *,
        platform: str | None = None,
        channel: str | None = None,
        user_id: str | None = None,
        active_since: datetime | None = None,
        after: str | None = None,
        limit: int = 100,
    ) -> list[ConversationInfo]:
        """Conversations in id order (after ``after``), filtered by platform, channel, user and activity."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise InvalidMessageError(f"limit must be an integer from 1 to 10000, not {limit!r}")
        for value, what in ((platform, "platform"), (channel, "channel"), (user_id, "user_id")):
            if value is not None:
                validate_text_argument(value, what, MAX_CONVERSATION_ID_LENGTH)
        # A cursor is any text an id may follow ("" or " " too: the inspector steps back one
        # character from an id), but text a database can store.
        if after is not None and (not isinstance(after, str) or text_problem(after) is not None):
            raise InvalidMessageError(f"after must be a string a database can store, not {after!r}")
        if active_since is not None and (
            not isinstance(active_since, datetime) or active_since.utcoffset() is None
        ):
            raise InvalidMessageError(f"active_since must be a timezone-aware datetime, not {active_since!r}")
        out: list[ConversationInfo] = []
        cursor = after
        while len(out) < limit:
            page = self.store.list_conversations(platform, cursor, max(limit, 100))
            for state in page:
                if channel is not None and state.channel != channel:
                    continue
                if user_id is not None and user_id not in state.users:
                    continue
                if active_since is not None and (
                    state.last_message_at is None or state.last_message_at < active_since
                ):
                    continue
                out.append(_info(state))
                if len(out) == limit:
                    break
            if len(page) < max(limit, 100):
                break
            cursor = page[-1].id
        return out

    def seal_current_topic(self, conversation_id: str) -> Summary | None:
        """Close the open topic now; the next maintenance summarises it."""
        validate_conversation_id(conversation_id)
        now = datetime.now(UTC)

        def plan(state: ConversationState | None) -> Writes | None:
            if state is None:
                raise ConversationNotFoundError(f"no conversation {conversation_id!r}")
            sealed = seal_now(state, self.rules_for(state), MANUAL, now)
            return None if sealed is None else sealed[0]

        writes = self._commit_planned(conversation_id, plan)
        if writes is None:
            return None
        topic = self.store.read_summaries(conversation_id, "topic", writes.summaries[0].ordinal - 1)
        return topic[0] if topic else None

    # -- reading -------------------------------------------------------------------------------

    def default_max_tokens(self) -> int:
        """The model's input window minus ``reserve_output_tokens``, else ``context_budget``."""
        from .modelinfo import input_window

        window = input_window(self.settings.model)
        if window is None:
            return self.settings.context_budget
        return max(window - self.settings.reserve_output_tokens, 1)

    def _request(self, state: ConversationState, max_tokens: int) -> ContextRequest:
        # Enough recent messages for any window (the budget, plus a chunk to find anchors in),
        # and the live summaries and archives, newest first, as far as a budget could use them.
        cap = max_tokens + int(max_tokens * self.shares.anchor) + 1
        mark = state.mark_for(max_tokens)
        summaries: tuple[SummaryWindow, ...] = (
            SummaryWindow("topic", state.topics_merged_upto, max_tokens),
            SummaryWindow("bulk", 0, max_tokens),
        )
        if state.archive_count and self.shares.redistribute:
            # A context with room to spare shows the newest archives' parts in their place.
            summaries += (
                SummaryWindow("topic", 0, max_tokens, merged=True),
                SummaryWindow("bulk", 0, max_tokens, merged=True),
            )
        return ContextRequest(
            (Window(0, state.last_sequence, cap),),
            summaries,
            mark.shown if mark is not None else (),
            state.pinned_sequences,
        )

    def snapshot(self, conversation_id: str, max_tokens: int) -> Snapshot:
        """The rows a context is built from, in one consistent read (planned from the state).

        Incremental when this conversation was read here before with the same budget: stored
        messages never change, so the recent window is the one kept plus the rows since, read
        from its newest message on (that row must be read back unchanged, else all is read)."""
        state = self.known_state(conversation_id)
        deadline = time.monotonic() + REPLAN_SECONDS
        while time.monotonic() < deadline:
            if state is None:
                raise ConversationNotFoundError(f"no conversation {conversation_id!r}")
            request = self._request(state, max_tokens)
            # The summary rows read (live ones, no pending topic) change only with the state's
            # search key, which a seal leaves alone (the pending topic it adds is not read): the
            # read after a seal reads no summary again. A new conversation of the same id starts
            # again from zero: its creation time tells them apart.
            skey = (state.created_at, state.search_key, request.summaries, request.summary_ids)
            summaries = self.contexts.summaries(conversation_id, skey, state.version)
            if summaries is not None:
                request = replace(request, summaries=(), summary_ids=())
            window = request.windows[0]
            kept = self.contexts.window(conversation_id, window.token_cap, state.version)
            if kept and kept[-1].sequence <= window.hi:
                since = Window(kept[-1].sequence - 1, window.hi, window.token_cap)
                request = replace(request, windows=(since,))
            else:
                kept = None
            snap = self.store.read_context(conversation_id, request, state.version)
            if snap is not None and kept:
                rows = snap.windows[0]
                if not rows or rows[0] != kept[-1]:
                    self.contexts.forget(conversation_id)  # not the rows kept: read them all
                    continue
                snap = replace(snap, windows=[newest_window([*kept[:-1], *rows], window.token_cap)])
            if snap is not None:
                if summaries is not None:
                    snap = replace(snap, summaries=summaries[0], by_id=summaries[1])
                else:
                    self.contexts.keep_summaries(
                        conversation_id, skey, snap.state.version, (snap.summaries, snap.by_id)
                    )
                self.states.put(snap.state)
                self.contexts.keep_window(
                    conversation_id, window.token_cap, snap.state.version, snap.windows[0]
                )
                return snap
            state = self.read_state(conversation_id)
        raise StoreError(f"could not read conversation {conversation_id!r}: it kept changing")

    def get_context(
        self,
        conversation_id: str,
        max_tokens: int | None = None,
        query: str | None = None,
        record: bool = True,
    ) -> CompressedContext:
        """What to send to the model: never more than ``max_tokens`` tokens, framing included."""
        validate_conversation_id(conversation_id)
        if max_tokens is None:
            max_tokens = self.default_max_tokens()
        check_max_tokens(max_tokens)
        if query is not None:
            validate_text_argument(query, "query", 10_000)
        # An estimated tokenizer may count low: fill only what its safety margin leaves.
        budget = self.counter.usable_budget(max_tokens)
        if budget < MIN_MAX_TOKENS:
            raise BudgetTooSmallError(
                f"max_tokens={max_tokens} leaves {budget} tokens once the {self.counter.safety_margin:.0%} "
                f"safety margin for the estimated tokenizer of {self.settings.model!r} is set aside; "
                f"the minimum is {MIN_MAX_TOKENS}"
            )
        asked = (budget, query, record)
        cached = self.contexts.get(conversation_id, asked)
        known = self.states.get(conversation_id)
        if cached is not None and (known is None or known == cached[0]):
            # One primary-key read says whether anything changed since (every write, this
            # process's or another's, and every maintenance step moves the version). When this
            # process wrote since, it is known changed: the snapshot read below checks the rest.
            state = self.read_state(conversation_id)
            if state is None:
                raise ConversationNotFoundError(f"no conversation {conversation_id!r}")
            if state == cached[0]:
                return _copied(cached[1], max_tokens)
        snap = self.snapshot(conversation_id, budget)
        ctx = replace(
            self.assemble(conversation_id, budget, snap, query),
            max_tokens=max_tokens,
            encoding=self.counter.encoding_name,
            exact_tokens=self.counter.exact,
        )
        # Kept for the state it was built from: a recorded window or budget moves the version,
        # so the next call builds it again from the recorded state (and keeps that one). Not
        # kept when the record must be tried again (a busy database): the next call does.
        if not record or self._remember(snap.state, budget, ctx):
            self.contexts.put(conversation_id, asked, snap.state, ctx)
        return _copied(ctx, max_tokens)

    def _remember(self, state: ConversationState, max_tokens: int, ctx: CompressedContext) -> bool:
        """Keep the budget this conversation is read with (topic sizes and merges follow it) and
        where its window starts (it moves only at events). When another writer moved the state
        first with no event (a reply, a lease), recorded on the state as it is now; skipped after an
        event or another read's mark for this budget. False when it could not be recorded now."""
        start = ctx.current_topic[0].sequence if ctx.current_topic and not ctx.truncated_newest else None
        shown = tuple(x.id for x in ctx.bulk_archives + ctx.historical_topics)
        mark = state.mark_for(max_tokens)
        if max_tokens < self.shares.cache_min:
            # Laid out for relevance, no prefix to keep: no mark, so that none of the cached
            # budgets' marks makes room for one (a bot's 1,500-token side reads evicted them).
            start = mark = None
        if start is not None:
            chosen = WindowMark(start, max_tokens, state.epoch, shown)
            # The same mark between events keeps its seal point (the window grew as the topic did).
            if mark is None or replace(mark, seal_at=None) != chosen:
                mark = chosen
                if self._window_seals(self.rules(state.platform, max_tokens), max_tokens):
                    # Where the window no longer fits: the room the context leaves (recall gives way).
                    room = max_tokens - ctx.total_tokens + ctx.tier_tokens.get("recall", 0)
                    mark = replace(chosen, seal_at=state.open.tokens + max(room, 0))
        for _ in range(REMEMBER_ATTEMPTS):
            window, others = state.with_mark(mark, max_tokens)
            if state.budget == max_tokens and window == state.window and others == state.other_windows:
                return True
            after = state.bumped(budget=max_tokens, window=window, other_windows=others)
            try:
                done = self.store.commit(state.id, Guard(state.version), Writes(after)).ok
            except TransientStoreError as e:
                # A busy database must not cost the reply its context: the next read records it.
                log.info("not recording the window of %r now: %s", state.id, e)
                return False
            if done:
                self.states.put(after)
                return True
            # Another writer moved the version first: a reply appended, maintenance took or gave
            # back its lease. With no event since and no other mark for this budget, the mark
            # still holds for the state as it is now; left unrecorded, the next read at the same
            # epoch would take the previous mark for one from before the event and might move the
            # window, a rewrite of the cached prefix without an event.
            fresh = self.store.read_state(state.id)
            if (
                fresh is None
                or fresh.epoch != state.epoch
                or fresh.mark_for(max_tokens) != state.mark_for(max_tokens)
            ):
                return True  # an event, or another read's mark: the next read decides anew
            state = fresh
        return True

    def assemble(
        self, conversation_id: str, max_tokens: int, snap: Snapshot, query: str | None = None
    ) -> CompressedContext:
        """The context from a snapshot: recall candidates searched, then the core's assembly."""
        state = snap.state
        recount = bool(state.encoding) and state.encoding != self.counter.encoding_name
        # Images are priced by the model, not by the encoding (gpt-4o-mini counts one at 33 times
        # gpt-4o's): a message with media parts is counted again by this reader whatever wrote it.
        fix = self._recounted if recount else _media_recounted(self._recounted)
        summ = self._recounted_summary if recount else (lambda x: x)
        # A copy, counted again only when the tokenizer changed (the window is a few hundred rows).
        window = snap.windows[0]
        # Without a new tokenizer only messages with media parts (kept in ``extra``) change.
        recent = [fix(m) for m in window] if recount else [fix(m) if m.extra else m for m in window]
        topics = [summ(t) for t in snap.summaries[0] if t.content]
        archives = sorted((summ(a) for a in snap.summaries[1] if a.content), key=lambda a: a.first_sequence)
        text = self._query_text(recent, query)
        recall = [_recounted_candidate(c, fix, summ) for c in self._recall(conversation_id, text)]
        back = self._topic_back(conversation_id, recall, topics, max_tokens, recent, fix)
        if back is not None:
            recall.append(back)
        pinned = [fix(m) for m in snap.pinned]
        rows = Rows(
            pinned=pinned,
            recent=recent,
            # What the messages counted again add: usually none is (compared in C).
            end_position=(
                sum(m.token_count for m in recent)
                if recount
                else state.context_tokens
                + (
                    0
                    if all(map(is_, recent, window))
                    else sum(
                        f.token_count - m.token_count
                        for m, f in zip(window, recent, strict=True)
                        if f is not m
                    )
                )
            ),
            topics=topics,
            archives=archives,
            recall=recall,
            uncovered=max(
                state.last_sequence
                - state.summarized_upto
                - len([p for p in pinned if p.sequence > state.summarized_upto]),
                0,
            ),
            summarized_upto=state.summarized_upto,
            query=text,
            explicit=query is not None,
            mark=state.mark_for(max_tokens),
            epoch=state.epoch,
            growth=self._growth(state, max_tokens),
            frozen=[summ(x) for x in snap.by_id if x.content],
            finer=[summ(x) for part in snap.summaries[2:] for x in part],
        )
        return assemble(
            conversation_id=conversation_id,
            max_tokens=max_tokens,
            shares=self.shares,
            counter=self.counter,
            rows=rows,
            measure=self._measure,
        )

    def _window_seals(self, rules: BoundaryRules, max_tokens: int) -> bool:
        """Whether the size rule seals the open topic where the window stops fitting (recorded with
        the window, :attr:`WindowMark.seal_at`): with the size rule on, at budgets laid out for the
        cache (below them the window reaches back as far as fits, so it would seal every message)."""
        return rules.size and max_tokens >= self.shares.cache_min

    def _growth(self, state: ConversationState, max_tokens: int) -> int:
        """How much room a window kept at an event must leave for the open topic to grow before a
        rule seals it (the next event). When the size rule seals where the window stops fitting
        (:meth:`_window_seals`), only ``min_topic_tokens``: the window then stays while it fits
        with that much room. Otherwise the size rule's limit less what the topic holds already
        (the limit this read records: judged by an earlier read's budget, the window could be left
        no room at all and move on the next message although nothing was sealed); with no size
        rule, a step of the window."""
        rules = self.rules(state.platform, max_tokens)
        if self._window_seals(rules, max_tokens):
            # Room for a topic of min_topic_tokens at least: else a window kept full at an event
            # would seal a topic of a message or two at each (a summary each, with an LLM a call).
            return rules.min_tokens
        if rules.size:
            return max(rules.size_limit - state.open.tokens, 0)
        return int(max_tokens * self.shares.anchor)

    def _measure(self, text: str) -> int:
        """Framed tokens of a user message with ``text`` (memoised: blocks repeat turn after turn)."""
        found = self._measured.get(text)
        if found is None:
            # A message's framing plus its content's count (``message_tokens`` adds them so), the
            # content counted line by line: a note or block shares most lines with earlier ones.
            found = self._frame + self.counter.count_lines(text)
            if len(self._measured) >= 512:
                self._measured.pop(next(iter(self._measured)))
            self._measured[text] = found
        return found

    def _query_text(self, recent: Sequence[StoredMessage], query: str | None) -> str:
        """What recall looks for: ``query`` if given, else the newest user message alone (its
        words are what the next answer needs; the open topic's are in the window already)."""
        if query is not None:
            return query
        if not self.settings.recall.enabled:
            return ""
        for i in range(len(recent) - 1, -1, -1):
            if recent[i].role == "user":
                return recent[i].content
        return recent[-1].content if recent else ""

    def _recall(self, conversation_id: str, text: str) -> list[Recalled]:
        """Recall candidates for ``text``: the best-matching messages (whole tool units) and summaries."""
        if not text or not self.settings.recall.enabled:
            return []
        return self._candidates(conversation_id, text, RECALL_MIN_SCORE)

    def _candidates(self, conversation_id: str, text: str, min_score: float) -> list[Recalled]:
        q = recall_query(text)
        if not q.groups:
            return []
        limit = self.settings.recall.max_items
        out: list[Recalled] = []
        # Messages and summaries searched in one read (one transaction: fewer round trips).
        found = self.store.search_each(
            conversation_id, q, {"message": limit * 2, "summary": max(limit // 2, 1)}
        )
        hits = found["message"]
        tools = [h.message for h in hits if h.message is not None and in_unit(h.message)]
        around: dict[int, StoredMessage] = {}
        if tools:
            lo = min(m.sequence for m in tools) - MAX_UNIT
            hi = max(m.sequence for m in tools) + MAX_UNIT
            around = {m.sequence: m for m in self.store.read_messages(conversation_id, max(lo, 1), hi)}
        for h in hits:
            m = h.message
            if m is None or m.pinned or h.score < min_score:
                continue
            unit = unit_of(m, around) if in_unit(m) else (m,)
            if unit:
                out.append(Recalled(h.score, messages=unit))
        for h in found["summary"]:
            if h.summary is not None and h.summary.content and h.score >= min_score:
                out.append(Recalled(h.score, summary=h.summary))
        return out

    def _topic_back(
        self,
        conversation_id: str,
        recall: Sequence[Recalled],
        topics: Sequence[Summary],
        max_tokens: int,
        recent: Sequence[StoredMessage],
        fix: Callable[[StoredMessage], StoredMessage],
    ) -> Recalled | None:
        """The topic the newest message goes back to, whole, as a recall candidate (see
        :func:`returned_topic`), when one stands out and could fit half the budget: taken from the
        recent messages read already when it is among them, else read (and counted again with
        ``fix``, as those were)."""
        found = returned_topic(recall, topics)
        if found is None:
            return None
        topic, strength = found
        if topic.source_tokens > max_tokens // 2:
            return None
        lo, hi = topic.first_sequence, topic.last_sequence
        if recent and recent[0].sequence <= lo:
            # Unpinned messages, in order: a slice (pinned ones are sent first anyway).
            rows = [
                m for m in recent[bisect_left(recent, lo, key=lambda m: m.sequence) :] if m.sequence <= hi
            ]
        else:
            rows = [fix(m) for m in self.store.read_messages(conversation_id, lo, hi)]
        # Pinned messages are sent first anyway; one inside a tool unit would break the unit.
        kept = [m for m in rows if not m.pinned]
        if any(in_unit(m) for m in rows if m.pinned):
            return None
        # Sealed: every call must have all its results, the last one's too.
        if not kept or sum(len(u) for u in group_units(kept, open_end=False)) != len(kept):
            return None
        return Recalled(strength, messages=tuple(kept))

    def _shown(self, m: StoredMessage) -> StoredMessage:
        """Kept for callers of the first API: messages are stored and shown whole."""
        return m

    def _recounted(self, m: StoredMessage) -> StoredMessage:
        """Stored counts came from another tokenizer (``model`` changed): count the message again."""
        n = self.counter.message_tokens(m.to_openai())
        return replace(m, token_count=n, full_token_count=n)

    def _recounted_summary(self, x: Summary) -> Summary:
        n = self.counter.count(item_line(x.content, x.started_at, x.ended_at)) + 1 if x.content else 0
        return replace(x, token_count=n)

    def get_history(self, conversation_id: str) -> History:
        """Every message, topic summary and archive (dropped ones included)."""
        validate_conversation_id(conversation_id)
        state = self.read_state(conversation_id)
        if state is None:
            raise ConversationNotFoundError(f"no conversation {conversation_id!r}")
        messages = self._active_pins(state, self.store.read_messages(conversation_id, 1, state.last_sequence))
        return History(
            conversation_id=conversation_id,
            platform=state.platform,
            messages=messages,
            topics=self.store.read_summaries(conversation_id, "topic"),
            archives=self.store.read_summaries(conversation_id, "bulk"),
            open_topic_start=state.topic_start_seq,
        )

    def search(self, conversation_id: str, text: str, limit: int = 20) -> list[SearchHit]:
        """Stored messages matching ``text``, best first: BM25 over its words (a piece like
        ``NEEDLE-4711`` is a phrase), newest first on equal scores; text with no word at all is
        matched literally. Each hit carries its topic and the summary that represents it now."""
        validate_conversation_id(conversation_id)
        validate_text_argument(text, "search text", 10_000)
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise InvalidMessageError(f"limit must be an integer, not {type(limit).__name__}")
        if limit < 1:
            raise InvalidMessageError(f"limit must be at least 1, not {limit}")
        self.require(conversation_id)
        hits = self.store.search(conversation_id, parse_query(text), min(limit, 1000))
        if not hits:
            return []
        topics = self.store.read_summaries(conversation_id, "topic")
        archives = {a.id: a for a in self.store.read_summaries(conversation_id, "bulk")}
        out = []
        for h in hits:
            assert h.message is not None
            m = self._shown(h.message)
            topic = next((t for t in topics if t.first_sequence <= m.sequence <= t.last_sequence), None)
            covering = topic
            while covering is not None and covering.merged_into is not None:
                covering = archives.get(covering.merged_into)
            if covering is not None and covering.status == "pending":
                covering = None
            out.append(SearchHit(m, h.score, topic, covering))
        return out

    def recall(self, conversation_id: str, query: str, max_tokens: int = 1000) -> Recollection:
        """The recall tool's answer: the excerpts that best match ``query`` (whole tool units and
        summaries), cited with their message numbers and dates, within ``max_tokens``."""
        validate_conversation_id(conversation_id)
        if not isinstance(query, str) or query.strip():
            validate_text_argument(query, "query", 10_000)
        check_max_tokens(max_tokens)
        self.require(conversation_id)
        # A blank query (a model may send one) finds nothing rather than failing the tool call.
        # Asked for explicitly: any match counts (the per-turn recall wants a strong one).
        candidates = self._candidates(conversation_id, query, 0.0) if query.strip() else []

        def measure(text: str) -> int:
            return self.counter.message_tokens({"role": "tool", "tool_call_id": "call", "content": text})

        return recollect(conversation_id, query, candidates, max_tokens, measure, transcript_line)

    def exists(self, conversation_id: str) -> bool:
        """True once a message was stored for ``conversation_id``."""
        validate_conversation_id(conversation_id)
        return self.read_state(conversation_id) is not None

    def require(self, conversation_id: str) -> None:
        """Raise unless ``conversation_id`` is a valid id of a stored conversation."""
        validate_conversation_id(conversation_id)
        if self.read_state(conversation_id) is None:
            raise ConversationNotFoundError(f"no conversation {conversation_id!r}")

    def stats(self, conversation_id: str | None = None) -> list[ConversationStats]:
        """Tier usage, compressions and summariser spend per conversation."""
        if conversation_id is not None:
            validate_conversation_id(conversation_id)
        found = self.store.stats(conversation_id)
        if conversation_id is not None and not found:
            raise ConversationNotFoundError(f"no conversation {conversation_id!r}")
        return found

    def conversation_ids(self) -> list[str]:
        """Every stored conversation id."""
        return self.store.conversation_ids()


def _exported_part(state: ConversationState) -> tuple[object, ...]:
    """What an export shows of a conversation's state: equal values, equal export."""
    return (
        state.last_sequence,
        state.epoch,
        state.pins,
        state.archives_dropped_upto,
        state.platform,
        state.channel,
        state.users,
    )


def _has_media(m: StoredMessage) -> bool:
    return has_media(m.extra.get("content")) if m.extra else False


def _media_recounted(
    recount: Callable[[StoredMessage], StoredMessage],
) -> Callable[[StoredMessage], StoredMessage]:
    """``recount`` for the messages with media parts, the others as stored."""
    return lambda m: recount(m) if m.extra and _has_media(m) else m


def _recounted_candidate(
    c: Recalled, fix: Callable[[StoredMessage], StoredMessage], summ: Callable[[Summary], Summary]
) -> Recalled:
    """``c`` with its messages (or summary) counted again as ``fix`` (``summ``) do, itself when
    they count nothing again."""
    if c.summary is not None:
        summary = summ(c.summary)
        return c if summary is c.summary else replace(c, summary=summary)
    if len(c.messages) == 1:  # most candidates: a plain message
        m = fix(c.messages[0])
        return c if m is c.messages[0] else replace(c, messages=(m,))
    messages = tuple(fix(m) for m in c.messages)
    return (
        c if all(a is b for a, b in zip(messages, c.messages, strict=True)) else replace(c, messages=messages)
    )


def _info(state: ConversationState) -> ConversationInfo:
    return ConversationInfo(
        conversation_id=state.id,
        platform=state.platform,
        channel=state.channel,
        users=state.users,
        created_at=state.created_at,
        last_active_at=state.last_message_at,
        messages=state.last_sequence,
        topics=state.topic_count,
        archives=state.archive_count,
        pinned=len(state.pins),
    )


def _newest_unit(messages_oldest_first: list[StoredMessage]) -> list[StoredMessage]:
    """The newest unpinned message, preceded by its call (and sibling results) if it is a call's result."""
    msgs = [m for m in messages_oldest_first if not m.pinned]
    if not msgs:
        return []
    start = len(msgs) - 1
    while start > 0 and msgs[start].role in RESULT_ROLES:
        start -= 1
    return msgs[start:] if msgs[-1].role in RESULT_ROLES else msgs[-1:]
