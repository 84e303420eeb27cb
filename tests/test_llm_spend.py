"""Summariser spend is recorded exactly as the server reported it, on every backend, whatever
became of the answer: accepted, rejected, failed part-way through chunking, or retried."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import litellm
import pytest

import tests.openai_server as fake_openai
from tests.openai_server import OpenAIServer, Reply
from tiered_history import HistoryCompressor, Message, Summary
from tiered_history.summarizers.llm import LiteLLMSummarizer

MODEL = "openai/gpt-4o-mini"
CID = "spend-1"
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
SUMMARY = "- The team chose the rubber case.\n- Open: price the scroll wheel."

openai_server = fake_openai.openai_server


def price(prompt_tokens: int, completion_tokens: int) -> float:
    p, c = litellm.cost_per_token(
        model=MODEL, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
    )
    return float(p) + float(c)


async def one_sealed_topic(hc: HistoryCompressor, turns: int = 12) -> datetime:
    """A topic well over the summary target, sealed by hand; returns a time just after it."""
    filler = "we compared the rubber case, the scroll wheel, the battery and the price again. " * 3
    for i in range(turns):
        role = "user" if i % 2 == 0 else "assistant"
        msg = Message(role=role, content=f"Turn {i}: {filler}", timestamp=T0 + timedelta(minutes=i))
        await hc.add_message(CID, msg)
    await hc.seal_current_topic(CID)
    return T0 + timedelta(minutes=turns)


async def topic_row(hc: HistoryCompressor) -> Summary:
    [topic] = (await hc.get_history(CID)).topics
    return topic


def compressor(
    url: str, server: OpenAIServer, max_topic_tokens: int | None = None, **kw: Any
) -> HistoryCompressor:
    summ = LiteLLMSummarizer(MODEL, api_base=server.url, api_key="test", timeout=2.0, max_retries=0, **kw)
    # The library's default unless a test sets its own.
    cap = {} if max_topic_tokens is None else {"max_topic_tokens": max_topic_tokens}
    return HistoryCompressor.from_url(url, summarizer=summ, retry_backoff_seconds=60, **cap)


async def test_accepted_summary_records_what_the_server_reported(
    db_url: str, openai_server: OpenAIServer
) -> None:
    openai_server.script(Reply(text=SUMMARY, prompt_tokens=1234, completion_tokens=56))
    async with compressor(db_url, openai_server) as hc:
        now = await one_sealed_topic(hc)
        await hc.maintain(CID, now=now)
        topic = await topic_row(hc)
        assert (topic.status, topic.summarizer, topic.model) == ("final", "litellm", MODEL)
        assert topic.content == SUMMARY
        assert (topic.prompt_tokens, topic.completion_tokens) == (1234, 56)
        assert topic.cost == pytest.approx(price(1234, 56)) and topic.cost > 0
        [stats] = await hc.stats(CID)
        assert (stats.summarizer_prompt_tokens, stats.summarizer_completion_tokens) == (1234, 56)
        assert stats.summarizer_cost == pytest.approx(price(1234, 56))
    assert len(openai_server.requests) == 1


async def test_rejected_answers_and_failed_retries_are_still_paid_for(
    db_url: str, openai_server: OpenAIServer
) -> None:
    # A blank answer is billed (the prompt was read) but unusable: the topic gets a provisional
    # extractive summary, and each retry's spend is added until one succeeds.
    openai_server.script(
        Reply(text="  ", prompt_tokens=800, completion_tokens=3),
        Reply(text="", prompt_tokens=700, completion_tokens=0),
        Reply(text=SUMMARY, prompt_tokens=900, completion_tokens=40),
    )
    async with compressor(db_url, openai_server) as hc:
        now = await one_sealed_topic(hc)
        await hc.maintain(CID, now=now)
        first = await topic_row(hc)
        assert (first.status, first.summarizer, first.model) == ("provisional", "extractive", MODEL)
        assert first.content and first.last_error and "empty" in first.last_error
        assert (first.prompt_tokens, first.completion_tokens) == (800, 3)
        assert first.cost == pytest.approx(price(800, 3)) and first.cost > 0

        await hc.maintain(CID, now=now + timedelta(minutes=2))  # retry due after 60 s: fails again
        second = await topic_row(hc)
        assert second.status == "provisional" and second.content == first.content
        assert (second.prompt_tokens, second.completion_tokens) == (1500, 3)

        await hc.maintain(CID, now=now + timedelta(hours=1))  # next retry succeeds
        final = await topic_row(hc)
        assert (final.status, final.summarizer, final.content) == ("final", "litellm", SUMMARY)
        assert (final.prompt_tokens, final.completion_tokens) == (2400, 43)
        assert final.cost == pytest.approx(price(800, 3) + price(700, 0) + price(900, 40))
        [stats] = await hc.stats(CID)
        assert (stats.summarizer_prompt_tokens, stats.summarizer_completion_tokens) == (2400, 43)
        assert stats.summarizer_cost == pytest.approx(final.cost)
    assert len(openai_server.requests) == 3


async def test_chunks_answered_before_a_failure_are_recorded(
    db_url: str, openai_server: OpenAIServer
) -> None:
    # The topic is larger than the summariser's window: it is summarised in chunks, and the
    # second chunk's call fails for good (401). The first chunk was billed and must be counted.
    openai_server.script(
        Reply(text="Chunk one: rubber case chosen.", prompt_tokens=610, completion_tokens=9),
        Reply(status=401),
    )
    # No size cap: a topic of 30 turns, larger than the summariser's window, stays one topic.
    async with compressor(db_url, openai_server, max_topic_tokens=0, context_window=2000) as hc:
        now = await one_sealed_topic(hc, turns=30)
        await hc.maintain(CID, now=now)
        topic = await topic_row(hc)
        assert (topic.status, topic.summarizer) == ("provisional", "extractive")
        assert topic.last_error and "401" in topic.last_error
        assert (topic.prompt_tokens, topic.completion_tokens) == (610, 9)
        assert topic.cost == pytest.approx(price(610, 9))
    assert len(openai_server.requests) == 2
