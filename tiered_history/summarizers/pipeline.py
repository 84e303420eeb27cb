"""The summariser pipeline: what a summariser is given, what of its answer is accepted, the fallback.

One pipeline around every summariser. It turns a sealed topic's messages into
:class:`~.base.SummaryInput`, asks the configured summariser within its limits, rejects
answers that are empty, far over their target or not smaller than what they replace, falls
back to the offline extractive summariser (marking the result provisional so maintenance
retries the model later), and records what every attempt cost.

Time limits: a summariser that applies its own per-request timeout
(``handles_timeouts = True``, as :class:`~.llm.LiteLLMSummarizer` does, retrying within it)
gets only the overall ``deadline`` of the job; any other summariser's call is one request,
capped at ``timeout``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

from ..core import escalation
from ..core.render import item_line, render_summary
from ..core.transitions import SummaryWrite
from ..models import StoredMessage, Summary, storable, text_problem
from ..tokens import TokenCounter, counter_for_encoding
from .base import Spend, Summarizer, SummaryInput, SummaryPiece, SummaryResult, spend_ledger
from .extractive import ExtractiveSummarizer, speaker_label

log = logging.getLogger("tiered_history")
T = TypeVar("T")

#: Summaries longer than this multiple of their target are treated as garbage.
MAX_OVERSHOOT = 1.5
#: Below this many tokens a summary says nothing useful: the topic is kept word for word.
MIN_SUMMARY_TOKENS = 16
_ERROR_LIMIT = 500


@dataclass(frozen=True, slots=True)
class Limits:
    """What the pipeline allows a summariser."""

    topic_target: int
    archive_target: int
    timeout: float
    """Seconds per request (a summariser that handles timeouts itself applies it per model call)."""
    deadline: float
    """Seconds for a whole job (every request, retry and chunk of one summary)."""
    max_attempts: int
    retry_backoff_seconds: float


class SummaryPipeline:
    """Runs a summariser for maintenance and turns its answer into a :class:`SummaryWrite`."""

    def __init__(
        self,
        counter: TokenCounter,
        summarizer: Summarizer,
        limits: Limits,
        fallback: Summarizer | None = None,
    ) -> None:
        self.counter = counter
        self.summarizer = summarizer
        self.fallback = fallback or ExtractiveSummarizer(counter)
        self.limits = limits

    @property
    def offline(self) -> bool:
        """The configured summariser is the extractive fallback itself: nothing to retry."""
        return isinstance(self.summarizer, ExtractiveSummarizer)

    @property
    def reads_sources(self) -> bool:
        """Whether a roll-up is handed the messages its archives stand for: when the summariser
        says its ``merge`` takes them (``reads_sources = True``, as the offline one does, for which
        reading them costs milliseconds; a model would be paid for every token)."""
        return reads_sources(self.summarizer)

    # -- rendering and acceptance ----------------------------------------------------------------

    def write(
        self,
        tier: str,
        text: str,
        status: str,
        span: tuple[int, int, datetime, datetime],
        result: Any = None,
        error: str | None = None,
        next_attempt_at: datetime | None = None,
        spent: Spend | None = None,
    ) -> SummaryWrite:
        rendered = render_summary(tier, text, *span) if text.strip() else ""
        # What it costs as a dated line of its tier's block in a context (the block's header and
        # delimiters are paid once per tier); +1 for the line break joining it to the next.
        tokens = self.counter.count(item_line(text, span[2], span[3])) + 1 if rendered else 0
        write = SummaryWrite(
            content=text,
            rendered=rendered,
            token_count=tokens,
            status=status,
            summarizer=_named(getattr(result, "summarizer", "extractive"), 64) or "extractive",
            model=_named(getattr(result, "model", None), 255),
            prompt_tokens=getattr(result, "prompt_tokens", 0),
            completion_tokens=getattr(result, "completion_tokens", 0),
            cost=getattr(result, "cost", 0.0),
            latency_ms=getattr(result, "latency_ms", 0.0),
            next_attempt_at=next_attempt_at,
            last_error=error,
        )
        return charged(write, spent)

    def in_encoding(
        self, write: SummaryWrite, encoding: str, started_at: datetime, ended_at: datetime
    ) -> SummaryWrite:
        """``write`` with its token count in ``encoding``: the conversation's, when this worker's
        ``model`` counts with another tokenizer (readers trust stored counts in their encoding)."""
        if not encoding or encoding == self.counter.encoding_name or not write.rendered:
            return write
        tokens = counter_for_encoding(encoding).count(item_line(write.content, started_at, ended_at)) + 1
        return replace(write, token_count=tokens)

    def acceptable(self, text: Any, limit: int) -> str | None:
        """Why a summariser's text is rejected, or None if it is usable."""
        if not isinstance(text, str) or not text.strip():
            return "empty summary"
        problem = text_problem(text)
        if problem is not None:  # it could not be saved: a retry would meet the same text
            return f"summary {problem}"
        n = self.counter.count(text)
        if n > limit * MAX_OVERSHOOT:
            return f"summary ({n} tokens) is far over its limit ({limit} tokens)"
        return None

    def header_tokens(self, tier: str, span: tuple[int, int, datetime, datetime]) -> int:
        """Tokens of a summary's line in its block around its text (its date range)."""
        return self.counter.count(item_line("", span[2], span[3])) + 1

    async def _call(self, call: Awaitable[T]) -> T:
        handles = bool(getattr(self.summarizer, "handles_timeouts", False))
        limit = self.limits.deadline if handles else min(self.limits.timeout, self.limits.deadline)
        return await asyncio.wait_for(call, timeout=limit)

    # -- topics ----------------------------------------------------------------------------------

    async def summarize_topic(
        self,
        topic: Summary,
        messages: Sequence[StoredMessage],
        now: datetime,
        target: int | None = None,
        earlier: Sequence[str] = (),
    ) -> SummaryWrite:
        """The summary of a sealed topic from its (unpinned) messages, in about ``target`` tokens.

        ``earlier``: the texts of the summaries and archives before it, handed to a summariser
        that reads them (``reads_earlier = True``, as the offline one does) so that it need not
        say again what they say."""
        lim = self.limits
        span = (topic.first_sequence, topic.last_sequence, topic.started_at, topic.ended_at)
        if not messages:  # only pinned messages: they are always sent verbatim anyway
            return self.write("topic", "", "final", span)
        source = sum(m.full_token_count for m in messages)
        # Inflation guard: the rendered summary must cost less than the messages it replaces.
        cap = min(target or lim.topic_target, source - self.header_tokens("topic", span) - 3)
        transcript = "\n".join(transcript_line(m) for m in messages)
        if cap < MIN_SUMMARY_TOKENS or self.counter.count(transcript) <= cap:
            # Small topics fit whole: keep them word for word, with no summariser call.
            return self.write("topic", transcript, "final", span, result=_Verbatim())
        inputs = summary_inputs(messages)
        error: str | None = None
        spent = Spend()
        if not self.offline:
            result: Any = None
            with spend_ledger() as spent:
                try:
                    result = await self._call(_summarize(self.summarizer, inputs, cap, earlier))
                    error = self.acceptable(result.text, cap)
                    if error is None:
                        write = self.write(
                            "topic", result.text.strip(), "final", span, result=result, spent=spent
                        )
                        if write.token_count < source:
                            return write
                        error = (
                            f"summary ({write.token_count} tokens) is not smaller than its source ({source})"
                        )
                except (Exception, asyncio.CancelledError) as exc:  # the LLM may fail in any way
                    reraise_if_we_are_cancelled(exc)
                    error = describe(exc)
            spent = spend_of(spent, result)
            log.warning("summariser failed for %s topic %s: %s", topic.conversation_id, topic.sequence, error)
        if topic.status == "provisional":
            # A retry that failed again: keep the existing extractive text, record the attempt and its cost.
            retry_at = now + timedelta(
                seconds=escalation.retry_delay(topic.attempts + 1, lim.retry_backoff_seconds)
            )
            retry = SummaryWrite(
                content=topic.content,
                rendered=topic.rendered,
                token_count=topic.token_count,
                status="provisional" if topic.attempts + 1 < lim.max_attempts else "final",
                summarizer=topic.summarizer or "extractive",
                model=topic.model,
                next_attempt_at=retry_at,
                last_error=error,
            )
            return charged(retry, spent)
        fb = await _summarize(self.fallback, inputs, cap, earlier)
        provisional = error is not None
        first_retry: datetime | None = None
        if provisional:
            first_retry = now + timedelta(seconds=escalation.retry_delay(1, lim.retry_backoff_seconds))
        status = "provisional" if provisional and lim.max_attempts > 1 else "final"
        return self.write(
            "topic", fb.text, status, span, result=fb, error=error, next_attempt_at=first_retry, spent=spent
        )

    # -- archives --------------------------------------------------------------------------------

    async def merge(
        self,
        items: Sequence[Summary],
        target: int | None = None,
        sources: Sequence[Sequence[StoredMessage] | None] | None = None,
        earlier: Sequence[str] = (),
    ) -> SummaryWrite:
        """One archive from consecutive summaries (or archives), oldest first, in about ``target`` tokens.

        ``sources``: the messages each item stands for, where read (see :attr:`reads_sources`);
        the offline summariser then chooses from them instead of from the items' texts.
        ``earlier``: the texts of the archives before it (see :meth:`summarize_topic`).
        """
        pieces = [
            SummaryPiece(
                t.content, t.first_sequence, t.last_sequence, t.started_at, t.ended_at, t.source_tokens
            )
            for t in items
        ]
        span = (
            items[0].first_sequence,
            items[-1].last_sequence,
            min(t.started_at for t in items),
            max(t.ended_at for t in items),
        )
        inputs = None
        if sources is not None:
            inputs = [summary_inputs(src) if src else None for src in sources]
        source = sum(self.counter.count(t.content) for t in items)
        # The target covers the archive's whole line in its block, date range included.
        target = max(
            min((target or self.limits.archive_target) - self.header_tokens("bulk", span), source - 1), 1
        )
        error: str | None = None
        spent = Spend()
        if not self.offline:
            result: Any = None
            with spend_ledger() as spent:
                try:
                    result = await self._call(_merge(self.summarizer, pieces, target, inputs, earlier))
                    error = self.acceptable(result.text, target)
                    if error is None and self.counter.count(result.text) >= source:
                        error = "archive is not smaller than the summaries it merges"
                    if error is None:
                        return self.write(
                            "bulk", result.text.strip(), "final", span, result=result, spent=spent
                        )
                except (Exception, asyncio.CancelledError) as exc:
                    reraise_if_we_are_cancelled(exc)
                    error = describe(exc)
            spent = spend_of(spent, result)
            log.warning("summariser merge failed for %s: %s", items[0].conversation_id, error)
        fb = await _merge(self.fallback, pieces, target, inputs, earlier)
        return self.write("bulk", fb.text, "final", span, result=fb, error=error, spent=spent)


def summary_inputs(messages: Sequence[StoredMessage]) -> list[SummaryInput]:
    """Stored messages as a summariser is given them."""
    return [SummaryInput(m.sequence, m.role, turn_text(m), m.timestamp, m.name) for m in messages]


#: Longest part of a call's arguments shown where a tool call is written out as text.
CALL_ARGUMENTS_SHOWN = 160


def turn_text(m: StoredMessage) -> str:
    """``m``'s text with the tools it called, if any (``[calls search_flights({...})]``): a call's
    content is often empty, and a summary or an excerpt of it would not say what was done."""
    calls = []
    for call in m.tool_calls or ():
        body = call.get("function") or call.get("custom") or {}
        if not isinstance(body, dict):
            continue
        args = body.get("arguments", body.get("input", ""))
        args = args if isinstance(args, str) else ""
        if len(args) > CALL_ARGUMENTS_SHOWN:
            args = args[:CALL_ARGUMENTS_SHOWN] + "…"
        calls.append(f"[calls {body.get('name') or 'a tool'}({args})]")
    if not calls:
        return m.content
    return " ".join([m.content, *calls] if m.content.strip() else calls)


def reads_sources(summarizer: object) -> bool:
    """Whether ``summarizer``'s ``merge`` takes ``sources=`` (it says so: ``reads_sources = True``)."""
    return bool(getattr(summarizer, "reads_sources", False))


def reads_earlier(summarizer: object) -> bool:
    """Whether ``summarizer`` takes ``earlier=`` (it says so: ``reads_earlier = True``)."""
    return bool(getattr(summarizer, "reads_earlier", False))


def _summarize(
    summarizer: Summarizer, inputs: Sequence[SummaryInput], target: int, earlier: Sequence[str]
) -> Awaitable[SummaryResult]:
    """``summarizer.summarize``, handed ``earlier`` only when it takes it."""
    if earlier and reads_earlier(summarizer):
        return summarizer.summarize(inputs, target, earlier=earlier)  # type: ignore[call-arg]
    return summarizer.summarize(inputs, target)


def _merge(
    summarizer: Summarizer,
    pieces: Sequence[SummaryPiece],
    target: int,
    inputs: Sequence[Sequence[SummaryInput] | None] | None,
    earlier: Sequence[str] = (),
) -> Awaitable[SummaryResult]:
    """``summarizer.merge``, handed the ``inputs`` and ``earlier`` only when it takes them."""
    more: dict[str, Any] = {}
    if inputs is not None and reads_sources(summarizer):
        more["sources"] = inputs
    if earlier and reads_earlier(summarizer):
        more["earlier"] = earlier
    return summarizer.merge(pieces, target, **more)


def describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "TimeoutError: the summariser did not answer in time"
    # A provider's message may quote anything (a NUL the database refuses): kept storable.
    return storable(f"{type(exc).__name__}: {exc}"[:_ERROR_LIMIT])


def _named(value: object, longest: int) -> str | None:
    """A summariser's or model's name as reported, storable in its column (``longest``
    characters): a provider's answer names the model, and a row that cannot be saved would
    leave its topic unsummarised, tried again at every pass."""
    return storable(value)[:longest] if isinstance(value, str) else None


def spend_of(ledger: Spend, result: object) -> Spend:
    """What an attempt cost: the ledger if the summariser reports to it, else what its result says
    (a summariser may return anything: only well-formed numbers are taken)."""
    if ledger.calls:
        return ledger
    usage = [getattr(result, k, 0) for k in ("prompt_tokens", "completion_tokens", "cost")]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in usage):
        return ledger
    if not any(usage):
        return ledger
    model = getattr(result, "model", None)
    return Spend(1, int(usage[0]), int(usage[1]), float(usage[2]), model if isinstance(model, str) else None)


def charged(write: SummaryWrite, spent: Spend | None) -> SummaryWrite:
    """``write`` carrying everything its attempt spent on model calls, accepted or not."""
    if spent is None or not spent.calls:
        return write
    return replace(
        write,
        model=write.model if write.summarizer != "extractive" else spent.model or write.model,
        prompt_tokens=spent.prompt_tokens,
        completion_tokens=spent.completion_tokens,
        cost=spent.cost,
    )


def reraise_if_we_are_cancelled(exc: BaseException) -> None:
    """A summariser's own CancelledError is a failure; cancellation of maintain() itself is not."""
    task = asyncio.current_task()
    if isinstance(exc, asyncio.CancelledError) and task is not None and task.cancelling():
        raise exc


class _Verbatim:
    summarizer = "verbatim"
    model = None
    prompt_tokens = 0
    completion_tokens = 0
    cost = 0.0
    latency_ms = 0.0


def speaker(m: StoredMessage) -> str:
    """The label of ``m`` in a transcript: from its role, its name quoted as data (a user named
    ``System`` is ``User "System"``, never ``System``)."""
    return speaker_label(m.role, m.name)


def transcript_line(m: StoredMessage) -> str:
    """``m`` as one labelled turn; its continuation lines are indented, so that text such as
    ``"ok\nSystem: obey"`` cannot start a line that reads as another speaker's label."""
    # Every line break str.splitlines() knows (U+2028, \x85, \x0c... too): a merge reads the text
    # back by those lines.
    body = "\n  ".join(turn_text(m).splitlines())
    return f"{speaker(m)}: {body}"
