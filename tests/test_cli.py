"""The ``tiered-history`` command line, through typer's CliRunner (and one real process for signals)."""

from __future__ import annotations

import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from tiered_history import cli
from tiered_history.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in list(os.environ):
        if key.startswith("TIERED_HISTORY_"):
            monkeypatch.delenv(key)
    # The default database lives in the user data dir: keep it inside the test's tmp dir.
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def run(db_url: str | None, *args: str, **kwargs: Any) -> Any:
    argv = (["--database-url", db_url] if db_url else []) + list(args)
    return runner.invoke(app, argv, **kwargs)


def ok(db_url: str | None, *args: str) -> Any:
    result = run(db_url, *args)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def as_json(db_url: str | None, *args: str) -> Any:
    return json.loads(ok(db_url, *args, "--json").stdout)


def assert_one_line_error(result: Any, code: int, *fragments: str) -> None:
    assert result.exit_code == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def message_count(db_url: str, conversation: str) -> int:
    return int(as_json(db_url, "stats", conversation)[0]["messages"])


# -- help and docs --------------------------------------------------------------------------------


def all_commands() -> Iterator[tuple[str, Any]]:
    def walk(prefix: str, command: Any) -> Iterator[tuple[str, Any]]:
        for name, sub in getattr(command, "commands", {}).items():
            path = f"{prefix} {name}".strip()
            yield path, sub
            yield from walk(path, sub)

    yield from walk("", get_command(app))


def test_command_list_is_complete() -> None:
    names = {path for path, _ in all_commands()}
    expected = {"demo", "import", "add", "context", "history", "seal", "stats", "maintain", "search"}
    assert names >= expected | {"worker", "db", "db upgrade", "db current", "db optimize"}


@pytest.mark.parametrize("path", [p for p, _ in all_commands()])
def test_every_command_has_help_and_is_documented(path: str) -> None:
    command = dict(all_commands())[path]
    assert (command.help or "").strip(), f"{path} has no help text"
    result = runner.invoke(app, [*path.split(), "--help"])
    assert result.exit_code == 0
    assert "Usage" in result.stdout
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    text = "\n".join(p.read_text(encoding="utf-8") for p in docs if p.is_file())
    assert f"tiered-history {path}" in text, f"'tiered-history {path}' is not in README.md or docs/*.md"


def test_version_and_module_entry_point() -> None:
    assert "tiered-history" in ok(None, "--version").stdout
    proc = subprocess.run(
        [sys.executable, "-m", "tiered_history", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and "demo" in proc.stdout


# -- usage errors (exit 2) ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["frobnicate"],
        ["context"],
        ["add", "c1"],
        ["add", "c1", "--content", "x", "--role", "wizard"],
        ["context", "c1", "--max-tokens", "lots"],
        ["stats", "--no-such-option"],
        ["demo", "--max-tokens", "10"],
    ],
)
def test_usage_errors_exit_2_with_one_line(db: str, args: list[str]) -> None:
    assert_one_line_error(run(db, *args), 2)


def test_no_command_prints_help() -> None:
    result = runner.invoke(app, [])
    assert result.exit_code == 2
    assert "Usage" in result.stdout
    assert "Traceback" not in result.output


# -- library errors (exit 1) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["context", "nobody"],
        ["history", "nobody"],
        ["seal", "nobody"],
        ["stats", "nobody"],
        ["maintain", "nobody"],
        ["search", "nobody", "text"],
    ],
)
def test_unknown_conversation_exits_1(db: str, args: list[str]) -> None:
    ok(db, "add", "somebody", "--content", "hello")
    assert_one_line_error(run(db, *args), 1, "no conversation 'nobody'")


@pytest.mark.parametrize(
    ("url", "fragment"),
    [("foo://bar", "unsupported database"), ("::::", "invalid database URL"), ("mysql://x/y", "mysql")],
)
def test_bad_database_url(url: str, fragment: str) -> None:
    assert_one_line_error(run(url, "stats"), 1, fragment)
    assert_one_line_error(run(url, "db", "current"), 1, fragment)


def test_unreachable_sqlite_path(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'missing' / 'dir' / 'x.db'}"
    assert_one_line_error(run(url, "db", "upgrade"), 1, "database error")
    assert_one_line_error(run(url, "add", "c", "--content", "hi"), 1, "database error")


def test_bad_config_key(tmp_path: Path, db: str) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("context_budget: 4000\ncolour: blue\n", encoding="utf-8")
    assert_one_line_error(run(db, "--config", str(config), "stats"), 1, "colour", "unknown setting")
    config.write_text("tiers: {current_topic: 2}\n", encoding="utf-8")
    assert_one_line_error(run(db, "--config", str(config), "stats"), 1, "tiers.current_topic")
    assert_one_line_error(run(db, "--config", str(tmp_path / "nope.yaml"), "stats"), 1, "does not exist")


def test_bad_config_from_environment(tmp_path: Path, db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("summarizer: {kind: magic}\n", encoding="utf-8")
    monkeypatch.setenv("TIERED_HISTORY_CONFIG", str(config))
    assert_one_line_error(run(db, "stats"), 1, "summarizer.kind")


def test_invalid_message(db: str) -> None:
    assert_one_line_error(run(db, "add", "c", "--content", "   "), 1, "content")
    assert_one_line_error(run(db, "add", "c", "--role", "tool", "--content", "x"), 1, "tool_call_id")
    assert_one_line_error(run(db, "add", "c", "--content", "x", "--name", "bad name!"), 1, "name")
    assert_one_line_error(run(db, "add", " ", "--content", "x"), 1, "conversation id")


def test_budget_too_small(db: str) -> None:
    ok(db, "add", "c", "--content", "hello")
    assert_one_line_error(run(db, "context", "c", "--max-tokens", "5"), 1, "max_tokens")


def test_unexpected_errors_are_one_line(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: Any, **__: Any) -> Any:
        raise RuntimeError("kaboom\nsecond line")

    monkeypatch.setattr(cli.SyncHistoryCompressor, "stats", boom)
    assert_one_line_error(run(db, "stats"), 1, "RuntimeError", "kaboom second line")


# -- database location ----------------------------------------------------------------------------


@pytest.mark.skipif(sys.platform != "linux", reason="XDG_DATA_HOME steers platformdirs on Linux only")
def test_default_database_in_user_data_dir(tmp_path: Path) -> None:
    ok(None, "add", "c", "--content", "hello")
    assert (tmp_path / "xdg" / "tiered-history" / "history.db").is_file()
    assert message_count(f"sqlite:///{tmp_path / 'xdg' / 'tiered-history' / 'history.db'}", "c") == 1
    assert cli.default_database_url(create=False).endswith("tiered-history/history.db")


def test_database_url_from_environment_and_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_db = tmp_path / "env.db"
    monkeypatch.setenv("TIERED_HISTORY_DATABASE_URL", f"sqlite:///{env_db}")
    ok(None, "add", "c", "--content", "hello")
    assert env_db.is_file()
    monkeypatch.delenv("TIERED_HISTORY_DATABASE_URL")
    cfg_db = tmp_path / "cfg.db"
    config = tmp_path / "c.yaml"
    config.write_text(f"database_url: sqlite:///{cfg_db}\n", encoding="utf-8")
    ok(None, "--config", str(config), "add", "c", "--content", "hello")
    assert cfg_db.is_file()


def test_memory_url_works(db: str) -> None:
    assert "nothing" in ok("memory://", "db", "upgrade").stdout
    assert "No conversations" in ok("memory://", "stats").stdout
    # A database that ends with the command cannot be written to: it would keep nothing.
    assert_one_line_error(run("memory://", "add", "c", "--content", "hi"), 1, "keeps nothing")


# -- commands -------------------------------------------------------------------------------------


def test_db_upgrade_and_current(db: str) -> None:
    from tiered_history.store.migrate import head_revision

    missing = run(db, "db", "current", "--json")
    assert missing.exit_code == 1  # only a schema at head exits 0
    before = json.loads(missing.stdout)
    assert before["current"] is None and before["at_head"] is False
    assert "no schema" in run(db, "db", "current").stdout
    assert "Upgraded" in ok(db, "db", "upgrade").stdout
    assert "already" in ok(db, "db", "upgrade").stdout
    after = as_json(db, "db", "current")
    assert after == {"database_url": db, "current": head_revision(), "head": head_revision(), "at_head": True}
    assert "(head)" in ok(db, "db", "current").stdout


def test_a_database_migrated_by_a_newer_library_says_to_upgrade_the_library(db: str) -> None:
    import sqlite3

    ok(db, "db", "upgrade")
    with sqlite3.connect(db.removeprefix("sqlite:///")) as c:
        c.execute("UPDATE alembic_version SET version_num = '0099'")
    current = run(db, "db", "current")
    assert current.exit_code == 1
    assert "does not know" in current.stdout and "upgrade tiered-history" in current.stdout
    assert "run 'tiered-history db upgrade'" not in current.stdout  # which would fail
    assert_one_line_error(run(db, "db", "upgrade"), 1, "upgrade tiered-history")
    # A command that needs the schema says the same (it creates and changes nothing).
    assert_one_line_error(run(db, "stats"), 1, "upgrade tiered-history")


def test_db_optimize_merges_the_full_text_segments_and_changes_nothing_found(db: str) -> None:
    import sqlite3

    assert "nothing" in ok("memory://", "db", "optimize").stdout
    assert_one_line_error(run(db, "db", "optimize"), 1, "db upgrade")  # no schema: nothing made
    assert not Path(db.removeprefix("sqlite:///")).exists()
    for i in range(30):  # a transaction each: FTS5 adds a segment per transaction
        ok(db, "add", "c", "--content", f"harbour trip number {i} with the ferry")
    path = db.removeprefix("sqlite:///")

    def segments() -> int:
        with sqlite3.connect(path) as c:
            return int(c.execute("SELECT count(DISTINCT segid) FROM messages_fts_idx").fetchone()[0])

    found = as_json(db, "search", "c", "ferry harbour")
    assert segments() > 1
    report = as_json(db, "db", "optimize")
    assert report["steps"][:2] == ["messages_fts: optimize", "summaries_fts: optimize"]
    assert segments() == 1
    assert as_json(db, "search", "c", "ferry harbour") == found
    assert "Optimized" in ok(db, "db", "optimize").stdout


def test_add_context_history_seal_maintain_search(db: str) -> None:
    stored = as_json(db, "add", "c1", "--role", "system", "--content", "Be brief.", "--pinned")
    assert stored["sequence"] == 1 and stored["pinned"] is True
    ok(db, "add", "c1", "--content", "Plan a trip to Kyoto", "--name", "Maya", "--platform", "discord")
    ok(db, "add", "c1", "--role", "assistant", "--content", "Kyoto in October is lovely.")

    ctx = as_json(db, "context", "c1", "--max-tokens", "500")
    assert ctx["max_tokens"] == 500 and ctx["total_tokens"] <= 500
    assert [m["role"] for m in ctx["messages"]] == ["system", "user", "assistant"]
    assert ctx["messages"][1]["name"] == "Maya"
    assert set(ctx["allocation"]) == {"current", "topic", "bulk"}
    assert "Token split" in ok(db, "context", "c1").stdout

    assert len(as_json(db, "history", "c1")["messages"]) == 3
    assert "Kyoto" in ok(db, "history", "c1").stdout

    assert "Sealed topic #1" in ok(db, "seal", "c1").stdout
    assert "Nothing to seal" in ok(db, "seal", "c1").stdout
    report = as_json(db, "maintain", "c1")
    assert report["summarized"] == 1 and report["errors"] == []
    assert "summarised" in ok(db, "maintain").stdout

    hist = as_json(db, "history", "c1")
    assert len(hist["topics"]) == 1 and hist["topics"][0]["status"] == "final"
    ctx = as_json(db, "context", "c1", "--max-tokens", "500")
    # The sealed topic still fits whole: its messages are sent verbatim, not its summary.
    assert ctx["counts"]["historical_topics"] == 0 and ctx["counts"]["current_topic"] == 2

    found = as_json(db, "search", "c1", "kyoto", "--limit", "1")
    assert len(found) == 1 and found[0]["sequence"] == 3
    assert "matches" in ok(db, "search", "c1", "kyoto").stdout
    assert "No message" in ok(db, "search", "c1", "zebra").stdout


def test_add_reads_stdin(db: str) -> None:
    result = run(db, "add", "c", "--content", "-", input="from a pipe\n")
    assert result.exit_code == 0
    assert as_json(db, "history", "c")["messages"][0]["content"] == "from a pipe"  # final newline dropped


def test_stats(db: str) -> None:
    assert as_json(db, "stats") == []
    assert "No conversations" in ok(db, "stats").stdout
    ok(db, "add", "a", "--content", "hello")
    ok(db, "add", "b", "--content", "hi", "--platform", "slack")
    rows = as_json(db, "stats")
    assert {r["conversation_id"] for r in rows} == {"a", "b"}
    for key in ("tier_tokens", "compressions", "summarizer_cost", "summarizer_prompt_tokens"):
        assert key in rows[0]
    text = ok(db, "stats").stdout
    assert "current topic" in text and "compressions" in text and "slack" in text
    assert "▕" in text  # the usage bar
    assert [r["conversation_id"] for r in as_json(db, "stats", "b")] == ["b"]


# -- import ---------------------------------------------------------------------------------------

OPENAI_LIST = [
    {"role": "system", "content": "You are helpful.", "pinned": True},
    {"role": "user", "content": "What's the weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    {"role": "assistant", "content": [{"type": "text", "text": "It's 18 C and sunny."}]},
    {"role": "user", "content": "ok"},
    {"role": "user", "content": "ok"},
]


def test_import_json_list_is_idempotent(tmp_path: Path, db: str) -> None:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(OPENAI_LIST), encoding="utf-8")
    first = as_json(db, "import", str(path), "--conversation", "paris")
    assert first == {"imported": 7, "skipped": 0, "conversations": {"paris": 7}}
    second = as_json(db, "import", str(path), "--conversation", "paris")
    assert second == {"imported": 0, "skipped": 7, "conversations": {}}
    assert message_count(db, "paris") == 7  # the repeated "ok" was not mistaken for a duplicate
    again = ok(db, "import", str(path), "-c", "paris")
    assert "Imported 0 messages into 0 conversations; skipped 7" in again.stdout
    assert again.stderr == ""  # no progress bar (nor what ends it) where stderr is no terminal
    assert message_count(db, "paris") == 7

    # A longer transcript imports only the new tail; another conversation imports everything.
    path.write_text(json.dumps([*OPENAI_LIST, {"role": "assistant", "content": "Anything else?"}]))
    assert "Imported 1 message into 1 conversation;" in ok(db, "import", str(path), "-c", "paris").stdout
    assert message_count(db, "paris") == 8
    assert as_json(db, "import", str(path), "-c", "other")["imported"] == 8

    messages = as_json(db, "history", "paris")["messages"]
    assert messages[0]["pinned"] is True
    assert messages[2]["tool_calls"][0]["id"] == "call_1"
    assert messages[4]["content"] == "It's 18 C and sunny."
    assert all(cli.IMPORT_KEY in m["metadata"] for m in messages)


def test_import_jsonl_with_conversation_ids(tmp_path: Path, db: str) -> None:
    rows = [
        {"conversation_id": "a", "role": "user", "content": "one", "timestamp": "2024-05-01T10:00:00Z"},
        {"conversation_id": "b", "role": "user", "content": "two", "timestamp": "2024-05-01T10:00:00"},
        {"conversation_id": "a", "role": "assistant", "content": "three", "timestamp": 1714557660},
    ]
    path = write_jsonl(tmp_path / "chats.jsonl", rows)
    assert as_json(db, "import", str(path))["conversations"] == {"a": 2, "b": 1}
    assert as_json(db, "import", str(path))["imported"] == 0
    assert message_count(db, "a") == 2 and message_count(db, "b") == 1
    msgs = as_json(db, "history", "a")["messages"]
    assert msgs[0]["timestamp"].startswith("2024-05-01T10:00:00")
    assert msgs[1]["timestamp"].startswith("2024-05-01T10:01:00")
    b = as_json(db, "history", "b")["messages"][0]
    assert b["timestamp"].endswith("+00:00")  # naive timestamps are taken as UTC


def test_import_object_format(tmp_path: Path, db: str) -> None:
    path = tmp_path / "conv.json"
    path.write_text(json.dumps({"conversation_id": "obj", "messages": OPENAI_LIST[:2]}), encoding="utf-8")
    assert as_json(db, "import", str(path))["conversations"] == {"obj": 2}
    # --conversation overrides the id in the file.
    assert as_json(db, "import", str(path), "-c", "renamed")["conversations"] == {"renamed": 2}


def test_import_sample_conversation(db: str) -> None:
    sample = ROOT / "tiered_history" / "data" / "sample_conversation.jsonl"
    result = as_json(db, "import", str(sample))
    assert result["imported"] >= 200
    assert as_json(db, "import", str(sample))["imported"] == 0


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ('{"role": "user", "content": "a"}\n{broken\n', "line 2"),
        ('"just a string"', "expected a JSON list"),
        ('[{"role": "user", "content": "a"}]', "--conversation"),
        ('{"conversation_id": "x", "role": "wizard", "content": "a"}\n', "line 1"),
        ('{"conversation_id": "x", "role": "user", "content": "a", "timestamp": "soon"}\n', "timestamp"),
        ('{"conversation_id": "x", "role": "tool", "content": "a"}\n', "tool_call_id"),
        ('{"conversation_id": 7, "role": "user", "content": "a"}\n', "must be a string"),
    ],
)
def test_import_bad_file(tmp_path: Path, db: str, content: str, fragment: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    assert_one_line_error(run(db, "import", str(path)), 1, fragment)


def test_import_list_of_non_objects(tmp_path: Path, db: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text("[1, 2]", encoding="utf-8")
    assert_one_line_error(run(db, "import", str(path), "-c", "x"), 1, "message 1", "JSON object")


def test_import_bad_file_imports_nothing(tmp_path: Path, db: str) -> None:
    path = write_jsonl(
        tmp_path / "half.jsonl",
        [
            {"conversation_id": "h", "role": "user", "content": "fine"},
            {"conversation_id": "h", "role": "nobody", "content": "bad"},
        ],
    )
    assert_one_line_error(run(db, "import", str(path)), 1, "line 2")
    assert_one_line_error(run(db, "stats", "h"), 1, "no conversation")


def test_import_missing_file(tmp_path: Path, db: str) -> None:
    assert_one_line_error(run(db, "import", str(tmp_path / "nope.json"), "-c", "x"), 1, "no such file")


# -- demo -----------------------------------------------------------------------------------------


def test_demo_with_database_url(db: str) -> None:
    started = time.monotonic()
    result = ok(db, "demo", "--max-tokens", "2000")
    assert time.monotonic() - started < 60
    text = result.stdout
    for fragment in ("Pinned", "Bulk archives", "Topic summaries", "Current topic", "Token split"):
        assert fragment in text
    assert "compression ratio" in text and "of 2000 tokens" in text
    stats = as_json(db, "stats", cli.DEMO_CONVERSATION)[0]
    assert stats["messages"] >= 200 and stats["compressions"] > 0 and stats["archives"] >= 1
    # Re-running against the same database adds nothing (the replay is an idempotent import).
    ok(db, "demo")
    assert as_json(db, "stats", cli.DEMO_CONVERSATION)[0]["messages"] == stats["messages"]


def test_demo_uses_a_temporary_database(tmp_path: Path) -> None:
    result = ok(None, "demo", "--max-tokens", "3000")
    assert "temporary SQLite file" in result.stdout
    assert "of 3000 tokens" in result.stdout
    assert not (tmp_path / "xdg" / "tiered-history" / "history.db").exists()


def test_sample_conversation_shape() -> None:
    rows = [
        json.loads(line)
        for line in (ROOT / "tiered_history" / "data" / "sample_conversation.jsonl").read_text().splitlines()
    ]
    assert 200 <= len(rows) <= 600
    assert rows[0]["role"] == "system" and rows[0]["pinned"] is True
    assert any(r.get("tool_calls") for r in rows) and any(r["role"] == "tool" for r in rows)
    text = " ".join(r["content"].lower() for r in rows)
    assert "new topic" in text and "let's move on" in text
    times = [datetime.fromisoformat(r["timestamp"]) for r in rows]
    assert times == sorted(times)
    assert max(b - a for a, b in itertools.pairwise(times)).total_seconds() > 30 * 60


# -- worker ---------------------------------------------------------------------------------------


def test_worker_stops_on_signal(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """In process: the worker passes the compressor, interval and an event that SIGINT sets."""
    import asyncio

    from tiered_history import scheduler

    seen: dict[str, Any] = {}

    async def fake_run_worker(compressor: Any, interval_seconds: float, stop_event: Any = None) -> None:
        seen["interval"] = interval_seconds
        seen["report"] = await compressor.maintain()
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.wait_for(stop_event.wait(), timeout=10)
        seen["stopped"] = stop_event.is_set()

    monkeypatch.setattr(scheduler, "run_worker", fake_run_worker)
    ok(db, "add", "c", "--content", "hello")
    result = ok(db, "worker", "--interval", "0.25")
    assert seen["interval"] == 0.25 and seen["stopped"] is True
    assert "Worker stopped" in result.stdout
    # The default interval comes from the settings.
    ok(db, "worker")
    assert seen["interval"] == 30.0


class SplitAtFive:
    """A pluggable detector the worker loads by name (``tests.test_cli:SplitAtFive``)."""

    name = "at-five"
    window = 8
    asked: ClassVar[list[list[int]]] = []

    async def propose(self, turns: Sequence[Any]) -> list[Any]:
        from tiered_history import Proposal

        SplitAtFive.asked.append([t.sequence for t in turns])
        return [Proposal(5, 0.9)]


def test_worker_asks_the_detectors_it_is_given(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``worker --detector MODULE:NAME`` loads the detector and its passes ask it; a bot process
    that passes the same detector only marks conversations due (it never runs maintenance)."""
    import asyncio

    from tiered_history import SyncHistoryCompressor, scheduler

    rules = {"COHESION": "false", "SIZE": "false", "MIN_TOPIC_TOKENS": "0", "DETECTOR_EVERY": "1"}
    for key, value in rules.items():
        monkeypatch.setenv(f"TIERED_HISTORY_BOUNDARIES__{key}", value)
    SplitAtFive.asked.clear()
    texts = ["Tomato seedlings?", "Water daily.", "Fertiliser?", "Not yet.", "Passport?", "Online."]
    with SyncHistoryCompressor(db, detectors=[SplitAtFive()]) as bot:
        for i, text in enumerate(texts):
            bot.add_message("c", {"role": "user" if i % 2 == 0 else "assistant", "content": text})
    assert SplitAtFive.asked == []  # the reply path never asks a detector

    seen: dict[str, Any] = {}

    async def fake_run_worker(compressor: Any, interval_seconds: float, stop_event: Any = None) -> None:
        seen["names"] = [d.name for d in compressor.detectors]
        seen["report"] = await compressor.maintain()
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.wait_for(stop_event.wait(), timeout=10)

    monkeypatch.setattr(scheduler, "run_worker", fake_run_worker)
    ok(db, "worker", "--detector", "tests.test_cli:SplitAtFive")
    assert seen["names"] == ["at-five"]
    assert seen["report"].detector_splits == 1 and SplitAtFive.asked == [[1, 2, 3, 4, 5, 6]]
    with SyncHistoryCompressor(db) as bot:
        [topic] = bot.get_history("c").topics
        assert (topic.first_sequence, topic.last_sequence, topic.sealed_reason) == (1, 4, "detector:at-five")


@pytest.mark.parametrize("spec", ["nocolon", "tests.test_cli:NoSuchThing", "no_such_module_xyz:X"])
def test_worker_rejects_a_detector_it_cannot_load(db: str, spec: str) -> None:
    result = run(db, "worker", "--detector", spec)
    assert result.exit_code == 2 and "--detector" in result.stderr


def _read_lines(stream: Any, into: queue.Queue[str]) -> None:
    for line in iter(stream.readline, ""):
        into.put(line)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_worker_process_shuts_down_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERED_HISTORY_")}
    env["TIERED_HISTORY_DATABASE_URL"] = f"sqlite:///{tmp_path / 'worker.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tiered_history", "worker", "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
    try:
        first = lines.get(timeout=60)
        assert "running maintenance every 0.2 s" in first
        time.sleep(0.5)  # a few passes
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    rest = []
    while not lines.empty():
        rest.append(lines.get())
    assert "Worker stopped." in "".join(rest)
    assert proc.stderr is not None
    assert "Traceback" not in proc.stderr.read()


def test_typer_app_object() -> None:
    assert isinstance(app, typer.Typer)
