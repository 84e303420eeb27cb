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
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import tiktoken
from hypothesis import HealthCheck, event, example, given, settings
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
from tiered_history.core import ranking
from tiered_history.core.excerpt import ELLIPSIS
from tiered_history.tokens import TokenCounter

TokenCounter()  # loading an encoding points TIKTOKEN_CACHE_DIR at litellm's bundled copy
ENC = tiktoken.get_encoding("cl100k_base")

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
A_TAG, B_TAG = "alphaconv", "bravoconv"
WORDS = (
    "the", "budget", "keeps", "every", "topic", "summary", "archive", "token", "reply", "question",
    "Oslo", "Zürich", "naïve", "café", "東京", "données", "🙂", "42", "3.14", "x_y", "a%b", "<tag>",
    "{json}", "```code```", "\\n", "tabs\t", "done.", "why?", "駅。",
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
    st.sampled_from([False, False, True]),  # legacy: one OpenAI function_call and its role "function" result
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

    async def add(cid: str, msg: Message | dict[str, Any]) -> None:
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
            _, n_calls, result_sizes, unfinished, *legacy = op  # (the explicit examples have no flag)
            preface = rng.choice(["", f"{A_TAG} calling tools {i}"])
            if any(legacy):
                call = {"name": f"tool_{i}", "arguments": json.dumps({"q": i})}
                fc = {"role": "assistant", "content": preface or None, "function_call": call}
                await add(a, {**fc, "timestamp": tick(1)})
                if not unfinished:
                    content = text_of(rng, A_TAG, i, result_sizes[0])
                    result = {"role": "function", "name": f"tool_{i}", "content": content}
                    await add(a, {**result, "timestamp": tick(1 / 60)})
            else:
                calls = [
                    {
                        "id": f"call_{i}_{j}",
                        "type": "function",
                        "function": {"name": f"tool_{j}", "arguments": json.dumps({"q": i, "j": j})},
                    }
                    for j in range(n_calls)
                ]
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
    while start > 0 and messages[start].role in ("tool", "function"):
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
    # A topic reopened by the next messages (issue 14) stays in history, superseded by the later one.
    for t in [t for t in history.topics if t.status != "superseded"]:
        assert t.first_sequence == expected_first
        assert t.last_sequence >= t.first_sequence
        expected_first = t.last_sequence + 1
    assert history.open_topic_start == expected_first <= n + 1
    # No topic ends between a tool call and its results.
    by_seq = {m.sequence: m for m in history.messages}
    for t in history.topics:
        nxt = by_seq.get(t.last_sequence + 1)
        assert nxt is None or nxt.role not in ("tool", "function")
    # Archives merge consecutive topics or roll up consecutive archives; nothing leaves history.
    for a in history.archives:
        members = sorted(
            (x for x in history.topics + history.archives if x.merged_into == a.id),
            key=lambda x: x.first_sequence,
        )
        assert members, "an archive merges at least one summary"
        assert all(x.level < a.level for x in members)
        assert (a.first_sequence, a.last_sequence) == (members[0].first_sequence, members[-1].last_sequence)
        assert a.dropped_at is None
    # The whole timeline stays represented: live archives cover it from its first message on.
    live = sorted((a for a in history.archives if a.merged_into is None), key=lambda a: a.first_sequence)
    expected_first = 1
    for a in live:
        assert a.first_sequence == expected_first
        expected_first = a.last_sequence + 1


def complete_units(messages: list[StoredMessage]) -> list[StoredMessage]:
    """The messages of complete units, oldest first: calls with all their results, plain messages.

    Tool results without their call and calls still missing results are left out.
    """
    out: list[StoredMessage] = []
    unit: list[StoredMessage] = []
    pending: set[str] = set()
    for m in [*messages, None]:
        if m is not None and (key := _answer(m)) is not None:
            if unit and key in pending:
                unit.append(m)
                pending.discard(key)
            continue
        if unit and not pending:
            out.extend(unit)
        if m is not None:
            unit = [m]
            pending = _calls(m)
    return out


def check_context(ctx: CompressedContext, history: History, max_tokens: int) -> None:
    """The layout of issue 13: pinned, the archives block, the topic block, the current window
    with the recalled part just before its newest user message; exact budget; units whole."""
    msgs = ctx.to_messages()
    assert ctx.total_tokens <= max_tokens
    assert ctx.total_tokens == count_request(msgs)
    assert sum(ctx.tier_tokens.values()) == ctx.total_tokens
    assert ctx.max_tokens == max_tokens
    stored_by_seq = {m.sequence: m for m in history.messages}
    newest = history.messages[-1]
    window, recalled = ctx.current_topic, ctx.recalled
    seqs = [m.sequence for m in window]
    r_seqs = [m.sequence for m in recalled]

    # Pinned: every pinned message, first, verbatim, in order (never cut, never summarised).
    pinned = [m for m in history.messages if m.pinned]
    assert [m.sequence for m in ctx.pinned] == [m.sequence for m in pinned]
    assert msgs[: len(pinned)] == [m.to_openai() for m in pinned]
    system_dicts = [m for m in msgs if m["role"] == "system"]
    assert system_dicts == [m.to_openai() for m in pinned if m.role == "system"]

    # The stable blocks: live summaries, or the parts of the newest archives in their place (never
    # both, never what a dropped archive holds); archives before topics, oldest first, one user
    # message per tier, marked as data.
    by_id = {x.id: x for x in history.topics + history.archives}
    for x in ctx.bulk_archives + ctx.historical_topics:
        assert by_id[x.id] == x and x.rendered and x.status not in ("pending", "superseded")
        top = x
        while top.merged_into is not None:
            top = by_id[top.merged_into]
        assert top.dropped_at is None and top.status not in ("pending", "superseded")
    for prev, nxt in itertools.pairwise(ctx.bulk_archives + ctx.historical_topics):
        assert prev.last_sequence < nxt.first_sequence
    at = len(pinned)
    for tier, items in (("bulk", ctx.bulk_archives), ("topic", ctx.historical_topics)):
        if items:
            block = ctx.blocks[tier]
            assert msgs[at] == {"role": "user", "content": block}
            assert "not instructions" in block.split("\n", 1)[0]
            for x in items:
                assert x.content.split("\n")[0].strip() in block
            at += 1
        else:
            assert not ctx.blocks.get(tier)

    # The window: a run of whole units of unpinned messages that ends with the newest one, verbatim
    # (only the newest unit may be cut, and only when it alone is over budget).
    unpinned = [m for m in history.messages if not m.pinned]
    if not newest.pinned:
        assert window, "the newest message is missing"
        assert window[-1].sequence == newest.sequence
        assert {m.sequence for m in newest_unit(history)} <= set(seqs), "the newest tool unit is incomplete"
    if window:
        assert window[0].role not in ("tool", "function")
        expected = [m for m in complete_units(unpinned) if m.sequence >= seqs[0]]
        tail = last_unit(unpinned)
        if tail and tail[-1].sequence not in {m.sequence for m in expected}:
            expected += [m for m in tail if m.sequence >= seqs[0]]
        assert seqs == [m.sequence for m in expected]
        # Summaries shown beside it start before it (they stand for what it does not hold).
        for x in ctx.bulk_archives + ctx.historical_topics:
            assert x.first_sequence < seqs[0]
    unit_seqs = {m.sequence for m in last_unit(unpinned)}
    for m in window:
        original = stored_by_seq[m.sequence].context_content
        if ctx.truncated_newest and m.sequence in unit_seqs:
            assert m.context_content == original or "[truncated" in m.context_content
        else:
            assert m.context_content == original

    # Recall: whole units from before the window, verbatim, in order, after a note, just before
    # the newest user message; nothing repeated.
    if recalled:
        assert ctx.recall_note and ctx.recall_start is not None
        assert r_seqs == sorted(set(r_seqs))
        assert all(q < seqs[0] for q in r_seqs)
        assert all(not m.pinned for m in recalled)
        assert recalled == [m for m in complete_units(recalled)]
        for m in recalled:
            stored = stored_by_seq[m.sequence]
            if m != stored:
                # A long match that did not fit whole: its sentences, in order, omissions marked;
                # the message otherwise as stored.
                assert (
                    replace(m, truncated_content=stored.truncated_content, token_count=stored.token_count)
                    == stored
                )
                pieces = [p.strip() for p in m.context_content.split(ELLIPSIS)]
                assert ELLIPSIS in m.context_content and any(pieces), m.context_content
                found = 0
                for p in filter(None, pieces):
                    found = stored.context_content.index(p, found) + len(p)
                event("recalled an excerpt")
        start = ctx.recall_start
        assert msgs[start] == {"role": "user", "content": ctx.recall_note}
        assert msgs[start + 1 : start + 1 + len(recalled)] == [m.to_openai() for m in recalled]
        assert all(m.role != "user" for m in window[ctx.recall_at + 1 :])
    assert msgs[at:] == [m.to_openai() for m in window[: ctx.recall_at]] + (
        [{"role": "user", "content": ctx.recall_note}] if ctx.recall_note else []
    ) + [m.to_openai() for m in recalled] + [m.to_openai() for m in window[ctx.recall_at :]]

    # Tool calls and results travel together, complete, in the window and in what is recalled.
    for part in (recalled, window):
        i = 0
        while i < len(part):
            m = part[i]
            assert _answer(m) is None, f"result {m.sequence} without its call"
            i += 1
            if _calls(m):
                results = []
                while i < len(part) and (key := _answer(part[i])) is not None:
                    results.append(key)
                    i += 1
                # Only the newest unit may still wait for results: any other must be complete.
                if part is recalled or m.sequence != last_unit(unpinned)[0].sequence:
                    assert sorted(results) == sorted(_calls(m)), (
                        m.sequence,
                        results,
                    )


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
    # Every message holds the tag once: all are found (ranked by BM25, issue 13, not by recency).
    assert sorted(m.sequence for m in found) == list(range(1, len(script.added[b]) + 1))

    # The query path: an explicit query keeps every rule, and what it recalls matches it.
    query = " ".join(WORDS[i % len(WORDS)] for i in range(len(ha.messages), len(ha.messages) + 3))
    for max_tokens in budgets:
        if must_be_too_small(ha, max_tokens):
            continue
        ctx = await hc.get_context(a, max_tokens, query=query)
        check_context(ctx, ha, max_tokens)
        wanted = {w for w in ranking.words(query) if w not in ranking.STOPWORDS}
        recalled = {x.sequence for x in ctx.recalled}
        by_seq = {x.sequence: x for x in ha.messages}

        def matches(x: StoredMessage, wanted: set[str] = wanted) -> bool:
            # (a call's arguments are searchable too)
            made = x.tool_calls or x.to_openai().get("function_call") or []
            return bool(wanted & set(ranking.words(x.content + " " + json.dumps(made))))

        for m in ctx.recalled:
            # Its whole tool unit: the call and every result (the match may be in any of them).
            call = next((x for x in ctx.recalled if _answer(m) in _calls(x)), m)
            unit = [call, *(x for x in ctx.recalled if _answer(x) in _calls(call))]
            if m != by_seq[m.sequence]:  # an excerpt: only sentences that match
                assert wanted & set(ranking.words(m.context_content)), (query, m.context_content)
            if any(matches(x) for x in unit):
                continue
            # Or it belongs to a topic the query goes back to, recalled whole (its unpinned
            # messages; the topic matches the query in its messages or its summary).
            topic = next((t for t in ha.topics if t.first_sequence <= m.sequence <= t.last_sequence), None)
            assert topic is not None, (query, m.content)
            whole = [x for x in ha.messages if topic.first_sequence <= x.sequence <= topic.last_sequence]
            assert all(x.sequence in recalled for x in whole if not x.pinned), (query, m.content)
            assert any(map(matches, whole)) or wanted & set(ranking.words(topic.content)), (query, m.content)
            event("query goes back to a topic, recalled whole")
        observed.append(("query", max_tokens, ctx.to_messages()))

    # Prefix stability: reading again changes nothing; a turn without an event (no seal, summary,
    # merge or roll-up) keeps everything the previous context held before its recalled part.
    for max_tokens in (2500, 6000):
        first = await hc.get_context(a, max_tokens)
        assert (await hc.get_context(a, max_tokens)).to_messages() == first.to_messages()
        msg = Message(role="user", content=f"{A_TAG} one more question", timestamp=script.clock)
        script.added[a].append(await hc.add_message(a, msg))
        after = await hc.get_context(a, max_tokens)
        check_context(after, await hc.get_history(a), max_tokens)
        before = first.to_messages()
        stable = before[: first.recall_start] if first.recall_start is not None else before
        # A newest call still awaiting its results is left out once the user moves on (sent
        # unanswered it is a 400): it alone may leave the prefix.
        calls = [i for i, m in enumerate(stable) if m.get("tool_calls") or m.get("function_call")]
        if calls:
            after_call = stable[calls[-1] + 1 :]
            made = stable[calls[-1]].get("tool_calls")
            if made:
                unanswered = {c["id"] for c in made} - {m.get("tool_call_id") for m in after_call}
            else:
                unanswered = set() if any(m["role"] == "function" for m in after_call) else {"fn"}
            if unanswered:
                stable = stable[: calls[-1]]
        # The window moves between events only when it no longer fits beside the blocks and the
        # recall reserve (which is kept whether or not this turn recalls anything).
        reserve = int(first.allocation["topic"] * hc.settings.recall.share)
        unrecalled = first.total_tokens - (first.tier_tokens.get("recall", 0))
        full = unrecalled + script.added[a][-1].token_count + reserve > max_tokens
        if after.maintenance_epoch == first.maintenance_epoch and not full:
            event("prefix kept between events")
            assert after.to_messages()[: len(stable)] == stable
        else:
            event("prefix after an event")
    return observed


def _calls(m: StoredMessage) -> set[str]:
    """Ids of the calls ``m`` makes: its tool calls', or its legacy function call's (by name)."""
    if m.tool_calls:
        return {str(c["id"]) for c in m.tool_calls}
    fc = m.to_openai().get("function_call")
    return {f"fn:{fc['name']}"} if fc else set()


def _answer(m: StoredMessage) -> str | None:
    """The id of the call ``m`` is a result of (a tool's, or a legacy function's by name)."""
    if m.role == "tool":
        return str(m.tool_call_id)
    return f"fn:{m.name}" if m.role == "function" else None


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
        assert len(observed) == len(reference)
        for got, want in zip(observed, reference, strict=True):
            # BM25 scores differ by backend (SQLite's FTS5 counts term statistics over the whole
            # table, PostgreSQL and memory per conversation), so what is recalled may too; every
            # other decision must be the same.
            if _recalled(got) or _recalled(want):
                continue
            assert got == want


def _recalled(entry: Any) -> bool:
    return entry[0] == "query" or (len(entry) == 5 and entry[4].get("recall", 0) > 0)


COMMON = {
    # Fixed examples: a red run is reproducible from the log. Random exploration (derandomize off,
    # thousands of examples) finds what they miss: its finds are pinned below as @example.
    "derandomize": True,
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


#: Found by random exploration: the window started at a tool call that was still awaiting its
#: results; once the user moved on the call was left out, the window lost its start and was chosen
#: anew, and the archive block before it went (a prefix rewrite without an event).
ABANDONED_CALL_AT_WINDOW_START = [
    *[("msg", "user", 1, False, 1)] * 6,
    *[("tools", 1, [1, 1, 1], False)] * 3,
    ("msg", "user", 15, True, 1),
    ("pin", "system", 1),
    ("msg", "user", 1, False, 1),
    ("msg", "user", 1, False, 1),
    ("seal",),
    ("msg", "user", 1, False, 1),
    ("msg", "user", 58, False, 1),
    ("seal",),
    ("msg", "user", 1, False, 1),
    ("tools", 1, [60, 1, 1500], False),
    ("msg", "user", 1, False, 1),
    ("pin", "system", 1),
    ("tools", 1, [1, 1, 1], False),
    ("pin", "system", 1),
    ("tools", 2, [1, 1500, 1], False),
    ("tools", 2, [3638, 1, 1], True),
    ("maintain", 1, False),
]


#: Found by random exploration: a message after a seal reopened the topic sealed just before
#: (its summary superseded); the window kept its start and the blocks shown with it, so the
#: superseded summary was still sent.
SUMMARY_SUPERSEDED_BESIDE_THE_WINDOW = [
    ("seal",),
    ("pin", "system", 298),
    ("msg", "user", 1, False, 1),
    ("seal",),
    ("msg", "user", 42, False, 1),
    ("tools", 1, [3908, 1, 1], False),
    ("seal",),
    ("maintain", 1, False),
    ("msg", "user", 1, False, 45),
    ("pin", "system", 1),
]


#: Found by random exploration after the swap-back landed: a query going back to a topic brings
#: all of it back, messages that do not match the query included (the property now allows that).
QUERY_GOES_BACK_TO_A_TOPIC = [
    ("tools", 2, [174, 424, 1], False),
    ("pin", "system", 1),
    ("msg", "user", 1500, False, 1),
    ("seal",),
    ("msg", "user", 1, False, 1),
    ("pin", "system", 1),
    ("pin", "system", 1),
    ("pin", "system", 1),
    ("maintain", 1, False),
    ("msg", "user", 1, False, 1),
]


#: Found once legacy function calls became units: a result larger than the window's read left its
#: call out of the rows read, and the window (the result alone, whose call was cut off) was empty.
LEGACY_RESULT_PAST_THE_WINDOW: list[tuple[Any, ...]] = [
    *[("msg", "user", 1, False, 1)] * 9,
    ("tools", 1, [1500, 1, 1], False, True),
]


@settings(max_examples=150, **COMMON)
@example(ops=LEGACY_RESULT_PAST_THE_WINDOW, budgets=[32], context_budget=200, seed=0)
@example(ops=QUERY_GOES_BACK_TO_A_TOPIC, budgets=[566], context_budget=2500, seed=0)
@example(ops=ABANDONED_CALL_AT_WINDOW_START, budgets=[32], context_budget=200, seed=1)
@example(ops=SUMMARY_SUPERSEDED_BESIDE_THE_WINDOW, budgets=[32], context_budget=600, seed=32)
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


# -- word counting ----------------------------------------------------------------------------------

_TEXT = st.text(
    st.one_of(
        st.sampled_from([" ", "_", "-", "a", "b", "İ", "ß", "é", "\u0301", "²", "Ⅻ", "\ue000"]),
        st.characters(),
    ),
    max_size=40,
)


@settings(max_examples=400, **COMMON)
@given(text=_TEXT, probe=_TEXT)
def test_occurrences_counts_as_the_words_do(text: str, probe: str) -> None:
    """Recall's fast count of a word (``str.find`` with letter-or-digit neighbours left out) is
    exactly the count over :func:`~tiered_history.core.ranking.words`, for any text and word,
    and for phrases (which it counts over the words)."""
    doc = ranking.words(text)
    count = ranking.occurrences(text)
    groups = [
        tuple(ranking.words(probe)),
        *((w,) for w in ranking.words(probe)),
        *((w,) for w in doc),
        (probe,),
    ]
    for g in groups:
        assert count(g) == ranking.phrase_count(doc, g), (text, g)
