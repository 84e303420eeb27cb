"""The original design's YAML layout (ADR-033: ``conversation.history.compression``, camelCase)
is read by ``Settings.load`` and mapped onto our settings; keys it does not have are refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tiered_history import ConfigurationError, HistoryCompressor, Settings

#: The design's example, as ADR-033 writes it (values changed from the defaults, so each mapping shows).
DESIGN_YAML = """\
conversation:
  history:
    compression:
      enabled: true
      tiers:
        currentTopic: 0.60       # 60% of context budget
        historicalTopics: 0.25   # 25%
        bulkArchives: 0.15      # 15%
      maxMessageChars: 3000      # truncation threshold
      topicSummaryTokens: 150   # target size for topic summaries
      bulkSummaryTokens: 350    # target size for bulk summaries
      bulkMergeSize: 4          # topics per bulk merge
      topicBoundary:
        silenceMinutes: 45      # time gap for auto-topic-boundary
        tokenThreshold: 0.70    # force seal at this % of allocation
    model: null                  # null = use default utility model
"""


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("TIERED_HISTORY_"):
            monkeypatch.delenv(key)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_design_layout_is_mapped_onto_the_settings(tmp_path: Path) -> None:
    s = Settings.load(write(tmp_path, DESIGN_YAML))
    assert (s.tiers.current_topic, s.tiers.topic_summaries, s.tiers.bulk_archives) == (0.60, 0.25, 0.15)
    assert s.max_message_chars == 3000
    assert (s.topic_summary_tokens, s.bulk_summary_tokens, s.bulk_merge_size) == (150, 350, 4)
    assert (s.silence_minutes, s.token_threshold) == (45, 0.70)
    assert s.summarizer.kind == "extractive"  # model: null keeps the default summariser
    assert s.boundaries.explicit and s.boundaries.temporal and s.boundaries.size  # enabled: true
    # Everything else keeps its default.
    rest = Settings().model_dump()
    mine = s.model_dump()
    changed = {k for k in rest if rest[k] != mine[k]}
    assert changed == {
        "tiers",
        "max_message_chars",
        "topic_summary_tokens",
        "bulk_summary_tokens",
        "bulk_merge_size",
        "silence_minutes",
        "token_threshold",
    }


def test_the_design_defaults_are_ours(tmp_path: Path) -> None:
    text = DESIGN_YAML
    for ours, design in (("0.60", "0.50"), ("0.25", "0.30"), ("0.15", "0.20"), ("3000", "2000")):
        text = text.replace(f": {ours} ", f": {design} ")
    for ours, design in (("150", "200"), ("350", "300"), ("4 ", "3 "), ("45", "30"), ("0.70", "0.60")):
        text = text.replace(f": {ours}", f": {design}")
    assert Settings.load(write(tmp_path, text)).model_dump() == Settings().model_dump()


def test_a_model_selects_the_litellm_summariser(tmp_path: Path) -> None:
    s = Settings.load(write(tmp_path, DESIGN_YAML.replace("model: null", "model: gpt-4o-mini")))
    assert (s.summarizer.kind, s.summarizer.model) == ("litellm", "gpt-4o-mini")
    assert s.model == "cl100k_base"  # the tokenizer setting is another thing


def test_enabled_false_draws_no_topic_boundary(tmp_path: Path) -> None:
    s = Settings.load(write(tmp_path, DESIGN_YAML.replace("enabled: true", "enabled: false")))
    b = s.boundaries
    assert not (b.explicit or b.temporal or b.size or b.cohesion)


async def test_a_compressor_runs_on_the_design_layout(tmp_path: Path) -> None:
    settings = Settings.load(write(tmp_path, DESIGN_YAML.replace("enabled: true", "enabled: false")))
    async with HistoryCompressor("memory://", settings=settings) as hc:
        for k in range(40):
            await hc.add_message("c", {"role": "user", "content": f"new topic: question {k} " + "word " * 40})
        assert (await hc.get_history("c")).topics == []  # compression off: never sealed
        assert (await hc.get_context("c", 500)).total_tokens <= 500


def test_the_layout_may_be_given_as_keyword_arguments() -> None:
    s = Settings.load(conversation={"history": {"compression": {"topicBoundary": {"silenceMinutes": 5}}}})
    assert s.silence_minutes == 5


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (
            DESIGN_YAML.replace("bulkMergeSize", "bulkMergeSise"),
            "conversation.history.compression.bulkMergeSise",
        ),
        (
            DESIGN_YAML.replace("currentTopic", "current_topic"),
            "conversation.history.compression.tiers.current_topic",
        ),
        (
            DESIGN_YAML.replace("silenceMinutes", "silence"),
            "conversation.history.compression.topicBoundary.silence",
        ),
        (DESIGN_YAML.replace("    model: null", "    modell: null"), "conversation.history.modell"),
        ("conversation:\n  memory: {}\n", "conversation.memory"),
        (DESIGN_YAML.replace("enabled: true", "enabled: maybe"), "enabled"),
        (
            "conversation:\n  history:\n    compression:\n      tiers: 3\n",
            "compression.tiers: must be a mapping",
        ),
        ("conversation: 3\n", "conversation"),
    ],
)
def test_unknown_or_malformed_keys_of_the_layout_are_refused(
    tmp_path: Path, text: str, fragment: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.load(write(tmp_path, text))
    assert fragment in str(caught.value)


def test_bad_values_are_reported_under_the_name_written(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"conversation\.history\.compression\.bulkMergeSize"):
        Settings.load(write(tmp_path, DESIGN_YAML.replace("bulkMergeSize: 4", "bulkMergeSize: 1")))
    with pytest.raises(ConfigurationError, match="add up to 1"):
        Settings.load(write(tmp_path, DESIGN_YAML.replace("0.60", "0.90")))


def test_a_setting_given_in_both_layouts_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="set twice"):
        Settings.load(write(tmp_path, DESIGN_YAML + "silence_minutes: 10\n"))
    # Different settings from each layout combine; the environment still overrides the file.
    s = Settings.load(write(tmp_path, DESIGN_YAML + "context_budget: 4000\n"))
    assert (s.context_budget, s.silence_minutes) == (4000, 45)


def test_the_environment_overrides_the_design_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERED_HISTORY_SILENCE_MINUTES", "12")
    assert Settings.load(write(tmp_path, DESIGN_YAML)).silence_minutes == 12
