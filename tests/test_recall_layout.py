"""What recall puts in the context: the core's choice among scored candidates (no store, no model)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiered_history.core.assembly import (
    Recalled,
    Rows,
    Shares,
    _Block,
    _line,
    _recall,
    assemble,
    group_units,
)
from tiered_history.core.render import NOTE_SPANS, recall_note
from tiered_history.core.state import WindowMark
from tiered_history.core.units import unit_of
from tiered_history.models import CompressedContext, StoredMessage, Summary
from tiered_history.store.base import newest_window
from tiered_history.tokens import TokenCounter

COUNTER = TokenCounter()
T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
SHARES = Shares(0.5, 0.3, 0.2)


def message(seq: int, text: str, role: str = "user") -> StoredMessage:
    n = COUNTER.message_tokens({"role": role, "content": text})
    return StoredMessage("c", seq, role, text, T0 + timedelta(minutes=seq), n, n)  # type: ignore[arg-type]


def summary(id_: int, first: int, last: int, text: str) -> Summary:
    n = COUNTER.count(text) + 12
    return Summary(
        id_,
        "c",
        "topic",
        id_,
        first,
        last,
        text,
        text,
        n,
        n * 4,
        T0,
        T0,
        "summarized",  # type: ignore[arg-type]
    )


def measure(text: str) -> int:
    return COUNTER.message_tokens({"role": "user", "content": text})


def filler(seq: int) -> str:
    return f"Item {seq}: the delivery van for depot {seq} leaves at {seq % 12 + 1} o'clock with crates."


def _small_topic_after_a_long_one() -> Rows:
    old = [message(i, filler(i)) for i in range(1, 61)]
    newest = [message(61, "Noted.", "assistant"), message(62, "Which van leaves for which depot?")]
    return Rows(
        pinned=[],
        recent=[*old, *newest],
        end_position=sum(m.token_count for m in [*old, *newest]),
        topics=[summary(100, 1, 60, "Vans and depots were listed.")],
        recall=[Recalled(70.0 - i, messages=(m,)) for i, m in enumerate(old)],
        summarized_upto=60,
    )


def _at_1k(rows: Rows) -> CompressedContext:
    """The short context (relevance layout) of ``rows`` at 1,000 tokens."""
    return assemble(conversation_id="c", max_tokens=1000, shares=SHARES, counter=COUNTER, rows=rows)


def _recall_took_the_room(ctx: CompressedContext) -> bool:
    """Recall's matches took more than the topic tier's share, the earlier topic's summary's room too."""
    return ctx.tier_tokens["recall"] > ctx.allocation["topic"] and not ctx.topic_summaries


def test_at_a_small_budget_room_the_window_and_summaries_leave_goes_to_recall() -> None:
    """The open topic is two messages and the rest is summarised: the room the window leaves goes
    to what matches the newest message (not only the topic tier's share of it), ahead of the
    summary, which is merely recent."""
    rows = _small_topic_after_a_long_one()
    ctx = _at_1k(rows)
    assert ctx.current_topic[-1].sequence == 62
    assert ctx.tier_tokens["recall"] > ctx.allocation["topic"]
    assert ctx.tier_tokens["current"] < ctx.allocation["current"] // 2
    assert ctx.total_tokens <= 1000
    # Best first: the recalled ones are the best-scoring (the oldest here), shown oldest first.
    seqs = [m.sequence for m in ctx.recalled]
    assert seqs == list(range(1, len(seqs) + 1))
    assert 1000 - ctx.total_tokens < rows.recent[0].token_count + 8  # nothing more would have fitted


def test_without_redistribution_recall_keeps_to_the_topic_tiers_share() -> None:
    shares = Shares(0.5, 0.3, 0.2, redistribute=False)
    ctx = assemble(
        conversation_id="c",
        max_tokens=1000,
        shares=shares,
        counter=COUNTER,
        rows=_small_topic_after_a_long_one(),
    )
    assert 0 < ctx.tier_tokens["recall"] + ctx.tier_tokens["topic"] <= ctx.allocation["topic"]


def test_recall_prefers_what_adds_something_new_to_what_repeats_a_pick() -> None:
    """A message inside a recalled summary's topic repeats part of it: while the room is short,
    a match from elsewhere goes first; repeats only fill room nothing new fits in."""
    msgs = [message(i, filler(i)) for i in range(1, 31)]
    window = [message(31, "Which van leaves for which depot?")]
    first_topic = summary(100, 1, 10, "Vans one to ten and their depots were listed with times.")
    candidates = [
        Recalled(10.0, summary=first_topic),
        Recalled(9.0, messages=(msgs[2],)),
        Recalled(8.5, messages=(msgs[4],)),
        Recalled(5.0, messages=(msgs[14],)),
        Recalled(4.0, messages=(msgs[16],)),
    ]
    rows = Rows(pinned=[], recent=[*msgs, *window], end_position=0, topics=[first_topic], recall=candidates)
    # Room for the summary and two messages with their note, and not for a fourth item.
    fresh = [candidates[0], *candidates[3:]]
    _, _, note_tokens = _recall(
        replace(rows, recall=fresh), window, _Block("topic"), _Block("bulk"), 2000, measure
    )
    room = note_tokens + msgs[14].token_count + msgs[16].token_count + 12  # (picks estimate the note)
    picked, note, tokens = _recall(rows, window, _Block("topic"), _Block("bulk"), room, measure)
    assert note and tokens + sum(m.token_count for c in picked for m in c.messages) <= room
    assert [(c.first, c.last) for c in picked] == [(1, 10), (15, 15), (17, 17)]
    # With room for everything, the repeats come too.
    picked, _, _ = _recall(rows, window, _Block("topic"), _Block("bulk"), 2000, measure)
    assert [(c.first, c.last) for c in picked] == [(1, 10), (3, 3), (5, 5), (15, 15), (17, 17)]


def test_a_message_said_again_word_for_word_is_recalled_once() -> None:
    """Six copies of the same question take room a message saying something else could have: one
    copy is recalled (case and spacing aside), then the next best that says something new."""
    asked = [
        message(s, "Can I change the colour of the rug?" if s % 2 else "can i  change the colour OF the rug?")
        for s in range(1, 7)
    ]
    answer = message(9, "I want the terracotta rug, not the grey one, for the colour.")
    window = [message(31, "What colour did I pick for the rug?")]
    candidates = [
        *(Recalled(10.0 - k / 10, messages=(m,)) for k, m in enumerate(asked)),
        Recalled(5.0, messages=(answer,)),
    ]
    rows = Rows(pinned=[], recent=[*asked, answer, window[0]], end_position=0, recall=candidates)
    picked, _, _ = _recall(rows, window, _Block("topic"), _Block("bulk"), 2000, measure)
    assert [c.first for c in picked] == [1, 9]


def test_a_sealed_range_keeps_no_unit_still_awaiting_results() -> None:
    """Only the newest unit of a live window may await its results; in a sealed range (a topic
    recalled whole) a call without all its results is left out like any other."""
    call = replace(
        message(2, "", "assistant"),
        tool_calls=[
            {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in "ab"
        ],
    )
    answer = replace(message(3, "result a", "tool"), tool_call_id="a")
    msgs = [message(1, "Look both up."), call, answer]
    assert group_units(msgs) == [[msgs[0]], [call, answer]]
    assert group_units(msgs, open_end=False) == [[msgs[0]]]


def legacy_call(seq: int, name: str = "get_time") -> StoredMessage:
    """An assistant message making an OpenAI legacy ``function_call`` (kept in ``extra``)."""
    return replace(message(seq, "", "assistant"), extra={"function_call": {"name": name, "arguments": "{}"}})


def legacy_result(seq: int, name: str = "get_time") -> StoredMessage:
    return replace(message(seq, "12:00", "function"), name=name)


def test_a_legacy_function_call_and_its_result_are_one_unit() -> None:
    """OpenAI's legacy function calling pairs like tool calls: the ``function_call`` and the
    ``role: "function"`` result naming it travel together; an abandoned call and a result whose
    call lies before the messages read are left out; a result sent with no call at all (a bot
    logging function output on its own) stays a message of its own, as stored."""
    ask, call, result, reply = (
        message(1, "What time is it?"),
        legacy_call(2),
        legacy_result(3),
        message(4, "Noon."),
    )
    assert group_units([ask, call, result, reply]) == [[ask], [call, result], [reply]]
    # The newest unit may await its result; an older one may not.
    assert group_units([ask, call]) == [[ask], [call]]
    assert group_units([ask, call, reply]) == [[ask], [reply]]
    assert group_units([ask, call], open_end=False) == [[ask]]
    # A result of another function does not complete the call.
    other = legacy_result(3, "get_date")
    assert group_units([ask, call, other, reply]) == [[ask], [other], [reply]]
    # Paging cut its call off: left out; on its own mid-conversation: kept.
    assert group_units([result, reply]) == [[reply]]
    lone = legacy_result(2)
    assert group_units([ask, lone, reply]) == [[ask], [lone], [reply]]


def test_recall_completes_a_legacy_unit_from_either_end() -> None:
    ask, call, result, reply = (
        message(1, "What time is it?"),
        legacy_call(2),
        legacy_result(3),
        message(4, "Noon."),
    )
    around = {m.sequence: m for m in (ask, call, result, reply)}
    assert unit_of(result, around) == (call, result)
    assert unit_of(call, around) == (call, result)
    lone = legacy_result(5)  # a function result a bot stored with no call before it
    assert unit_of(lone, {**around, 5: lone}) == (lone,)
    del around[3]
    assert unit_of(call, around) == ()  # no result: incomplete, not recalled


# -- the recall reserve beside a window that keeps its start (cacheable budgets) -------------------

BUDGET = 4000
GROWTH = 1000
RESERVE = int(int((BUDGET - 3) * SHARES.topics) * SHARES.recall)


def _window_of(tokens: int) -> list[StoredMessage]:
    """Messages from sequence 1 on whose framed costs add up to more than ``tokens`` - 40."""
    msgs: list[StoredMessage] = []
    while sum(m.token_count for m in msgs) <= tokens - 40:
        msgs.append(message(len(msgs) + 1, filler(len(msgs) + 1)))
    return msgs


def _kept(msgs: list[StoredMessage], epoch: int) -> Rows:
    """A window marked as starting at message 1 when the conversation's event count was 1."""
    return Rows(
        pinned=[],
        recent=msgs,
        end_position=sum(m.token_count for m in msgs),
        mark=WindowMark(1, BUDGET, 1),
        epoch=epoch,
        growth=GROWTH,
    )


def _assemble(rows: Rows) -> CompressedContext:
    return assemble(conversation_id="c", max_tokens=BUDGET, shares=SHARES, counter=COUNTER, rows=rows)


def test_after_an_event_a_kept_start_needs_the_growth_room_not_the_recall_reserve_too() -> None:
    """Recall uses the room the current topic has not grown into yet: after an event the window
    keeps its start (and the provider's cached prefix) when it leaves the growth until the next
    seal, even though that room and the recall reserve together would not fit."""
    msgs = _window_of(BUDGET - 3 - GROWTH - RESERVE + 200)
    window = sum(m.token_count for m in msgs)
    assert window + GROWTH <= BUDGET - 3 < window + GROWTH + RESERVE
    ctx = _assemble(_kept(msgs, 2))
    assert ctx.current_topic[0].sequence == 1
    # With less than the growth room left it moves (the event allows it).
    msgs = _window_of(BUDGET - 3 - GROWTH + 60)
    ctx = _assemble(_kept(msgs, 2))
    assert ctx.current_topic[0].sequence > 1


def test_between_events_the_window_grows_into_the_recall_reserve() -> None:
    """Between events the kept start stays while the window fits at all, the recall reserve
    included: moving it then would rewrite the cached prefix without an event."""
    msgs = _window_of(BUDGET - 3 - RESERVE // 2)
    assert sum(m.token_count for m in msgs) + RESERVE > BUDGET - 3
    ctx = _assemble(_kept(msgs, 1))
    assert ctx.current_topic[0].sequence == 1
    assert ctx.total_tokens <= BUDGET


def test_without_redistribution_an_event_brings_a_kept_window_back_within_its_share() -> None:
    """Tiers that keep to their shares: between events the kept window may outgrow its share
    (moving it would rewrite the cached prefix), but after an event it is chosen within it."""
    shares = Shares(0.5, 0.3, 0.2, redistribute=False)
    msgs = _window_of(BUDGET - 3 - GROWTH - 100)
    window = sum(m.token_count for m in msgs)
    assert window + GROWTH > int((BUDGET - 3) * shares.current) and window + GROWTH <= BUDGET - 3

    def start(epoch: int) -> int:
        rows = _kept(msgs, epoch)
        ctx = assemble(conversation_id="c", max_tokens=BUDGET, shares=shares, counter=COUNTER, rows=rows)
        assert ctx.total_tokens <= BUDGET
        return ctx.current_topic[0].sequence

    assert start(1) == 1
    assert start(2) > 1


def test_a_one_word_message_recalls_within_its_reserve_and_keeps_the_timelines_summaries() -> None:
    """A one-word newest message ("Vans?") is a weak query: in a short context it still recalls,
    but only within the recall reserve; the summary of the earlier topic stays. Two words (an
    ordinary question) take the room first, as above."""
    rows = _small_topic_after_a_long_one()
    weak = replace(rows, query="Vans?")
    ctx = _at_1k(weak)
    assert [t.id for t in ctx.topic_summaries] == [100]
    assert ctx.tier_tokens["recall"] > 0
    assert ctx.total_tokens <= 1000
    strong = _at_1k(replace(rows, query="Which van leaves for which depot?"))
    assert strong.tier_tokens["recall"] > ctx.allocation["topic"]
    assert strong.tier_tokens["recall"] > ctx.tier_tokens["recall"]
    assert not strong.topic_summaries  # the strong query's matches took the summary's room
    # A query the caller gave (get_context(query="Vans?")) is taken as meant, however short.
    assert _recall_took_the_room(_at_1k(replace(weak, explicit=True)))


def test_a_message_going_on_with_the_window_recalls_within_its_reserve() -> None:
    """A newest message most of whose words the window holds already (the conversation it goes
    on with) is a weak query too: in a short context it recalls within its reserve and the
    earlier topic's summary stays. The same question after a window that does not hold its
    words goes back to the past: its matches take the room first."""
    rows = _small_topic_after_a_long_one()
    question = "Which van leaves for which depot?"
    said = message(61, "The van for depot four leaves at five; the other van leaves later.", "assistant")
    going_on = replace(rows, recent=[*rows.recent[:60], said, rows.recent[61]], query=question)
    ctx = _at_1k(going_on)
    assert [m.sequence for m in ctx.current_topic] == [61, 62]
    assert [t.id for t in ctx.topic_summaries] == [100]
    assert ctx.tier_tokens["recall"] > 0  # within its reserve first, then in the room left
    assert ctx.total_tokens <= 1000
    assert _recall_took_the_room(_at_1k(replace(rows, query=question)))
    # The newest message's own words do not count: alone in the window, it goes back to the past.
    asked = "Van depot van depot?"
    alone = replace(rows, recent=[*rows.recent[:61], message(62, asked)], query=asked)
    assert _recall_took_the_room(_at_1k(alone))
    # A query the caller gave is taken as meant.
    assert _recall_took_the_room(_at_1k(replace(going_on, explicit=True)))


def test_going_on_counts_whole_words_of_the_other_messages() -> None:
    from tiered_history.core.assembly import _continues

    asked = "Which VAN leaves for the depot?"  # recall words: van, leaves, depot
    said = [message(1, "The vans' DEPOT-4 opens at five.", "assistant"), message(2, asked)]
    assert not _continues(asked, said)  # "depot" only: "vans" is not "van"; the question is not counted
    said[0] = message(1, "Every van: depot 4, leaves at five.", "assistant")
    assert _continues(asked, said)
    assert _continues("Zürich depot van?", [message(1, "ZÜRICH depot"), message(2, "Zürich depot van?")])
    assert not _continues("?!", said)  # no recall word at all


def test_a_question_answered_already_recalls_only_into_room_left() -> None:
    """When the newest message is the assistant's answer (a context read before the user speaks
    again), the user message recall looks for has been answered: recall takes no room first,
    only what the summaries and the window leave, and the timeline's summaries stay. An answer
    that calls a tool is still answering it."""
    rows = _small_topic_after_a_long_one()
    question = "Which van leaves for which depot?"
    answer = message(63, "Noted, I will check.", "assistant")
    answered = replace(rows, recent=[*rows.recent, answer], query=question)
    ctx = _at_1k(answered)
    assert [t.id for t in ctx.topic_summaries] == [100]
    assert ctx.tier_tokens["recall"] > 0
    assert ctx.total_tokens <= 1000
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    calling = replace(answer, tool_calls=[call])
    assert _recall_took_the_room(_at_1k(replace(answered, recent=[*rows.recent, calling])))


def test_query_words_counts_unspaced_scripts_by_characters() -> None:
    from tiered_history.core.ranking import query_words

    assert query_words("") == query_words("ok thanks") == 0
    assert query_words("nice") == query_words("Budget?") == query_words("thanks Anna") == 1
    assert query_words("what was the budget for the remote?") == 2
    assert query_words("预算是多少") == 2  # one run of five characters: a question, not a word
    assert query_words("ราคาเท่าไหร่") >= 2


def _long_answer(seq: int) -> StoredMessage:
    text = " ".join(
        f"Point {k}: the crates for depot {k} are stacked by the north door and counted twice."
        for k in range(1, 30)
    )
    text += " The blue van was repainted on Tuesday. " + " ".join(
        f"Note {k}: the loading bay stays closed during the inspection of shelf {k}." for k in range(30)
    )
    return message(seq, text, "assistant")


def test_a_long_match_that_does_not_fit_is_recalled_as_its_matching_sentences() -> None:
    long = _long_answer(5)
    msgs = (
        [message(i, filler(i)) for i in range(1, 5)] + [long] + [message(i, filler(i)) for i in range(6, 12)]
    )
    newest = message(12, "When was the blue van repainted?")
    rows = Rows(
        pinned=[],
        recent=[*msgs, newest],
        end_position=0,
        recall=[Recalled(20.0, messages=(long,)), Recalled(3.0, messages=(msgs[1],))],
        query=newest.content,
    )
    assert long.token_count > 500
    picked, _, tokens = _recall(rows, [newest], _Block("topic"), _Block("bulk"), 200, measure)
    assert [c.first for c in picked] == [2, 5]
    cut = picked[1].messages[0]
    assert cut.content == long.content  # the stored message is untouched; the context shows a cut
    shown = cut.to_openai()["content"]
    assert "The blue van was repainted on Tuesday." in shown
    assert shown.startswith("[…] ") and shown.endswith(" […]")
    assert cut.token_count == COUNTER.message_tokens(cut.to_openai())  # exact, framing included
    assert tokens + sum(c.messages[0].token_count for c in picked) <= 200
    # With no room for even one matching sentence, nothing of it is shown.
    picked, _, _ = _recall(rows, [newest], _Block("topic"), _Block("bulk"), 60, measure)
    assert all(c.first != 5 for c in picked)


def test_a_tool_unit_is_never_cut_for_recall() -> None:
    call = StoredMessage(
        "c", 3, "assistant", "", T0, 20, 20, tool_calls=[{"id": "t1", "type": "function",
        "function": {"name": "van", "arguments": "{}"}}]
    )  # fmt: skip
    result_text = " ".join(f"Van {k} was repainted blue on day {k}." for k in range(80))
    n = COUNTER.message_tokens({"role": "tool", "content": result_text, "tool_call_id": "t1"})
    result = StoredMessage("c", 4, "tool", result_text, T0, n, n, tool_call_id="t1")
    newest = message(9, "When was the blue van repainted?")
    rows = Rows(
        pinned=[],
        recent=[message(1, "hi there"), call, result, newest],
        end_position=0,
        recall=[Recalled(20.0, messages=(call, result))],
        query=newest.content,
    )
    picked, _, _ = _recall(rows, [newest], _Block("topic"), _Block("bulk"), 200, measure)
    assert picked == []


def test_excerpts_are_tried_a_bounded_number_of_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cutting a long text costs a split and a few counts: the best-scoring long matches get it,
    not every candidate of a read."""
    import tiered_history.core.assembly as assembly

    # Each matching sentence alone is some 90 tokens: none fits the room left.
    said = " ".join(f"the blue van {k} was repainted with care" for k in range(12)) + "."
    long = [
        message(i, f"{said} Then nothing else happened at all. {said}", "assistant") for i in range(1, 11)
    ]
    newest = message(20, "When was the blue van repainted?")
    rows = Rows(
        pinned=[],
        recent=[*long, newest],
        end_position=0,
        recall=[Recalled(30.0 - i, messages=(m,)) for i, m in enumerate(long)],
        query=newest.content,
    )
    calls: list[int] = []
    real = assembly._excerpt

    def counted(m: StoredMessage, *args: Any) -> StoredMessage | None:
        calls.append(m.sequence)
        return real(m, *args)

    monkeypatch.setattr(assembly, "_excerpt", counted)
    # Room for the note and a little more: no sentence of these answers fits.
    picked, _, _ = _recall(rows, [newest], _Block("topic"), _Block("bulk"), 100, measure)
    assert picked == [] and calls == [1, 2, 3, 4]


def test_the_recall_note_names_each_stretch_recalled() -> None:
    """Excerpts from far apart must not read as one stretch of conversation: the note names each
    span (adjacent ones as one), and past a few of them their bounds and how many there are."""
    msgs = [message(i, filler(i)) for i in range(1, 31)]
    window = [message(31, "Which van leaves for which depot?")]
    first_topic = summary(100, 1, 10, "Vans one to ten and their depots were listed with times.")
    candidates = [
        Recalled(10.0, summary=first_topic),
        Recalled(8.5, messages=(msgs[10],)),  # 11: right after the summary's range
        Recalled(5.0, messages=(msgs[14],)),
        Recalled(4.0, messages=(msgs[16],)),
    ]
    rows = Rows(pinned=[], recent=[*msgs, *window], end_position=0, topics=[first_topic], recall=candidates)
    picked, note, tokens = _recall(rows, window, _Block("topic"), _Block("bulk"), 2000, measure)
    assert [(c.first, c.last) for c in picked] == [(1, 10), (11, 11), (15, 15), (17, 17)]
    assert note.startswith("[Earlier conversation, recalled (messages 1–11, 15, 17; ")
    assert tokens == measure(note)
    day = T0
    assert "(message 7; " in recall_note([(7, 7)], day, day)
    many = [(10 * k, 10 * k + 2) for k in range(1, NOTE_SPANS + 2)]
    expected = f"({NOTE_SPANS + 1} excerpts of messages 10–{10 * (NOTE_SPANS + 1) + 2}; "
    assert expected in recall_note(many, day, day)


def test_recall_is_never_empty_while_a_match_fits_in_its_room() -> None:
    """Picks are made against an estimate of the note; a pick that does not fit once the note is
    measured goes, and the room is chosen again without it. It once went with nothing in its
    place: a chat's context had nothing recalled at one room and 14 messages at a smaller one."""
    msgs = [message(i, filler(i)) for i in range(1, 31)]
    window = [message(31, "Which van leaves for which depot?")]
    # A long summary, best match: its dated line makes the note longer than the estimate.
    text = " ".join(f"Van {i} leaves for depot {i} at {i} am." for i in range(1, 30))
    long_topic = replace(summary(100, 1, 10, text), ended_at=T0 + timedelta(days=60))
    # Its cost as stored: its dated line (what the note carries), as the summary pipeline counts it.
    long_topic = replace(long_topic, token_count=COUNTER.count(_line(long_topic)) + 1)
    candidates = [Recalled(10.0, summary=long_topic), Recalled(5.0, messages=(msgs[14],))]
    rows = Rows(pinned=[], recent=[*msgs, *window], end_position=0, topics=[], recall=candidates)
    _, _, alone = _recall(
        replace(rows, recall=candidates[1:]), window, _Block("topic"), _Block("bulk"), 2000, measure
    )
    # The small match with its note, and the margin the picks allow the note's estimate.
    small = alone + msgs[14].token_count + 16
    for room in range(small, long_topic.token_count + 200):
        picked, _, tokens = _recall(rows, window, _Block("topic"), _Block("bulk"), room, measure)
        assert picked, room
        assert tokens + sum(m.token_count for c in picked for m in c.messages) <= room


def test_beside_a_newest_tool_unit_too_large_for_the_blocks_what_still_fits_of_them_is_shown() -> None:
    """A tool result that leaves no room for the blocks and the recall reserve still leaves some: the
    archives (the whole timeline at its coarsest) fill it, rather than no summary at all."""
    archive = replace(summary(1, 1, 100, "Archive: the depot plan, vans and crates. " * 90), tier="bulk")
    old = [message(s, filler(s), "user" if s % 2 else "assistant") for s in range(1, 101)]
    call = replace(
        message(101, "", "assistant"),
        tool_calls=[{"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    )
    big = "result " * 2800
    n = COUNTER.message_tokens({"role": "tool", "content": big, "tool_call_id": "t1"})
    result = replace(message(102, big, "tool"), token_count=n, full_token_count=n, tool_call_id="t1")
    rows = Rows(
        pinned=[],
        recent=[*old, call, result],
        end_position=sum(m.token_count for m in (*old, call, result)),
        archives=[archive],
        summarized_upto=100,
        growth=GROWTH,
    )
    unit = call.token_count + n
    assert unit + archive.token_count + RESERVE > BUDGET - 3 > unit + archive.token_count + 20
    ctx = _assemble(rows)
    assert [m.sequence for m in ctx.current_topic] == [101, 102]
    assert ctx.bulk_archives == [archive]
    assert ctx.total_tokens <= BUDGET


@given(
    st.lists(st.tuples(st.integers(0, 40), st.sampled_from(["user", "assistant", "tool"])), max_size=30),
    st.integers(-5, 400),
)
def test_the_newest_window_is_the_newest_messages_up_to_the_cap_and_their_tool_unit(
    spec: list[tuple[int, str]], cap: int
) -> None:
    """The window read: newest first, messages are taken while fewer tokens than the cap are
    taken, and past it while the oldest taken is a tool result (its call comes too)."""
    msgs = [replace(message(i, "x", role), token_count=n) for i, (n, role) in enumerate(spec, 1)]
    out: list[StoredMessage] = []
    tokens = 0
    for m in reversed(msgs):
        if tokens >= cap and (not out or out[-1].role != "tool"):
            break
        out.append(m)
        tokens += m.token_count
    assert newest_window(msgs, cap) == out[::-1]


@given(st.lists(st.sampled_from(["user", "assistant", "call", "tool"]), max_size=20))
def test_units_group_each_call_with_its_results(roles: list[str]) -> None:
    """Every message its own unit but a call with its results; results without their call and
    calls left unanswered (but the newest) are left out: with tool messages or without."""
    msgs = []
    for i, role in enumerate(roles, 1):
        m = message(i, f"m{i}", "assistant" if role == "call" else role)
        if role == "call":
            m = replace(m, tool_calls=[{"id": f"c{i}", "type": "function", "function": {"name": "f"}}])
        elif role == "tool":
            m = replace(m, tool_call_id=f"c{i - 1}")
        msgs.append(m)
    units = group_units(msgs)
    seqs = [m.sequence for u in units for m in u]
    assert seqs == sorted(set(seqs))
    for u in units:
        assert len(u) == 1 or (u[0].tool_calls and all(m.role == "tool" for m in u[1:]))
    if not any(m.role == "tool" or m.tool_calls for m in msgs):
        assert units == [[m] for m in msgs]
