"""core.excerpt: a long text cut to its sentences that best match a query (pure)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tiered_history.core.excerpt import ELLIPSIS, joined, matching_sentences, sentences, spans
from tiered_history.core.ranking import words
from tiered_history.tokens import TokenCounter

COUNTER = TokenCounter()


def cost(text: str) -> int:
    return COUNTER.message_tokens({"role": "assistant", "content": text})


def test_sentences_split_on_ends_lines_and_unspaced_scripts() -> None:
    assert sentences("One. Two? Three!\nFour\n\n  Five.") == ["One.", "Two?", "Three!", "Four", "Five."]
    assert sentences("東京に行きます。明日です！") == ["東京に行きます。", "明日です！"]
    assert sentences("v3.14 is out") == ["v3.14 is out"]  # a dot inside a word ends nothing


def test_joined_marks_every_omission_and_keeps_a_runs_own_text() -> None:
    text = "a.  b.\nc. d."
    where = spans(text)
    assert [text[x:y] for x, y in where] == ["a.", "b.", "c.", "d."]
    assert joined(text, where, [0, 1, 2, 3]) == text
    assert joined(text, where, [1, 3]) == f"{ELLIPSIS} b. {ELLIPSIS} d."
    assert joined(text, where, [0, 2]) == f"a. {ELLIPSIS} c. {ELLIPSIS}"
    assert joined(text, where, [1, 2]) == f"{ELLIPSIS} b.\nc. {ELLIPSIS}"


def test_the_best_matching_sentences_in_their_order_within_room() -> None:
    text = " ".join(f"Filler sentence {k} about nothing." for k in range(40))
    text += " The vault code is 7781. " + " ".join(f"More filler {k} here." for k in range(40))
    text += " Change the vault code monthly."
    terms = frozenset({"vault", "code"})
    found = matching_sentences(text, terms, cost, 40, cost(text) / len(text))
    assert found is not None
    shown, n = found
    assert n == cost(shown) <= 40
    assert shown == f"{ELLIPSIS} The vault code is 7781. {ELLIPSIS} Change the vault code monthly."
    assert matching_sentences(text, frozenset({"zebra"}), cost, 40, 0.3) is None
    assert matching_sentences("One sentence with vault.", terms, cost, 40, 0.3) is None
    assert matching_sentences(text, terms, cost, 5, 0.3) is None  # not even one sentence fits
    # Every sentence fits (the text has spaces at its ends the room did not): still an excerpt.
    short = "  The vault is shut. The code is 7781.  \n\n"
    found = matching_sentences(short, terms, cost, cost(short.strip()), 0.01)
    assert found is not None and ELLIPSIS in found[0]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(["alpha", "beta", "gamma", "delta", "x.", "why?", "駅。", "\n", "3.14"]), max_size=80
    ),
    st.sets(st.sampled_from(["alpha", "beta", "gamma", "駅"]), max_size=3),
    st.integers(0, 120),
    st.floats(0.05, 2.0),
)
def test_property_an_excerpt_fits_and_shows_only_matching_sentences_in_order(
    tokens: list[str], query: set[str], room: int, per_char: float
) -> None:
    text = " ".join(tokens)
    found = matching_sentences(text, frozenset(query), cost, room, per_char)
    if found is None:
        return
    shown, n = found
    assert n == cost(shown) <= room and ELLIPSIS in shown
    parts = sentences(text)
    pieces = [p.strip() for p in shown.split(ELLIPSIS) if p.strip()]
    at = 0
    for piece in pieces:
        at = text.index(piece, at) + len(piece)  # the text's own words, in order
        for s in sentences(piece):
            assert s in parts and set(words(s)) & query
