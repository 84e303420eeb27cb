"""Hypothesis properties over random conversations, random maintenance and random budgets.

Each example replays a random script (user/assistant turns of 1 to ~6000 characters,
tool-call rounds, a few pinned messages, boundary phrases, silences, manual seals and
``maintain()`` calls) into conversation A, with conversation B interleaved, then checks
``get_context`` at random budgets against an independent token count and the
structural rules, and ``get_history`` for complete, unmodified storage. On SQL
backends the same script also runs on the in-memory store and the two must agree.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import tempfile
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import tiktoken
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tiered_history import (
    BudgetTooSmallError,
    CompressedContext,
    History,
    HistoryCompressor,
    Message,
    StoredMessage,
    Summary,
)
from tiered_history.tokens import TokenCounter

TokenCounter()  # loading an encoding points TIKTOKEN_CACHE_DIR at litellm's bundled copy
ENC = tiktoken.get_encoding("cl100k_base")

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
A_TAG, B_TAG = "alphaconv", "bravoconv"
WORDS = (
    "the", "budget", "keeps", "every", "topic", "summary", "archive", "token", "reply", "question",
    "Oslo", "Zürich", "naïve", "café", "東京", "données", "🙂", "42", "3.14", "x_y", "a%b", "<tag>",
    "{json}", "```code```", "\\n", "tabs\t",
)  # fmt: skip
#: Minimum tokens a truncated message's content can take: the marker with its number, plus slack.
MARKER_ALLOWANCE = 16


# -- independent token counting -------------------------------------------------------------------


def count_text(text: str) -> int:
    return len(ENC.encode(text, disallowed_special=()))


def count_message(m: dict[str, Any]) -> int:
    total = 3
    for key, value in m.items():
        if value is None:
            continue
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        total += count_text(text)
        if key == "name":
            total += 1
    return total


def count_request(messages: list[dict[str, Any]]) -> int:
    return 3 + sum(count_message(m) for m in messages)


# -- the random script ---------------------------------------------------------------------------

sizes = st.one_of(
    st.integers(1, 60),
    st.integers(60, 700),
    st.integers(1500, 6000),  # above max_message_chars=2000: shown head + tail
)
msg_op = st.tuples(
    st.just("msg"),
    st.sampled_from(["user", "assistant"]),
    sizes,
    st.booleans(),  # trigger phrase (user turns only)
    st.sampled_from([1, 1, 1, 2, 45]),  # minutes since the previous message (45: a silence)
)
pin_op = st.tuples(st.just("pin"), st.sampled_from(["system", "user"]), st.integers(1, 300))
tool_op = st.tuples(
    st.just("tools"),
    st.integers(1, 3),  # calls
    st.lists(sizes, min_size=3, max_size=3),  # result sizes
    st.sampled_from([False, False, False, True]),  # unfinished: the next turn abandons the open calls
)
seal_op = st.just(("seal",))
maintain_op = st.tuples(st.just("maintain"), st.sampled_from([1, 5, 40, 120]), st.booleans())
ops_strategy = st.lists(
    st.one_of(msg_op, msg_op, msg_op, tool_op, pin_op, seal_op, maintain_op),
    min_size=10,
    max_size=40,
)
budgets_strategy = st.lists(st.one_of(st.integers(32, 300), st.integers(300, 5000)), min_size=1, max_size=3)
context_budget_strategy = st.sampled_from([200, 600, 2500])


def text_of(rng: random.Random, tag: str, index: int, size: int) -> str:
    head = f"{tag} m{index} "
    words: list[str] = []
    length = len(head)
    while length < size:
        w = rng.choice(WORDS)
        words.append(w)
        length += len(w) + 1
    text = (head + " ".join(words))[:size]
    return text if text.strip() else "x"


@dataclass
class Script:
    """What was added, in order, to each conversation (the returned stored rows)."""

    a: str
    b: str
    added: dict[str, list[StoredMessage]] = field(default_factory=dict)
    clock: datetime = T0
    index: int = 0


async def run_script(hc: HistoryCompressor, script: Script, ops: list[tuple[Any, ...]], seed: int) -> None:
    rng = random.Random(seed)
    a, b = script.a, script.b
    script.added = {a: [], b: []}
    pinned = 0

    async def add(cid: str, msg: Message) -> None:
        script.added[cid].append(await hc.add_message(cid, msg))

    def tick(minutes: float) -> datetime:
        script.clock += timedelta(minutes=minutes)
        return script.clock

    async def add_b() -> None:
        script.index += 1
        text = f"{B_TAG} note {script.index} " + text_of(rng, B_TAG, script.index, rng.randint(5, 200))
        await add(b, Message(role="user", content=text, timestamp=tick(0.5)))

    await add_b()
    await add(a, Message(role="user", content=f"{A_TAG} hello", timestamp=tick(1)))
    for n, op in enumerate(ops):
        script.index += 1
        i = script.index
        kind = op[0]
        if kind == "msg":
            _, role, size, trigger, gap = op
            content = text_of(rng, A_TAG, i, size)
            if trigger and role == "user":
                content = rng.choice(["new topic: ", "Moving on, ", "Anyway, "]) + content
            await add(a, Message(role=role, content=content, timestamp=tick(gap)))
        elif kind == "pin":
            _, role, size = op
            if pinned >= 3:
                continue
            pinned += 1
            content = f"PINNED {i} " + text_of(rng, A_TAG, i, size)
            await add(a, Message(role=role, content=content, pinned=True, timestamp=tick(1)))
        elif kind == "tools":
            _, n_calls, result_sizes, unfinished = op
            calls = [
                {
                    "id": f"call_{i}_{j}",
                    "type": "function",
                    "function": {"name": f"tool_{j}", "arguments": json.dumps({"q": i, "j": j})},
                }
                for j in range(n_calls)
            ]
            preface = rng.choice(["", f"{A_TAG} calling tools {i}"])
            await add(a, Message(role="assistant", content=preface, tool_calls=calls, timestamp=tick(1)))
            answered = rng.randint(0, n_calls - 1) if unfinished else n_calls
            for j in range(answered):
                content = text_of(rng, A_TAG, i, result_sizes[j])
                msg = Message(
                    role="tool", content=content, tool_call_id=f"call_{i}_{j}", timestamp=tick(1 / 60)
                )
                await add(a, msg)
        elif kind == "seal":
            await hc.seal_current_topic(a)
        elif kind == "maintain":
            _, after, everyone = op
            await hc.maintain(None if everyone else a, now=script.clock + timedelta(minutes=after))
        if n % 6 == 5:
            await add_b()
    await add_b()


# -- the checks ----------------------------------------------------------------------------------


def summarized_upto(history: History) -> int:
    """The contiguous prefix of message sequences represented by saved (non-pending) summaries."""
    upto = 0
    for t in sorted(history.topics, key=lambda t: t.first_sequence):
        if t.status == "pending" or t.first_sequence != upto + 1:
            break
        upto = t.last_sequence
    return upto


def last_unit(messages: list[StoredMessage]) -> list[StoredMessage]:
    """The last message with the tool call it answers and that call's other results so far."""
    start = len(messages) - 1
    while start > 0 and messages[start].role == "tool":
        start -= 1
    return messages[start:] if messages else []


def newest_unit(history: History) -> list[StoredMessage]:
    return last_unit(history.messages)


def check_history(history: History, added: list[StoredMessage]) -> None:
    n = len(added)
    assert [m.sequence for m in history.messages] == list(range(1, n + 1))
    # Stored exactly as returned when added, full content included, never modified by maintenance.
    assert history.messages == added
    expected_first = 1
    for t in history.topics:
        assert t.first_sequence == expected_first
        assert t.last_sequence >= t.first_sequence
        expected_first = t.last_sequence + 1
    assert history.open_topic_start == expected_first <= n + 1
    # No topic ends between a tool call and its results.
    by_seq = {m.sequence: m for m in history.messages}
    for t in history.topics:
        nxt = by_seq.get(t.last_sequence + 1)
        assert nxt is None or nxt.role != "tool"
    for a in history.archives:
        members = [t for t in history.topics if t.merged_into == a.id]
        assert members, "an archive merges at least one topic"
        assert (a.first_sequence, a.last_sequence) == (members[0].first_sequence, members[-1].last_sequence)


def complete_units(messages: list[StoredMessage]) -> list[StoredMessage]:
    """The messages of complete units, oldest first: calls with all their results, plain messages.

    Tool results without their call and calls still missing results are left out.
    """
    out: list[StoredMessage] = []
    unit: list[StoredMessage] = []
    pending: set[str] = set()
    for m in [*messages, None]:
        if m is not None and m.role == "tool":
            if unit and str(m.tool_call_id) in pending:
                unit.append(m)
                pending.discard(str(m.tool_call_id))
            continue
        if unit and not pending:
            out.extend(unit)
        if m is not None:
            unit = [m]
            pending = {str(c["id"]) for c in m.tool_calls} if m.tool_calls else set()
    return out


def check_context(ctx: CompressedContext, history: History, max_tokens: int) -> None:
    msgs = ctx.to_messages()
    assert ctx.total_tokens <= max_tokens
    assert ctx.total_tokens == count_request(msgs)
    assert sum(ctx.tier_tokens.values()) == ctx.total_tokens
    assert ctx.max_tokens == max_tokens
    stored_by_seq = {m.sequence: m for m in history.messages}
    newest = history.messages[-1]
    covered_upto = summarized_upto(history)
    uncovered = [m for m in history.messages if m.sequence > covered_upto and not m.pinned]
    current, recent = ctx.current_topic, ctx.recent_topics
    seqs = [m.sequence for m in current]
    r_seqs = [m.sequence for m in recent]

    # Pinned: every pinned message, first, verbatim, in order.
    pinned = [m for m in history.messages if m.pinned]
    assert [m.sequence for m in ctx.pinned] == [m.sequence for m in pinned]
    assert msgs[: len(pinned)] == [m.to_openai() for m in pinned]

    # Topics: the newest run of active summaries, the newest of them possibly swapped back for
    # their own messages (recent_topics, complete units only, none repeated from the current topic).
    active_topics = [
        t for t in history.topics if t.merged_into is None and t.status != "pending" and t.rendered
    ]
    k_t = len(ctx.historical_topics)
    shown_ids = [t.id for t in ctx.historical_topics]
    assert shown_ids == [t.id for t in active_topics if t.id in shown_ids]
    verbatim = set(r_seqs) | set(seqs)

    def messages_of(t: Summary) -> list[int]:
        in_range = [m for m in history.messages if t.first_sequence <= m.sequence <= t.last_sequence]
        return [m.sequence for m in complete_units([m for m in in_range if not m.pinned])]

    # Swapped topics: the newest ones after the shown summaries, every message of theirs sent.
    newer = active_topics[active_topics.index(ctx.historical_topics[-1]) + 1 :] if k_t else active_topics
    swapped: list[Summary] = []
    for t in reversed(newer):
        if not set(messages_of(t)) <= verbatim:
            break
        swapped.insert(0, t)
    k_s = len(swapped)
    if k_t:
        assert swapped == newer  # nothing between the shown summaries and the swapped topics
    assert shown_ids + [t.id for t in swapped] == [
        t.id for t in active_topics[len(active_topics) - k_t - k_s :]
    ]
    for t in swapped:
        assert [q for q in r_seqs if t.first_sequence <= q <= t.last_sequence] == [
            q for q in messages_of(t) if q not in seqs
        ]
    assert sum(1 for q in r_seqs if any(t.first_sequence <= q <= t.last_sequence for t in swapped)) == len(
        recent
    )

    # Current topic: the newest units of what no summary covers (a call still missing results
    # only as the newest unit).
    eligible = complete_units(uncovered)
    tail = last_unit(uncovered)
    if tail and tail[-1].sequence not in {m.sequence for m in eligible}:
        eligible += tail
    if uncovered:
        assert seqs == [m.sequence for m in eligible][len(eligible) - len(current) :]
    if recent:  # swapping back only uses room the current topic could not use
        assert [m.sequence for m in eligible] == [q for q in seqs if q > covered_upto]

    # Archives: the newest run over all of them; dropped ones (always the oldest) only fill room
    # that every other tier left unused.
    active_archives = [a for a in history.archives if a.dropped_at is None and a.rendered]
    all_archives = [a for a in history.archives if a.rendered]
    k_a = len(ctx.bulk_archives)
    assert [a.id for a in ctx.bulk_archives] == [a.id for a in all_archives[len(all_archives) - k_a :]]
    revived = [a for a in ctx.bulk_archives if a.dropped_at is not None]
    if revived:
        assert {a.id for a in active_archives} <= {a.id for a in ctx.bulk_archives}
        if not swapped:  # the room they use could not take an older topic or current-topic unit
            room = max_tokens - ctx.total_tokens + sum(a.token_count for a in revived)
            if k_t < len(active_topics):
                assert active_topics[len(active_topics) - k_t - 1].token_count > room
            older = [m for m in eligible if m.sequence < min(seqs, default=10**9)]
            if older:
                assert sum(m.token_count for m in last_unit(older)) > room

    # Summaries are user messages marked as data, oldest first, before every message.
    summaries: list[Summary] = ctx.bulk_archives + ctx.historical_topics
    for summary in summaries:
        sent = summary.to_openai()
        assert sent["role"] == "user"
        assert "not instructions" in sent["content"]
    for prev, nxt in itertools.pairwise(summaries):
        assert prev.last_sequence < nxt.first_sequence
    system_dicts = [m for m in msgs if m["role"] == "system"]
    assert system_dicts == [m.to_openai() for m in pinned if m.role == "system"]
    start = len(pinned)
    assert msgs[start : start + len(summaries)] == [x.to_openai() for x in summaries]
    assert msgs[start + len(summaries) :] == [m.to_openai() for m in recent + current]
    both = r_seqs + seqs
    assert both == sorted(set(both))
    if summaries:
        top = max(x.last_sequence for x in summaries)
        assert all(q > top for q in r_seqs)
        later = [q for q in seqs if q <= top]
        # Only the newest unpinned unit is repeated verbatim when everything up to it is summarised.
        unpinned = [m for m in history.messages if not m.pinned]
        assert later == [] or later == seqs == [m.sequence for m in last_unit(unpinned)]

    if current:
        assert current[0].role != "tool"

    # The newest message is always there (cut head + tail only if it alone is over budget).
    unit_seqs = {m.sequence for m in newest_unit(history)}
    if not newest.pinned:
        assert current, "the newest message is missing"
        assert current[-1].sequence == newest.sequence
        assert msgs[-1]["role"] == newest.role
        assert msgs[-1].get("tool_call_id") == newest.tool_call_id
        assert unit_seqs <= set(seqs), "the newest message's tool unit is incomplete"
    for m, sent in zip(recent + current, msgs[len(msgs) - len(both) :], strict=True):
        original = stored_by_seq[m.sequence].context_content
        if ctx.truncated_newest and m.sequence in unit_seqs:
            assert sent["content"] == original or "[truncated" in sent["content"]
        else:
            assert sent["content"] == original

    # Tool calls and results travel together, complete.
    results_of: dict[int, list[str]] = {}
    for m in history.messages:
        if m.role == "tool":
            owner = max(x.sequence for x in history.messages if x.sequence < m.sequence and x.tool_calls)
            results_of.setdefault(owner, []).append(str(m.tool_call_id))
    sent_messages = recent + current
    i = 0
    while i < len(sent_messages):
        m = sent_messages[i]
        assert m.role != "tool", f"tool result {m.sequence} without its call"
        i += 1
        if m.tool_calls:
            results = []
            while i < len(sent_messages) and sent_messages[i].role == "tool":
                results.append(str(sent_messages[i].tool_call_id))
                i += 1
            assert results == results_of.get(m.sequence, []), (m.sequence, results)
            # Only the newest unit may still wait for results: any other must be complete (else a 400).
            # Pinned messages after it do not end the wait (they are instructions, not turns).
            unpinned = [x for x in history.messages if not x.pinned]
            if m.sequence != last_unit(unpinned)[0].sequence:
                assert sorted(results) == sorted(str(c["id"]) for c in m.tool_calls), (m.sequence, results)


def must_be_too_small(history: History, max_tokens: int) -> bool:
    """True when pinned messages plus the newest unit, cut to a marker, cannot fit."""
    pinned = sum(count_message(m.to_openai()) for m in history.messages if m.pinned)
    newest = history.messages[-1]
    if newest.pinned:
        return 3 + pinned > max_tokens
    unit = newest_unit(history)
    fixed = sum(count_message(m.to_openai(content="")) for m in unit)
    return 3 + pinned + fixed + MARKER_ALLOWANCE * len(unit) > max_tokens


async def check_all(hc: HistoryCompressor, script: Script, budgets: list[int]) -> list[Any]:
    """Check every property; return what was observed, for comparing backends."""
    observed: list[Any] = []
    a, b = script.a, script.b
    ha = await hc.get_history(a)
    hb = await hc.get_history(b)
    check_history(ha, script.added[a])
    check_history(hb, script.added[b])
    observed.append((normalise_history(ha), normalise_history(hb)))
    event(f"messages: {len(ha.messages) // 10 * 10}+")
    event(f"archives: {len(ha.archives)}, dropped {sum(x.dropped_at is not None for x in ha.archives)}")
    for max_tokens in budgets:
        try:
            ctx = await hc.get_context(a, max_tokens)
        except BudgetTooSmallError:
            assert must_be_too_small(ha, max_tokens), f"BudgetTooSmallError at max_tokens={max_tokens}"
            observed.append(("too small", max_tokens))
            event("too small")
            continue
        check_context(ctx, ha, max_tokens)
        event(f"omitted>0: {ctx.omitted_messages > 0}")
        event(f"truncated newest: {ctx.truncated_newest}")
        event(f"topics shown: {bool(ctx.historical_topics)}")
        event(f"archives shown: {bool(ctx.bulk_archives)}")
        assert B_TAG not in json.dumps(ctx.to_messages(), ensure_ascii=False)
        observed.append((max_tokens, ctx.total_tokens, ctx.to_messages(), ctx.allocation, ctx.tier_tokens))
    ctx_b = await hc.get_context(b, 5000)
    check_context(ctx_b, hb, 5000)
    # Isolation: nothing of A is visible from B and the other way round.
    assert A_TAG not in json.dumps(ctx_b.to_messages(), ensure_ascii=False)
    assert A_TAG not in repr(hb)
    assert B_TAG not in repr(ha)
    assert await hc.search(a, B_TAG) == []
    assert await hc.search(b, A_TAG) == []
    found = await hc.search(b, B_TAG, limit=1000)
    assert [m.sequence for m in found] == list(range(len(script.added[b]), 0, -1))
    return observed


def normalise_history(h: History) -> Any:
    """History without ids and wall-clock times, for comparing backends."""
    ids = {a.id: a.sequence for a in h.archives}

    def summary(s: Summary) -> tuple[Any, ...]:
        return (
            s.tier,
            s.sequence,
            s.first_sequence,
            s.last_sequence,
            s.status,
            s.content,
            s.rendered,
            s.token_count,
            s.source_tokens,
            s.started_at,
            s.ended_at,
            s.sealed_reason,
            s.attempts,
            ids.get(s.merged_into) if s.merged_into is not None else None,
            s.dropped_at,
        )

    return (
        h.platform,
        h.messages,
        [summary(t) for t in h.topics],
        [summary(a) for a in h.archives],
        h.open_topic_start,
    )


async def scenario(
    url: str, tag: str, ops: list[tuple[Any, ...]], budgets: list[int], context_budget: int, seed: int
) -> list[Any]:
    script = Script(a=f"A-{tag}", b=f"B-{tag}")
    async with HistoryCompressor.from_url(url, context_budget=context_budget) as hc:
        await run_script(hc, script, ops, seed)
        return await check_all(hc, script, budgets)


def run(url: str, ops: list[tuple[Any, ...]], budgets: list[int], context_budget: int, seed: int) -> None:
    tag = uuid.uuid4().hex[:8]  # SQL databases are shared between examples: fresh conversation ids
    observed = asyncio.run(scenario(url, tag, ops, budgets, context_budget, seed))
    if not url.startswith("memory://"):
        # The in-memory store must behave exactly like the SQL one on the same script.
        reference = asyncio.run(scenario("memory://", tag, ops, budgets, context_budget, seed))
        assert observed == reference


COMMON = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    "database": None,
}
given_script = given(
    ops=ops_strategy,
    budgets=budgets_strategy,
    context_budget=context_budget_strategy,
    seed=st.integers(0, 2**32 - 1),
)


@settings(max_examples=300, **COMMON)
@given_script
def test_properties_memory(
    ops: list[tuple[Any, ...]], budgets: list[int], context_budget: int, seed: int
) -> None:
    run("memory://", ops, budgets, context_budget, seed)


@pytest.fixture(scope="module")
def sqlite_url() -> Any:
    with tempfile.TemporaryDirectory() as d:
        yield f"sqlite:///{Path(d) / 'props.db'}"


@settings(max_examples=25, **COMMON)
@given_script
def test_properties_sqlite(
    sqlite_url: str, ops: list[tuple[Any, ...]], budgets: list[int], context_budget: int, seed: int
) -> None:
    run(sqlite_url, ops, budgets, context_budget, seed)


@pytest.mark.postgres
@settings(max_examples=6, **COMMON)
@given_script
def test_properties_postgresql(
    pg_url: str, ops: list[tuple[Any, ...]], budgets: list[int], context_budget: int, seed: int
) -> None:
    run(pg_url, ops, budgets, context_budget, seed)
