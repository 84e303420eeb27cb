"""The content detector: terms, state, incremental == batch, bounded state, confirmation window."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import zlib
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiered_history.core import cohesion
from tiered_history.core.boundaries import COHESION, BoundaryRules, Incoming, OpenTopic, decide
from tiered_history.core.cohesion import (
    CohesionParams,
    CohesionState,
    observe,
    size_keep,
    term_ids,
    terms,
)

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)

PASTA = [
    "How long should I boil fresh pasta for carbonara?",
    "Fresh pasta needs two or three minutes; dried spaghetti about nine.",
    "And the carbonara sauce, eggs and pecorino only, no cream?",
    "Yes: eggs, pecorino, guanciale and pepper. Toss the pasta off the heat.",
    "Guanciale or pancetta for the carbonara?",
    "Guanciale is traditional; pancetta works if you cannot find it.",
]
ENGINE = [
    "My car engine rattles when accelerating uphill.",
    "A rattling engine under load often means loose heat shields or worn timing chain tensioners.",
    "The mechanic mentioned the timing chain, expensive repair?",
]


def rules(**over: object) -> BoundaryRules:
    base = BoundaryRules(
        explicit=True,
        temporal=True,
        size=True,
        phrases=("new topic",),
        trigger_roles=("user",),
        silence=timedelta(minutes=30),
        size_limit=100_000,
    )
    fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
    fields.update(over)
    return BoundaryRules(**fields)  # type: ignore[arg-type]


def replay(
    texts: list[str], r: BoundaryRules, roles: list[str] | None = None
) -> list[tuple[int, str | None, int]]:
    """Feed ``texts`` through ``decide`` as the engine would; (index, reason, keep) of each decision."""
    out = []
    start, messages, tokens, state = 0, 0, 0, None
    cuts: list[int] = []
    for i, text in enumerate(texts):
        role = roles[i] if roles else ("user" if i % 2 == 0 else "assistant")
        topic = OpenTopic(
            messages=messages,
            tokens=tokens,
            last_timestamp=T0 + timedelta(seconds=30 * i) if i else None,
            tool_call_open=False,
            start=start,
            detector=state,
            last_seal_start=cuts[-1] if cuts else None,
        )
        d = decide(r, topic, Incoming(role, text, T0 + timedelta(seconds=30 * (i + 1)), 20, False, False))
        state = d.detector
        out.append((i, d.reason, d.keep))
        if d.reason == "unseal":
            start = cuts.pop()
            messages = i - start
        elif d.reason is not None:
            cuts.append(start)
            start, messages = i - d.keep, d.keep
        messages += 1
        tokens = 20 * messages
    return out


# -- terms ----------------------------------------------------------------------------------------------


def test_terms_drop_stop_words_markup_and_stem_lightly() -> None:
    assert terms("I think the cats are sleeping {vocalsound} <b>here</b>") == ["cat", "sleep"]
    assert terms("Dogs, dogs and more DOGS!") == ["dog"]
    assert terms("see https://example.com/page for details") == ["detail"]
    assert terms("") == [] and terms("ok yeah lol") == []
    assert terms("话题很有意思") == ["话题", "题很", "很有", "有意", "意思"]  # pairs in unspaced scripts
    assert len(terms(" ".join(f"word{chr(97 + i % 26)}{chr(97 + i // 26)}x" for i in range(200)))) == 24


def test_term_ids_are_stable_crc32_values() -> None:
    assert term_ids("cats") == [zlib.crc32(b"cat") & 0xFFFFFF]
    assert term_ids("Cats and dogs") == term_ids("cat dog")


def test_state_does_not_depend_on_the_process_hash_seed() -> None:
    code = (
        "from tiered_history.core.boundaries import *;"
        "from tests.test_cohesion import PASTA, ENGINE, replay, rules;"
        "import tiered_history.core.cohesion as c;"
        "print(c.CohesionState.from_json(None).to_json());"
        "print(replay(PASTA + ENGINE, rules()))"
    )
    outs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        outs.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout)
    assert len(outs) == 1 and "cohesion" in outs.pop()


# -- state ------------------------------------------------------------------------------------------------


def feed(state: CohesionState, texts: list[str], params: CohesionParams | None = None) -> list[object]:
    params = params or CohesionParams()
    seen = []
    for i, text in enumerate(texts):
        o = observe(
            state, params, role="user" if i % 2 == 0 else "assistant", text=text, tokens=20, may_open=True
        )
        seen.append((o.words, o.shift_keep))
    return seen


def test_round_trip_is_exact() -> None:
    fresh = CohesionState()
    assert CohesionState.from_json(fresh.to_json()) == fresh
    state = CohesionState()
    feed(state, PASTA * 40 + ENGINE)  # enough terms to fill and flip a filter generation
    text = state.to_json()
    cohesion._PARSED.clear()  # parse it for real, not from the cache
    again = CohesionState.from_json(text)
    assert again == state and again.to_json() == text


def test_cached_state_is_not_changed_by_later_use_of_the_original() -> None:
    state = CohesionState()
    feed(state, PASTA)
    text = state.to_json()
    feed(state, ENGINE)  # the caller keeps using its object
    assert CohesionState.from_json(text).to_json() == text


@pytest.mark.parametrize("bad", ["", "{", "[]", '{"v": 99}', '{"v":1}', '{"v":1,"s":1,"r":"!!"}', "null"])
def test_damaged_or_foreign_state_restarts_fresh(bad: str) -> None:
    assert CohesionState.from_json(bad) == CohesionState()


def test_incremental_equals_batch() -> None:
    convo = PASTA + ENGINE + ["ok", ""] + PASTA[:2] + ENGINE
    batch = CohesionState()
    expected = feed(batch, convo)
    text: str | None = None
    got = []
    for i, t in enumerate(convo):
        cohesion._PARSED.clear()  # as if every message were handled by a fresh process
        state = CohesionState.from_json(text)
        got.extend(feed_one(state, t, i))
        text = state.to_json()
    assert got == expected
    assert text == batch.to_json()


def feed_one(state: CohesionState, text: str, i: int) -> list[object]:
    o = observe(
        state,
        CohesionParams(),
        role="user" if i % 2 == 0 else "assistant",
        text=text,
        tokens=20,
        may_open=True,
    )
    return [(o.words, o.shift_keep)]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.text(min_size=0, max_size=400), min_size=1, max_size=60), st.randoms(use_true_random=False)
)
def test_state_stays_small_whatever_is_said(texts: list[str], rnd: random.Random) -> None:
    state = CohesionState()
    for i, t in enumerate(texts):
        observe(
            state,
            CohesionParams(),
            role=rnd.choice(["user", "assistant", "tool"]),
            text=t,
            tokens=i,
            may_open=True,
        )
        assert len(state.to_json().encode()) <= 2048


# Words of ASCII text take a quicker pattern (cohesion's terms, the stored word count): the
# same words as the general one, for any ASCII text, markup, digits and apostrophes included.
_ASCII_TEXT = st.lists(
    st.sampled_from([*"abcXYZ019 '_-.,?!{}<>/:\n\t", "http://x.y", "don't", "New topic", "{vocalsound}"]),
    max_size=80,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(_ASCII_TEXT)
def test_ascii_text_has_the_words_the_general_pattern_finds(text: str) -> None:
    from tiered_history.core.ranking import word_count, words

    cleaned = cohesion._clean(text)
    assert cleaned.isascii()
    found = [w.decode() if isinstance(w, bytes) else w for w in cohesion._words(cleaned)]  # bytes: ASCII
    assert found == cohesion._WORD.findall(cleaned)
    assert word_count(text) == len(words(text))


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_any_text_has_the_words_the_general_pattern_finds(text: str) -> None:
    from tiered_history.core.ranking import word_count, words

    cleaned = cohesion._clean(text)
    found = [w.decode() if isinstance(w, bytes) else w for w in cohesion._words(cleaned)]  # bytes: ASCII
    assert found == cohesion._WORD.findall(cleaned)
    assert word_count(text) == len(words(text))


def test_state_stays_small_in_a_long_conversation_of_long_words() -> None:
    rnd = random.Random(7)
    alphabet = "абвгдежзийклмнопрстуфхцчшщэюяabcdefghijklmnopqrstuvwxyz"
    state = CohesionState()
    largest = 0
    for i in range(3000):
        text = " ".join("".join(rnd.choice(alphabet) for _ in range(30)) for _ in range(40))
        observe(state, CohesionParams(), role="user", text=text, tokens=10**6 + i, may_open=True)
        largest = max(largest, len(state.to_json().encode()))
    assert largest <= 2048
    assert len(state.gaps) == 2 * cohesion._GAPS


def test_detector_is_deterministic() -> None:
    a, b = CohesionState(), CohesionState()
    assert feed(a, PASTA + ENGINE) == feed(b, PASTA + ENGINE)
    assert a.to_json() == b.to_json()


# -- the confirmation window --------------------------------------------------------------------------------


def test_shift_is_placed_where_it_began_not_where_it_was_noticed() -> None:
    decisions = replay(PASTA + ENGINE, rules())
    sealed = [(i, keep) for i, reason, keep in decisions if reason is not None]
    # Noticed at the second engine message (index 7), placed at the first (index 6).
    assert sealed == [(7, 1)]
    assert decisions[7][1] == COHESION


def test_a_wider_window_waits_longer_and_moves_more_messages() -> None:
    # The shift to the engine begins at index 6 whatever the window; it is noticed later with a wider one.
    last = [(i, keep) for i, reason, keep in replay(PASTA + ENGINE, rules(cohesion_window=3)) if reason][-1]
    assert last == (8, 2)
    sealed = [(i, keep) for i, reason, keep in replay(PASTA + ENGINE, rules(cohesion_window=1)) if reason]
    assert (6, 0) in sealed


def test_a_reply_that_goes_back_to_the_old_topic_cancels_the_shift() -> None:
    # The statement at index 6 is all new words, but the reply picks the carbonara up again.
    back = "Back to the carbonara though: pecorino, guanciale and the pasta."
    assert all(reason is None for _i, reason, _k in replay([*PASTA, ENGINE[0], back], rules()))
    # Without the confirmation (anything the reply says confirms) the statement alone is a shift.
    unconfirmed = replay([*PASTA, ENGINE[0], back], rules(cohesion_confirm_novelty=1.01))
    assert [(i, keep) for i, reason, keep in unconfirmed if reason] == [(7, 1)]


def test_a_short_remark_does_not_open_a_topic_the_message_after_it_does() -> None:
    # "Nice weather." has one content term: too little to say the talk turned there. Judged
    # together with the next message (``cohesion_opener_min_terms=0``) it opened the topic.
    convo = [*PASTA, "Nice weather.", *ENGINE]
    cuts = [i - keep for i, reason, keep in replay(convo, rules()) if reason]
    assert cuts == [7]
    joint = [i - keep for i, reason, keep in replay(convo, rules(cohesion_opener_min_terms=0)) if reason]
    assert joint == [6]


def test_messages_without_content_inside_the_window_move_with_it() -> None:
    convo = [*PASTA, ENGINE[0], "ok", "", ENGINE[1]]
    sealed = [(i, keep) for i, reason, keep in replay(convo, rules()) if reason]
    assert sealed == [(9, 3)]  # the cut is still before ENGINE[0], three stored messages move


def test_a_continuing_topic_is_never_cut() -> None:
    assert all(reason is None for _i, reason, _k in replay(PASTA * 3, rules()))


def test_an_answer_to_a_question_does_not_open_a_topic() -> None:
    convo = [
        *PASTA[:4],
        "What engine does your car have, by the way?",
        "A rattling diesel with a timing chain.",
    ]
    roles = ["user", "assistant"] * 3
    # The question may open a topic; its answer, however new its words, never does.
    cuts = [i - keep for i, reason, keep in replay(convo, rules(cohesion_window=1), roles) if reason]
    assert 5 not in cuts and 4 in cuts


def test_detector_needs_a_topic_first() -> None:
    # A fresh state (an old conversation, a lost state) learns before it may cut.
    assert all(
        reason is None for _i, reason, _k in replay(ENGINE + PASTA[:1], rules(cohesion_min_messages=3))
    )


def test_disabled_detector_never_cuts_but_still_returns_state() -> None:
    out = replay(PASTA + ENGINE, rules(cohesion=False))
    assert all(reason is None for _i, reason, _k in out)


# -- size seals cut where the talk turned ------------------------------------------------------------------


def test_size_seal_cuts_at_the_newest_turn_within_reach() -> None:
    state = CohesionState()
    feed(state, PASTA + ENGINE[:2])
    # As in decide: the incoming message is observed first, then the cut is chosen.
    observe(state, CohesionParams(), role="user", text=ENGINE[2], tokens=20, may_open=True)
    keep = size_keep(state, incoming_tokens=20, topic_tokens=8 * 20, limit=200, floor=0)
    assert keep == 2  # the two stored engine messages move to the new topic with the incoming one
    assert size_keep(state, incoming_tokens=20, topic_tokens=8 * 20, limit=90, floor=0) == 1  # reach
    assert (
        size_keep(state, incoming_tokens=20, topic_tokens=8 * 20, limit=200, floor=150) == 0
    )  # too little left


def test_size_rule_uses_the_cut_through_decide() -> None:
    r = rules(size_limit=8 * 20 + 10, cohesion=False)
    sealed = [
        (i, reason, keep) for i, reason, keep in replay(PASTA + ENGINE[:2] + ["and the cost?"], r) if reason
    ]
    assert sealed == [(8, "size", 2)]
