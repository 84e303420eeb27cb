"""Embedding in real bots (issue 16): every message shape round-trips, and the conversation lifecycle.

Real objects from litellm (``mock_response``) and the OpenAI SDK go through ``add_message`` and come
back out of ``get_context`` exactly, within budget, on memory, SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tiered_history import (
    ConversationNotFoundError,
    HistoryCompressor,
    InvalidMessageError,
    SyncHistoryCompressor,
)
from tiered_history.tokens import TokenCounter

from .conftest import database_url
from .shapes import SHAPES

BUDGET = 100_000


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    with database_url(request.param, tmp_path) as u:
        yield u


async def test_every_shape_round_trips_through_get_context_within_budget(url: str) -> None:
    built = [s.build() for s in SHAPES]
    counter = TokenCounter()
    async with HistoryCompressor.from_url(url, boundaries={"size": False, "explicit": False}) as hc:
        for message, _ in built:
            await hc.add_message("shapes", message)
        ctx = await hc.get_context("shapes", BUDGET)
        sent = ctx.to_messages()
        pinned = [expected for s, (_, expected) in zip(SHAPES, built, strict=True) if s.pinned]
        rest = [expected for s, (_, expected) in zip(SHAPES, built, strict=True) if not s.pinned]
        assert sent == pinned + rest
        assert ctx.total_tokens == counter.messages_tokens(sent) <= BUDGET
        # The history returns the same, message by message, in the order they were added.
        history = await hc.get_history("shapes")
        assert [m.to_openai() for m in history.messages] == [expected for _, expected in built]
        # A tight budget is still respected, and the newest message is still sent.
        small = await hc.get_context("shapes", 2000)
        assert small.total_tokens <= 2000 and small.to_messages()[-1] == built[-1][1]


async def test_changing_the_messages_sent_changes_nothing_kept(url: str) -> None:
    # A prompt-cache recipe marks a content part in place; a tool loop may edit arguments.
    part = {"type": "text", "text": "What is in this file?"}
    call = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    async with HistoryCompressor.from_url(url) as hc:
        await hc.add_message("c", {"role": "user", "content": [part]})
        await hc.add_message("c", {"role": "assistant", "content": None, "tool_calls": [call]})
        await hc.add_message("c", {"role": "tool", "tool_call_id": "c1", "content": "nothing"})
        first = await hc.get_context("c", 500)
        before = json.loads(json.dumps(first.to_messages()))  # a copy of its own
        sent = first.to_messages()
        sent[0]["content"][0]["cache_control"] = {"type": "ephemeral", "note": "x" * 2000}
        sent[1]["tool_calls"][0]["function"]["arguments"] = '{"path": "/etc/passwd"}'
        assert first.to_messages() == before
        assert (await hc.get_context("c", 500)).to_messages() == before
        await hc.add_message("c", {"role": "user", "content": "thanks"})
        assert (await hc.get_context("c", 500)).to_messages()[:3] == before


async def test_a_litellm_message_is_stored_as_it_came() -> None:
    import os

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    response = litellm.completion(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], mock_response="Hello there!"
    )
    message = response.choices[0].message
    async with HistoryCompressor.from_url("memory://") as hc:
        await hc.add_message("c", {"role": "user", "content": "hi"})
        stored = await hc.add_message("c", message)
        assert stored.to_openai() == {"role": "assistant", "content": "Hello there!"}
        assert (await hc.get_context("c", 500)).to_messages()[-1] == stored.to_openai()


def test_pinned_system_prompt_survives_restarts_once() -> None:
    prompt = {"role": "system", "content": "You are a helpful bot."}
    with SyncHistoryCompressor.from_url("sqlite://") as hc:
        for _ in range(3):
            hc.pin("bot", prompt, key="system")
            hc.add_message("bot", {"role": "user", "content": "hello"})
        sent = hc.get_context("bot", 1000).to_messages()
        assert [m for m in sent if m["role"] == "system"] == [prompt]
        # Editing it replaces it; the old text stays stored, no longer pinned.
        hc.pin("bot", "You are a terse bot.", key="system")
        sent = hc.get_context("bot", 1000).to_messages()
        assert [m["content"] for m in sent if m["role"] == "system"] == ["You are a terse bot."]
        history = hc.get_history("bot")
        assert [m.content for m in history.messages if m.role == "system"] == [prompt["content"]] * 3 + [
            "You are a terse bot."
        ]
        assert [m.pinned for m in history.messages if m.role == "system"] == [False, False, False, True]
        assert hc.unpin("bot", "system") is True
        assert hc.unpin("bot", "system") is False
        assert all(m["role"] != "system" for m in hc.get_context("bot", 1000).to_messages())


async def test_pins_restart_across_compressors_on_one_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bot.db'}"
    for start in range(3):
        async with HistoryCompressor.from_url(url) as hc:
            await hc.pin("bot", {"role": "system", "content": "Be kind."}, key="system")
            await hc.add_message("bot", {"role": "user", "content": f"start {start}"})
    async with HistoryCompressor.from_url(url) as hc:
        sent = (await hc.get_context("bot", 1000)).to_messages()
    assert [m for m in sent if m["role"] == "system"] == [{"role": "system", "content": "Be kind."}]


async def test_add_messages_is_all_or_nothing_and_keeps_order(url: str) -> None:
    async with HistoryCompressor.from_url(url) as hc:
        await hc.add_message("c", {"role": "user", "content": "before"})
        bad = [
            {"role": "user", "content": "one"},
            {"role": "user", "content": ""},
            {"role": "user", "content": "x"},
        ]
        with pytest.raises(InvalidMessageError, match="message 1 of the batch"):
            await hc.add_messages("c", bad)
        orphan = [{"role": "user", "content": "ok"}, {"role": "tool", "content": "r", "tool_call_id": "nope"}]
        with pytest.raises(InvalidMessageError, match="message 1 of the batch"):
            await hc.add_messages("c", orphan)
        assert [m.content for m in (await hc.get_history("c")).messages] == ["before"]
        with pytest.raises(InvalidMessageError):
            await hc.add_messages("new", [{"role": "user", "content": "ok"}, "not a message"])
        assert not await hc.exists("new")
        batch = [{"role": "user" if k % 2 == 0 else "assistant", "content": f"m{k}"} for k in range(10_000)]
        stored = await hc.add_messages("big", batch)
        assert [m.sequence for m in stored] == list(range(1, 10_001))
        messages = await hc.get_messages("big", 9_990)
        assert [m.content for m in messages] == [f"m{k}" for k in range(9_989, 10_000)]
        assert (await hc.stats("big"))[0].messages == 10_000


async def test_list_conversations_with_platform_metadata(url: str) -> None:
    async with HistoryCompressor.from_url(url) as hc:
        await hc.add_message(
            "d1", {"role": "user", "content": "hi"}, platform="discord", channel="#a", user_id="u1"
        )
        await hc.add_message("d1", {"role": "user", "content": "yo"}, user_id="u2")
        await hc.add_message(
            "s1", {"role": "user", "content": "hi"}, platform="slack", channel="C1", user_id="u1"
        )
        await hc.add_message("t1", {"role": "user", "content": "hi"}, platform="telegram")
        every = await hc.list_conversations()
        assert [c.conversation_id for c in every] == ["d1", "s1", "t1"]
        d1 = every[0]
        assert (d1.platform, d1.channel, d1.users, d1.messages) == ("discord", "#a", ("u1", "u2"), 2)
        assert d1.created_at is not None and d1.last_active_at is not None
        assert [c.conversation_id for c in await hc.list_conversations(platform="slack")] == ["s1"]
        assert [c.conversation_id for c in await hc.list_conversations(user_id="u1")] == ["d1", "s1"]
        assert [c.conversation_id for c in await hc.list_conversations(channel="#a")] == ["d1"]
        assert [c.conversation_id for c in await hc.list_conversations(after="d1", limit=1)] == ["s1"]
        with pytest.raises(InvalidMessageError):
            await hc.list_conversations(limit=0)


async def test_fork_shares_the_history_up_to_the_fork_point(url: str) -> None:
    async with HistoryCompressor.from_url(url, boundaries={"min_topic_tokens": 0}) as hc:
        for k in range(6):
            prefix = "new topic: " if k % 2 == 0 else ""
            await hc.add_message("main", {"role": "user", "content": f"{prefix}question {k} about item {k}"})
            await hc.add_message("main", {"role": "assistant", "content": f"answer {k}"})
        await hc.maintain("main")
        before = await hc.get_history("main")
        info = await hc.fork("main", "branch", at_sequence=8)
        assert (info.conversation_id, info.messages) == ("branch", 8)
        branch = await hc.get_history("branch")
        assert [m.to_openai() for m in branch.messages] == [m.to_openai() for m in before.messages[:8]]
        assert [(t.first_sequence, t.last_sequence, t.content) for t in branch.topics] == [
            (t.first_sequence, t.last_sequence, t.content) for t in before.topics if t.last_sequence <= 8
        ]
        # Replaying the open part runs no boundary rule: the state counts exactly the topics copied.
        state = await hc.store.state("branch")
        assert state is not None and state.topic_count == len(branch.topics)
        assert branch.open_topic_start == max((t.last_sequence for t in branch.topics), default=0) + 1
        # The branch goes its own way; the source is untouched.
        await hc.add_message("branch", {"role": "user", "content": "a different follow-up"})
        assert (await hc.get_history("main")) == before
        assert (await hc.get_messages("branch", 9))[0].content == "a different follow-up"
        assert (await hc.get_context("branch", 2000)).total_tokens <= 2000
        with pytest.raises(InvalidMessageError, match="exists already"):
            await hc.fork("main", "branch")
        with pytest.raises(InvalidMessageError, match="at_sequence"):
            await hc.fork("main", "other", at_sequence=99)
        with pytest.raises(ConversationNotFoundError):
            await hc.fork("missing", "other")


SECRET = "my-secret-phone-number-5551234"


def _rows_mentioning(url: str, text: str) -> list[str]:
    """Every table (index tables included) holding ``text`` anywhere, read from the database itself."""
    found: list[str] = []
    if url.startswith("sqlite"):
        con = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            for table in tables:
                for row in con.execute(f'SELECT * FROM "{table}"'):
                    if any(
                        isinstance(v, str | bytes)
                        and text.encode() in (v if isinstance(v, bytes) else v.encode())
                        for v in row
                    ):
                        found.append(table)
                        break
            # The full-text index keeps terms, not rows: ask it for the secret's words.
            for table in ("messages_fts", "summaries_fts"):
                hits = con.execute(
                    f"SELECT count(*) FROM {table} WHERE {table} MATCH ?", ('"5551234"',)
                ).fetchone()
                if hits[0]:
                    found.append(table)
        finally:
            con.close()
    else:
        with psycopg.connect(url) as con:
            tables = [
                r[0] for r in con.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            ]
            for table in tables:
                n = con.execute(
                    f'SELECT count(*) FROM "{table}" t WHERE t::text LIKE %s', (f"%{text}%",)
                ).fetchone()
                if n and n[0]:
                    found.append(table)
    return found


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
async def test_delete_conversation_leaves_no_row_holding_its_text(kind: str, tmp_path: Path) -> None:
    with database_url(kind, tmp_path) as url:
        async with HistoryCompressor.from_url(url, boundaries={"min_topic_tokens": 0}) as hc:
            for cid in ("keep", "gone"):
                for k in range(6):
                    text = f"new topic: {cid} {k} {SECRET if cid == 'gone' else 'nothing to hide'}"
                    meta = {"note": SECRET if cid == "gone" else "public"}
                    await hc.add_message(cid, {"role": "user", "content": text, "metadata": meta})
                await hc.seal_current_topic(cid)
            await hc.maintain()
            assert _rows_mentioning(url, SECRET), "the test would not see the secret if it were there"
            assert await hc.delete_conversation("gone") is True
            assert await hc.delete_conversation("gone") is False
            assert not await hc.exists("gone")
            assert _rows_mentioning(url, SECRET) == []
            assert len((await hc.get_history("keep")).messages) == 6
            with pytest.raises(ConversationNotFoundError):
                await hc.get_history("gone")


def test_export_shape_is_json_serialisable() -> None:
    # What to_messages() returns for every shape is plain JSON (a bot can log or export it).
    for shape in SHAPES:
        _, expected = shape.build()
        json.dumps(expected)
