"""A newest message of interjections, backchannels or laughter recalls nothing.

"Mmm ." or "hahaha" says nothing about what the next answer needs; matched literally, it brought
back earlier "Mmm ." messages as recalled conversation (seen at the end of a QMSum meeting).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tiered_history import HistoryCompressor
from tiered_history.core.ranking import is_filler, recall_query

T0 = datetime(2026, 4, 6, 9, 0, tzinfo=UTC)
EXPLICIT_ONLY = {"temporal": False, "size": False, "cohesion": False}

OLD_TOPIC = [
    "The lavender by the door survived the winter and is flowering again now.",
    "Mmmm .",
    "Order compost and a trellis for the climbing beans before the weekend.",
    "Hahaha , lol .",
    "The neighbour offered cuttings from her fig tree, ready in autumn.",
    "Hmmm . Uhh , ooh .",
]
NEW_TOPIC = [
    "New topic: the Lisbon trip in May. Flights leave Berlin on May 14.",
    "TAP flight TP 537 lands at 11:40; the hotel is in Alfama near the castle.",
    "Day two is Sintra by train from Rossio station, the Pena palace first.",
    "Book the fado dinner for May 16; the place on Rua de Sao Miguel is small.",
    "Return flight on May 19 in the evening, so the last day is free until 17:00.",
    "Budget is 1,400 euros per person including the hotel and the flights.",
    "Pack light: the hotel has a washing machine and the trams are crowded.",
    "Rent no car; Lisbon's hills are easier by tram 28 and the metro.",
]
#: Room for the new topic and little more: the old one is out of the window.
ROOM = 200


FILLER = (
    "mmm mmmm hmm hmmm mmhmm uhh uhhh umm ahh ohh ooh huh errr erm aww ugh shh yay yeahhh yup okk "
    "okayy kk haha hahaha ahaha hahah hehe lol lolol looool lmao lmfao"
)
LOOKALIKES = "emma hummus hamm mommy summer hahn lola loom ugly uhlan er ha lo hello2 4711 mmx"


@pytest.mark.parametrize("word", FILLER.split())
def test_drawn_out_interjections_and_laughter_are_filler(word: str) -> None:
    assert is_filler(word)


@pytest.mark.parametrize("word", LOOKALIKES.split())
def test_words_that_merely_look_alike_are_not(word: str) -> None:
    assert not is_filler(word)


def test_a_query_of_filler_alone_has_no_word_to_look_for() -> None:
    assert recall_query("Mmmm . Hahaha , lol . Uhh").groups == ()
    assert recall_query("hahaha ok, the lavender?").groups == (("lavender",),)


async def _conversation(hc: HistoryCompressor) -> None:
    minute = 0
    for lines in (OLD_TOPIC, NEW_TOPIC):
        for i, line in enumerate(lines):
            role = "user" if i % 2 == 0 else "assistant"
            stamp = T0 + timedelta(minutes=minute)
            await hc.add_message("c", {"role": role, "content": line, "timestamp": stamp})
            minute += 1
    await hc.maintain("c")


async def test_a_newest_message_of_filler_recalls_nothing(db_url: str) -> None:
    async with HistoryCompressor.from_url(db_url, context_budget=1000, boundaries=EXPLICIT_ONLY) as hc:
        await _conversation(hc)
        history = await hc.get_history("c")
        assert any(t.last_sequence == len(OLD_TOPIC) for t in history.topics)  # sealed, out of the window
        for text in ("Mmmm .", "Hahaha , lol .", "Hmmm . Uhh , ooh ."):
            await hc.add_message("c", {"role": "user", "content": text})
            ctx = await hc.get_context("c", max_tokens=ROOM)
            shown = {m.sequence for m in ctx.current_topic}
            assert not shown & set(range(1, len(OLD_TOPIC) + 1))  # the old topic is out of the window
            assert ctx.recalled == [] and ctx.recalled_summaries == [] and ctx.recall_note == "", text
            assert ctx.total_tokens <= ROOM
        # A real word among the filler is still looked for.
        await hc.add_message("c", {"role": "user", "content": "Hahaha , and the lavender by the door?"})
        ctx = await hc.get_context("c", max_tokens=ROOM)
        recalled = [m.content for m in ctx.recalled] + [s.content for s in ctx.recalled_summaries]
        assert any("lavender" in t.lower() for t in recalled)
