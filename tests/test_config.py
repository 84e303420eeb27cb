"""config.example.yaml documents exactly the settings model; precedence and validation of Settings.load."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from tiered_history import ConfigurationError, Settings

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "config.example.yaml"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("TIERED_HISTORY_"):
            monkeypatch.delenv(key)


def field_tree(model: type[BaseModel]) -> dict[str, Any]:
    """{field: None, nested_model_field: {...}} for every field of ``model``, recursively."""
    tree: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            tree[name] = field_tree(ann)
        else:
            tree[name] = None
    return tree


def yaml_tree(data: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in data.items():
        info = model.model_fields.get(key)
        ann = info.annotation if info else None
        if isinstance(ann, type) and issubclass(ann, BaseModel) and isinstance(value, dict):
            tree[key] = yaml_tree(value, ann)
        else:
            tree[key] = None
    return tree


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


# -- the example file -----------------------------------------------------------------------------


def test_example_covers_exactly_the_settings_keys() -> None:
    data = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    assert yaml_tree(data, Settings) == field_tree(Settings)


def test_example_values_are_the_defaults() -> None:
    assert Settings.load(EXAMPLE).model_dump() == Settings.load().model_dump()
    assert Settings.load(EXAMPLE).model_dump() == Settings().model_dump()


def test_documented_defaults_named_in_the_issue() -> None:
    s = Settings.load(EXAMPLE)
    assert (s.tiers.current_topic, s.tiers.topic_summaries, s.tiers.bulk_archives) == (0.5, 0.3, 0.2)
    assert s.max_message_chars == 2000
    assert s.topic_summary_tokens == 200
    assert s.bulk_summary_tokens == 300
    assert s.bulk_merge_size == 3
    assert s.silence_minutes == 30
    assert s.token_threshold == 0.6
    assert s.summarizer.kind == "extractive"


def test_every_key_of_the_example_has_a_comment() -> None:
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines()
    key_line = re.compile(r"^\s*([a-z_]+):")
    undocumented = []
    for i, line in enumerate(lines):
        match = key_line.match(line)
        if not match:
            continue
        previous = lines[i - 1].strip() if i else ""
        if "#" not in line and not previous.startswith("#"):
            undocumented.append(match.group(1))
    assert undocumented == []


# -- precedence -----------------------------------------------------------------------------------


def test_precedence_kwargs_over_env_over_yaml_over_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(
        tmp_path,
        "silence_minutes: 10\ncontext_budget: 1000\ntopic_summary_tokens: 150\n"
        "tiers: {current_topic: 0.6, topic_summaries: 0.2, bulk_archives: 0.2}\n"
        "summarizer: {kind: litellm, model: gpt-4o-mini}\n",
    )
    monkeypatch.setenv("TIERED_HISTORY_SILENCE_MINUTES", "20")
    monkeypatch.setenv("TIERED_HISTORY_CONTEXT_BUDGET", "2000")
    monkeypatch.setenv("TIERED_HISTORY_SUMMARIZER__MODEL", "ollama/llama3.1")
    s = Settings.load(path, silence_minutes=40)
    assert s.silence_minutes == 40  # kwargs beat env and YAML
    assert s.context_budget == 2000  # env beats YAML
    assert s.summarizer.model == "ollama/llama3.1"  # nested env beats nested YAML ...
    assert s.summarizer.kind == "litellm"  # ... and keeps the YAML's sibling keys
    assert s.topic_summary_tokens == 150  # YAML beats the default
    assert s.tiers.current_topic == 0.6
    assert s.bulk_summary_tokens == 300  # default


def test_nested_kwargs_merge_with_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "summarizer: {kind: litellm, model: gpt-4o-mini, timeout: 5}\n")
    s = Settings.load(path, summarizer={"timeout": 9})
    assert (s.summarizer.kind, s.summarizer.model, s.summarizer.timeout) == ("litellm", "gpt-4o-mini", 9)


def test_config_file_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERED_HISTORY_CONFIG", str(write(tmp_path, "bulk_merge_size: 4\n")))
    assert Settings.load().bulk_merge_size == 4


def test_nested_env_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERED_HISTORY_TIERS__CURRENT_TOPIC", "0.6")
    monkeypatch.setenv("TIERED_HISTORY_TIERS__TOPIC_SUMMARIES", "0.2")
    monkeypatch.setenv("TIERED_HISTORY_BOUNDARIES__TEMPORAL", "false")
    s = Settings.load()
    assert s.tiers.current_topic == 0.6 and s.tiers.topic_summaries == 0.2
    assert s.boundaries.temporal is False


def test_env_database_url_is_kept_verbatim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERED_HISTORY_DATABASE_URL", "postgresql://u:p@localhost/db")
    assert Settings.load().database_url == "postgresql://u:p@localhost/db"


# -- validation -----------------------------------------------------------------------------------

INVALID = [
    ({"context_budget": 10}, "context_budget"),
    ({"context_budget": "lots"}, "context_budget"),
    ({"silence_minutes": 0}, "silence_minutes"),
    ({"token_threshold": 1.5}, "token_threshold"),
    ({"bulk_merge_size": 1}, "bulk_merge_size"),
    ({"tiers": {"current_topic": 0.9}}, "tiers"),
    ({"tiers": {"bulk_archives": -0.1}}, "tiers.bulk_archives"),
    ({"summarizer": {"kind": "magic"}}, "summarizer.kind"),
    ({"summarizer": {"timeout": 0}}, "summarizer.timeout"),
    ({"boundaries": {"trigger_roles": ["robot"]}}, "boundaries.trigger_roles"),
]


@pytest.mark.parametrize(("values", "key"), INVALID)
def test_invalid_kwargs_name_the_key(values: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(key)):
        Settings.load(**values)


@pytest.mark.parametrize(("values", "key"), INVALID)
def test_invalid_yaml_names_the_key(tmp_path: Path, values: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(key)):
        Settings.load(write(tmp_path, yaml.safe_dump(values)))


def test_invalid_env_names_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERED_HISTORY_BULK_MERGE_SIZE", "1")
    with pytest.raises(ConfigurationError, match="bulk_merge_size"):
        Settings.load()


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("colour: blue\n", "colour"),
        ("tiers: {current_topic: 0.5, topic_summaries: 0.3, bulk_archives: 0.2, extra: 0}\n", "tiers.extra"),
        ("summarizer: {kind: extractive, modle: gpt-4o}\n", "summarizer.modle"),
        ("boundaries: {silence: 5}\n", "boundaries.silence"),
    ],
)
def test_unknown_key_rejected(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(key) + ".*unknown"):
        Settings.load(write(tmp_path, text))


def test_unknown_kwarg_rejected() -> None:
    with pytest.raises(ConfigurationError, match="no_such_setting"):
        Settings.load(no_such_setting=1)


def test_bad_yaml_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="not valid YAML"):
        Settings.load(write(tmp_path, "tiers: [unclosed\n"))
    with pytest.raises(ConfigurationError, match="mapping"):
        Settings.load(write(tmp_path, "- a\n- b\n"))
    with pytest.raises(ConfigurationError, match="does not exist"):
        Settings.load(tmp_path / "missing.yaml")
