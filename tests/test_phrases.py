"""Anchored trigger phrases: only a phrase said as a discourse marker opens a topic."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tiered_history.core.boundaries import (
    EXPLICIT,
    BoundaryRules,
    Decision,
    Incoming,
    OpenTopic,
    decide,
)
from tiered_history.core.phrases import (
    DEFAULT_PHRASES,
    anchored_phrase,
    phrase_pattern,
    phrases_for,
    strip_quotes_and_code,
)

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)
DEFAULTS = phrases_for()
RULES = BoundaryRules(
    explicit=True,
    temporal=True,
    size=True,
    cohesion=False,
    phrases=DEFAULTS,
    trigger_roles=("user",),
    silence=timedelta(minutes=30),
    size_limit=10_000,
    min_tokens=0,
)


def add(text: str, role: str = "user", rules: BoundaryRules = RULES) -> Decision:
    topic = OpenTopic(messages=4, tokens=300, last_timestamp=T0, tool_call_open=False, start=1)
    return decide(rules, topic, Incoming(role, text, T0 + timedelta(seconds=30), 12, False, False))


STAYS = [
    "the new topic model we trained",
    "it keeps moving on its own",
    "anyway, the results are in",
    "Anyway, the results are in.",
    "We tried the new topic model we trained and it keeps moving on its own.",
    "New topic model results are in",  # a noun phrase, not a marker
    "Moving on its own, the robot crossed the room.",
    "Off topic posts get deleted by the moderators.",
    "Different topic models give different results.",
    "please renew topics",
    "the newest topic",
    "",
]

OPENS = [
    "New topic: billing",
    "Let's move on.",
    "let’s move on to the budget",
    "ok, new topic.",
    "OK so... new topic please",
    "Switching gears - what about X?",
    "Different question: how do I cook rice?",
    "Thanks! Moving on: the quarterly report",
    "Great, thanks. Unrelated question: where is the office?",
    "Off topic, but is it raining?",
    "**New topic:** billing",
    "- new topic: travel",
    "Changing the subject: I got a cat",
    "That works.\nOn another note, what's the weather?",
    "hmm. let's talk about something else",
]


@pytest.mark.parametrize("text", STAYS)
def test_mid_sentence_and_noun_phrase_uses_stay_in_the_topic(text: str) -> None:
    assert not anchored_phrase(text, DEFAULTS)
    assert add(text).reason is None


@pytest.mark.parametrize("text", OPENS)
def test_markers_at_the_start_of_a_message_or_sentence_open_a_topic(text: str) -> None:
    assert anchored_phrase(text, DEFAULTS)
    assert add(text).reason == EXPLICIT


@pytest.mark.parametrize(
    "text",
    [
        'he wrote "new topic" on the board',
        '"New topic: billing" is the subject line',
        "“New topic” is a tag in our forum",
        "„Neues Thema“ hieß der Film",
        "'new topic' is what she typed",
        "the `new topic` label",
        "```\nnew topic: billing\n```",
        "```python\n# Let's move on.\n",  # an unclosed fence runs to the end
        "> New topic: billing\nwhat does this quoted line mean?",
        "«Nouveau sujet» est le titre",
    ],
)
def test_quoted_and_code_phrases_are_ignored(text: str) -> None:
    assert not anchored_phrase(text, DEFAULTS)
    assert add(text).reason is None


def test_a_quote_that_ends_a_sentence_still_lets_the_next_one_start() -> None:
    assert anchored_phrase('He said "stop." New topic: billing', DEFAULTS)
    assert "\x00" in strip_quotes_and_code('He said "stop." New topic')
    assert strip_quotes_and_code("let's go, the dogs' bowls") == "let's go, the dogs' bowls"  # apostrophes


def test_assistant_phrases_never_trigger_even_when_configured() -> None:
    text = "New topic: let me tell you about dogs."
    assert add(text, role="assistant").reason is None
    both = BoundaryRules(
        explicit=True,
        temporal=True,
        size=True,
        cohesion=False,
        phrases=DEFAULTS,
        trigger_roles=("user", "assistant"),
        silence=timedelta(minutes=30),
        size_limit=10_000,
    )
    assert add(text, role="assistant", rules=both).reason is None
    assert add(text, role="tool", rules=both).reason is None
    assert add(text, role="user", rules=both).reason == EXPLICIT


def test_system_messages_trigger_only_when_configured() -> None:
    assert add("New topic: maintenance window", role="system").reason is None
    with_system = BoundaryRules(
        explicit=True,
        temporal=True,
        size=True,
        cohesion=False,
        phrases=DEFAULTS,
        trigger_roles=("user", "system"),
        silence=timedelta(minutes=30),
        size_limit=10_000,
    )
    assert add("New topic: maintenance window", role="system", rules=with_system).reason == EXPLICIT


@pytest.mark.parametrize(
    "text",
    [
        "Neues Thema: Urlaub",
        "Also, anderes Thema bitte",
        "Bueno, cambiando de tema, ¿qué tal el fútbol?",
        "Nouveau sujet : la facture",
        "Ok, cambiamo argomento.",
        "Então, mudando de assunto: e o jantar?",
        "Nieuw onderwerp: vakantie",
        "では話題を変えましょう",
        "好，换个话题吧",
    ],
)
def test_default_phrases_in_other_languages(text: str) -> None:
    assert anchored_phrase(text, DEFAULTS)


def test_per_language_lists() -> None:
    english = phrases_for(["en"])
    assert "new topic" in english and "neues Thema" not in english
    assert not anchored_phrase("Neues Thema: Urlaub", english)
    assert phrases_for(["de"], extra=["übrigens"])[-1] == "übrigens"
    assert set(DEFAULT_PHRASES) >= {"en", "de", "es", "fr", "it", "pt", "nl", "ja", "zh"}
    assert not any(p.startswith("anyway") for p in phrases_for())  # returns as often as it leaves
    with pytest.raises(KeyError):
        phrases_for(["xx"])


def test_custom_phrases_stay_literal_and_anchored() -> None:
    custom = ("(off topic)", "next agenda item")
    assert anchored_phrase("ok (off topic) question", custom)
    assert not anchored_phrase("ok off topic question", custom)
    assert anchored_phrase("Next agenda item: the budget", custom)
    assert not anchored_phrase("we reached the next agenda item", custom)
    assert phrase_pattern(()) is None and phrase_pattern(("", "  ")) is None


def test_matching_is_fast_enough_for_long_messages() -> None:
    # The substring pre-filter keeps long messages without a phrase word cheap; a long
    # message with one still finds it at a sentence start deep inside.
    long = "This is a sentence about a compiler bug. " * 200
    assert not anchored_phrase(long, DEFAULTS)
    assert anchored_phrase(long + "New topic: billing", DEFAULTS)
