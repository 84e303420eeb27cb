"""The get_context read path (issue 15): the per-conversation context cache and bounded search.

The cache keeps the newest context of a conversation with the state it was built from; a call
reads that state back by primary key and returns the kept context only when nothing changed, in
this process or in any other. Search ranks a bounded candidate set: each query word's newest
matching rows, so a word in thousands of messages costs no more than one in a few hundred.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiered_history import SyncHistoryCompressor
from tiered_history.core.ranking import parse_query
from tiered_history.errors import TransientStoreError
from tiered_history.store.base import Window
from tiered_history.store.sql import CANDIDATES_PER_WORD, SQLStore, _tally
from tiered_history.testing import ScriptedSummarizer

CID = "cache"
T0 = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
SPAWN = multiprocessing.get_context("spawn")


def msg(role: str, text: str, i: int) -> dict[str, Any]:
    return {"role": role, "content": text, "timestamp": T0 + timedelta(seconds=i)}


@contextmanager
def counting(obj: Any, names: tuple[str, ...]) -> Iterator[dict[str, int]]:
    """Count calls to ``obj``'s methods ``names`` while the block runs."""
    counts = dict.fromkeys(names, 0)
    originals = {n: getattr(obj, n) for n in names}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*a: Any, **k: Any) -> Any:
            counts[name] += 1
            return fn(*a, **k)

        return counted

    for n, fn in originals.items():
        setattr(obj, n, wrap(n, fn))
    try:
        yield counts
    finally:
        for n in names:
            delattr(obj, n)  # the instance attribute goes, the class method is seen again


def _add_from_another_process(url: str, text: str, seal: bool) -> None:
    h = SyncHistoryCompressor(url, recall={"enabled": True})
    try:
        if not seal:
            h.add_message(CID, msg("user", text, len(h.get_messages(CID)) + 1))
        else:
            h.seal_current_topic(CID)
            h.maintain(CID)
    finally:
        h.close()


def run_child(url: str, text: str, seal: bool = False) -> None:
    p = SPAWN.Process(target=_add_from_another_process, args=(url, text, seal))
    p.start()
    p.join(120)
    assert p.exitcode == 0


def test_a_repeated_read_costs_one_primary_key_read(sql_url: str) -> None:
    with SyncHistoryCompressor(sql_url) as h:
        for i in range(12):
            h.add_message(CID, msg("user" if i % 2 == 0 else "assistant", f"harbour trip note {i}", i))
        h.get_context(CID, 2000)  # records the budget and window: a write, the version moves
        first = h.get_context(CID, 2000)
        store = h.reply.store
        with counting(store, ("read_state", "read_context", "search_each", "read_messages")) as calls:
            again = h.get_context(CID, 2000)
        assert calls == {"read_state": 1, "read_context": 0, "search_each": 0, "read_messages": 0}
        assert again == first
        # A different question is not answered from the kept context.
        with counting(store, ("read_context", "search_each")) as calls:
            asked = h.get_context(CID, 2000, query="harbour")
        assert calls["read_context"] == 1 and calls["search_each"] == 1  # messages and summaries in one
        assert asked.recall_query in ("", "harbour")


def test_the_read_after_a_seal_reads_no_summary_again(sql_url: str) -> None:
    """A seal adds a pending topic, which no read returns: the summary rows kept from the read
    before serve the read after it (no summary statement), and it builds the context a compressor
    keeping nothing builds; the read after maintenance summarised the topic reads them again."""
    now = datetime.now(UTC)
    n = 0

    def add(h: SyncHistoryCompressor, text: str) -> None:
        nonlocal n
        n += 1
        at = now - timedelta(seconds=600 - n)
        h.add_message(CID, {"role": "user" if n % 2 else "assistant", "content": text, "timestamp": at})

    with SyncHistoryCompressor(sql_url) as h, SyncHistoryCompressor(sql_url) as fresh:
        for topic in ("ferry timetable", "lantern repair", "pasta recipe", "budget review"):
            for i in range(4):
                detail = " ".join(
                    f"{topic.split()[0]}{k} costs {i * k} crowns on day {k}." for k in range(12)
                )
                add(h, f"the {topic} again, point {i}: {detail}")
            h.seal_current_topic(CID)
        h.maintain(CID)
        for text in ("the kite festival", "the kite festival, first of all"):  # read as a bot reads
            add(h, text)
            h.get_context(CID, 1500)
        asked: list[Any] = []
        read = h.reply.store.read_context

        def recorded(cid: str, request: Any, version: Any = None) -> Any:
            asked.append(request)
            return read(cid, request, version)

        h.reply.store.read_context = recorded  # type: ignore[method-assign]
        add(h, "the kite festival, more of it")
        h.seal_current_topic(CID)  # a pending topic
        add(h, "a seventh topic: the harbour")
        sealed = h.get_context(CID, 1500)
        assert asked and asked[-1].summaries == () and asked[-1].summary_ids == ()
        assert sealed.historical_topics or sealed.bulk_archives
        assert fresh.get_context(CID, 1500) == sealed
        h.maintain(CID)  # the pending topic gets its summary: the rows are read again
        summarised = h.get_context(CID, 1500)
        assert asked[-1].summaries != ()
        assert fresh.get_context(CID, 1500) == summarised


def test_what_a_caller_changes_in_a_context_is_not_kept(sql_url: str) -> None:
    with SyncHistoryCompressor(sql_url) as h:
        for i in range(6):
            h.add_message(CID, msg("user", f"message {i}", i))
        ctx = h.get_context(CID, 2000)
        shown = [m.sequence for m in ctx.current_topic]
        ctx.current_topic.clear()
        ctx.tier_tokens.clear()
        again = h.get_context(CID, 2000)
        assert [m.sequence for m in again.current_topic] == shown
        assert again.tier_tokens


def test_a_write_by_another_process_is_seen_on_the_next_call(sql_url: str) -> None:
    with SyncHistoryCompressor(sql_url, recall={"enabled": True}) as h:
        for i in range(8):
            h.add_message(CID, msg("user" if i % 2 == 0 else "assistant", f"talking about tomatoes {i}", i))
        before = h.get_context(CID, 3000)
        assert h.get_context(CID, 3000) == before  # kept
        run_child(sql_url, "a message written by another process")
        after = h.get_context(CID, 3000)
        assert after.current_topic[-1].content == "a message written by another process"
        assert after.current_topic[-1].sequence == before.current_topic[-1].sequence + 1
        assert h.get_context(CID, 3000) == after
        # Maintenance elsewhere (a seal and its summary, no new message) is seen too.
        run_child(sql_url, "", seal=True)
        sealed = h.get_context(CID, 3000)
        assert sealed.maintenance_epoch > after.maintenance_epoch


def test_a_deleted_and_recreated_conversation_is_read_again(sql_url: str) -> None:
    with SyncHistoryCompressor(sql_url) as h, SyncHistoryCompressor(sql_url) as other:
        h.add_message(CID, msg("user", "the first life of this conversation", 1))
        assert h.get_context(CID, 1000).current_topic[-1].content == "the first life of this conversation"
        other.delete_conversation(CID)
        other.add_message(CID, msg("user", "a second life", 2))
        assert h.get_context(CID, 1000).current_topic[-1].content == "a second life"


def test_a_conversation_made_again_shows_its_own_summaries(sql_url: str) -> None:
    """The same steps in a conversation's second life give the same state counters: the summaries
    kept from the first life must not be shown (their creation time tells the lives apart)."""

    def life(h: SyncHistoryCompressor, subject: str) -> None:
        h.add_messages(CID, [msg("user", f"{subject} plan number {i} is settled", i) for i in range(6)])
        h.seal_current_topic(CID)
        filler = " ".join(["and now for something else entirely"] * 30)
        h.add_messages(CID, [msg("user", filler, 7 + i) for i in range(8)])
        h.maintain(CID)

    with SyncHistoryCompressor(sql_url) as h, SyncHistoryCompressor(sql_url) as other:
        life(other, "zanzibar")
        first = h.get_context(CID, 700)
        assert "zanzibar" in " ".join(x.content for x in first.historical_topics)
        other.delete_conversation(CID)
        life(other, "lantern")
        second = h.get_context(CID, 700)
        shown = " ".join(x.content for x in second.historical_topics)
        assert "lantern" in shown and "zanzibar" not in shown


# -- bounded search --------------------------------------------------------------------------------


def test_search_past_the_candidate_cap_returns_the_best_and_newest(sql_url: str) -> None:
    """A word in more messages than the cap: the rare word still finds its old message, equal
    scores come newest first, and the best-ranked message wins however old it is."""
    with SyncHistoryCompressor(sql_url) as h:
        store = h.reply.store
        assert isinstance(store, SQLStore)
        cap = CANDIDATES_PER_WORD
        texts = ["the zanzibar plan is settled, ferry booked"]  # 1: old, holds the rare word
        texts += ["ferry again"] * (cap + 40)  # identical: equal scores
        texts += ["ferry ferry ferry ferry timetable"]  # newest but one: ferry four times
        texts += ["unrelated words only"]
        h.add_messages(CID, [msg("user", t, i) for i, t in enumerate(texts)])
        last = len(texts)
        found = [m.sequence for m in h.search(CID, "zanzibar", limit=5)]
        assert found == [1]
        both = [m.sequence for m in h.search(CID, "zanzibar ferry", limit=3)]
        assert both[0] == 1  # the only message with both words (and the rare one)
        # Ranked over its newest rows: the one that says it most first, then the newest.
        assert [m.sequence for m in h.search(CID, "ferry", limit=4)] == [
            last - 1,
            last - 2,
            last - 3,
            last - 4,
        ]
        hits = store.search(CID, parse_query("ferry"), 4)
        assert [x.score for x in hits] == sorted((x.score for x in hits), reverse=True)


def _ranked(store: SQLStore, text: str, kind: str, limit: int) -> list[tuple[int, float]]:
    from tiered_history.core.ranking import recall_query

    q = recall_query(text) if kind != "message" else parse_query(text)
    return [
        ((x.message.sequence if x.message else x.summary.id if x.summary else 0), round(x.score, 9))
        for x in store.search(CID, q, limit, kind=kind)
    ]


@contextmanager
def _kept_writer_fresh(url: str) -> Iterator[tuple[SQLStore, SyncHistoryCompressor, SQLStore]]:
    """A store that keeps search candidates, another compressor that writes, and a store whose
    kept candidates a caller clears before each search (to rank as keeping nothing)."""
    with (
        SyncHistoryCompressor(url) as kept,
        SyncHistoryCompressor(url) as writer,
        SyncHistoryCompressor(url) as fresh,
    ):
        ks, fs = kept.reply.store, fresh.reply.store
        assert isinstance(ks, SQLStore) and isinstance(fs, SQLStore)
        yield ks, writer, fs


def test_kept_candidates_rank_what_a_fresh_search_ranks(sql_url: str) -> None:
    """Candidate lists kept between searches (brought up to date with the messages written since,
    dropped when the summaries change or the conversation is made again) rank exactly what a
    store keeping nothing ranks, while another writer appends, seals, summarises and deletes."""
    import random

    from tiered_history.store.recall import CandidateCache

    rng = random.Random(5)
    vocab = ["ferry", "kite", "budget", "oven", "zanzibar", "lantern", "pasta", "harbour", "rain", "code"]
    with _kept_writer_fresh(sql_url) as (ks, writer, fs):
        i = 0
        for step in range(70):
            burst = rng.choice([1, 1, 2, 5, 90])  # 90: more new matches than a list holds
            batch = []
            for _ in range(burst):
                i += 1
                text = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 9)))
                batch.append(msg("user" if i % 2 else "assistant", text, i))
            writer.add_messages(CID, batch)
            if step % 9 == 4:
                writer.seal_current_topic(CID)  # a pending topic: not searchable yet
            if step % 9 == 6:
                writer.maintain(CID)  # its summary: searchable
            if step == 40:
                writer.delete_conversation(CID)
                i = 0
                writer.add_message(CID, msg("user", "ferry kite budget after the deletion", 0))
            for _ in range(2):
                query = " ".join(rng.sample(vocab, rng.randint(1, 4)))
                for kind, limit in (("message", 8), ("summary", 4)):
                    fs._recall = CandidateCache()
                    assert _ranked(ks, query, kind, limit) == _ranked(fs, query, kind, limit), (
                        step,
                        query,
                        kind,
                    )
                    # The rows too (kept ones included): a summary changed since is read again.
                    q = parse_query(query)
                    assert ks.search(CID, q, limit, kind) == fs.search(CID, q, limit, kind), (step, kind)


def test_kept_lists_brought_up_to_date_beside_other_conversations(sql_url: str, monkeypatch: Any) -> None:
    """A kept list further behind than the new messages read directly is brought up to date by
    the index, and finds what a fresh search finds and none of another conversation's rows:
    when the other conversations wrote few messages since (SQLite then takes the conversation
    from the join, not from the index) and when they wrote many."""
    from tiered_history.store import sql as sql_module
    from tiered_history.store.recall import RECENT_SCAN, CandidateCache

    few_others = sql_module._few_others
    taken: list[bool] = []

    def recorded(*args: Any) -> bool:
        taken.append(few_others(*args))
        return taken[-1]

    monkeypatch.setattr(sql_module, "_few_others", recorded)
    query = "ferry kite budget"
    own = RECENT_SCAN + 6  # more than are read directly: the index brings the lists up to date
    with _kept_writer_fresh(sql_url) as (ks, writer, fs):
        writer.add_messages(CID, [msg("user", f"ferry kite {i}", i) for i in range(1, 40)])
        _ranked(ks, query, "message", 8)  # the lists kept
        i = j = 40
        for others in (RECENT_SCAN // 4, 6 * RECENT_SCAN):
            for k in range(max(own, others)):  # the two conversations' rows interleaved
                if k < others:
                    j += 1
                    writer.add_message("other", msg("user", f"ferry kite budget budget other {j}", j))
                if k < own:
                    i += 1
                    writer.add_message(CID, msg("assistant", f"kite budget oven {i}", i))
            fs._recall = CandidateCache()
            assert _ranked(ks, query, "message", 8) == _ranked(fs, query, "message", 8), others
            hits = ks.search(CID, parse_query(query), 8)
            assert hits and not any("other" in h.message.content for h in hits if h.message), others
    if sql_url.startswith("sqlite"):
        assert taken == [True] * 3 + [False] * 3, taken


def test_a_large_conversations_words_are_found_from_its_first_row(tmp_path: Path) -> None:
    """SQLite: in a conversation holding most rows written since its first, a word's newest
    matches (messages and summaries) are found by rowid from its first row, the conversation
    read from the join, instead of by FTS5's conv column: the same rows, with other
    conversations' rows before and among its own; where they are many, the conv column again."""
    from tiered_history.store.recall import SMALL_SCAN, CandidateCache

    url = f"sqlite:///{tmp_path / 'dense.db'}"
    now = datetime.now(UTC)
    n = 0

    def add(h: SyncHistoryCompressor, cid: str, text: str) -> None:
        nonlocal n
        n += 1
        h.add_message(cid, {"role": "user", "content": text, "timestamp": now - timedelta(seconds=5000 - n)})

    def lists(store: SQLStore, query: str) -> list[Any]:
        store._recall = CandidateCache()
        return [_ranked(store, query, kind, 8) for kind in ("message", "summary")]

    queries = ("ferry kite", "harbour", "lantern ferry oven", "zanzibar")
    with SyncHistoryCompressor(url) as dense, SyncHistoryCompressor(url) as plain:
        ds, ps = dense.reply.store, plain.reply.store
        assert isinstance(ds, SQLStore) and isinstance(ps, SQLStore)
        ps._dense_from = lambda cur, at: None  # type: ignore[method-assign]
        taken: list[bool] = []
        found = ds._dense_from

        def recorded(cur: Any, at: Any) -> int | None:
            first = found(cur, at)
            taken.append(first is not None)
            return first

        ds._dense_from = recorded  # type: ignore[method-assign]
        for i in range(20):  # another conversation's rows before the first of ours
            add(dense, "other", f"ferry kite harbour lantern zanzibar {i}")
        for i in range(2 * SMALL_SCAN + 6):
            add(dense, CID, f"ferry harbour {i} lantern" if i % 3 else f"kite harbour oven {i}")
            if i % 2:
                dense.seal_current_topic(CID)
            if i % 9 == 0:
                add(dense, "other", f"ferry kite harbour zanzibar oven {i}")  # among ours
        dense.maintain(CID)
        state = ds.read_state(CID)
        assert state is not None and state.topic_count + state.archive_count > SMALL_SCAN
        for query in queries:
            assert lists(ds, query) == lists(ps, query), query
        assert taken and all(taken), taken
        # Many rows of another conversation since ours began: FTS5's conv column again.
        for i in range(4 * SMALL_SCAN):
            add(dense, "other", f"ferry kite harbour lantern zanzibar oven {i}")
            dense.seal_current_topic("other")
        dense.maintain("other")
        taken.clear()
        for query in queries:
            assert lists(ds, query) == lists(ps, query), query
        assert taken and not any(taken), taken


def test_kept_candidates_rank_what_a_fresh_search_ranks_in_any_script(sql_url: str) -> None:
    """The same with texts FTS5 and our word split may cut differently (letters beyond ASCII,
    private-use characters, words glued by punctuation) beside plain ones: SQLite brings kept
    lists up to date by reading the new messages only when every one of them is plain."""
    import random

    from tiered_history.store.recall import CandidateCache

    rng = random.Random(9)
    plain = ["ferry", "kite", "budget", "oven", "ferry’s", "“kite”", "kite—oven", "x_y"]
    other = ["café", "Zürich", "İstanbul", "ferry", "KITEK", "🙂kite", "straße"]
    with _kept_writer_fresh(sql_url) as (ks, writer, fs):
        i = 0
        for step in range(40):
            batch = []
            for _ in range(rng.choice([1, 1, 2, 3, 70])):
                i += 1
                vocab = plain if rng.random() < 0.7 else plain + other
                text = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 8)))
                batch.append(msg("user" if i % 2 else "assistant", text, i))
            writer.add_messages(CID, batch)
            for _ in range(2):
                query = " ".join(rng.sample(["ferry", "kite", "budget", "oven", "café", "istanbul", "s"], 3))
                fs._recall = CandidateCache()
                assert _ranked(ks, query, "message", 8) == _ranked(fs, query, "message", 8), (step, query)


def test_plain_punctuation_separates_words_in_fts5_too() -> None:
    """The characters beyond ASCII that SQLite's search takes for plain text are separators for
    FTS5's unicode61 tokenizer as for our word split (so a word is found alike by both)."""
    from tiered_history.core.ranking import words
    from tiered_history.store.sql import _PLAIN_EXTRA, _plain

    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE t USING fts5(content, tokenize='unicode61 remove_diacritics 0')")
    db.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'row')")
    for c in _PLAIN_EXTRA:
        text = f"Alpha{c}beta{c}{c}GAMMA"
        db.execute("DELETE FROM t")
        db.execute("INSERT INTO t(content) VALUES (?)", (text,))
        assert sorted(r[0] for r in db.execute("SELECT term FROM v")) == sorted(words(text)), repr(c)
        assert _plain(text)
    assert not _plain("caf\u00e9") and not _plain("a\x00b") and _plain("plain text, ASCII only!")


def test_a_restored_conversation_is_found_as_it_reads_now(sql_url: str) -> None:
    """Deleted and restored by another process (same creation time), a conversation can get its
    old key back on SQLite and its messages ids that held others of its messages: what a store
    kept from the first life must not stand for them."""
    with SyncHistoryCompressor(sql_url) as h, SyncHistoryCompressor(sql_url) as other:
        other.add_message("other", msg("user", "unrelated words", 0))
        # The conversation's messages interleaved with another's: its ids are not contiguous.
        other.add_message(CID, msg("user", "alpha ferry leaves early", 1))
        other.add_message("other", msg("user", "more unrelated words", 2))
        other.add_message(CID, msg("user", "beta kite over the harbour", 3))
        other.add_message(CID, msg("user", "gamma ferry leaves late", 4))
        dump = other.export_conversation(CID)
        ks = h.reply.store
        assert isinstance(ks, SQLStore)
        assert [s for s, _ in _ranked(ks, "ferry", "message", 8)] == [3, 1]
        other.delete_conversation(CID)
        other.import_conversation(dump)
        for word, seq in (("alpha", 1), ("beta", 2), ("gamma", 3)):
            found = ks.search(CID, parse_query(word), 4)
            assert [(x.message.sequence, word in x.message.content) for x in found if x.message] == [
                (seq, True)
            ], word


def test_a_conversation_restored_cut_short_shows_nothing_of_its_first_life(sql_url: str) -> None:
    """Restored from an export cut short (same id, same creation time) and written on, the
    conversation's new messages take ids its deleted ones had on SQLite: a store that kept the
    deleted rows must not find, recall or send them."""
    with SyncHistoryCompressor(sql_url) as h, SyncHistoryCompressor(sql_url) as other:
        for i in range(1, 9):
            h.add_message(CID, msg("user" if i % 2 else "assistant", f"secret {i} of the old budget plan", i))
        assert len(h.search(CID, "budget plan")) == 8  # its rows are kept now
        dump = h.export_conversation(CID).splitlines()
        other.delete_conversation(CID)
        other.import_conversation("\n".join(dump[: 1 + 5]) + "\n")  # the header and 5 messages
        other.add_message(CID, msg("user", "zebra giraffe savanna", 9))
        found = h.search(CID, "zebra giraffe")
        assert [(x.message.sequence, x.message.content) for x in found] == [(6, "zebra giraffe savanna")]
        assert [x.message.sequence for x in h.search(CID, "budget plan")] == [5, 4, 3, 2, 1]
        assert "secret 6" not in h.recall(CID, "zebra giraffe", 300).text()
        sent = h.get_context(CID, 300).to_messages()
        assert not any("secret 6" in str(m["content"]) for m in sent)


def test_kept_summary_candidates_are_dropped_when_maintenance_changes_the_summaries(sql_url: str) -> None:
    """A sealed topic is pending (not searchable) until maintenance summarises it: a search kept
    from before sees the summary after, although no message was written in between."""
    now = datetime.now(UTC)  # recent: maintenance must not seal the open topic for its silence

    def recent(text: str, i: int) -> dict[str, Any]:
        return {"role": "user", "content": text, "timestamp": now - timedelta(seconds=60 - i)}

    with SyncHistoryCompressor(sql_url) as kept, SyncHistoryCompressor(sql_url) as writer:
        store = kept.reply.store
        assert isinstance(store, SQLStore)
        writer.add_messages(
            CID, [recent(f"the zanzibar ferry leaves at {9 + i} tomorrow", i) for i in range(6)]
        )
        writer.seal_current_topic(CID)
        writer.add_message(CID, recent("now something else entirely", 7))
        assert _ranked(store, "zanzibar ferry", "summary", 4) == []  # pending: nothing to find
        before = writer.reply.store.read_state(CID)
        writer.maintain(CID)
        after = writer.reply.store.read_state(CID)
        assert before is not None and after is not None and after.topic_start_seq == before.topic_start_seq
        assert [i for i, _ in _ranked(store, "zanzibar ferry", "summary", 4)] == [
            x.id for x in writer.get_history(CID).topics if x.content
        ]


def test_a_summary_replaced_in_place_is_found_as_it_reads_now(sql_url: str) -> None:
    """A provisional summary that maintenance replaces (the same row, a new text) is found with
    its new text by a store that found, and kept, the old one."""
    # Fails the topic's first attempt (a provisional extract), then answers with the new text.
    replaced = "zanzibar ferry timetable, as replaced"
    fails_once = ScriptedSummarizer(summaries=[RuntimeError("provider down")], default=replaced)

    now = datetime.now(UTC)

    def recent(text: str, i: int) -> dict[str, Any]:
        return {"role": "user", "content": text, "timestamp": now - timedelta(seconds=60 - i)}

    settings = {"retry_backoff_seconds": 1.0, "summary_max_attempts": 3, "boundaries": {"temporal": False}}
    with (
        SyncHistoryCompressor(sql_url, **settings) as reader,
        SyncHistoryCompressor(sql_url, summarizer=fails_once, **settings) as writer,
    ):
        store = reader.reply.store
        assert isinstance(store, SQLStore)
        writer.add_messages(CID, [recent(f"the zanzibar ferry leaves at {9 + i}", i) for i in range(6)])
        writer.seal_current_topic(CID)
        writer.add_message(CID, recent("now something else entirely", 7))
        writer.maintain(CID)
        q = parse_query("zanzibar ferry")
        [before] = store.search(CID, q, 4, kind="summary")
        assert before.summary is not None and before.summary.status == "provisional"
        writer.maintain(CID, now=now + timedelta(minutes=5))
        [after] = store.search(CID, q, 4, kind="summary")
        assert after.summary is not None and after.summary.id == before.summary.id
        assert (after.summary.status, after.summary.content) == (
            "final",
            "zanzibar ferry timetable, as replaced",
        )


def test_a_reopened_topic_is_no_longer_found_by_a_store_that_kept_its_summary(sql_url: str) -> None:
    """A summarised topic that a reply reopens is superseded: a store that found (and kept) its
    summary finds nothing after, as a store keeping nothing does."""
    from tiered_history.store.recall import CandidateCache

    now = datetime.now(UTC)

    def at(text: str, minutes: int, reply_to: int | None = None) -> dict[str, Any]:
        meta = {"reply_to": reply_to} if reply_to is not None else None
        return {
            "role": "user",
            "content": text,
            "timestamp": now - timedelta(minutes=minutes),
            "metadata": meta,
        }

    settings = {"boundaries": {"min_topic_tokens": 0}}
    with (
        SyncHistoryCompressor(sql_url, **settings) as kept,
        SyncHistoryCompressor(sql_url, **settings) as writer,
        SyncHistoryCompressor(sql_url, **settings) as fresh,
    ):
        ks, fs = kept.reply.store, fresh.reply.store
        assert isinstance(ks, SQLStore) and isinstance(fs, SQLStore)
        writer.add_message(CID, at("the zanzibar ferry timetable for tomorrow morning", 120))
        writer.add_message(CID, at("the zanzibar ferry leaves at nine from the old harbour", 119))
        writer.add_message(CID, at("any plans for the weekend?", 3))  # the silence seals the ferry
        writer.maintain(CID)
        q = parse_query("zanzibar ferry")
        [found] = ks.search(CID, q, 4, kind="summary")
        assert found.summary is not None and found.summary.status in ("provisional", "final")
        writer.add_message(CID, at("thanks, that helped", 2, reply_to=2))  # reopens the ferry topic
        assert [t.status for t in writer.get_history(CID).topics] == ["superseded"]
        fs._recall = CandidateCache()
        assert ks.search(CID, q, 4, kind="summary") == fs.search(CID, q, 4, kind="summary") == []


def test_a_seal_keeps_the_summary_candidates_found_before(sql_url: str) -> None:
    """A seal adds a pending topic, which no search finds: a store keeps its summary lists and
    rows across it (no search statement), and still ranks what a store keeping nothing ranks."""
    from tiered_history.store.recall import CandidateCache

    now = datetime.now(UTC)

    def recent(text: str, i: int) -> dict[str, Any]:
        return {"role": "user", "content": text, "timestamp": now - timedelta(seconds=90 - i)}

    with _kept_writer_fresh(sql_url) as (ks, writer, fs):
        writer.add_messages(
            CID, [recent(f"the zanzibar ferry leaves at {9 + i} tomorrow", i) for i in range(6)]
        )
        writer.seal_current_topic(CID)
        writer.add_message(CID, recent("a lantern festival by the harbour", 7))
        writer.maintain(CID)
        query = "zanzibar ferry harbour"
        before = _ranked(ks, query, "summary", 4)
        assert before
        writer.add_message(CID, recent("the lantern festival starts at dusk", 8))
        writer.seal_current_topic(CID)
        writer.add_message(CID, recent("something else", 9))
        with counting(ks, ("_fts_lists", "_pg_lists", "_rows")) as calls:
            after = _ranked(ks, query, "summary", 4)
        assert calls == {"_fts_lists": 0, "_pg_lists": 0, "_rows": 0}
        fs._recall = CandidateCache()
        assert after == before == _ranked(fs, query, "summary", 4)


def test_kept_summary_lists_take_in_the_summaries_maintenance_adds(sql_url: str) -> None:
    """When maintenance only summarises pending topics, a store's kept summary lists of single
    words are brought up to date from the new summaries (no index search for those words), and
    rank what a store keeping nothing ranks: below the cap, and (SQLite) past it, where the
    newest rows by id are kept. A phrase's list is made again."""
    from tiered_history.store.recall import CandidateCache

    now = datetime.now(UTC)
    n = 0

    def topic(words: str) -> None:
        nonlocal n
        for k in range(2):
            n += 1
            at = now - timedelta(seconds=900 - n)
            writer.add_message(CID, {"role": "user", "content": f"{words} {k}", "timestamp": at})
        writer.seal_current_topic(CID)

    searched: list[tuple[str, ...]] = []
    with _kept_writer_fresh(sql_url) as (ks, writer, fs):
        made = ks._fts_lists if ks._sqlite else ks._pg_lists

        def recorded(cur: Any, at: Any, stale: dict[Any, Any]) -> Any:
            if at.summary:
                searched.extend(stale)
            return made(cur, at, stale)

        setattr(ks, "_fts_lists" if ks._sqlite else "_pg_lists", recorded)
        for i in range(CANDIDATES_PER_WORD + 2):
            topic(f"the zanzibar ferry timetable {i} harbour" if i % 2 else f"lantern harbour kite {i}")
        writer.maintain(CID)
        queries = ("zanzibar ferry", "harbour", "lantern oven")  # "harbour": in every topic
        for query in queries:
            _ranked(ks, query, "summary", 4)
        for words in ("zanzibar ferry harbour", "oven ferry", "lantern"):
            before = writer.reply.store.read_state(CID)
            topic(words)
            writer.maintain(CID)
            after = writer.reply.store.read_state(CID)
            assert before is not None and after is not None
            assert after.compressions == before.compressions + 1
            assert after.archive_count == before.archive_count  # nothing merged: only added
            searched.clear()
            for query in queries:
                fs._recall = CandidateCache()
                assert _ranked(ks, query, "summary", 4) == _ranked(fs, query, "summary", 4), (words, query)
                q = parse_query(query)
                assert ks.search(CID, q, 4, "summary") == fs.search(CID, q, 4, "summary"), (words, query)
            # PostgreSQL extends a list past the cap ("harbour") only when no new summary holds it.
            expected = [("harbour",)] if not ks._sqlite and "harbour" in words else []
            assert sorted(g for g in searched if g != ("zanzibar", "ferry")) == expected, searched


def test_postgresql_small_conversations_rank_as_the_index_would(pg_url: str, monkeypatch: Any) -> None:
    """A small conversation's candidates come from one statement over all its messages (or
    summaries), not one planned per word: the same ranking either way."""
    import random

    import tiered_history.store.sql as sql_module
    from tiered_history.store.recall import CandidateCache

    rng = random.Random(11)
    vocab = [
        "ferry",
        "kite",
        "budget",
        "oven",
        "zanzibar",
        "lantern",
        "pasta",
        "harbour",
        "rain",
        "code",
        "tenant",
        "deposit",
    ]
    with SyncHistoryCompressor(pg_url) as h:
        store = h.reply.store
        assert isinstance(store, SQLStore)
        for topic in range(5):
            texts = [" ".join(rng.choice(vocab) for _ in range(rng.randint(2, 12))) for _ in range(30)]
            h.add_messages(CID, [msg("user", t, topic * 100 + i) for i, t in enumerate(texts)])
            h.seal_current_topic(CID)
        h.maintain(CID)
        queries = [" ".join(rng.sample(vocab, rng.randint(1, 6))) for _ in range(12)]

        def ranked() -> list[list[tuple[int, float]]]:
            out = []
            for q in queries:
                for kind, limit in (("message", 10), ("summary", 4)):
                    store._recall = CandidateCache()
                    out.append(_ranked(store, q, kind, limit))
            return out

        small = ranked()
        assert any(small[1::2]), "no summary was found: the summary path went untested"
        monkeypatch.setattr(sql_module, "SMALL_CONVERSATION", 0)
        assert ranked() == small


def test_sqlite_small_conversations_rank_as_the_index_would(tmp_path: Path, monkeypatch: Any) -> None:
    """In a small SQLite conversation, the lists no search kept (messages and summaries) come from
    one read of its rows, counted in Python, not one FTS5 query per word: the same ranking either
    way, for plain texts and for texts FTS5 may split otherwise (which leave every list to
    FTS5), while it grows past the size read that way."""
    import random

    import tiered_history.store.sql as sql_module
    from tiered_history.store.recall import SMALL_SCAN, CandidateCache

    rng = random.Random(13)
    plain = ["ferry", "kite", "budget", "oven", "lantern", "pasta", "ferry’s", "kite—oven", "x_y"]
    other = ["café", "Zürich", "İstanbul", "🙂kite"]
    queries = ["ferry kite", "budget oven pasta", "lantern", "kite café", "x y ferry", "istanbul oven"]
    scanned = {"message": 0, "summary": 0}
    # Silences of over a year seal (in the future: maintenance never seals the open topic too).
    with SyncHistoryCompressor(f"sqlite:///{tmp_path / 'small.db'}", silence_minutes=525_600) as h:
        store = h.reply.store
        assert isinstance(store, SQLStore)

        def noting(made: Any, kind: str) -> Any:
            def run(cur: Any, at: Any, stale: Any) -> Any:
                fresh = made(cur, at, stale)
                scanned[kind] += bool(fresh)
                return fresh

            return run

        monkeypatch.setattr(store, "_fts_new_messages", noting(store._fts_new_messages, "message"))
        monkeypatch.setattr(store, "_fts_few_summaries", noting(store._fts_few_summaries, "summary"))
        i, gap = 0, timedelta(0)

        def at(role: str, text: str, **extra: Any) -> dict[str, Any]:
            return {**msg(role, text, i), "timestamp": T0 + gap + timedelta(seconds=i), **extra}

        while i < SMALL_SCAN + 10:
            vocab = plain if i < 30 or rng.random() < 0.8 else plain + other
            batch = []
            for _ in range(rng.choice([1, 2, 5])):
                i += 1
                batch.append(
                    at("user" if i % 2 else "assistant", " ".join(rng.sample(vocab, rng.randint(1, 6))))
                )
            h.add_messages(CID, batch)
            if rng.random() < 0.3:
                # A silence seals the topic (a seal a reply into it undoes: its summary superseded).
                gap += timedelta(days=400)
                i += 1
                h.add_message(CID, at("user", "lantern pasta budget"))
                h.maintain(CID)
                if rng.random() < 0.5:
                    i += 1
                    h.add_message(CID, at("user", "ferry kite", metadata={"reply_to": i - 2}))
            for q in queries:
                for kind, limit in (("message", 6), ("summary", 3)):
                    store._recall = CandidateCache()
                    small = _ranked(store, q, kind, limit)
                    monkeypatch.setattr(sql_module, "SMALL_SCAN", 0)
                    store._recall = CandidateCache()
                    assert _ranked(store, q, kind, limit) == small, (i, q, kind)
                    monkeypatch.setattr(sql_module, "SMALL_SCAN", SMALL_SCAN)
        statuses = {x.status for x in store.read_summaries(CID, "topic")}
    assert all(scanned.values()), f"a path went untested: {scanned}"
    assert "superseded" in statuses, "no summary was superseded: the live filter went untested"


def test_kept_candidates_never_bring_another_conversations_rows(sql_url: str) -> None:
    """Whatever a kept list holds (here: forged to name another conversation's messages, as a
    list kept from a deleted conversation whose key and creation time came back could), a search
    returns the searched conversation's rows only."""
    from tiered_history.store.recall import CandidateCache, candidates

    with SyncHistoryCompressor(sql_url) as h:
        store = h.reply.store
        assert isinstance(store, SQLStore)
        h.add_messages("other", [msg("user", f"zanzibar secret number {i}", i) for i in range(5)])
        h.add_messages(CID, [msg("user", f"zanzibar plan {i}", i) for i in range(3)])
        assert sorted(m.sequence for m in h.search(CID, "zanzibar", limit=10)) == [1, 2, 3]
        raw = store.engine.raw_connection()
        try:
            cur = raw.cursor()
            cur.execute("SELECT key FROM conversations WHERE id = 'cache'")
            key = cur.fetchone()[0]
            cur.execute(
                "SELECT m.id, m.seq FROM messages m JOIN conversations c ON c.key = m.conv "
                "WHERE c.id = 'other'"
            )
            theirs = [(int(i), int(seq)) for i, seq in cur.fetchall()]
        finally:
            raw.close()
        state = store.read_state(CID)
        assert state is not None
        row_created = store._ts(state.created_at)
        forged = candidates(64, state.last_sequence, [(i, 100 + seq, 4, 1) for i, seq in theirs], len(theirs))
        store._recall.put(CandidateCache.key(f"{key}:{row_created}", "message", ("zanzibar",)), forged)
        found = h.search(CID, "zanzibar", limit=10)
        # Rows are read by id and returned as this conversation's: only its own may come back.
        assert "secret" not in " ".join(m.message.content for m in found)


def _vm_steps(store: SQLStore, run: Callable[[], Any]) -> int:
    """SQLite virtual-machine steps ``run`` costs (counted by a progress handler on every connection)."""
    steps = [0]

    def tick() -> int:
        steps[0] += 1
        return 0

    from sqlalchemy import event

    def on_checkout(dbapi: sqlite3.Connection, *_: Any) -> None:
        dbapi.set_progress_handler(tick, 100)

    event.listen(store.engine, "checkout", on_checkout)
    try:
        run()
    finally:
        event.remove(store.engine, "checkout", on_checkout)
    return steps[0] * 100


def test_sqlite_search_cost_does_not_grow_with_matching_rows(tmp_path: Path) -> None:
    """Ten times as many messages holding the query's words cost about the same search."""
    from tiered_history.store.recall import CandidateCache

    costs = []
    for n in (400, 4000):
        # An engine passed in is checked out per transaction (not held), so _vm_steps sees it.
        engine = sa.create_engine(f"sqlite:///{tmp_path / f'{n}.db'}")
        with SyncHistoryCompressor(engine) as h:
            texts = [f"weather report {i} says rain again" for i in range(n)]
            h.add_messages(CID, [msg("user", t, i) for i, t in enumerate(texts)])
            store = h.reply.store
            assert isinstance(store, SQLStore)
            q = parse_query("weather rain report")
            assert len(store.search(CID, q, 16)) == 16
            # Measured with nothing kept (no candidate lists, no rows): a search from scratch.
            store._recall = CandidateCache()
            costs.append(_vm_steps(store, partial(store.search, CID, q, 16)))
    assert 0 < costs[1] < costs[0] * 1.5, costs


def test_an_incremental_read_builds_the_context_a_fresh_reader_builds(sql_url: str) -> None:
    """The window kept from the last read, extended by the rows since, gives the context a reader
    with nothing kept gives: through tool units, pins, long bursts and maintenance."""
    with SyncHistoryCompressor(sql_url, recall={"enabled": True}) as h:
        i = 0

        def add(role: str, text: str, **extra: Any) -> None:
            nonlocal i
            i += 1
            h.add_message(CID, {**msg(role, text, i), **extra})

        for step in range(60):
            if step % 7 == 3:
                call = {"id": f"c{step}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                add("assistant", "", tool_calls=[call])
                add("tool", f"result of call {step} " * 5, tool_call_id=f"c{step}")
            elif step % 11 == 5:
                h.pin(CID, f"pinned rule {step}", key=f"rule{step % 2}")
            elif step % 13 == 0:
                add("user", f"a long burst {step} " * 300)  # more than the window's cap by itself
            else:
                add("user" if step % 2 else "assistant", f"chatting about kites and ferries {step}")
            if step % 17 == 16:
                h.seal_current_topic(CID)
                h.maintain(CID)
            kept = h.get_context(CID, 1500, record=False)
            with SyncHistoryCompressor(sql_url, recall={"enabled": True}) as fresh:
                assert fresh.get_context(CID, 1500, record=False) == kept, step


def _rows_examined(plan: Any) -> int:
    """Rows a JSON plan's scans produced or filtered away, over all its nodes."""
    total = 0
    if "Scan" in plan.get("Node Type", ""):
        total += int(plan.get("Actual Rows", 0)) + int(plan.get("Rows Removed by Filter", 0))
    for child in plan.get("Plans", []):
        total += _rows_examined(child)
    return total


def test_postgresql_search_cost_does_not_grow_with_matching_rows(pg_url: str) -> None:
    """Ten times as many messages holding the query's words: the candidate statement examines
    about as many rows (each word's newest matches, whatever their number)."""
    with SyncHistoryCompressor(pg_url) as h:
        store = h.reply.store
        assert isinstance(store, SQLStore)
        examined = []
        for k, n in enumerate((400, 4000)):
            cid = f"{CID}-{k}"
            texts = [f"weather report {i} says rain again" for i in range(n)]
            h.add_messages(cid, [msg("user", t, i) for i, t in enumerate(texts)])
            raw = store.engine.raw_connection()
            try:
                cur = raw.cursor()
                cur.execute("ANALYZE messages")
                cur.execute("SELECT key FROM conversations WHERE id = %(id)s", {"id": cid})
                found = cur.fetchone()
                assert found is not None
                conv = found[0]
                sql = store.q.pg_candidates([("weather",), ("rain",), ("report",)], False)
                cur.execute(
                    "EXPLAIN (ANALYZE, FORMAT JSON) " + sql, {"conv": conv, "cap": CANDIDATES_PER_WORD}
                )
                plan = cur.fetchone()
                assert plan is not None
                examined.append(_rows_examined(plan[0][0]["Plan"]))
                raw.rollback()
            finally:
                raw.close()
            assert len(store.search(cid, parse_query("weather rain report"), 16)) == 16
        assert examined[1] < examined[0] * 1.5, examined


def test_pg_a_tsvector_counted_from_its_text_as_unnest_counts_it(pg_url: str) -> None:
    """The candidate statement's rows are counted by the client (``_tally``) from the tsvector's
    text: the same length and rarest-word count as taking it apart on the server."""
    texts = [
        "weather report: rain, rain and more rain",
        "Ünïcode café naïve 東京 東京 über 1.5 2,5 it's don't",
        "x " * 20000,  # positions past 16,383 and more than 256 of one word
        "",
        "   ",
    ]
    n = "coalesce(array_length(v.positions, 1), 1)"
    counted = (
        f"SELECT t::text, (SELECT coalesce(sum({n}), 0) FROM unnest(t) v), "
        f"(SELECT coalesce(min({n}) FILTER (WHERE v.lexeme = ANY(%(l)s)), 1) FROM unnest(t) v) FROM "
    )
    # As migration 0002's generated column makes it.
    made = (
        "(SELECT to_tsvector('simple', regexp_replace(regexp_replace(%(t)s, '[^[:alnum:]]+', ' ', 'g'), "
        "'([[:alnum:]]+)', 'w\\1', 'g')) AS t) q"
    )
    with SyncHistoryCompressor(pg_url) as h:
        store = h.reply.store
        assert isinstance(store, SQLStore)
        raw = store.engine.raw_connection()
        try:
            cur = raw.cursor()
            cases: list[tuple[str, dict[str, Any]]] = [
                (counted + made, {"t": text, "l": lexemes})
                for text in texts
                for lexemes in (["wrain"], ["wweather", "wrain"], ["wx"], ["wcafé", "w東京"], ["wnone"])
            ]
            # Lexemes without positions, and weights (neither made by the column, both read right).
            for tsv in ("'wa' 'wb':1,2", "'wa':1A,2B 'wb':3C", "'wa'"):
                cases.append((counted + "(SELECT %(v)s::tsvector AS t) q", {"v": tsv, "l": ["wa"]}))
            for sql, params in cases:
                cur.execute(sql, params)
                row = cur.fetchone()
                assert row is not None
                assert _tally(row[0], params["l"]) == (row[1], row[2]), params
            raw.rollback()
        finally:
            raw.close()


def test_a_record_a_busy_database_refused_is_tried_again_on_the_next_call(tmp_path: Path) -> None:
    with SyncHistoryCompressor(f"sqlite:///{tmp_path / 'busy.db'}") as h:
        for i in range(6):
            h.add_message(CID, msg("user", f"message {i}", i))
        store = h.reply.store
        real = store.commit
        tried: list[int] = []

        def busy(*a: Any, **k: Any) -> Any:
            tried.append(1)
            raise TransientStoreError("database is locked")

        store.commit = busy  # type: ignore[method-assign]
        first = h.get_context(CID, 2000)  # the reply still gets its context
        store.commit = real  # type: ignore[method-assign]
        assert tried == [1]
        assert h.get_context(CID, 2000) == first
        recorded = h.reply.read_state(CID)
        assert recorded is not None and recorded.budget is not None  # by the second call


# -- kept candidates, as a property ----------------------------------------------------------------

_WORDS = ["ferry", "Ferry", "kite", "café", "cafe", "Zürich", "budget", "oven", "42", "naïve", "東京", "x_y"]
# A round: messages added (up to 70 at once: more new matches than a kept list holds), maybe a
# seal, a maintenance pass or a deletion by another compressor, then a search.
_ROUND = st.tuples(
    st.lists(st.lists(st.sampled_from(_WORDS), min_size=1, max_size=8), max_size=70),
    st.sampled_from([None, None, None, "seal", "maintain", "maintain", "delete"]),
    st.lists(st.sampled_from(_WORDS), min_size=1, max_size=4),
)


def _replay(url: str, rounds: list[tuple[list[list[str]], str | None, list[str]]]) -> None:
    from tiered_history.store.recall import CandidateCache

    now = datetime.now(UTC) - timedelta(hours=1)
    with _kept_writer_fresh(url) as (ks, writer, fs):
        i = 0
        for texts, event, words in rounds:
            if texts:
                batch = []
                for text in texts:
                    i += 1
                    role = "user" if i % 2 else "assistant"
                    batch.append(
                        {"role": role, "content": " ".join(text), "timestamp": now + timedelta(seconds=i)}
                    )
                writer.add_messages(CID, batch)
            if event == "seal" and writer.exists(CID):
                writer.seal_current_topic(CID)
            elif event == "maintain" and writer.exists(CID):
                writer.maintain(CID)
            elif event == "delete":
                writer.delete_conversation(CID)
            query = " ".join(words)
            for kind, limit in (("message", 6), ("summary", 3)):
                fs._recall = CandidateCache()
                assert _ranked(ks, query, kind, limit) == _ranked(fs, query, kind, limit), (query, kind)


def _property(kind: str, examples: int) -> Callable[..., None]:
    @settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(rounds=st.lists(_ROUND, min_size=2, max_size=10))
    def run(tmp_path: Path, rounds: list[tuple[list[list[str]], str | None, list[str]]]) -> None:
        from tests.conftest import database_url

        with tempfile.TemporaryDirectory(dir=tmp_path) as d, database_url(kind, Path(d)) as url:
            _replay(url, rounds)

    return run


test_kept_candidates_property_sqlite = _property("sqlite", 25)
test_kept_candidates_property_postgresql = _property("postgresql", 6)


def _every_score(
    lists: dict[tuple[str, ...], Any], weights: dict[tuple[str, ...], float], n: int, avg: float, last: int
) -> dict[int, tuple[float, int]]:
    """Each candidate's exact score (every occurrence counted) and recency: what rank must agree
    with, summed the same way."""
    from tiered_history.core.ranking import K1, B, idf

    held: dict[int, int] = {}
    for c in lists.values():
        for i in c.ids:
            held[i] = held.get(i, 0) + 1
    out: dict[int, tuple[float, int]] = {}
    for g, c in lists.items():
        df = c.cap * last / max(last - min(c.rec) + 1, 1) if c.capped and c.rec else len(c.ids)
        cg = weights[g] * idf(n, min(round(df), n))
        for i, r, dl, tf in zip(c.ids, c.rec, c.dl, c.tf, strict=True):
            t = min(tf, max((max(dl, 1) - held[i] + 1) // len(g), 1))
            score, rec = out.get(i, (0.0, r))
            out[i] = (score + cg * t * (K1 + 1.0) / (t + K1 * (1.0 - B + B * max(dl, 1) / avg)), rec)
    return out


_ROW = st.tuples(st.integers(1, 300), st.integers(0, 3))  # (id, a seed of its counts)


@settings(max_examples=300, derandomize=True, deadline=None, database=None)
@given(
    words=st.lists(
        st.tuples(st.lists(_ROW, max_size=70), st.sampled_from([1.0, 0.35, 2.0]), st.booleans()),
        min_size=1,
        max_size=7,
    ),
    limit=st.integers(1, 40),
    last=st.integers(300, 5000),
    counted=st.floats(0.0, 1.0),
)
def test_rank_is_the_best_of_every_candidate_scored(
    words: list[tuple[list[tuple[int, int]], float, bool]], limit: int, last: int, counted: float
) -> None:
    """rank (bounds, texts counted only where they may matter, lists of light words left once the
    heavier ones have found the best) returns exactly the best ``limit`` of every candidate
    scored in full, newest first among equal scores, whatever is counted already."""
    import random

    from tiered_history.store.recall import candidates, rank

    rng = random.Random(len(words) * 1000 + limit)
    lengths = {i: 1 + i % 9 + (i * 7) % 23 for i in range(1, 301)}  # a row's length, in every list
    lists: dict[tuple[str, ...], Any] = {}
    weights: dict[tuple[str, ...], float] = {}
    full: dict[tuple[str, ...], Any] = {}
    for k, (rows, weight, capped) in enumerate(words):
        g = (f"w{k}",) if k % 3 else (f"w{k}", "x")  # a phrase now and then
        ids = sorted(dict.fromkeys(i for i, _ in rows), reverse=True)[:64]
        seeds = dict(rows)
        made = [(i, i, lengths[i], 1 + (seeds[i] * i) % max(lengths[i] // len(g), 1)) for i in ids]
        full[g] = candidates(64, last, made, 64 if capped else len(made))
        known = [(i, r, dl, tf if rng.random() < counted else 0) for i, r, dl, tf in made]
        lists[g] = candidates(64, last, known, 64 if capped else len(known))
        weights[g] = weight
    n, avg = last, 9.5
    scores = _every_score(full, weights, n, avg, last)
    want = sorted(((-s, -r, -i) for i, (s, r) in scores.items()))[:limit]
    counts = {
        i: {g: full[g].tf[j] for g in full for j, x in enumerate(full[g].ids) if x == i} for i in scores
    }
    texts: list[int] = []

    def count(batch: list[int]) -> dict[int, Callable[[tuple[str, ...]], int]]:
        texts.extend(batch)
        return {i: counts[i].__getitem__ for i in batch}

    got = rank(lists, weights, n, avg, last, limit, count)
    assert got == [(-s, -i, -r) for s, r, i in want]
    assert len(texts) == len(set(texts))  # a text is counted once at most


@contextmanager
def pg_statements() -> Iterator[list[str]]:
    """The statements psycopg cursors execute while the block runs (each one a round trip)."""
    import psycopg

    seen: list[str] = []
    original = psycopg.Cursor.execute

    def execute(self: Any, query: Any, params: Any = None, *a: Any, **k: Any) -> Any:
        seen.append(" ".join(str(query).split()))
        return original(self, query, params, *a, **k)

    psycopg.Cursor.execute = execute  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        psycopg.Cursor.execute = original  # type: ignore[method-assign]


def test_pg_a_read_after_a_write_is_one_statement(pg_url: str) -> None:
    """PostgreSQL, recall off: the read after a reply is one statement (the state, the rows since
    the window kept and the pinned messages: a snapshot by itself), not a transaction of four, and
    it builds the context a compressor reading everything builds."""
    with SyncHistoryCompressor(pg_url, recall={"enabled": False}) as h:
        for i in range(40):
            h.add_message(CID, msg("user" if i % 2 == 0 else "assistant", f"harbour trip note {i}", i))
        h.pin(CID, msg("user", "Always answer in French.", 40), key="lang")
        h.get_context(CID, 2000)
        for i in range(41, 47):
            h.add_message(CID, msg("user" if i % 2 == 0 else "assistant", f"ferry timetable {i}", i))
            with pg_statements() as seen:
                ctx = h.get_context(CID, 2000, record=False)
            assert len(seen) == 1 and seen[0].startswith("WITH st AS"), seen
            with SyncHistoryCompressor(pg_url, recall={"enabled": False}) as fresh:
                assert fresh.get_context(CID, 2000, record=False) == ctx
        assert "Always answer in French." in str(ctx.to_messages())


def test_pg_a_context_head_with_other_pins_reads_as_usual(pg_url: str) -> None:
    """The one-statement read checks the pins the request expected against the state it read: when
    they differ (a conversation made again, the same version), it reads the usual way."""
    with SyncHistoryCompressor(pg_url) as h:
        for i in range(6):
            h.add_message(CID, msg("user" if i % 2 == 0 else "assistant", f"harbour trip note {i}", i))
        h.pin(CID, msg("user", "Always answer in French.", 7), key="lang")
        store = h.reply.store
        assert isinstance(store, SQLStore)
        state = store.read_state(CID)
        assert state is not None and state.pinned_sequences
        request = h.reply._request(state, 2000)
        last = state.last_sequence
        request = replace(request, windows=(Window(last - 3, last, 2000),), summaries=(), summary_ids=())
        usual = store.read_context(CID, replace(request, pinned=None), state.version)
        with pg_statements() as seen:
            wrong = store.read_context(CID, replace(request, pinned=()), state.version)
        assert len(seen) > 1 and wrong == usual
        with pg_statements() as seen:
            right = store.read_context(CID, request, state.version)
        assert len(seen) == 1 and right == usual
        assert usual is not None and [m.content for m in usual.pinned] == ["Always answer in French."]
        with pg_statements() as seen:
            assert store.read_context(CID, request, state.version + 1) is None
            assert store.read_context("missing", request, 1) is None
        assert len(seen) == 2
