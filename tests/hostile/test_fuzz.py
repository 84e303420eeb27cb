"""A standing fuzz of the public surface (issue 17): hostile and careless input of every shape.

For ``add_message``, ``add_messages``, ``search``, ``get_context`` and the CLI's ``add`` and
``import``, over arbitrary JSON, unicode (zero-width, right-to-left, lone surrogates, NUL), huge
and empty values and delimiter-like strings, every call ends in one of two ways: success, or a
documented :mod:`tiered_history.errors` exception. Never a raw exception, never a partial write
(rows are counted before and after), never a context over its budget.

Profiles: ``ci`` (the default, well under a minute) and ``nightly`` (many more examples), chosen
with ``TIERED_HISTORY_TEST_FUZZ=nightly`` (see docs/operations.md).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tiered_history import SyncHistoryCompressor, TieredHistoryError
from tiered_history.cli import app
from tiered_history.errors import ConversationNotFoundError, InvalidConversationIdError
from tiered_history.tokens import TokenCounter

from .strategies import FRAMING, delimiter_like, hostile_text, json_values

PROFILE = os.environ.get("TIERED_HISTORY_TEST_FUZZ", "ci")
if PROFILE not in ("ci", "nightly"):
    raise ValueError(f"TIERED_HISTORY_TEST_FUZZ must be ci or nightly, not {PROFILE!r}")
NIGHTLY = PROFILE == "nightly"
_COMMON: dict[str, Any] = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    "database": None,
}


def fuzz(ci: int) -> settings:
    """The settings of one fuzz test: ``ci`` examples in CI, 50 times as many at night."""
    return settings(max_examples=ci * 50 if NIGHTLY else ci, **_COMMON)


MAX_CONTENT = 2000  # max_content_chars for these tests: "huge" values stay cheap to make
ids = itertools.count()
runner = CliRunner()


def new_cid() -> str:
    return f"fz-{next(ids)}"


# -- strategies ----------------------------------------------------------------------------------

ROLES = ["system", "developer", "user", "assistant", "tool", "function", "System", "", "wizard"]
texts = st.one_of(
    hostile_text(),
    st.sampled_from(FRAMING),
    delimiter_like(),
    st.sampled_from([0, 1, MAX_CONTENT - 1, MAX_CONTENT, MAX_CONTENT + 1, 40_000]).map(lambda n: "x" * n),
    st.builds(
        lambda a, n: a * n,
        st.sampled_from(["\u200b", "\u202e", "<summary>", "héllo ", "\U0001f600"]),
        st.integers(1, 600),
    ),
)
names = st.one_of(
    st.none(), st.sampled_from(["bob", "System", "bob\n", "a" * 64, "a" * 65, "", "b-o_b"]), hostile_text(20)
)
call_ids = st.one_of(st.sampled_from(["call_1", "call_2", "", " ", "x" * 256]), hostile_text(20))
tool_calls = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {
                "id": call_ids,
                "type": st.sampled_from(["function", "custom", "weird"]),
                "function": st.fixed_dictionaries(
                    {"name": texts, "arguments": st.one_of(texts, json_values())}
                ),
            }
        ),
        json_values(4),
    ),
    max_size=3,
)
parts = st.lists(
    st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
        st.fixed_dictionaries(
            {"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": texts})}
        ),
        st.dictionaries(hostile_text(8), json_values(4), max_size=3),
        json_values(3),
    ),
    max_size=3,
)
timestamps = st.one_of(
    st.none(),
    st.sampled_from(
        [
            "2026-01-01T00:00:00Z",
            "9999-12-31T23:59:59-05:00",
            "9999-12-31T23:59:59+00:00",
            "0001-01-01T00:00:00+01:00",
            "2026-01-01T00:00:00",
            "soon",
            "",
        ]
    ),
    st.integers(-(2**63), 2**63),
    st.floats(),
    json_values(3),
)


@st.composite
def chat_message(draw: st.DrawFn) -> Any:
    """A message close enough to valid to get past the first checks, with one or more hostile parts."""
    out: dict[str, Any] = {"role": draw(st.sampled_from(ROLES))}
    content = draw(st.one_of(texts, parts, st.none(), json_values(3)))
    if draw(st.integers(0, 9)):
        out["content"] = content
    optional = {
        "name": names,
        "tool_calls": st.one_of(tool_calls, json_values(3)),
        "tool_call_id": call_ids,
        "pinned": st.one_of(st.booleans(), json_values(2)),
        "timestamp": timestamps,
        "metadata": st.one_of(st.dictionaries(hostile_text(12), json_values(6), max_size=4), json_values(4)),
        "refusal": texts,
        "reasoning_content": texts,
    }
    for key, strategy in optional.items():
        if draw(st.integers(0, 4)) == 0:
            out[key] = draw(strategy)
    if draw(st.integers(0, 6)) == 0:
        out[draw(hostile_text(10))] = draw(json_values(3))
    return out


messages = st.one_of(chat_message(), chat_message(), chat_message(), json_values(4), st.builds(object))


# -- the library ---------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["memory", "sqlite"])
def hc(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SyncHistoryCompressor]:
    url = (
        "memory://" if request.param == "memory" else f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'f.db'}"
    )
    with SyncHistoryCompressor(
        url, max_content_chars=MAX_CONTENT, boundaries={"temporal": False}
    ) as compressor:
        yield compressor


def rows(hc: SyncHistoryCompressor, cid: str) -> int:
    """How many messages ``cid`` holds (0 when it does not exist or cannot)."""
    try:
        return len(hc.get_messages(cid))
    except (ConversationNotFoundError, InvalidConversationIdError):
        return 0


def seeded(hc: SyncHistoryCompressor) -> str:
    """A conversation with a little history, including an open tool call."""
    cid = new_cid()
    hc.add_messages(
        cid,
        [
            {"role": "user", "content": "hello, look up order 42"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
                ],
            },
        ],
    )
    return cid


@fuzz(20)
@given(message=messages)
def test_add_message_succeeds_or_fails_cleanly(hc: SyncHistoryCompressor, message: Any) -> None:
    cid = seeded(hc)
    before = rows(hc, cid)
    try:
        hc.add_message(cid, message)
    except TieredHistoryError:
        assert rows(hc, cid) == before
    else:
        assert rows(hc, cid) == before + 1


@fuzz(15)
@given(batch=st.one_of(st.lists(messages, max_size=5), json_values(3)), fresh=st.booleans())
def test_add_messages_is_all_or_nothing(hc: SyncHistoryCompressor, batch: Any, fresh: bool) -> None:
    cid = new_cid() if fresh else seeded(hc)
    before = rows(hc, cid)
    try:
        stored = hc.add_messages(cid, batch)
    except TieredHistoryError:
        assert rows(hc, cid) == before
    else:
        assert rows(hc, cid) == before + len(stored) == before + len(batch)


@fuzz(20)
@given(cid=st.one_of(hostile_text(300), json_values(2)), message=chat_message())
def test_hostile_conversation_ids(hc: SyncHistoryCompressor, cid: Any, message: Any) -> None:
    try:
        before = rows(hc, cid)
    except TieredHistoryError:
        before = 0
    try:
        hc.add_message(cid, message)
    except TieredHistoryError:
        with contextlib.suppress(TieredHistoryError):
            assert rows(hc, cid) == before
    else:
        assert rows(hc, cid) >= 1


@fuzz(30)
@given(
    text=st.one_of(texts, json_values(2)),
    limit=st.one_of(st.integers(-3, 3000), st.sampled_from(["3", 2.5, None, True, 10**30])),
)
def test_search_returns_hits_or_a_library_error(hc: SyncHistoryCompressor, text: Any, limit: Any) -> None:
    cid = seeded(hc)
    hc.add_message(cid, {"role": "tool", "tool_call_id": "call_1", "content": "found order 42, hi there"})
    try:
        hits = hc.search(cid, text, limit=limit)
    except TieredHistoryError:
        return
    assert isinstance(limit, int) and len(hits) + 1 > 0 and len(hits) <= limit


@fuzz(20)
@given(
    history=st.lists(chat_message(), max_size=8),
    max_tokens=st.one_of(st.integers(-5, 6000), st.sampled_from([None, "100", 1.5, True, 10**12])),
    query=st.one_of(st.none(), texts, json_values(2)),
)
def test_get_context_stays_within_budget(
    hc: SyncHistoryCompressor, history: list[Any], max_tokens: Any, query: Any
) -> None:
    cid = seeded(hc)
    hc.add_message(cid, {"role": "tool", "tool_call_id": "call_1", "content": "order 42: shipped"})
    for m in history:
        with contextlib.suppress(TieredHistoryError):
            hc.add_message(cid, m)
    try:
        ctx = hc.get_context(cid, max_tokens, query=query)
    except TieredHistoryError:
        return
    budget = max_tokens if max_tokens is not None else hc.settings.context_budget
    assert ctx.total_tokens <= budget
    sent = ctx.to_messages()
    json.dumps(sent)  # strict JSON: what a provider SDK will send
    assert TokenCounter(hc.settings.model).messages_tokens(sent) <= budget


# -- the CLI -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cli_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('fuzz-cli') / 'cli.db'}"


def stored_count(db: str) -> int:
    with SyncHistoryCompressor(db) as hc:
        return sum(s.messages for s in hc.stats())


def assert_clean_exit(result: Any) -> None:
    assert result.exit_code in (0, 1, 2), (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    if result.exit_code == 1:
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)


@fuzz(15)
@given(
    cid=st.one_of(st.just("c"), hostile_text(40)),
    content=texts,
    role=st.sampled_from(["user", "assistant", "system", "tool", "nobody"]),
    name=st.one_of(st.none(), hostile_text(20)),
)
def test_cli_add(cli_db: str, cid: str, content: str, role: str, name: str | None) -> None:
    before = stored_count(cli_db)
    args = ["--database-url", cli_db, "add", cid, "--role", role, "--content", content]
    if name is not None:
        args += ["--name", name]
    result = runner.invoke(app, args)
    assert_clean_exit(result)
    assert stored_count(cli_db) == before + (result.exit_code == 0)


file_bodies = st.one_of(
    json_values(6).map(json.dumps),
    st.lists(chat_message(), max_size=4).map(lambda ms: json.dumps(ms, default=str)),
    st.lists(
        st.builds(
            lambda m, c: {**m, "conversation_id": c} if isinstance(m, dict) else m,
            chat_message(),
            st.sampled_from(["a", "b", ""]),
        ),
        max_size=5,
    ).map(lambda ms: "\n".join(json.dumps(m, default=str) for m in ms)),
    hostile_text(300),
)


@fuzz(15)
@given(body=file_bodies, conversation=st.one_of(st.none(), st.just("imp"), hostile_text(20)))
def test_cli_import(
    cli_db: str, tmp_path_factory: pytest.TempPathFactory, body: str, conversation: str | None
) -> None:
    path = tmp_path_factory.mktemp("import") / "in.jsonl"
    path.write_bytes(body.encode("utf-8", "surrogatepass"))
    before = stored_count(cli_db)
    args = ["--database-url", cli_db, "import", str(path)]
    if conversation is not None:
        args += ["--conversation", conversation]
    result = runner.invoke(app, args)
    assert_clean_exit(result)
    if result.exit_code != 0:
        assert stored_count(cli_db) == before
