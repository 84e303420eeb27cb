"""Issue 17, items 13-18: operations and security (CLI output, configuration, the event loop, timeouts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import tests.openai_server as fake_openai
from tests.openai_server import OpenAIServer, Reply
from tiered_history import ConfigurationError, HistoryCompressor, Settings
from tiered_history.cli import app
from tiered_history.database import mask_url

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
openai_server = fake_openai.openai_server
SECRET = "s3cr3t-Pa55"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in list(os.environ):
        if key.startswith("TIERED_HISTORY_") and key != "TIERED_HISTORY_BOUNDARIES__MIN_TOPIC_TOKENS":
            monkeypatch.delenv(key)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


def cli(db: str | None, *args: str, **kwargs: Any) -> Any:
    return runner.invoke(app, [*(["--database-url", db] if db else []), *args], **kwargs)


# -- 13. passwords never printed ------------------------------------------------------------------

BAD_URLS = [
    f"postgresql://admin:{SECRET}@127.0.0.1:notaport/db",
    f"postgresql://admin:{SECRET}@127.0.0.1:1/db",
    f"postgresql+psycopg://admin:{SECRET}@[::1/db",
    f"postgresql://admin:{SECRET}@127.0.0.1:99999/db",
    f"mysql://admin:{SECRET}@127.0.0.1/db",
    f"postgresql://admin:{SECRET}@:5432:5432/db",
]


@pytest.mark.parametrize("url", BAD_URLS)
@pytest.mark.parametrize(
    "command", [["stats"], ["db", "current"], ["db", "current", "--json"], ["db", "upgrade"]]
)
def test_item13_cli_never_prints_the_database_password(url: str, command: list[str]) -> None:
    result = cli(url, *command)
    assert result.exit_code != 0
    assert SECRET not in result.output, result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("url", BAD_URLS)
def test_item13_mask_url_hides_the_password_of_any_url(url: str) -> None:
    assert SECRET not in mask_url(url)


async def test_item13_library_errors_do_not_carry_the_password() -> None:
    from tiered_history import TieredHistoryError

    for url in BAD_URLS:
        try:
            async with HistoryCompressor(url) as hc:
                await hc.exists("c")
        except TieredHistoryError as exc:
            assert SECRET not in str(exc)
            assert exc.__cause__ is None or SECRET not in str(exc.__cause__)


# -- 14. careless CLI use -------------------------------------------------------------------------


def test_item14_db_current_without_schema_exits_non_zero(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'empty.db'}"
    result = cli(db, "db", "current")
    assert result.exit_code == 1, result.output
    assert "no schema" in result.output
    as_json = cli(db, "db", "current", "--json")
    assert as_json.exit_code == 1
    assert json.loads(as_json.stdout)["at_head"] is False
    assert cli(db, "db", "upgrade").exit_code == 0
    assert cli(db, "db", "current").exit_code == 0


@pytest.mark.parametrize("content", ["", "   \n", "\n\n"])
def test_item14_importing_an_empty_file_is_an_error(tmp_path: Path, content: str) -> None:
    db = f"sqlite:///{tmp_path / 'x.db'}"
    path = tmp_path / "empty.jsonl"
    path.write_text(content, encoding="utf-8")
    result = cli(db, "import", str(path), "-c", "x")
    assert result.exit_code == 1, result.output
    assert "empty" in result.stderr
    empty_list = tmp_path / "empty.json"
    empty_list.write_text("[]", encoding="utf-8")
    assert cli(db, "import", str(empty_list), "-c", "x").exit_code == 1


@pytest.mark.parametrize("url", ["memory://", "sqlite://", "sqlite:///:memory:"])
def test_item14_cli_refuses_to_write_to_a_database_that_ends_with_the_command(
    url: str, tmp_path: Path
) -> None:
    result = cli(url, "add", "c", "--content", "hello")
    assert result.exit_code == 1, result.output
    assert "Added" not in result.output
    assert "keeps nothing" in result.stderr
    path = tmp_path / "one.jsonl"
    path.write_text('{"conversation_id": "c", "role": "user", "content": "hi"}\n', encoding="utf-8")
    assert cli(url, "import", str(path)).exit_code == 1


def test_item14_add_from_stdin_drops_the_trailing_newline(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'x.db'}"
    result = cli(db, "add", "c", "--content", "-", "--json", input="hello\nworld\n")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["content"] == "hello\nworld"
    result = cli(db, "add", "c", "--content", "-", "--json", input="crlf\r\n")
    assert json.loads(result.stdout)["content"] == "crlf"


# -- 15. stdout holds the command's result only ---------------------------------------------------


def test_item15_unknown_model_prints_nothing_but_the_json(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'x.db'}"
    env = {
        **os.environ,
        "TIERED_HISTORY_DATABASE_URL": db,
        "TIERED_HISTORY_MODEL": "no-such-provider-model-xyz",
    }
    env.pop("LITELLM_LOCAL_MODEL_COST_MAP", None)
    run = [sys.executable, "-m", "tiered_history"]
    subprocess.run(
        [*run, "add", "c", "--content", "hello"], env=env, check=True, capture_output=True, cwd=ROOT
    )
    done = subprocess.run([*run, "context", "c", "--json"], env=env, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "Provider List" not in done.stdout
    assert json.loads(done.stdout)["conversation_id"] == "c"


# -- 16. environment variables --------------------------------------------------------------------


def test_item16_documented_list_syntax_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERED_HISTORY_BOUNDARIES__TRIGGER_ROLES", "[user, assistant]")
    assert Settings.load().boundaries.trigger_roles == ["user", "assistant"]
    monkeypatch.setenv("TIERED_HISTORY_BOUNDARIES__TRIGGER_ROLES", '["user", "tool"]')
    assert Settings.load().boundaries.trigger_roles == ["user", "tool"]


@pytest.mark.parametrize(
    "name", ["TIERED_HISTORY_CONTEXT_BUGDET", "TIERED_HISTORY_TIERS__CURENT_TOPIC", "TIERED_HISTORY_MODLE"]
)
def test_item16_misspelt_variable_is_rejected(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "4000")
    with pytest.raises(ConfigurationError, match="unknown setting"):
        Settings.load()


def test_item16_misspelt_variable_fails_the_cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TIERED_HISTORY_CONTEXT_BUGDET", "4000")
    result = cli(f"sqlite:///{tmp_path / 'x.db'}", "stats")
    assert result.exit_code == 1
    assert "context_bugdet" in result.stderr.lower()


# -- 17. the event loop never stalls on litellm ---------------------------------------------------

STALL_PROBE = textwrap.dedent(
    """
    import asyncio, sys, time
    from tiered_history import HistoryCompressor

    async def main():
        async with HistoryCompressor("memory://", model="gpt-4o") as hc:
            await hc.add_message("c", {"role": "user", "content": "hello"})
            assert "litellm" not in sys.modules
            gaps = []
            stop = False

            async def tick():
                last = time.perf_counter()
                while not stop:
                    await asyncio.sleep(0.005)
                    now = time.perf_counter()
                    gaps.append(now - last)
                    last = now

            ticker = asyncio.create_task(tick())
            await asyncio.sleep(0.02)
            ctx = await hc.get_context("c")
            stop = True
            await ticker
            print(max(gaps), ctx.max_tokens)

    asyncio.run(main())
    """
)


def test_item17_first_get_context_without_max_tokens_does_not_stall_the_loop() -> None:
    done = subprocess.run(
        [sys.executable, "-c", STALL_PROBE], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    stall, max_tokens = done.stdout.split()
    assert int(max_tokens) > 8000  # gpt-4o's window, less the reserve: the model was looked up
    assert float(stall) < 0.25, f"the event loop stalled {float(stall):.2f} s"


# -- 18. the summariser timeout applies per request -----------------------------------------------


async def test_item18_a_retry_after_a_slow_transient_failure_is_not_cancelled(
    openai_server: OpenAIServer,
) -> None:
    # Each request takes 55% of the timeout: the failure and its retry together take 110%.
    openai_server.script(
        Reply(status=500, delay=1.1), Reply(text="They agreed to refund the duplicate charge.", delay=1.1)
    )
    summarizer = {
        "kind": "litellm",
        "model": "openai/gpt-4o-mini",
        "api_base": openai_server.url,
        "api_key": "test",
        "timeout": 2.0,
        "max_retries": 1,
    }
    text = "We compared the March and April invoices line by line and found a duplicate charge. " * 6
    async with HistoryCompressor("memory://", summarizer=summarizer, boundaries={"temporal": False}) as hc:
        for i in range(4):
            await hc.add_message(
                "c", {"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} {text}"}
            )
        await hc.seal_current_topic("c")
        await hc.maintain("c")
        topic = (await hc.get_history("c")).topics[0]
    assert len(openai_server.requests) == 2
    assert topic.status == "final", topic
    assert topic.content == "They agreed to refund the duplicate charge."
