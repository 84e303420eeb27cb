"""Smoke test of ``bench.retention`` on tiny synthetic meetings (no dataset needed)."""

from __future__ import annotations

import itertools
import json
import random
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bench.retention import __main__ as cli
from bench.retention import api, bm25, prefix, replay, systems
from bench.retention.data import Meeting, content_words, load_meeting

FILLER = ["budget", "remote", "control", "battery", "design", "market", "button", "colour", "price", "wheel"]
# Words that appear in exactly one stretch of the meeting, so a query about them has evidence there.
RARE = {
    "kinetic": "kinetic charger dynamo crank",
    "titanium": "titanium casing alloy weight",
    "banana": "banana shape yellow curve",
}


def transcript(turns: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for i in range(turns):
        words = [rng.choice(FILLER) for _ in range(rng.randint(8, 20))]
        for n, rare in enumerate(RARE.values()):
            if 20 + 60 * n <= i < 30 + 60 * n:  # evidence spans 20-29, 80-89, 140-149
                words += rare.split()
        out.append({"speaker": f"Speaker {'ABCD'[i % 4]}", "content": " ".join(words).capitalize() + "."})
    return out


def queries() -> list[dict[str, Any]]:
    return [
        {"query": f"What did they say about the {key} idea?", "relevant_text_span": [[str(s), str(s + 9)]]}
        for key, s in zip(RARE, (20, 80, 140), strict=True)
    ]


def write_meeting(directory: Path, name: str, turns: int, seed: int) -> Path:
    path = directory / f"{name}.json"
    data = {"meeting_transcripts": transcript(turns, seed), "specific_query_list": queries()}
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def default_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # conftest lowers min_topic_tokens for other tests; the bench measures the defaults.
    monkeypatch.delenv("TIERED_HISTORY_BOUNDARIES__MIN_TOPIC_TOKENS", raising=False)


@pytest.fixture
def meeting(tmp_path: Path) -> Meeting:
    return load_meeting(write_meeting(tmp_path, "ES9999a", 240, seed=3))


# -- BM25 baseline ------------------------------------------------------------------------------------


def test_bm25_ranks_the_rare_match_first_and_ties_go_to_the_newer_turn() -> None:
    docs = ["the remote control", "remote battery", "a kinetic charger for the remote", "remote battery"]
    index = bm25.BM25(docs)
    assert index.ranking("kinetic remote")[0] == 2
    assert index.ranking("battery") == [3, 1]  # same score: newer first
    assert index.ranking("nothing matches") == []
    assert all(v >= 0 for v in index.idf.values())  # "remote" is in every document, still not negative


def test_retrieval_context_fits_is_chronological_and_ends_with_the_query(meeting: Meeting) -> None:
    shared = systems.Shared(meeting)
    q = systems.query_message("What about the kinetic idea?")
    q_cost = shared.framed.one("user", q["content"])
    for budget in (300, 1000):
        ctx = bm25.retrieval_context(shared.messages, shared.costs, shared.index, q, q_cost, budget)
        assert ctx[-1] is q
        assert shared.counter.messages_tokens(ctx) <= budget
        positions = [shared.messages.index(m) for m in ctx[:-1]]
        assert positions == sorted(set(positions))  # chronological, no duplicates
        assert any("kinetic" in m["content"] for m in ctx[:-1])  # the evidence was retrieved
        # The newest turns are there too (the recency half).
        assert positions[-1] == len(shared.messages) - 1
        filled = bm25.retrieval_context(shared.messages, shared.costs, shared.index, q, q_cost, budget, True)
        assert set(map(id, ctx)) <= set(map(id, filled))  # the variant only adds newer turns
        assert shared.counter.messages_tokens(ctx) <= shared.counter.messages_tokens(filled) <= budget
        if budget == 1000:  # only the ten "kinetic" turns match: the plain baseline leaves room unused
            assert len(filled) > len(ctx)


# -- the replay of one meeting ------------------------------------------------------------------------


def test_without_query_drops_only_the_query_message() -> None:
    msgs = [
        {"role": "user", "content": "hello"},
        {"role": "user", "content": "q?"},
        {"role": "user", "content": "x"},
    ]
    assert replay.without_query(msgs, "q?") == [msgs[0], msgs[2]]
    assert replay.without_query(msgs, "absent") == msgs


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_queries_work_on_copies_and_do_not_see_each_other(
    meeting: Meeting, store: str, tmp_path: Path
) -> None:
    make = systems.ours(systems.OURS_VARIANTS[systems.OURS])
    assert make is not None
    ours = make(systems.Shared(meeting, store=store, tmp=tmp_path), 800)
    assert isinstance(ours, systems.Ours)
    for turn in meeting.turns:
        await ours.add(turn)
    await ours.end()
    before = (await ours.h.stats(systems.CONVERSATION))[0].messages
    at = meeting.turns[-1].timestamp + timedelta(seconds=5)
    first = await ours.ask("first question about kinetic", at)
    second = await ours.ask("second question about banana", at)
    assert first[-1]["content"] == "first question about kinetic"
    assert second[-1]["content"] == "second question about banana"
    assert not any(m["content"] == "first question about kinetic" for m in second)
    assert (await ours.h.stats(systems.CONVERSATION))[0].messages == before == len(meeting.turns)
    await ours.close()
    assert list(tmp_path.glob("*.db")) == []  # copies and the store file are cleaned up


async def test_one_meeting_through_every_system(meeting: Meeting) -> None:
    result = await replay.run_loaded(meeting, [600, 2000], (replay.STATIC, replay.QUERY))
    assert result.queries == 3 and result.messages == 240
    for budget, b in result.budgets.items():
        ran_static = {s.name for s in systems.SYSTEMS if s.static and s.make is not None}
        ran_query = {s.name for s in systems.SYSTEMS if s.query and s.make is not None}
        assert set(b.static) == ran_static and set(b.query) == ran_query
        assert systems.RETRIEVAL not in b.static  # needs a query
        for scores in [*b.static.values(), *b.query.values()]:
            assert len(scores) == 3 and all(0.0 <= x <= 1.0 for x in scores)
        for used in [*b.static_used.values(), *(u for us in b.query_used.values() for u in us)]:
            assert 0 < used <= budget
        # The retrieval baseline finds each query's rare evidence words; at 600 tokens recency,
        # which keeps only the last turns, has the filler words but not those.
        assert min(b.query[systems.RETRIEVAL]) == 1.0
        if budget == 600:
            assert max(b.query[systems.RECENCY]) < 1.0
        assert b.cost[systems.OURS].calls > 0
    if not api.HAS_RECALL:
        assert systems.OURS_RECALL not in result.budgets[600].query  # reported as n/a


# -- cached prefix ------------------------------------------------------------------------------------


def test_common_prefix_counts_tokens_up_to_the_first_difference() -> None:
    a = [(1, 2, 3), (4, 5), (6,)]
    assert prefix.common_prefix(a, a) == 6
    assert prefix.common_prefix(a, [(1, 2, 3), (4, 9), (6,)]) == 4
    assert prefix.common_prefix(a, [(7,), (4, 5)]) == 0
    assert prefix.common_prefix(a, a[:2]) == 5


def test_prefix_counts_on_a_hand_made_run() -> None:
    r = prefix.PrefixResult(
        "x", 100, 1, tokens=[10, 12, 12, 6], common=[10, 3, 6], event=[False, False, True]
    )
    assert r.shares() == [10 / 12, 3 / 12, 1.0]
    assert r.rewrites(False) == 1 and r.rewrites(True) == 0  # 3/12 kept without an event; 6/12 is half
    assert r.losses_without_event() == 1
    assert r.uncached() == [2, 9, 0]
    # With a recall part at the end of each context, only losses before it count.
    r = prefix.PrefixResult("x", 100, 1, tokens=[10, 12], common=[9], event=[False])
    assert r.losses_without_event() == 1
    r.stable = [8, 10]  # the previous context's last 2 tokens were its recall part
    assert r.losses_without_event() == 0


def test_halve_baseline_rewrites_only_when_it_halves(meeting: Meeting) -> None:
    r = prefix.run_halve(meeting.turns, 600)
    assert r.turns == len(meeting.turns) and len(r.event) == r.turns - 1
    assert r.rewrites(True) == sum(r.event) > 0 and r.rewrites(False) == 0 and r.losses_without_event() == 0


async def test_summarization_prefix_replay_marks_its_summaries_as_events(meeting: Meeting) -> None:
    r = await prefix.run_summarization(meeting.turns, 600)
    assert r.system == systems.SUMMARIZATION and r.turns == len(meeting.turns) and len(r.event) == r.turns - 1
    assert sum(r.event) > 0 and r.over_budget == 0
    # Only its summaries rewrite what it sent before: between two of them it appends.
    assert r.rewrites(False) == 0 and r.losses_without_event() == 0


async def test_ours_prefix_replay_records_every_turn(meeting: Meeting) -> None:
    r = await prefix.run_ours(meeting.turns[:120], 1000, 10, systems.OURS)
    assert r is not None and r.turns == 120 and len(r.event) == 119
    assert all(0.0 <= s <= 1.0 for s in r.shares()) and r.over_budget == 0
    assert sum(r.event) > 0  # topics were sealed and summarised on the way
    on = await prefix.run_ours(meeting.turns[:5], 1000, 10, systems.OURS_RECALL)
    assert (on is None) == (not api.HAS_RECALL)


def test_conversation_turns_run_meetings_back_to_back_on_one_clock(tmp_path: Path) -> None:
    split = tmp_path / "qmsum" / "test"
    split.mkdir(parents=True)
    write_meeting(split, "ES0001a", 30, seed=1)
    write_meeting(split, "ES0001b", 30, seed=2)
    turns = prefix.conversation_turns(tmp_path, "test", 50)
    assert len(turns) == 50 and prefix.meetings_in(turns) == 2
    assert [t.sequence for t in turns] == list(range(1, 51))
    assert all(b.timestamp > a.timestamp for a, b in itertools.pairwise(turns))


def _write_tiage(root: Path, dialogues: int, turns: int) -> None:
    (root / "tiage").mkdir(parents=True)
    data = {
        f"d{d}": [
            [f"dialogue {d} turn {i} about gardens and tomatoes number {d * 7 + i}", "0"]
            for i in range(turns)
        ]
        for d in range(dialogues)
    }
    (root / "tiage" / prefix.CHAT_FILE).write_text(json.dumps(data), encoding="utf-8")


def test_chat_turns_alternate_speakers_in_sessions_a_silence_apart(tmp_path: Path) -> None:
    _write_tiage(tmp_path, 4, 6)
    turns = prefix.chat_turns(tmp_path, 20)
    assert len(turns) == 20 and prefix.sessions_in(turns) == 4
    assert [t.sequence for t in turns] == list(range(1, 21))
    assert [t.role for t in turns[:6]] == ["user", "assistant"] * 3 and turns[6].role == "user"
    assert turns[0].openai() == {"role": "user", "content": turns[0].content}  # no name
    gaps = [b.timestamp - a.timestamp for a, b in itertools.pairwise(turns)]
    # A session's turns are seconds apart; a new session comes hours later (silence seals the topic).
    assert all(g.total_seconds() <= prefix.CHAT_TURN_SECONDS[1] for i, g in enumerate(gaps) if (i + 1) % 6)
    assert all(
        g.total_seconds() >= 3600 * prefix.SESSION_GAP_HOURS[0] for i, g in enumerate(gaps) if not (i + 1) % 6
    )
    assert prefix.chat_turns(tmp_path, 20) == turns  # a fixed seed: the same chat every run


async def test_chat_prefix_replay_seals_sessions_on_silence(tmp_path: Path) -> None:
    _write_tiage(tmp_path, 6, 12)
    r = await prefix.run_ours(prefix.chat_turns(tmp_path, 72), 1000, 10, systems.OURS)
    assert r is not None and r.turns == 72 and r.over_budget == 0
    assert sum(r.event) >= 5  # at least each new session's seal


# -- the command line ---------------------------------------------------------------------------------


def test_quick_run_prints_all_three_sections(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    split = tmp_path / "qmsum" / "test"
    split.mkdir(parents=True)
    for n, name in enumerate(("Bxx001", "ES0001a", "covid_1")):
        write_meeting(split, name, 200, seed=n)
    dump = tmp_path / "run.json"
    argv = ["--data", str(tmp_path), "--quick", "--budgets", "1000", "--prefix-turns", "150", "--jobs", "1"]
    cli.main([*argv, "--json", str(dump)])
    out = capsys.readouterr().out
    for heading in (
        "## Query retention",
        "## Retention, speed and cost against peers",
        "## Cached-prefix share",
    ):
        assert heading in out
    assert "| BM25 retrieval (half newest, half BM25) |" in out
    assert "(1 AMI, 1 ICSI, 1 committee)" in out
    if not api.HAS_RECALL:
        assert "| tiered_history, recall on | n/a |" in out
    rows = json.loads(dump.read_text(encoding="utf-8"))
    assert {r["part"] for r in rows["retention"]} == {"static", "query"}
    assert len([r for r in rows["retention"] if r["system"] == systems.RETRIEVAL]) == 9  # 3 meetings x 3
    assert {p["system"] for p in rows["prefix"]} >= {systems.OURS, prefix.HALVE}


def test_chat_prefix_run_writes_its_own_section(tmp_path: Path) -> None:
    _write_tiage(tmp_path, 8, 10)
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# B\n\n<!-- peers:begin -->\nold\n<!-- peers:end -->\n", encoding="utf-8")
    argv = ["--data", str(tmp_path), "--only", "prefix", "--prefix-data", "chat", "--prefix-turns", "60"]
    cli.main([*argv, "--jobs", "1", "--out", str(doc)])
    text = doc.read_text(encoding="utf-8")
    assert "<!-- retention_prefix_chat:begin -->" in text and "<!-- retention_prefix:begin -->" not in text
    assert "## Cached-prefix share (two-party chat replay" in text and "(6 dialogues)" in text
    assert "old" in text  # the other sections are left as they were


def test_sections_are_written_in_place_and_new_ones_before_the_peers_section(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# B\n\n<!-- peers:begin -->\nold\n<!-- peers:end -->\n\ntail\n", encoding="utf-8")
    cli.write(doc, "retention_query", "## Q")
    cli.write(doc, "peers", "## S")
    cli.write(doc, "retention_query", "## Q2")
    text = doc.read_text(encoding="utf-8")
    assert text.index("## Q2") < text.index("## S") < text.index("tail")
    assert "## Q\n" not in text and "old" not in text


def test_variants_merge_recall_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api, "HAS_RECALL", False)
    assert systems.variant(recall_on=True, recall={"share": 0.4}) is None
    assert systems.variant(recall_on=False, token_threshold=0.5) == {"token_threshold": 0.5}
    monkeypatch.setattr(api, "HAS_RECALL", True)
    assert systems.variant(recall_on=True, recall={"share": 0.4}) == {
        "recall": {"enabled": True, "share": 0.4}
    }
    assert systems.variant(recall_on=False) == {"recall": {"enabled": False}}


def test_chat_facts_plants_facts_in_sessions_and_scores_every_system(tmp_path: Path) -> None:
    from bench import chat_facts

    _write_tiage(tmp_path, 12, 8)
    chat = chat_facts.build_chat(tmp_path, prefix.CHAT_FILE, 1, 90, 4)
    assert len(chat.queries) == 4
    assert [t.role for t in chat.turns[:4]] == ["user", "assistant"] * 2
    for q in chat.queries:
        said = chat.turns[q.turns[0]]
        assert said.role == "user" and q.words and q.words == content_words(said.content)
        assert chat.turns[q.turns[0] + 1].content == "got it , i will keep that in mind ."
    assert chat_facts.build_chat(tmp_path, prefix.CHAT_FILE, 1, 90, 4) == chat  # fixed seed
    doc = tmp_path / "benchmarks.md"
    argv = ["--data", str(tmp_path), "--chats", "1", "--turns", "90", "--facts", "4", "--budgets", "1000"]
    chat_facts.main([*argv, "--jobs", "1", "--out", str(doc)])
    text = doc.read_text(encoding="utf-8")
    assert "<!-- chat_facts:begin -->" in text and "4 planted facts" in text
    assert "`python -m bench.chat_facts --budgets 1000 --turns 90 --facts 4 --chats 1`" in text
    row = next(line for line in text.splitlines() if line.startswith(f"| {systems.OURS_RECALL} |"))
    assert float(row.split("|")[2]) > 50  # asked about, each fact is found
