"""Going back to an earlier topic brings it back: verbatim when it fits, its summary when not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tiered_history import HistoryCompressor

T0 = datetime(2026, 4, 6, 9, 0, tzinfo=UTC)

TOPICS = {
    "cluster": [
        "Let's plan the Kubernetes cluster upgrade from 1.28 to 1.29 for the payments cluster.",
        "We drain node pool blue first, then node pool green, one node at a time.",
        "The Helm charts for ingress-nginx need the new API version before the upgrade.",
        "Etcd gets a snapshot to the S3 bucket backups-payments before anything starts.",
        "Rollback plan: keep the 1.28 node images for a week in case the upgrade fails.",
        "Agreed: the Kubernetes upgrade window is Saturday 02:00 UTC, Priya runs it.",
    ],
    "dinner": [
        "New topic: dinner on Friday. I'd like to cook a mushroom risotto for six people.",
        "Arborio rice, porcini, a good parmesan and a dry white wine for the risotto.",
        "Start the stock early and keep it simmering; stir the rice patiently.",
        "For dessert a lemon tart from the bakery on Rue Cler would be easy.",
        "Tomas is vegetarian, so the stock must be vegetable stock, not chicken.",
        "Shopping list done: rice, porcini, parmesan, wine, lemons, vegetable stock.",
    ],
    "trip": [
        "New topic: the Lisbon trip in May. Flights leave Berlin on May 14.",
        "TAP flight TP 537 lands at 11:40; the hotel is in Alfama near the castle.",
        "Day two is Sintra by train from Rossio station, the Pena palace first.",
        "Book the fado dinner for May 16; the place on Rua de São Miguel is small.",
        "Return flight on May 19 in the evening, so the last day is free until 17:00.",
        "Budget is 1,400 euros per person including the hotel and the flights.",
    ],
    "garden": [
        "New topic: the garden. The tomatoes on the balcony need bigger pots.",
        "Basil keeps bolting; pinch the flowers off and water it in the morning.",
        "The lavender by the door survived the winter and is flowering again now.",
        "Order compost and a trellis for the climbing beans before the weekend.",
        "The neighbour offered cuttings from her fig tree, ready in autumn.",
        "Slugs ate the lettuce again: copper tape around the raised bed this time.",
    ],
}
#: Topics end on "New topic: ..." alone here, so the test knows where each one is.
EXPLICIT_ONLY = {"temporal": False, "size": False, "cohesion": False}
QUESTION = "Back to the Kubernetes cluster upgrade: which node pool do we drain first, blue or green?"


async def conversation(hc: HistoryCompressor, cid: str) -> None:
    minute = 0
    for lines in TOPICS.values():
        for i, line in enumerate(lines):
            role = "user" if i % 2 == 0 else "assistant"
            await hc.add_message(
                cid, {"role": role, "content": line, "timestamp": T0 + timedelta(minutes=minute)}
            )
            minute += 1
    await hc.maintain(cid)
    await hc.add_message(
        cid, {"role": "user", "content": QUESTION, "timestamp": T0 + timedelta(minutes=minute)}
    )


def texts(messages: Any) -> list[str]:
    return [m.content for m in messages]


async def test_the_topic_gone_back_to_comes_back_word_for_word_when_it_fits(db_url: str) -> None:
    async with HistoryCompressor.from_url(db_url, context_budget=1000, boundaries=EXPLICIT_ONLY) as hc:
        await conversation(hc, "c")
        history = await hc.get_history("c")
        cluster = next(t for t in history.topics if t.first_sequence == 1)
        assert cluster.last_sequence == len(TOPICS["cluster"]) and cluster.status != "pending"
        ctx = await hc.get_context("c", max_tokens=1000)
        assert texts(ctx.recalled) == TOPICS["cluster"]  # the whole topic, in order
        assert ctx.total_tokens <= 1000
        # Only the newest message decides: a question about the garden brings nothing of it back.
        await hc.add_message("c", {"role": "user", "content": "And the lavender by the door?"})
        ctx = await hc.get_context("c", max_tokens=1000)
        assert not set(texts(ctx.recalled)) >= set(TOPICS["cluster"])


async def test_a_topic_too_large_for_the_room_comes_back_as_its_summary_or_best_messages() -> None:
    async with HistoryCompressor.from_url("memory://", context_budget=1000, boundaries=EXPLICIT_ONLY) as hc:
        await conversation(hc, "c")
        ctx = await hc.get_context("c", max_tokens=300)
        recalled = set(texts(ctx.recalled))
        assert not recalled >= set(TOPICS["cluster"])  # not all of it: it does not fit
        summaries = [s for s in ctx.recalled_summaries + ctx.historical_topics if s.first_sequence == 1]
        assert summaries or recalled & set(TOPICS["cluster"])
        assert ctx.total_tokens <= 300


async def test_a_topic_brought_back_keeps_its_tool_calls_with_their_results() -> None:
    async with HistoryCompressor.from_url("memory://", context_budget=1000, boundaries=EXPLICIT_ONLY) as hc:
        call = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "k1",
                    "type": "function",
                    "function": {"name": "kubectl", "arguments": '{"get": "node pools"}'},
                }
            ],
            "timestamp": T0,
        }
        result = {"role": "tool", "tool_call_id": "k1", "content": "node pool blue: 6 nodes", "timestamp": T0}
        await hc.add_messages("c", [call, result])
        await conversation(hc, "c")
        ctx = await hc.get_context("c", max_tokens=1000)
        sent = ctx.to_messages()
        assert set(TOPICS["cluster"]) <= set(texts(ctx.recalled))  # the topic came back
        assert [m.role for m in ctx.recalled[:2]] == ["assistant", "tool"]  # with its tool unit
        i = next(k for k, m in enumerate(sent) if m.get("tool_calls"))
        assert sent[i + 1] == {"role": "tool", "tool_call_id": "k1", "content": "node pool blue: 6 nodes"}
        assert ctx.total_tokens <= 1000


async def test_a_topic_older_than_the_recent_messages_read_comes_back_too(db_url: str) -> None:
    """The cluster topic lies further back than the messages a 1k read takes in (its budget and a
    quarter): it is read from the store."""
    async with HistoryCompressor.from_url(db_url, context_budget=8000, boundaries=EXPLICIT_ONLY) as hc:
        lines = list(TOPICS["cluster"])
        for k in range(10):
            lines += [f"New topic: errand {k}. The bakery order {k} is sourdough and rye for Thursday."]
            lines += [
                f"Errand {k} detail {i}: the florist delivers tulips and lilies at {i} o'clock."
                for i in range(5)
            ]
        for i, line in enumerate(lines):
            role = "user" if i % 2 == 0 else "assistant"
            await hc.add_message("c", {"role": role, "content": line, "timestamp": T0 + timedelta(minutes=i)})
        await hc.maintain("c")
        await hc.add_message("c", {"role": "user", "content": QUESTION})
        ctx = await hc.get_context("c", max_tokens=1000)
        assert texts(ctx.recalled) == TOPICS["cluster"]
        assert ctx.total_tokens <= 1000
