"""The search key (:attr:`ConversationState.search_key`): what recall's kept summary lists and rows
are keyed by. It must move at every change to a summary row a search can find or return, and
should not move at a seal (a pending topic has no text: no search finds it), so that kept lists
outlive the most frequent event."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tiered_history import SyncHistoryCompressor
from tiered_history.core import transitions
from tiered_history.core.state import ConversationState, Guard, search_key
from tiered_history.testing import ScriptedSummarizer

NOW = datetime.now(UTC)


def at(text: str, minutes: float, reply_to: int | None = None) -> dict[str, Any]:
    meta = {"reply_to": reply_to} if reply_to is not None else None
    return {"role": "user", "content": text, "timestamp": NOW + timedelta(minutes=minutes), "metadata": meta}


def fails_first() -> ScriptedSummarizer:
    """Fails the first attempt (that topic's summary is a provisional extract), then summarises."""
    return ScriptedSummarizer(summaries=[RuntimeError("provider down")], name="fails-first")


def test_the_search_key_moves_at_every_change_a_search_sees_and_not_at_a_seal() -> None:
    settings: dict[str, Any] = {
        "boundaries": {"min_topic_tokens": 0},
        "retry_backoff_seconds": 1.0,
        "summary_max_attempts": 3,
    }
    with SyncHistoryCompressor("memory://", summarizer=fails_first(), **settings) as h:
        store = h.reply.store

        def state() -> ConversationState:
            found = store.read_state("c")
            assert found is not None
            return found

        def sealed(before: ConversationState) -> None:
            after = state()
            assert after.topic_count == before.topic_count + 1 and after.epoch > before.epoch
            assert after.search_key == before.search_key

        for i in range(6):
            h.add_message("c", at(f"the tomato seedlings want water at {6 + i} in the morning", -250 + i))
        before = state()
        h.add_message("c", at("New topic: the zanzibar ferry", -238))  # a trigger phrase seals
        sealed(before)
        h.add_message("c", at("the ferry leaves at nine", -237))
        before = state()
        h.seal_current_topic("c")  # by hand
        sealed(before)
        h.add_message("c", at("and the lantern festival?", -236))
        before = state()
        h.add_message("c", at("it starts at dusk, by the harbour", -100))  # silence seals
        sealed(before)
        # A seal where a detector proposes one (the same transition maintenance applies).
        cur = state()
        messages = store.read_messages("c", cur.topic_start_seq, cur.last_sequence)
        h.add_message("c", at("the harbour lights go on at seven", -99))
        cur = state()
        messages = store.read_messages("c", cur.topic_start_seq, cur.last_sequence)
        split = transitions.seal_at(
            cur, messages, cur.last_sequence, "detector", h.reply.rules_for(cur), NOW - timedelta(minutes=99)
        )
        assert split is not None and split[0].topic_count == cur.topic_count + 1
        assert split[0].search_key == cur.search_key

        # A topic summarised (a provisional extract: the summariser failed), then replaced in place
        # by its summary: only the epoch moves then, of the fields the summaries key holds.
        before = state()
        h.maintain("c", now=NOW - timedelta(minutes=98))
        first = state()
        assert first.search_key != before.search_key
        assert any(t.status == "provisional" for t in h.get_history("c").topics)
        h.maintain("c", now=NOW - timedelta(minutes=90))
        replaced = state()
        fields = ("topic_count", "archive_count", "summarized_upto", "topics_merged_upto")
        fields += ("archives_dropped_upto", "compressions", "topic_start_seq")
        assert [getattr(replaced, f) for f in fields] == [getattr(first, f) for f in fields]
        assert replaced.epoch == first.epoch + 1  # the epoch alone moved
        assert replaced.search_key != first.search_key
        # A merge into an archive, and archives dropped (pure transitions: the same writes).
        topics = [t for t in store.read_summaries("c", "topic") if t.status in ("provisional", "final")]
        write = transitions.SummaryWrite("archive", "A", 5, "final", "test")
        merged = transitions.record_archive(replaced, topics[:2], write, NOW).state
        assert merged.search_key != replaced.search_key
        # A summarised topic reopened by a reply to it.
        h.add_message("c", at("one more thing", -60))
        before = state()
        last = before.last_seal
        assert last is not None
        h.add_message("c", at("thanks, that helped", -59, reply_to=last.first))
        after = state()
        assert after.topic_start_seq == last.first and after.search_key != before.search_key
        # The key read from a state's document is the state's own.
        assert search_key(__import__("json").loads(after.body())) == after.search_key


def test_dropping_archives_moves_the_search_key() -> None:
    """A dropped archive is still searchable, but the rows a search returns say it was dropped."""
    with SyncHistoryCompressor("memory://", boundaries={"min_topic_tokens": 0}) as h:
        store = h.reply.store
        h.add_message("c", at("tomato seedlings", -10))
        h.seal_current_topic("c")
        h.add_message("c", at("the zanzibar ferry", -9))
        h.seal_current_topic("c")
        h.maintain("c", now=NOW - timedelta(minutes=8))
        state = store.read_state("c")
        assert state is not None
        topics = store.read_summaries("c", "topic")
        write = transitions.SummaryWrite("archive", "A", 5, "final", "test")
        merged = transitions.record_archive(state, topics, write, NOW)
        assert store.commit("c", Guard(state.version), merged).ok
        state = store.read_state("c")
        assert state is not None
        dropped = transitions.drop_archives(state, store.read_summaries("c", "bulk"), NOW)
        assert dropped.state.search_key != state.search_key
