"""A batch appended at once (``append_all``) writes exactly what appending its messages one by one does.

``append_all`` hands the content detector's state from one message to the next as it is and
formats it only for the batch's last message; the per-message path formats it after every
message and reads it back before the next. A Hypothesis property replays random conversations
(topic changes, trigger phrases, silences, size limits, replies to sealed topics, tool calls,
pins, invalid tool results) in random batches through both and compares every write.
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiered_history.core.boundaries import BoundaryRules
from tiered_history.core.phrases import phrases_for
from tiered_history.core.state import ConversationState, NewMessage, NewSummary, SummaryUpdate, Writes
from tiered_history.core.transitions import Incoming, Origin, append, append_all
from tiered_history.errors import InvalidMessageError

T0 = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
ENCODING = "cl100k_base"

TEXTS = [
    "How long should I boil fresh pasta for carbonara?",
    "Fresh pasta needs two or three minutes; dried spaghetti about nine.",
    "And the carbonara sauce: eggs, pecorino and guanciale only?",
    "Guanciale is traditional; pancetta works if you cannot find it.",
    "My tomato seedlings wilt every afternoon on the balcony.",
    "Wilting seedlings on a sunny balcony usually need deeper watering and afternoon shade.",
    "New topic: the invoice for March is wrong, the VAT line is missing.",
    "Okay, so the kubernetes cluster keeps evicting pods under memory pressure.",
    "Raise the memory limits of the deployment and watch the eviction events.",
    "Anyway, which train goes from Zürich to Milano in the morning?",
    "The EuroCity leaves Zürich at 7:33 and reaches Milano Centrale before eleven.",
    "ok",
    "",
    "東京の天気はどうですか",
]
WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
]


def _text(rnd: random.Random) -> str:
    if rnd.random() < 0.7:
        return rnd.choice(TEXTS)
    return " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(1, 30)))


def _conversation(seed: int, n: int) -> list[Incoming]:
    """``n`` messages (a tool unit counts as its parts), some of them a batch cannot store."""
    rnd = random.Random(seed)
    out: list[Incoming] = []
    at = T0
    calls = 0

    def add(role: str, text: str, **extra: object) -> None:
        nonlocal at
        gap = rnd.choice([0.2, 1, 3, 45, 200]) if rnd.random() < 0.15 else rnd.uniform(0.1, 2)
        at = at + timedelta(minutes=gap) if rnd.random() > 0.03 else at - timedelta(minutes=5)
        tokens = max(4, len(text) // 4) * (rnd.choice([1, 1, 1, 8]))
        reply = rnd.randint(1, len(out)) if out and rnd.random() < 0.1 else None
        out.append(
            Incoming(
                role=role,
                content=text,
                wire=None,
                timestamp=at,
                token_count=tokens,
                full_token_count=tokens + rnd.choice([0, 0, 5]),
                reply_to=reply,
                words=len(text.split()),
                **extra,  # type: ignore[arg-type]
            )
        )

    while len(out) < n:
        r = rnd.random()
        if r < 0.08:
            calls += 1
            ids = tuple(f"call{calls}.{k}" for k in range(rnd.randint(1, 2)))
            add("assistant", "", tool_call_ids=ids)
            for i in ids[: len(ids) if rnd.random() < 0.9 else 1]:
                add("tool", f"result of {i}: {_text(rnd)}", tool_call_id=i)
        elif r < 0.12:
            key = rnd.choice([None, "sys", "rules"])
            add("system", f"Pinned {rnd.randint(0, 9)}: {_text(rnd)}", pinned=True, pin_key=key)
        elif r < 0.125:
            add("tool", "an answer to no call", tool_call_id="nobody")
        else:
            add(rnd.choice(["user", "assistant"]), _text(rnd))
    return out


def _rules(**changes: Any) -> BoundaryRules:
    """Every rule on (silence after 30 minutes, the default phrases), with ``changes``."""
    return BoundaryRules(
        explicit=True,
        temporal=True,
        size=True,
        phrases=phrases_for(),
        trigger_roles=("user",),
        silence=timedelta(minutes=30),
        **changes,
    )


def _per_message(
    state: ConversationState | None, messages: list[Incoming], rules: BoundaryRules, origin: Origin
) -> Writes:
    """The reference: ``append`` message by message, each state whole (its detector formatted and
    read back by the next), merged into one write as ``append_all`` merges them."""
    rows: list[NewMessage] = []
    sealed: list[NewSummary] = []
    updates: list[SummaryUpdate] = []
    cur = state
    for i, m in enumerate(messages):
        try:
            done = append(cur, "c", m, rules, platform="web", encoding=ENCODING, now=T0, origin=origin)
        except InvalidMessageError as exc:
            error = InvalidMessageError(f"message {i} of the batch: {exc}")
            error.index = i
            raise error from None
        assert done.writes.state.detector is not None or not rules.tracks_content
        rows.extend(done.writes.messages)
        sealed.extend(done.writes.summaries)
        updates.extend(done.writes.updates)
        cur = done.writes.state
    assert cur is not None
    base = 0 if state is None else state.version
    return Writes(
        replace(cur, version=base + 1), tuple(rows), tuple(sealed), tuple(updates), create=state is None
    )


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 90),
    cuts=st.lists(st.integers(1, 40), max_size=12),
    size_limit=st.sampled_from([120, 600, 100_000]),
    min_tokens=st.sampled_from([0, 60]),
    cohesion=st.booleans(),
    unseal_after_cohesion=st.booleans(),
    detect_every=st.sampled_from([0, 4]),
)
def test_a_batch_writes_what_its_messages_write_one_by_one(
    seed: int,
    n: int,
    cuts: list[int],
    size_limit: int,
    min_tokens: int,
    cohesion: bool,
    unseal_after_cohesion: bool,
    detect_every: int,
) -> None:
    rules = _rules(
        cohesion=cohesion,
        size_limit=size_limit,
        min_tokens=min_tokens,
        unseal_after_cohesion=unseal_after_cohesion,
        detect_every=detect_every,
    )
    messages = _conversation(seed, n)
    origin = Origin("web", "chan", "u1")
    batched: ConversationState | None = None
    reference: ConversationState | None = None
    at = 0
    sizes = iter(cuts)
    while at < len(messages):
        batch = messages[at : at + next(sizes, len(messages))]
        at += len(batch)
        try:
            want = _per_message(reference, batch, rules, origin)
        except InvalidMessageError as exc:
            with pytest.raises(InvalidMessageError) as got:
                append_all(
                    batched, "c", batch, rules, platform="web", encoding=ENCODING, now=T0, origin=origin
                )
            assert str(got.value) == str(exc) and got.value.index == exc.index
            continue  # all or nothing: the next batch starts from the same state
        got_writes = append_all(
            batched, "c", batch, rules, platform="web", encoding=ENCODING, now=T0, origin=origin
        )
        assert got_writes == want
        assert got_writes.state.body() == want.state.body()
        batched, reference = got_writes.state, want.state
    assert batched == reference


def test_the_property_reaches_every_kind_of_seal() -> None:
    """The replayed conversations seal for every reason and reopen topics (else the property
    would compare little)."""
    reasons: set[str] = set()
    unsealed = 0
    for seed in range(60):
        rules = _rules(
            size_limit=600 if seed % 2 else 100_000,
            min_tokens=0,
            unseal_after_cohesion=seed % 3 == 0,
        )
        state = None
        for m in _conversation(seed, 80):
            try:
                w = append_all(state, "c", [m], rules, platform="web", encoding=ENCODING, now=T0)
            except InvalidMessageError:
                continue
            reasons.update(s.sealed_reason or "" for s in w.summaries)
            unsealed += len(w.updates)
            state = w.state
    assert {"explicit", "silence", "size", "cohesion"} <= reasons
    assert unsealed > 0
