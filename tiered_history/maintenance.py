"""Background compression: seal silent topics, summarise, merge into archives, drop, retry.

One pass claims the conversations whose work is due (a lease per conversation, so many workers
can share a database), and for each runs the steps the core plans, committing each step's
writes under the lease and the version it was planned from. A write that lost a race with a
reply is planned again from the new state; the summariser's answer is not asked for again.
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from .core import escalation, transitions
from .core.boundaries import (
    DETECTOR,
    BoundaryDetector,
    BoundaryRules,
    Proposal,
    Turn,
    choose_proposal,
    proposer,
)
from .core.budget import EscalationBudget, topic_target
from .core.state import ConversationState, Outcome, Writes
from .errors import InvalidMessageError
from .models import StoredMessage, Summary
from .store.aio import AsyncStore
from .store.base import LeaseLostError
from .summarizers.pipeline import SummaryPipeline

log = logging.getLogger("tiered_history")

#: Conversations claimed per round of a pass.
BATCH = 16
#: A roll-up reads the messages of its newest archives up to this many tokens (about half a second
#: of the offline summariser's time); older archives take part through their text.
ROLLUP_SOURCE_TOKENS = 100_000
#: ...and at most this many per token of its target: small budgets roll up often, each time into
#: a small archive, so the work per message stays about the same at every budget.
ROLLUP_SOURCE_RATIO = 100


@dataclass
class MaintenanceReport:
    """What one ``maintain()`` call did."""

    conversations: int = 0
    sealed: int = 0
    summarized: int = 0
    provisional: int = 0
    merged: int = 0
    rolled_up: int = 0
    """Archives rolled up into coarser ones (the oldest parts: the timeline stays represented)."""
    dropped: int = 0
    detector_splits: int = 0
    """Topics sealed on a pluggable detector's proposal (counted in ``sealed`` too)."""
    detector_merges: int = 0
    """Topics reopened on a pluggable detector's proposal."""
    lease_lost: int = 0
    errors: list[str] = field(default_factory=list)


class Maintenance:
    """Runs maintenance passes for one compressor (one worker id)."""

    def __init__(
        self,
        store: AsyncStore,
        pipeline: SummaryPipeline,
        rules: Callable[[ConversationState], BoundaryRules],
        plan: Callable[[ConversationState], EscalationBudget],
        *,
        worker_id: str,
        lease_seconds: float,
        max_attempts: int,
        retry_backoff_seconds: float,
        merge_size: int,
        detectors: Sequence[BoundaryDetector] = (),
        detect_every: int = 1,
        detector_timeout_seconds: float = 30.0,
    ) -> None:
        self.store = store
        self.pipeline = pipeline
        self.rules = rules
        self.plan = plan
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds
        self.max_attempts = max_attempts
        self.retry_backoff = timedelta(seconds=retry_backoff_seconds)
        self.merge_size = merge_size
        self.detectors = tuple(detectors)
        self.detect_every = detect_every
        self.detector_timeout = detector_timeout_seconds
        self.stopping = False
        """Set while a shutdown waits for the pass in progress: it ends after the conversation in
        hand, giving the rest of its batch back (a backlog would otherwise hold a stop for as long
        as it takes to work through)."""

    async def run(
        self, conversation_id: str | None = None, now: datetime | None = None, *, detect: bool = True
    ) -> MaintenanceReport:
        """One pass over every conversation with work due (or just ``conversation_id``).

        ``detect=False`` leaves the pluggable detectors out (a pass run inline by a reply).
        """
        if now is not None:
            check_now(now)
        report = MaintenanceReport()
        after: str | None = None  # a pass walks the conversations with work once, in id order
        while True:
            at = now or datetime.now(UTC)
            claimed = await self.store.claim(
                self.worker_id, at, self.lease_seconds, BATCH, after=after, conversation_id=conversation_id
            )
            for i, cid in enumerate(claimed):
                if self.stopping:
                    # Asked to stop: the rest of the batch goes back now, not when its leases expire.
                    await self._release_all(claimed[i:])
                    return report
                report.conversations += 1
                try:
                    await self._compact(cid, at, report, detect)
                except asyncio.CancelledError:
                    await asyncio.shield(self._release_all(claimed[i + 1 :]))
                    raise
            if conversation_id is not None or not claimed:
                return report
            # Conversations that still have work (a topic that cannot be sealed yet, say) stay
            # behind the cursor: they cannot crowd out the ones not visited yet in this pass.
            after = claimed[-1]

    async def _release_all(self, conversation_ids: Sequence[str]) -> None:
        for cid in conversation_ids:
            try:
                await self.store.release(self.worker_id, cid)
            except Exception:  # the lease then expires: nothing is lost, the work waits for it
                log.exception("could not give back the lease on %s", cid)

    # -- one conversation ------------------------------------------------------------------------

    async def _commit(
        self, cid: str, state: ConversationState, plan: Callable[[ConversationState], Writes | None]
    ) -> tuple[ConversationState, bool]:
        """Apply ``plan`` to the conversation's current state, locked, under the lease.

        Maintenance never loses a race to the replies arriving meanwhile: the store runs the plan on
        the state as it is when the lock is taken. Returns the state after and whether anything was
        written (False: nothing to do, or a guarded summary row changed meanwhile).
        """

        def locked(current: ConversationState | None) -> Writes | None:
            if current is None:
                raise LeaseLostError(cid)  # deleted meanwhile
            return plan(current)

        done = await self.store.update(cid, locked, self.worker_id)
        if done.writes is not None and done.outcome is Outcome.COMMITTED:
            return done.writes.state, True
        fresh = await self.store.state(cid)
        return (fresh or state), False

    async def _compact(self, cid: str, now: datetime, report: MaintenanceReport, detect: bool) -> None:
        owner = self.worker_id
        state = await self.store.state(cid)
        if state is None:
            return
        rules = self.rules(state)
        try:
            if detect and self.detectors and transitions.detection_due(state, self.detect_every):
                # Before the silence rule: a topic that went quiet may still hold a boundary.
                state = await self._detect(cid, state, rules, now, report)
            state, sealed = await self._commit(
                cid, state, lambda s: _first(transitions.seal_if_silent(s, rules, now))
            )
            report.sealed += sealed
            plan = self.plan(state)
            topics = await self.store.read_summaries(cid, "topic", state.topics_merged_upto)
            due = transitions.due_topics(topics, now, self.max_attempts)
            # What the summaries before each say, where contexts show them all beside it.
            archives = await self.store.read_summaries(cid, "bulk") if due and plan.timeline else []
            shown = plan.topic_share + plan.bulk_share  # what the tiers can show before a topic
            for topic in due:
                await self._renew(cid)
                messages = await self.store.read_messages(cid, topic.first_sequence, topic.last_sequence)
                unpinned = [m for m in messages if not m.pinned]
                target = topic_target(plan, sum(m.full_token_count for m in unpinned))
                earlier = (
                    transitions.earlier_texts(topic.first_sequence, archives, topics, limit=shown)
                    if plan.timeline
                    else []
                )
                write = await self.pipeline.summarize_topic(topic, unpinned, now, target, earlier)
                write = self.pipeline.in_encoding(write, state.encoding, topic.started_at, topic.ended_at)
                state, saved = await self._commit(
                    cid, state, _planned(transitions.record_summary, topic, write, now)
                )
                if saved:
                    report.summarized += 1
                    report.provisional += write.status == "provisional"
                    # The next topic's summary is told what this one says.
                    said = replace(
                        topic, content=write.content, token_count=write.token_count, status="final"
                    )
                    topics = [said if t.id == topic.id else t for t in topics]
            # Read the active summaries once; each merge removes its group (a backlog stays linear).
            active = transitions.active_topics(
                await self.store.read_summaries(cid, "topic", state.topics_merged_upto)
            )
            # Only the summaries the context shows beside the verbatim window count against the
            # topic share: those of topics the window still holds word for word cost nothing yet.
            mark = state.window
            active = escalation.beside_window(
                active, state.open.tokens, plan.window_share, mark.start if mark is not None else None
            )
            report.merged += await self._merge(
                cid,
                state,
                active,
                plan.topic_share,
                plan.merge_target(self.pipeline.reads_sources),
                now,
                plan.bulk_share,
                plan.timeline,
            )
            state = await self.store.state(cid) or state
            archives = transitions.active_archives(await self.store.read_summaries(cid, "bulk"))
            report.rolled_up += await self._merge(
                cid, state, archives, plan.bulk_share, plan.bulk_share, now, timeline=plan.timeline
            )
            state = await self.store.state(cid) or state
            topics = await self.store.read_summaries(cid, "topic", state.topics_merged_upto)
            retry_at = transitions.next_retry(topics, self.max_attempts)
            # The pass's last commit gives the lease back with it (the release below is then a no-op).
            await self._commit(
                cid, state, lambda s: Writes(transitions.finish(s, rules, retry_at, now), release=True)
            )
        except asyncio.CancelledError:
            # Give the conversation back now rather than when the lease expires.
            await asyncio.shield(self.store.release(owner, cid))
            raise
        except LeaseLostError:
            report.lease_lost += 1
            log.warning("lease on %s was taken over by another worker; stopping this pass", cid)
            return
        except Exception as exc:
            # Keep other conversations going; the work stays due and is retried after a pause.
            log.exception("maintenance of %s failed", cid)
            report.errors.append(f"{cid}: {exc}")
            try:
                fresh = await self.store.state(cid)
                if fresh is not None:
                    await self._commit(
                        cid,
                        fresh,
                        lambda s: Writes(transitions.retry_later(s, rules, self.retry_backoff, now)),
                    )
            except Exception:
                log.exception("could not schedule a retry for %s", cid)
        await self.store.release(owner, cid)

    async def _merge(
        self,
        cid: str,
        state: ConversationState,
        active: list[Summary],
        share: int,
        target: int,
        now: datetime,
        bulk_share: int = 0,
        timeline: bool = True,
    ) -> int:
        """Merge the oldest summaries (topics into an archive, or archives into a coarser one) while
        they exceed ``share``; returns how many merges were saved. A merge of many topics is split
        into as many archives as the archives' room (``bulk_share``) has left at ``target``.
        ``timeline``: contexts show every archive before it (the summariser is told what they say)."""
        rollup = bool(active) and active[0].tier != "topic"
        items = [escalation.Item(t.id, t.token_count) for t in active]
        by_id = {t.id: t for t in active}
        if rollup:
            whole = escalation.next_rollup(items, share)
            plan = [whole] if whole else []
        else:
            plan = escalation.merge_plan(items, share, self.merge_size, self.merge_size)
            if plan and len(plan[0]) >= 2 * self.merge_size and target > 0:
                archives = transitions.active_archives(await self.store.read_summaries(cid, "bulk"))
                left = bulk_share - sum(a.token_count for a in archives)
                # merge_plan's group is always the oldest items.
                plan = escalation.split_merge(items[: len(plan[0])], left // target, self.merge_size)
        merges = 0
        for ids in plan:
            group = [by_id[i] for i in ids]
            await self._renew(cid)
            sources = None
            if rollup and self.pipeline.reads_sources:
                sources = await self._sources(
                    cid, group, min(ROLLUP_SOURCE_TOKENS, ROLLUP_SOURCE_RATIO * target)
                )
            # The archives before it (a roll-up takes the oldest: usually none).
            earlier: list[str] = []
            if timeline:
                older = active if rollup else await self.store.read_summaries(cid, "bulk")
                earlier = transitions.earlier_texts(group[0].first_sequence, older, limit=share + bulk_share)
            write = await self.pipeline.merge(group, target, sources, earlier)
            write = self.pipeline.in_encoding(
                write, state.encoding, min(x.started_at for x in group), max(x.ended_at for x in group)
            )
            state, saved = await self._commit(
                cid, state, _planned(transitions.record_archive, group, write, now)
            )
            if not saved:
                break
            merges += 1
        return merges

    async def _sources(
        self, cid: str, group: Sequence[Summary], cap: int
    ) -> list[list[StoredMessage] | None]:
        """The unpinned messages each archive of a roll-up stands for, newest archives first while
        they add up to at most ``cap`` tokens (older ones are given as their text: a roll-up's
        work stays bounded however long the conversation grows)."""
        out: list[list[StoredMessage] | None] = [None] * len(group)
        total = 0
        first = None
        for i in range(len(group) - 1, -1, -1):
            total += group[i].source_tokens
            if total > cap:
                break
            first = i
        if first is None:
            return out
        messages = await self.store.read_messages(cid, group[first].first_sequence, group[-1].last_sequence)
        for i in range(first, len(group)):
            lo = bisect_left(messages, group[i].first_sequence, key=lambda m: m.sequence)
            hi = bisect_right(messages, group[i].last_sequence, key=lambda m: m.sequence)
            out[i] = [m for m in messages[lo:hi] if not m.pinned]
        return out

    async def _detect(
        self,
        cid: str,
        state: ConversationState,
        rules: BoundaryRules,
        now: datetime,
        report: MaintenanceReport,
    ) -> ConversationState:
        """Ask the pluggable detectors about the open topic's newest messages and apply the proposal
        :func:`choose_proposal` picks; the messages they saw are not offered to them again."""
        await self._renew(cid)
        start, upto = state.topic_start_seq, state.last_sequence
        window = max(d.window for d in self.detectors)
        rows = await self.store.read_messages(cid, max(start, upto - window + 1), upto)
        turns = [
            Turn(m.sequence, m.role, m.content, m.timestamp, m.token_count) for m in rows if not m.pinned
        ]
        votes = [
            v for found in await asyncio.gather(*(self._ask(d, turns) for d in self.detectors)) for v in found
        ]
        await self._renew(cid)
        chosen = choose_proposal([p for _, p in votes], rules, transitions.open_topic(state), turns)
        reason = DETECTOR + proposer(votes, chosen) if chosen is not None else ""
        messages: list[StoredMessage] = []
        if chosen is not None and chosen.kind == "split":
            # The whole open topic as it is now (a reply may have come while the detectors thought).
            fresh = await self.store.state(cid) or state
            if fresh.topic_start_seq == start:
                messages = await self.store.read_messages(cid, start, fresh.last_sequence)
        outcome: list[str] = []

        def plan(s: ConversationState) -> Writes:
            done = transitions.apply_proposal(s, chosen, reason, messages, rules, now, start=start, upto=upto)
            outcome[:] = [done.outcome]
            return done.writes

        state, saved = await self._commit(cid, state, plan)
        if saved and outcome == ["split"]:
            report.sealed += 1
            report.detector_splits += 1
            log.info("%s: topic sealed before message %s (%s)", cid, state.topic_start_seq, reason)
        elif saved and outcome == ["merge"]:
            report.detector_merges += 1
            log.info(
                "%s: topic reopened from message %s on a detector's proposal", cid, state.topic_start_seq
            )
        return state

    async def _ask(self, detector: BoundaryDetector, turns: Sequence[Turn]) -> list[tuple[str, Proposal]]:
        """One detector's proposals, or none when it fails, answers nonsense or takes too long."""
        mine = list(turns[-detector.window :])
        if not mine:
            return []
        task: asyncio.Future[Sequence[Proposal]] | None = None
        try:
            task = asyncio.ensure_future(detector.propose(mine))
            # wait(), not wait_for(): a detector that swallows its cancellation cannot hold the pass.
            done, _ = await asyncio.wait({task}, timeout=self.detector_timeout)
            if not done:
                log.warning(
                    "boundary detector %r gave no answer within %ss; ignored",
                    detector.name,
                    self.detector_timeout,
                )
                return []
            return [(detector.name, p) for p in task.result() if _valid(p)]
        except Exception:
            log.warning("boundary detector %r failed; ignored", detector.name, exc_info=True)
            return []
        finally:
            if task is not None and not task.done():
                task.cancel()
                task.add_done_callback(_retrieve)

    async def _renew(self, cid: str) -> None:
        until = datetime.now(UTC) + timedelta(seconds=self.lease_seconds)
        if not await self.store.renew(self.worker_id, cid, until):
            raise LeaseLostError(cid)


def _valid(p: object) -> bool:
    """A well-formed proposal (anything else a detector returns is dropped, not trusted)."""
    return (
        isinstance(p, Proposal)
        and type(p.sequence) is int
        and isinstance(p.confidence, int | float)
        and not isinstance(p.confidence, bool)
        and p.kind in ("split", "merge")
    )


def _retrieve(task: asyncio.Future[Sequence[Proposal]]) -> None:
    """Collect an abandoned detector call's outcome (so asyncio does not report it as lost)."""
    if not task.cancelled():
        task.exception()


def _first(pair: tuple[Writes, object] | None) -> Writes | None:
    return None if pair is None else pair[0]


def _planned(step: Callable[..., Writes], *args: Any) -> Callable[[ConversationState], Writes]:
    """``step(state, *args)`` as a plan the commit loop can run again on a newer state."""
    return lambda state: step(state, *args)


def check_now(now: object) -> None:
    """``maintain(now=...)``'s time: aware, and far enough from the ends of the calendar for the
    leases and retry times computed from it."""
    if not isinstance(now, datetime) or now.utcoffset() is None:
        raise InvalidMessageError(f"now must be a timezone-aware datetime, not {now!r}")
    try:
        now + timedelta(days=400)
        now - timedelta(days=400)
    except OverflowError:
        raise InvalidMessageError(f"now is too close to the ends of the calendar: {now!r}") from None
