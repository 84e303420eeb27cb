"""Per-platform boundary rules (issue 14, item 6): ``platforms.<name>`` overrides the silence gap,
the rules and the phrase lists for the conversations recorded on that platform; every other
conversation keeps the global settings. Run on memory, SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tiered_history import HistoryCompressor

T0 = datetime(2024, 5, 1, 9, 0, tzinfo=UTC)

SETTINGS: dict[str, Any] = {
    "silence_minutes": 30,
    "boundaries": {
        "cohesion": False,
        "size": False,
        "unseal": False,
        "min_topic_tokens": 0,
        "languages": ["en"],
    },
    "platforms": {
        # A Slack thread goes quiet for hours and is still one conversation.
        "slack": {"silence_minutes": 240},
        # A German community, with its own marker phrase added to the global list.
        "forum-de": {"languages": ["de"], "trigger_phrases": ["frische Runde"]},
        # A channel where only a person may end a topic by saying so.
        "telegram": {"temporal": False},
    },
}


def msg(content: str, minutes: float, role: str = "user") -> dict[str, Any]:
    return {"role": role, "content": content, "timestamp": T0 + timedelta(minutes=minutes)}


async def seals(hc: HistoryCompressor, cid: str) -> list[tuple[int, str | None]]:
    return [(t.first_sequence, t.sealed_reason) for t in (await hc.get_history(cid)).topics]


async def test_the_silence_gap_is_the_platforms(db_url: str) -> None:
    async with HistoryCompressor(db_url, **SETTINGS) as hc:
        for cid, platform in (("s", "slack"), ("d", "discord"), ("t", "telegram")):
            await hc.add_message(cid, msg("Our deploy failed at step three.", 0), platform=platform)
            await hc.add_message(cid, msg("Which step exactly?", 1, "assistant"), platform=platform)
            # 90 minutes later: past the global 30, within Slack's 240.
            await hc.add_message(cid, msg("The database migration step.", 91), platform=platform)
            # 300 minutes later: past Slack's 240 too.
            await hc.add_message(cid, msg("Lunch plans for Friday?", 391), platform=platform)
        assert await seals(hc, "d") == [(1, "silence"), (3, "silence")]
        assert await seals(hc, "s") == [(1, "silence")]  # only the 300-minute gap
        assert await seals(hc, "t") == []  # the temporal rule is off there


async def test_phrase_lists_are_the_platforms(db_url: str) -> None:
    async with HistoryCompressor(db_url, **SETTINGS) as hc:
        for cid, platform in (("de", "forum-de"), ("en", "discord")):
            await hc.add_message(cid, msg("Wie backe ich Brot?", 0), platform=platform)
            await hc.add_message(cid, msg("Neues Thema: mein Fahrrad quietscht.", 1), platform=platform)
            await hc.add_message(cid, msg("Frische Runde: was kochen wir?", 2), platform=platform)
            await hc.add_message(cid, msg("New topic: billing.", 3), platform=platform)
        # forum-de: German defaults and its own phrase, not the English list (languages replaces it).
        assert await seals(hc, "de") == [(1, "explicit"), (2, "explicit")]
        # Elsewhere the global list (English only here) applies; the platform phrases do not.
        assert await seals(hc, "en") == [(1, "explicit")]


async def test_a_conversation_keeps_the_platform_it_was_recorded_on(db_url: str) -> None:
    """Rules follow the conversation's recorded platform: a later message naming no platform (or
    another one) does not switch them."""
    async with HistoryCompressor(db_url, **SETTINGS) as hc:
        await hc.add_message("s", msg("Standup notes, part one.", 0), platform="slack")
        await hc.add_message("s", msg("Standup notes, part two.", 90))
        await hc.add_message("s", msg("Standup notes, part three.", 180), platform="discord")
        assert await seals(hc, "s") == []
        assert (await hc.list_conversations())[0].platform == "slack"
