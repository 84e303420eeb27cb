"""Smoke test of ``bench.llm_cost`` on a small synthetic meeting (local test server only)."""

from __future__ import annotations

import argparse
import random
from datetime import timedelta

import pytest

from bench import llm_cost
from bench.retention.data import START, Meeting, Turn

WORDS = [
    "budget",
    "remote",
    "control",
    "battery",
    "design",
    "speaker",
    "market",
    "button",
    "colour",
    "price",
    "scroll",
    "wheel",
    "prototype",
    "users",
    "interface",
    "plastic",
    "rubber",
    "evaluation",
    "deadline",
    "meeting",
    "agenda",
]


def synthetic_meeting(turns: int, seed: int = 7) -> Meeting:
    rng = random.Random(seed)
    out = []
    for i in range(turns):
        sentences = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))).capitalize() + "."
            for _ in range(rng.randint(1, 3))
        ]
        out.append(
            Turn(i, i + 1, f"S{i % 4}", f"S{i % 4}", " ".join(sentences), START + timedelta(seconds=5 * i))
        )
    return Meeting("synthetic", "AMI", tuple(out), (), 0, 0)


@pytest.fixture(autouse=True)
def default_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # conftest lowers min_topic_tokens for other tests; the bench measures the defaults.
    monkeypatch.delenv("TIERED_HISTORY_BOUNDARIES__MIN_TOPIC_TOKENS", raising=False)


async def test_ours_makes_fewer_calls_than_baselines_and_usage_agrees() -> None:
    meeting = synthetic_meeting(240)
    totals = await llm_cost.run_all([meeting], [2000], maintain_every=6, baselines=True)
    ours, every, rolling = totals.ours[2000], totals.every_turn, totals.rolling

    assert totals.messages == 240
    assert every.usage.calls == rolling.usage.calls == 240  # one call per message
    # Topics are summarised once each and some are merged into archives at this small budget.
    assert ours.topics_llm > 1 and ours.archives_llm > 0
    assert ours.usage.topic_calls == ours.topics_llm
    assert ours.usage.merge_calls == ours.archives_llm
    assert 0 < ours.usage.calls < every.usage.calls / 5
    assert ours.usage.total_tokens < rolling.usage.total_tokens < every.usage.total_tokens
    # Tokens (and cost) the library recorded equal what the server reported, nothing fell back.
    assert (ours.recorded.prompt_tokens, ours.recorded.completion_tokens) == (
        ours.usage.prompt_tokens,
        ours.usage.completion_tokens,
    )
    assert ours.recorded.cost == pytest.approx(
        llm_cost.price(ours.usage.prompt_tokens, ours.usage.completion_tokens)
    )
    assert llm_cost.mismatches(totals) == []

    args = argparse.Namespace(split="test", limit=1, budgets="2000", maintain_every=6, no_baselines=False)
    md = llm_cost.render(args, totals, 1.0, "test machine")
    assert "| tiered_history, budget 2,000 |" in md and "all agree." in md


def test_stand_in_summary_is_sized_to_the_target() -> None:
    llm = llm_cost.LocalLLM(llm_cost.MODEL)
    try:
        data = "\n".join(f"[{t.sequence}] user ({t.name}): {t.content}" for t in synthetic_meeting(60).turns)
        text = llm.extract(data, 120)
        assert 100 <= llm.counter.count(text) <= 120
        assert "[1]" not in text and "(S0)" not in text  # labels are not copied
    finally:
        llm.close()
