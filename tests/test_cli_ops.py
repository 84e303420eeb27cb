"""The operator commands of the CLI: tool calls in ``add``, ``conversations``, ``delete``, ``export``
and restoring an export with ``import``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tiered_history import SyncHistoryCompressor
from tiered_history.core.budget import MIN_MAX_TOKENS

from .test_cli import as_json, assert_one_line_error, ok, run


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in list(os.environ):
        if key.startswith("TIERED_HISTORY_") and key != "TIERED_HISTORY_BOUNDARIES__MIN_TOPIC_TOKENS":
            monkeypatch.delenv(key)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ops.db'}"


def _sent(db: str, cid: str) -> list[dict[str, Any]]:
    return list(as_json(db, "context", cid, "--max-tokens", "4000")["messages"])


# -- add: tool calls and whole messages -------------------------------------------------------------


def test_add_stores_a_tool_call_and_its_results_that_a_provider_accepts(db: str) -> None:
    ok(db, "add", "bot", "--content", "Weather and time in Paris?")
    stored = as_json(
        db,
        "add",
        "bot",
        "--tool-call",
        'get_weather={"city": "Paris"}',
        "--tool-call",
        "get_time={}",
        "--tool-call-id",
        "call_w",
        "--tool-call-id",
        "call_t",
    )
    assert stored["role"] == "assistant"
    assert [c["id"] for c in stored["tool_calls"]] == ["call_w", "call_t"]
    ok(db, "add", "bot", "--role", "tool", "--tool-call-id", "call_w", "--content", "18C, sunny")
    ok(db, "add", "bot", "--role", "tool", "--tool-call-id", "call_t", "--content", "12:00")
    assert _sent(db, "bot")[1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_w",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {"id": "call_t", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_w", "content": "18C, sunny"},
        {"role": "tool", "tool_call_id": "call_t", "content": "12:00"},
    ]


def test_generated_call_ids_are_printed_for_the_results(db: str) -> None:
    ok(db, "add", "bot", "--content", "look it up")
    out = ok(db, "add", "bot", "--tool-call", 'search={"q": "kyoto"}', "--content", "Searching.").stdout
    call_id = out.split("tool call ")[1].split()[0]
    assert call_id.startswith("call_") and f"--tool-call-id {call_id}" in out
    ok(db, "add", "bot", "--role", "tool", "--tool-call-id", call_id, "--content", "3 results")
    sent = _sent(db, "bot")
    assert sent[1]["content"] == "Searching." and sent[1]["tool_calls"][0]["id"] == call_id
    assert sent[2] == {"role": "tool", "tool_call_id": call_id, "content": "3 results"}


def test_add_message_stores_a_whole_openai_message_exactly(db: str) -> None:
    ok(db, "add", "bot", "--content", "hi")
    message = {
        "role": "assistant",
        "content": None,
        "reasoning_content": "thinking...",
        "thinking_blocks": [{"type": "thinking", "thinking": "hm", "signature": "sig=="}],
        "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    ok(db, "add", "bot", "--message", json.dumps(message))
    result = run(
        db,
        "add",
        "bot",
        "--message",
        "-",
        input=json.dumps({"role": "tool", "tool_call_id": "toolu_1", "content": "done"}),
    )
    assert result.exit_code == 0, result.stderr
    assert _sent(db, "bot")[1:] == [message, {"role": "tool", "tool_call_id": "toolu_1", "content": "done"}]


def test_pin_key_replaces_the_pinned_prompt(db: str) -> None:
    for prompt in ("Be brief.", "Be brief. Answer in French."):
        ok(db, "add", "bot", "--role", "system", "--content", prompt, "--pin-key", "system")
    ok(db, "add", "bot", "--content", "hello")
    assert [m for m in _sent(db, "bot") if m["role"] == "system"] == [
        {"role": "system", "content": "Be brief. Answer in French."}
    ]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--tool-call", "no-equals-sign"], "NAME=JSON"),
        (["--tool-call", "f={not json"], "not JSON"),
        (["--tool-call", "f={}", "--role", "user"], "assistant"),
        (["--tool-call", "f={}", "--tool-call-id", "a", "--tool-call-id", "b"], "2 ids for 1 calls"),
        (["--message", "{}", "--content", "x"], "--message"),
        (["--message", "[1]"], "JSON object"),
        (["--message", "nope"], "not JSON"),
        (["--role", "tool", "--tool-call-id", "a", "--tool-call-id", "b", "--content", "x"], "one call"),
        ([], "--content, --tool-call or --message"),
    ],
)
def test_add_refuses_options_that_do_not_fit_together(db: str, args: list[str], fragment: str) -> None:
    assert_one_line_error(run(db, "add", "bot", *args), 2, fragment)
    assert as_json(db, "conversations") == []


def test_add_passes_a_bad_message_to_the_library_which_refuses_it(db: str) -> None:
    assert_one_line_error(run(db, "add", "bot", "--message", '{"role": "wizard", "content": "x"}'), 1, "role")
    # A result for a call nobody made is refused too (nothing is stored).
    ok(db, "add", "bot", "--content", "hi")
    assert_one_line_error(
        run(db, "add", "bot", "--role", "tool", "--tool-call-id", "call_x", "--content", "r"),
        1,
        "no open tool call",
    )
    assert as_json(db, "conversations")[0]["messages"] == 1


# -- --max-tokens ---------------------------------------------------------------------------------


def test_max_tokens_help_states_the_real_minimum(db: str) -> None:
    assert MIN_MAX_TOKENS == 32
    help_text = " ".join(ok(None, "context", "--help").stdout.split())
    assert "at least 32" in help_text
    ok(db, "add", "c", "--content", "hi")
    assert_one_line_error(run(db, "context", "c", "--max-tokens", "31"), 1, "minimum of 32")
    assert as_json(db, "context", "c", "--max-tokens", "32")["total_tokens"] <= 32


# -- conversations and delete ---------------------------------------------------------------------


def test_conversations_lists_metadata_with_filters(db: str) -> None:
    ok(db, "add", "d1", "--content", "hi", "--platform", "discord", "--channel", "#a", "--user-id", "u1")
    ok(db, "add", "d1", "--content", "me too", "--user-id", "u2")
    ok(db, "add", "s1", "--content", "hey", "--platform", "slack", "--user-id", "u1")
    rows = as_json(db, "conversations")
    assert [r["conversation_id"] for r in rows] == ["d1", "s1"]
    d1 = rows[0]
    assert (d1["platform"], d1["channel"], d1["users"], d1["messages"]) == ("discord", "#a", ["u1", "u2"], 2)
    assert d1["created_at"] and d1["last_active_at"]
    ids = lambda *a: [r["conversation_id"] for r in as_json(db, "conversations", *a)]  # noqa: E731
    assert ids("--platform", "slack") == ["s1"]
    assert ids("--channel", "#a") == ["d1"]
    assert ids("--user-id", "u2") == ["d1"]
    assert ids("--after", "d1") == ["s1"]
    assert ids("--limit", "1") == ["d1"]
    assert ids("--active-since", "1h") == ["d1", "s1"]
    assert ids("--active-since", "2999-01-01T00:00:00+00:00") == []
    table = ok(db, "conversations").stdout
    assert "d1" in table and "discord" in table and "u1, u2" in table
    assert_one_line_error(run(db, "conversations", "--active-since", "yesterday"), 2, "--active-since")
    assert_one_line_error(run(db, "conversations", "--active-since", "2025-01-01T00:00:00"), 2, "offset")


def test_delete_needs_yes_and_removes_the_conversation(db: str) -> None:
    ok(db, "add", "gone", "--content", "my phone is 555-1234")
    ok(db, "add", "kept", "--content", "hello")
    assert_one_line_error(run(db, "delete", "gone"), 2, "--yes")
    assert message_ids(db) == ["gone", "kept"]
    assert "Deleted" in ok(db, "delete", "gone", "--yes").stdout
    assert message_ids(db) == ["kept"]
    assert_one_line_error(run(db, "delete", "gone", "--yes"), 1, "no conversation")
    with SyncHistoryCompressor.from_url(db) as hc:
        assert not hc.exists("gone") and hc.search("kept", "hello")


def message_ids(db: str) -> list[str]:
    return [r["conversation_id"] for r in as_json(db, "conversations")]


# -- export and import ----------------------------------------------------------------------------


def _fill(db: str, cid: str = "bot") -> None:
    ok(
        db,
        "add",
        cid,
        "--role",
        "system",
        "--content",
        "Be brief.",
        "--pin-key",
        "system",
        "--platform",
        "discord",
    )
    ok(db, "add", cid, "--content", "Weather in Paris?", "--user-id", "u1", "--channel", "#g")
    ok(db, "add", cid, "--tool-call", 'get_weather={"city": "Paris"}', "--tool-call-id", "call_1")
    ok(db, "add", cid, "--role", "tool", "--tool-call-id", "call_1", "--content", "18C")
    ok(db, "add", cid, "--content", "new topic: and in Rome?")
    ok(db, "maintain", cid)


def test_export_to_stdout_and_file_then_import_restores_it_elsewhere(db: str, tmp_path: Path) -> None:
    _fill(db)
    text = ok(db, "export", "bot").stdout
    path = tmp_path / "bot.jsonl"
    result = ok(db, "export", "bot", "-o", str(path))
    assert path.read_text(encoding="utf-8") == text and "bot.jsonl" in result.stderr
    other = f"sqlite:///{tmp_path / 'other.db'}"
    report = as_json(other, "import", str(path))
    assert report == {"imported": 5, "skipped": 0, "conversations": {"bot": 5}}
    assert ok(other, "export", "bot").stdout == text
    assert _sent(other, "bot") == _sent(db, "bot")
    # Again: nothing changes. Under another id: a second copy.
    assert as_json(other, "import", str(path))["skipped"] == 5
    as_json(other, "import", str(path), "--conversation", "copy")
    assert message_ids(other) == ["bot", "copy"]
    # The conversation changed since: the file is refused, nothing is written.
    ok(other, "add", "bot", "--content", "later")
    assert_one_line_error(run(other, "import", str(path)), 1, "exists already")
    assert as_json(other, "stats", "bot")[0]["messages"] == 6


def test_export_without_summaries_and_broken_files(db: str, tmp_path: Path) -> None:
    _fill(db)
    text = ok(db, "export", "bot", "--no-summaries").stdout
    assert '"type":"summary"' not in text and '"type":"summary"' in ok(db, "export", "bot").stdout
    broken = tmp_path / "broken.jsonl"
    lines = text.splitlines()
    lines[2] = lines[2].replace('"role":"user"', '"role":"wizard"')
    broken.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert_one_line_error(run(db, "import", str(broken), "-c", "copy"), 1, "role")
    assert message_ids(db) == ["bot"]
    assert_one_line_error(run(db, "import", str(tmp_path / "bot.jsonl"), "--platform", "x"), 1)
    good = tmp_path / "good.jsonl"
    good.write_text(text, encoding="utf-8")
    assert_one_line_error(run(db, "import", str(good), "--platform", "x"), 2, "--platform")
    assert_one_line_error(run(db, "export", "missing"), 1, "no conversation")
    assert_one_line_error(
        run(db, "export", "bot", "-o", str(tmp_path / "no" / "such" / "dir.jsonl")), 1, "cannot write"
    )
