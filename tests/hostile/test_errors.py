"""Issue 17, items 8-12: every rejection is a tiered_history.errors exception, and stores nothing."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tiered_history import (
    ConfigurationError,
    HistoryCompressor,
    InvalidMessageError,
    Settings,
    SyncHistoryCompressor,
    TieredHistoryError,
)
from tiered_history.cli import app

from ..conftest import database_url

runner = CliRunner()


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with database_url(request.param, tmp_path) as u:
        yield u


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in list(os.environ):
        if key.startswith("TIERED_HISTORY_") and key != "TIERED_HISTORY_BOUNDARIES__MIN_TOPIC_TOKENS":
            monkeypatch.delenv(key)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


def cli(db: str, *args: str, **kwargs: Any) -> Any:
    return runner.invoke(app, ["--database-url", db, *args], **kwargs)


# -- 8. import validates the whole file, then stores it in one go ---------------------------------


@pytest.mark.usefixtures("clean_env")
def test_item08_import_of_a_file_with_an_orphan_tool_result_stores_nothing(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'imp.db'}"
    rows = [
        {"conversation_id": "a", "role": "user", "content": "one"},
        {"conversation_id": "b", "role": "user", "content": "two"},
        {"conversation_id": "a", "role": "assistant", "content": "three"},
        {"conversation_id": "a", "role": "tool", "tool_call_id": "call_nobody", "content": "orphan"},
    ]
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    result = cli(db, "import", str(path))
    assert result.exit_code == 1, result.output
    assert "line 4" in result.stderr and "Traceback" not in result.output
    with SyncHistoryCompressor(db) as hc:
        assert hc.conversation_ids() == []


# -- 9. wrong types are library errors ------------------------------------------------------------


@pytest.mark.parametrize("message", [None, "hello", 42, ["role", "user"], object(), b"x", 3.5, True])
async def test_item09_non_dict_message_is_an_invalid_message(url: str, message: Any) -> None:
    async with HistoryCompressor(url) as hc:
        with pytest.raises(InvalidMessageError, match="message"):
            await hc.add_message("c", message)
        with pytest.raises(InvalidMessageError):
            await hc.add_messages("c", [{"role": "user", "content": "fine"}, message])
        assert not await hc.exists("c")


@pytest.mark.parametrize("limit", ["3", 2.5, None, True, 0, -1, -100])
async def test_item09_bad_search_limit_is_rejected(url: str, limit: Any) -> None:
    async with HistoryCompressor(url) as hc:
        for i in range(3):
            await hc.add_message("c", {"role": "user", "content": f"hi there {i}"})
        with pytest.raises(InvalidMessageError, match="limit"):
            await hc.search("c", "hi", limit=limit)
        assert len(await hc.search("c", "hi", limit=2)) == 2


def test_item09_settings_load_on_a_directory_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="is a directory"):
        Settings.load(tmp_path)
    unreadable = tmp_path / "bad.yaml"
    unreadable.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ConfigurationError, match=r"bad\.yaml"):
        Settings.load(unreadable)


# -- 10. instants past year 9999 in UTC -----------------------------------------------------------


@pytest.mark.parametrize(
    "ts", ["9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+05:00", "+10000-01-01T00:00:00Z"]
)
async def test_item10_timestamp_outside_years_1_to_9999_is_rejected(url: str, ts: Any) -> None:
    async with HistoryCompressor(url) as hc:
        with pytest.raises(InvalidMessageError, match="timestamp"):
            await hc.add_message("c", {"role": "user", "content": "hi", "timestamp": ts})
        assert not await hc.exists("c")
        await hc.add_message("c", {"role": "user", "content": "hi", "timestamp": "9999-12-31T23:59:59+00:00"})
        report = await hc.maintain()
        assert report is not None


# -- 11. metadata numbers are finite --------------------------------------------------------------


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), {"deep": [1, float("nan")]}])
async def test_item11_non_finite_metadata_is_rejected(url: str, value: Any) -> None:
    async with HistoryCompressor(url) as hc:
        with pytest.raises(InvalidMessageError, match="metadata"):
            await hc.add_message("c", {"role": "user", "content": "hi", "metadata": {"score": value}})
        assert not await hc.exists("c")


@pytest.mark.usefixtures("clean_env")
def test_item11_history_json_is_strict_json(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'h.db'}"
    path = tmp_path / "nan.jsonl"
    path.write_text(
        '{"conversation_id": "c", "role": "user", "content": "hi", "metadata": {"score": NaN}}\n',
        encoding="utf-8",
    )
    result = cli(db, "import", str(path))
    assert result.exit_code == 1, result.output
    assert cli(db, "add", "c", "--content", "hello").exit_code == 0
    out = cli(db, "history", "c", "--json").stdout
    json.loads(out, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c} in output"))


# -- 12. the in-memory store keeps its own copies -------------------------------------------------


async def test_item12_memory_store_does_not_share_objects_with_the_caller() -> None:
    async with HistoryCompressor("memory://") as hc:
        calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
        meta: dict[str, Any] = {"tags": ["a"]}
        parts = [{"type": "text", "text": "hello"}]
        await hc.add_message("c", {"role": "user", "content": parts, "metadata": meta})
        await hc.add_message("c", {"role": "assistant", "content": None, "tool_calls": calls})
        calls[0]["id"] = "changed"
        calls.append({"id": "c2"})
        meta["tags"].append("b")
        parts[0]["text"] = "changed"
        first = (await hc.get_messages("c"))[0]
        first.metadata["tags"].append("mutated")
        got = await hc.get_messages("c")
        assert got[0].metadata == {"tags": ["a"]}
        assert got[0].to_openai()["content"] == [{"type": "text", "text": "hello"}]
        assert got[1].tool_calls == [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ]
        got[1].to_openai()["tool_calls"][0]["id"] = "x"
        assert (await hc.get_messages("c"))[1].tool_calls[0]["id"] == "c1"  # type: ignore[index]
        ctx = await hc.get_context("c", max_tokens=1000)
        ctx.to_messages()[0]["content"][0]["text"] = "x"
        assert (await hc.get_messages("c"))[0].to_openai()["content"][0]["text"] == "hello"


def test_item_errors_are_library_errors() -> None:
    assert issubclass(InvalidMessageError, TieredHistoryError)
    assert issubclass(ConfigurationError, TieredHistoryError)
