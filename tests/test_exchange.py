"""Export a conversation to JSONL and import it back: lossless on every backend, all or nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tiered_history import (
    ConversationNotFoundError,
    HistoryCompressor,
    InvalidMessageError,
    SyncHistoryCompressor,
    TieredHistoryError,
    TranscriptError,
)
from tiered_history.exchange import FORMAT, is_export, read_export

from .conftest import database_url
from .shapes import SHAPES

SMALL: dict[str, Any] = {
    "context_budget": 600,
    "bulk_merge_size": 2,
    "summarizer": {"kind": "extractive"},
    "boundaries": {"explicit": True, "temporal": False, "size": True, "min_topic_tokens": 0},
}
START = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with database_url(request.param, tmp_path) as u:
        yield u


async def _build(hc: HistoryCompressor, cid: str = "c") -> None:
    """Every message shape, replaced and removed pins, metadata, users, topics, archives."""
    await hc.pin(cid, "You are terse.", key="system", platform="discord", channel="#general")
    await hc.pin(cid, "Remember the user's name.", key="memory")
    for shape in SHAPES:
        message, _ = shape.build()
        await hc.add_message(cid, message, user_id="u1")
    for k in range(16):
        at = START + timedelta(minutes=k)
        await hc.add_message(
            cid,
            {
                "role": "user",
                "content": f"new topic: question {k} about item {k} alpha bravo charlie",
                "timestamp": at,
                "metadata": {"k": k, "nested": {"list": [1, None, "x"]}},
            },
            user_id=f"u{k % 3}",
        )
        await hc.add_message(cid, {"role": "assistant", "content": f"answer {k} " + "echo foxtrot " * 15})
        if k % 4 == 3:
            await hc.maintain(cid)
    await hc.pin(cid, "You are very terse.", key="system")  # replaces the first pin
    await hc.unpin(cid, "memory")
    await hc.add_message(cid, {"role": "user", "content": "and the last question, still open"})


def _records(text: str, cid: str | None = None) -> list[dict[str, Any]]:
    out = [json.loads(line) for line in text.splitlines()]
    if cid is not None:
        out[0]["conversation_id"] = cid
    return out


async def test_export_then_import_is_lossless(url: str) -> None:
    async with HistoryCompressor.from_url(url, **SMALL) as hc:
        await _build(hc)
        text = await hc.export_conversation("c")
        history = await hc.get_history("c")
        assert history.topics and history.archives, "the fixture must exercise every tier"
        assert any(t.merged_into is not None for t in history.topics)

        info = await hc.import_conversation(text, conversation_id="copy")
        # The file again, exactly: every message field, pin, metadata value, time and summary.
        assert _records(await hc.export_conversation("copy"), "c") == _records(text)
        copy = await hc.get_history("copy")
        assert [m.to_openai() for m in copy.messages] == [m.to_openai() for m in history.messages]
        assert [(m.timestamp, m.metadata, m.pinned, m.pin_key) for m in copy.messages] == [
            (m.timestamp, m.metadata, m.pinned, m.pin_key) for m in history.messages
        ]
        assert [(m.token_count, m.full_token_count) for m in copy.messages] == [
            (m.token_count, m.full_token_count) for m in history.messages
        ]
        fields = ("tier", "sequence", "first_sequence", "last_sequence", "content", "rendered", "token_count")
        for mine, theirs in ((copy.topics, history.topics), (copy.archives, history.archives)):
            assert [[getattr(s, f) for f in fields] for s in mine] == [
                [getattr(s, f) for f in fields] for s in theirs
            ]
        # The conversation's own data and what a bot is sent are the same too.
        original = (await hc.list_conversations(after="b", limit=1))[0]
        assert original.conversation_id == "c"
        assert info == replace(original, conversation_id="copy")
        for budget in (400, 900, 5000):
            assert (await hc.get_context("copy", budget)).to_messages() == (
                await hc.get_context("c", budget)
            ).to_messages()
        (before,), (after,) = await hc.stats("c"), await hc.stats("copy")
        assert after == replace(before, conversation_id="copy")


async def test_a_file_moves_between_backends(url: str, tmp_path: Path) -> None:
    async with HistoryCompressor.from_url("memory://", **SMALL) as source:
        await _build(source)
        text = await source.export_conversation("c")
        expected = (await source.get_context("c", 800)).to_messages()
    async with HistoryCompressor.from_url(url, **SMALL) as target:
        await target.import_conversation(text)
        assert _records(await target.export_conversation("c")) == _records(text)
        assert (await target.get_context("c", 800)).to_messages() == expected
        # It goes on like any other conversation.
        await target.add_message("c", {"role": "user", "content": "new topic: after the move"})
        await target.maintain("c")
        assert (await target.get_context("c", 800)).total_tokens <= 800


async def test_importing_the_same_file_again_changes_nothing_and_other_content_is_refused() -> None:
    async with HistoryCompressor.from_url("memory://", **SMALL) as hc:
        await _build(hc)
        text = await hc.export_conversation("c")
        await hc.import_conversation(text, conversation_id="copy")
        again = await hc.import_conversation(text, conversation_id="copy")
        assert again.messages == (await hc.get_history("c")).messages[-1].sequence
        await hc.add_message("copy", {"role": "user", "content": "one more"})
        before = await hc.export_conversation("copy")
        with pytest.raises(InvalidMessageError, match="exists already"):
            await hc.import_conversation(text, conversation_id="copy")
        assert await hc.export_conversation("copy") == before


def _corrupt(text: str, index: int, change: dict[str, Any]) -> str:
    records = _records(text)
    records[index] = {**records[index], **change}
    records[index] = {k: v for k, v in records[index].items() if v is not ...}
    return "\n".join(json.dumps(r) for r in records) + "\n"


def _merged(text: str) -> int:
    return next(i for i, r in enumerate(_records(text)) if r.get("merged_into") is not None)


def _topic(text: str, sequence: int) -> int:
    return next(
        i for i, r in enumerate(_records(text)) if r.get("tier") == "topic" and r["sequence"] == sequence
    )


def _message_at(text: str, sequence: int, **fields: Any) -> dict[str, Any]:
    record = _records(text)[sequence]
    return {"message": {**record["message"], **fields}}


@pytest.mark.parametrize(
    ("what", "make", "error"),
    [
        ("bad role", lambda t: _corrupt(t, 30, _message_at(t, 30, role="robot")), InvalidMessageError),
        (
            "NUL in content",
            lambda t: _corrupt(t, 31, _message_at(t, 31, content="a\x00b")),
            InvalidMessageError,
        ),
        ("token counts are not taken", lambda t: _corrupt(t, 5, {"token_count": 1}), TranscriptError),
        ("naive time", lambda t: _corrupt(t, 7, {"timestamp": "2025-03-01T09:00:00"}), TranscriptError),
        # In range as written, out of it in UTC (a raw OverflowError before).
        (
            "past year 9999 in UTC",
            lambda t: _corrupt(t, 7, {"timestamp": "9999-12-31T23:59:59-14:00"}),
            TranscriptError,
        ),
        (
            "before year 1 in UTC",
            lambda t: _corrupt(t, 0, {"created_at": "0001-01-01T00:00:00+14:00"}),
            TranscriptError,
        ),
        ("gap in sequences", lambda t: _corrupt(t, 8, {"sequence": 99}), TranscriptError),
        (
            "pin of a missing key",
            lambda t: _corrupt(t, 0, {"pins": [{"key": "x", "sequence": 1}]}),
            TranscriptError,
        ),
        ("unknown version", lambda t: _corrupt(t, 0, {"version": 2}), TranscriptError),
        ("summary past the end", lambda t: _corrupt(t, -1, {"last_sequence": 10_000}), TranscriptError),
        ("merged into nothing", lambda t: _corrupt(t, _merged(t), {"merged_into": 999}), TranscriptError),
        ("overlapping topics", lambda t: _corrupt(t, _topic(t, 2), {"first_sequence": 1}), TranscriptError),
        (
            "a pending topic with text",
            lambda t: _corrupt(t, _topic(t, 1), {"status": "pending"}),
            TranscriptError,
        ),
        ("not JSON", lambda t: t + "{oops\n", TranscriptError),
        ("a transcript, not an export", lambda t: '{"role": "user", "content": "hi"}\n', TranscriptError),
        ("empty", lambda t: "", TranscriptError),
    ],
)
def test_a_rejected_file_stores_nothing(what: str, make: Any, error: type[Exception], tmp_path: Path) -> None:
    with SyncHistoryCompressor.from_url(f"sqlite:///{tmp_path / 'h.db'}", **SMALL) as hc:
        source = _exported_sync()
        bad = make(source)
        with pytest.raises(error):
            hc.import_conversation(bad, conversation_id="imported")
        assert not hc.exists("imported")
        assert hc.conversation_ids() == []
        # The untouched file imports (so each case failed for its own reason).
        hc.import_conversation(source, conversation_id="imported")
        assert hc.exists("imported")


_CACHE: list[str] = []


def _exported_sync() -> str:
    """One export of the fixture conversation, shared by the rejection cases."""
    if not _CACHE:
        import asyncio

        async def build() -> str:
            async with HistoryCompressor.from_url("memory://", **SMALL) as hc:
                await _build(hc)
                return await hc.export_conversation("c")

        _CACHE.append(asyncio.run(build()))
    return _CACHE[0]


def test_a_tool_result_that_answers_no_call_is_refused() -> None:
    text = _exported_sync()
    records = _records(text)
    calls = [
        i for i, r in enumerate(records) if r.get("type") == "message" and r["message"]["role"] == "tool"
    ]
    assert calls
    records[calls[0]]["message"]["tool_call_id"] = "call_nobody_made"
    with SyncHistoryCompressor.from_url("memory://", **SMALL) as hc:
        with pytest.raises(TranscriptError, match="answers no open tool call"):
            hc.import_conversation([json.dumps(r) for r in records])
        assert hc.conversation_ids() == []


async def test_messages_only_export_has_its_topics_found_again(url: str) -> None:
    async with HistoryCompressor.from_url(url, **SMALL) as hc:
        await _build(hc)
        text = await hc.export_conversation("c", summaries=False)
        assert all(r.get("type") != "summary" for r in _records(text))
        await hc.import_conversation(text, conversation_id="again")
        again, original = await hc.get_history("again"), await hc.get_history("c")
        assert [m.to_openai() for m in again.messages] == [m.to_openai() for m in original.messages]
        assert again.topics and all(t.status == "pending" for t in again.topics)
        await hc.maintain("again")
        assert all(t.status != "pending" for t in (await hc.get_history("again")).topics)
        assert (await hc.get_context("again", 700)).total_tokens <= 700
        # The active pins are the file's: the replaced and the removed one are not sent.
        sent = (await hc.get_context("again", 700)).to_messages()
        assert [m["content"] for m in sent[:2]] == ["You are a terse assistant.", "You are very terse."]
        assert not any(m.get("content") == "Remember the user's name." for m in sent)


def test_the_blocking_twin_reads_a_file_line_by_line(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(_exported_sync(), encoding="utf-8")
    assert is_export(path.read_text(encoding="utf-8").splitlines()[0])
    assert read_export(path.read_text(encoding="utf-8")).conversation_id == "c"
    with SyncHistoryCompressor.from_url(f"sqlite:///{tmp_path / 'h.db'}", **SMALL) as hc:
        with path.open(encoding="utf-8") as lines:
            info = hc.import_conversation(lines)
        assert info.conversation_id == "c" and info.platform == "discord"
        assert hc.export_conversation("c") == _exported_sync()
        with pytest.raises(ConversationNotFoundError):
            hc.export_conversation("missing")


def test_spend_and_summary_fields_survive() -> None:
    records = _records(_exported_sync())
    topic = next(i for i, r in enumerate(records) if r.get("type") == "summary")
    records[topic].update(prompt_tokens=120, completion_tokens=30, cost=0.25, latency_ms=12.5, model="m")
    with SyncHistoryCompressor.from_url("memory://", **SMALL) as hc:
        hc.import_conversation("\n".join(json.dumps(r) for r in records))
        (stats,) = hc.stats("c")
        assert (stats.summarizer_prompt_tokens, stats.summarizer_completion_tokens) == (120, 30)
        assert stats.summarizer_cost == pytest.approx(0.25)
        assert _records(hc.export_conversation("c"))[topic] == records[topic]


def test_the_header_names_its_format() -> None:
    head = _records(_exported_sync())[0]
    assert head["format"] == FORMAT and head["version"] == 1
    pinned = [(r["pin_key"], r["sequence"]) for r in _records(_exported_sync()) if r.get("pinned")]
    # Four messages were pinned; the first system prompt was replaced and "memory" unpinned.
    assert [k for k, _ in pinned] == ["system", "memory", f"#{pinned[2][1]}", "system"]
    assert head["pins"] == [{"key": k, "sequence": q} for k, q in pinned[2:]]
    assert isinstance(TranscriptError("x"), TieredHistoryError)
