"""Start-up stays cheap (issue 15, item 6): what an import or a process's first call loads.

Checked by the modules a fresh interpreter holds, not by timing (bench/startup.py times it):
``import tiered_history`` loads no dependency, ``from tiered_history import HistoryCompressor``
none of the database, scheduler, CLI or LLM ones, and a restarted process's first
``get_context`` on a database already at the head neither imports Alembic nor litellm.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tiered_history
from tiered_history import Settings
from tiered_history.store import migrate

ROOT = Path(__file__).resolve().parents[1]

#: Never loaded by ``import tiered_history`` alone.
NOT_ON_IMPORT = (
    "pydantic",
    "asyncio",
    "sqlalchemy",
    "alembic",
    "litellm",
    "tiktoken",
    "apscheduler",
    "rich",
    "typer",
    "yaml",
    "pydantic_settings",
    "dotenv",
)
#: Never loaded by importing the compressors (the store loads sqlalchemy when it opens a database):
#: everything above but asyncio and pydantic, which the compressors' own modules need.
NOT_WITH_THE_COMPRESSORS = tuple(m for m in NOT_ON_IMPORT if m not in {"pydantic", "asyncio"})


def _loaded(code: str, env: dict[str, str] | None = None) -> set[str]:
    """The top-level packages a fresh interpreter holds after running ``code``."""
    probe = code + "\nimport sys, json; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_import_tiered_history_loads_no_dependency() -> None:
    loaded = _loaded("import tiered_history")
    assert "tiered_history" in loaded  # the probe is live
    assert loaded.isdisjoint(NOT_ON_IMPORT), sorted(loaded & set(NOT_ON_IMPORT))


def test_importing_the_compressors_loads_no_database_llm_or_cli_package() -> None:
    loaded = _loaded("from tiered_history import HistoryCompressor, SyncHistoryCompressor, Settings")
    assert {"pydantic", "asyncio"} <= loaded  # the probe is live: these really are needed
    assert loaded.isdisjoint(NOT_WITH_THE_COMPRESSORS), sorted(loaded & set(NOT_WITH_THE_COMPRESSORS))


def test_every_public_name_is_reachable_and_listed() -> None:
    code = (
        "import tiered_history as t\n"
        "missing = [n for n in t.__all__ if getattr(t, n, None) is None]\n"
        "assert not missing, missing\n"
        "assert set(t.__all__) <= set(dir(t))\n"
        "from tiered_history import *\n"
        "assert HistoryCompressor.__module__ == 'tiered_history.compressor'\n"
    )
    assert "tiered_history" in _loaded(code)
    for name in tiered_history.__all__:
        assert getattr(tiered_history, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        tiered_history.nope  # noqa: B018  (the lookup itself is the test)


def test_settings_keyword_arguments_win_over_the_environment_section_by_section(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What pydantic-settings' BaseSettings did before Settings became a plain model.
    for key in list(os.environ):
        if key.startswith("TIERED_HISTORY_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("TIERED_HISTORY_SILENCE_MINUTES", "12")
    monkeypatch.setenv("TIERED_HISTORY_CONTEXT_BUDGET", "5000")
    monkeypatch.setenv("TIERED_HISTORY_TIERS__CURRENT_TOPIC", "0.6")
    monkeypatch.setenv("TIERED_HISTORY_BOUNDARIES__TRIGGER_ROLES", "[user, assistant]")
    s = Settings(context_budget=3000, tiers={"topic_summaries": 0.2, "bulk_archives": 0.2})
    assert (s.context_budget, s.silence_minutes) == (3000, 12.0)
    assert (s.tiers.current_topic, s.tiers.topic_summaries, s.tiers.bulk_archives) == (0.6, 0.2, 0.2)
    assert s.boundaries.trigger_roles == ["user", "assistant"]
    # model_validate goes through __init__ as well (as it did with BaseSettings).
    again = Settings.model_validate(
        {"context_budget": 3000, "tiers": {"topic_summaries": 0.2, "bulk_archives": 0.2}}
    )
    assert (again.context_budget, again.silence_minutes, again.tiers.current_topic) == (3000, 12.0, 0.6)
    monkeypatch.setenv("TIERED_HISTORY_NOPE", "1")
    with pytest.raises(ValueError, match="nope"):
        Settings()


def test_the_scripts_head_read_as_text_is_alembics_head() -> None:
    assert migrate.scripts_head() == migrate.head_revision()


def _versions(tmp_path: Path, scripts: dict[str, str]) -> Path:
    (tmp_path / "versions").mkdir()
    for name, text in scripts.items():
        (tmp_path / "versions" / name).write_text(text, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(
    ("scripts", "head"),
    [
        (
            {
                "a.py": 'revision = "1"\ndown_revision = None\n',
                "b.py": 'revision: str = "2"\ndown_revision = "1"\n',
            },
            "2",
        ),
        # Two heads, a merge, a computed revision: Alembic decides (None sends upgrade to it).
        (
            {
                "a.py": 'revision = "1"\ndown_revision = None\n',
                "b.py": 'revision = "2"\ndown_revision = None\n',
            },
            None,
        ),
        ({"a.py": 'revision = "3"\ndown_revision = ("1", "2")\n'}, None),
        ({"a.py": "revision = make()\ndown_revision = None\n"}, None),
    ],
)
def test_scripts_head_is_only_trusted_for_one_plain_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scripts: dict[str, str], head: str | None
) -> None:
    monkeypatch.setattr(migrate, "migrations_dir", lambda: _versions(tmp_path, scripts))
    assert migrate.scripts_head.__wrapped__() == head


FIRST_CALL = """
import asyncio, json, os, sys, time
from tiered_history import HistoryCompressor
PG = "sqlalchemy.dialects.postgresql"

async def main(url, add):
    async with HistoryCompressor.from_url(url, model="gpt-4o-mini") as hc:
        if add:
            await hc.add_message("c", {"role": "user", "content": "hello"})
        ctx = await hc.get_context("c")
    print(json.dumps({
        "max_tokens": ctx.max_tokens,
        "modules": sorted(m for m in ("alembic", "litellm", "tenacity", PG) if m in sys.modules),
        "tiktoken_dir": os.environ.get("TIKTOKEN_CACHE_DIR"),
    }))

asyncio.run(main(sys.argv[1], sys.argv[2] == "add"))
"""


def test_a_restarted_sqlite_process_first_get_context_loads_no_alembic_litellm_or_pg(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    env = {k: v for k, v in os.environ.items() if k not in {"TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"}}
    runs = []
    for step in ("add", "read"):  # a new database (migrated), then a restart on it
        done = subprocess.run(
            [sys.executable, "-c", FIRST_CALL, url, step],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        runs.append(json.loads(done.stdout.splitlines()[-1]))
    new, restarted = runs
    assert "alembic" in new["modules"]  # the new database really was migrated by Alembic
    assert "litellm" not in new["modules"]
    # Nor SQLAlchemy's PostgreSQL dialect or tenacity (PostgreSQL's retries) in a SQLite process.
    assert restarted["modules"] == []
    assert restarted["max_tokens"] > 100_000  # gpt-4o-mini's window, from litellm's bundled table
    # litellm's bundled tokenizers, found without importing litellm
    assert restarted["tiktoken_dir"], "TIKTOKEN_CACHE_DIR was not pointed at litellm's tokenizers"
    assert Path(restarted["tiktoken_dir"]).parts[-3:] == ("litellm", "litellm_core_utils", "tokenizers")
