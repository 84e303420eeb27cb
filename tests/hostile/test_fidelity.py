"""Issue 17, items 1-4: what the model is sent is what was stored, and counted with its tokenizer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tiered_history import BudgetTooSmallError, HistoryCompressor, SyncHistoryCompressor
from tiered_history.tokens import ESTIMATED_SAFETY_MARGIN, TokenCounter

from ..conftest import database_url


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with database_url(request.param, tmp_path) as u:
        yield u


def long_text(chars: int) -> str:
    words = ["policy", "refunds", "escalation", "ticket", "customer", "answer", "account", "verify"]
    out: list[str] = []
    i = 0
    while sum(len(w) + 1 for w in out) < chars:
        out.append(f"{words[i % len(words)]}{i}")
        i += 1
    return " ".join(out)[:chars]


# -- 1. pinned messages are sent verbatim ---------------------------------------------------------


async def test_item01_pinned_prompt_is_sent_whole_when_the_budget_has_room(url: str) -> None:
    prompt = long_text(8208)
    async with HistoryCompressor(url) as hc:
        await hc.pin("c", prompt, key="system")
        await hc.add_message("c", {"role": "user", "content": "hello"})
        ctx = await hc.get_context("c", max_tokens=100_000)
    sent = ctx.to_messages()
    assert sent[0]["content"] == prompt
    assert "[truncated" not in sent[0]["content"]
    assert ctx.total_tokens > len(prompt) // 8


async def test_item01_pinned_prompt_that_cannot_fit_names_itself(url: str) -> None:
    async with HistoryCompressor(url) as hc:
        await hc.pin("c", long_text(8208), key="system")
        await hc.add_message("c", {"role": "user", "content": "hello"})
        with pytest.raises(BudgetTooSmallError, match="pinned") as err:
            await hc.get_context("c", max_tokens=500)
    assert "'system'" in str(err.value)


# -- 2. no truncation by default ------------------------------------------------------------------


async def test_item02_long_message_is_sent_whole_when_the_budget_has_room(url: str) -> None:
    text = long_text(8192)
    async with HistoryCompressor(url) as hc:
        await hc.add_message("c", {"role": "user", "content": text})
        await hc.add_message("c", {"role": "assistant", "content": "noted"})
        ctx = await hc.get_context("c", max_tokens=100_000)
    contents = [m["content"] for m in ctx.to_messages()]
    assert text in contents
    assert not ctx.truncated_newest


# -- 3. workers with different tokenizers on one database -----------------------------------------


def test_item03_mixed_model_workers_stay_within_the_reader_s_budget(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'mixed.db'}"
    # Text p50k_base needs far more tokens for than cl100k_base does (digits, accents, kana).
    text = "héllo wörld ñ 日本語のテキスト 1234567890 " * 12
    with (
        SyncHistoryCompressor(url, model="p50k_base", boundaries={"temporal": False}) as a,
        SyncHistoryCompressor(url, model="cl100k_base", boundaries={"temporal": False}) as b,
    ):
        a.add_message("c", {"role": "user", "content": "hello, code follows"})
        for i in range(12):
            b.add_message("c", {"role": "user" if i % 2 else "assistant", "content": f"{i} {text}"})
            if i == 3:
                b.seal_current_topic("c")
        b.maintain("c")  # summaries written (and counted) by the other worker too
        b.add_message("c", {"role": "user", "content": "and now?"})
        ctx = a.get_context("c", max_tokens=600)
        own = TokenCounter("p50k_base").messages_tokens(ctx.to_messages())
    assert ctx.historical_topics or ctx.bulk_archives
    assert ctx.total_tokens <= 600
    # The reader's own tokenizer is the truth: the reported total may not undercount it.
    assert own <= ctx.total_tokens, f"reported {ctx.total_tokens}, the reader's tokenizer counts {own}"


# -- 4. estimated tokenizers ----------------------------------------------------------------------


async def test_item04_unknown_model_reports_an_estimate_and_keeps_a_margin() -> None:
    async with HistoryCompressor("memory://", model="claude-3-5-sonnet-20241022") as hc:
        for i in range(40):
            await hc.add_message(
                "c", {"role": "user" if i % 2 else "assistant", "content": f"{i} {long_text(400)}"}
            )
        ctx = await hc.get_context("c", max_tokens=2000)
    assert ctx.encoding == "cl100k_base"
    assert ctx.exact_tokens is False
    assert ctx.total_tokens <= int(2000 * (1 - ESTIMATED_SAFETY_MARGIN))
    assert ctx.max_tokens == 2000


async def test_item04_known_model_reports_its_exact_encoding() -> None:
    async with HistoryCompressor("memory://", model="gpt-4o") as hc:
        await hc.add_message("c", {"role": "user", "content": "hello"})
        ctx = await hc.get_context("c", max_tokens=2000)
    assert ctx.encoding == "o200k_base"
    assert ctx.exact_tokens is True
