"""Adapters for pydantic-ai and LangChain (issue 16, item 3), against the real packages, offline.

Each test drives a real agent or chain whose model is a local fake that records what it received
(pydantic-ai's ``FunctionModel``, a LangChain fake chat model), and compares that with what the
compressor says the context is at that moment.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnablePassthrough
from langchain_core.runnables.history import RunnableWithMessageHistory
from pydantic import Field
from pydantic_ai import Agent
from pydantic_ai.messages import (
    BinaryContent,
    DocumentUrl,
    ImageUrl,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from tiered_history import HistoryCompressor, SyncHistoryCompressor
from tiered_history.integrations import _common
from tiered_history.integrations import langchain as lc
from tiered_history.integrations import pydantic_ai as pai
from tiered_history.tokens import TokenCounter

from .conftest import database_url

SYSTEM = "You are a helpful travel bot."
BUDGET = 900
SUBJECTS = ["Lisbon", "Kyoto", "Oslo", "Lima", "Cairo", "Hanoi", "Quito", "Perth"]
Compressor = HistoryCompressor | SyncHistoryCompressor


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    with database_url(request.param, tmp_path) as u:
        yield u


def compressor(url: str, blocking: bool) -> Compressor:
    cls = SyncHistoryCompressor if blocking else HistoryCompressor
    return cls.from_url(url, summarize_inline=True)


async def close(hc: Compressor) -> None:
    if isinstance(hc, HistoryCompressor):
        await hc.close()
    else:
        hc.close()


async def context(hc: Compressor, cid: str, budget: int = BUDGET) -> Any:
    if isinstance(hc, HistoryCompressor):
        return await hc.get_context(cid, budget)
    return hc.get_context(cid, budget)


async def history(hc: Compressor, cid: str) -> Any:
    return await hc.get_history(cid) if isinstance(hc, HistoryCompressor) else hc.get_history(cid)


def prompt_for(subject: str) -> str:
    days = (
        f"On day {d} in {subject} I would like to see sight {d} and taste dish {d}." for d in range(1, 13)
    )
    return f"New topic: let's plan a trip to {subject}. " + " ".join(days)


def answer_for(text: str) -> str:
    return "Here is a plan: " + " ".join(text.split()[:40])


def plain(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI dicts without the adapter metadata (which add_message keeps off the wire)."""
    return [{k: v for k, v in m.items() if k != "metadata"} for m in messages]


# -- pydantic-ai ---------------------------------------------------------------------------------


def joined_responses(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` as pydantic-ai's OpenAI mapping sends them: consecutive assistant turns (a
    recalled answer, then the recalled tool call) become one, texts joined by a blank line."""
    out: list[dict[str, Any]] = []
    for m in messages:
        prev = out[-1] if out else None
        if prev is not None and prev["role"] == m["role"] == "assistant":
            texts = [t for t in (prev.get("content"), m.get("content")) if t]
            merged = {**prev, "content": "\n\n".join(texts) if texts else None}
            calls = [*(prev.get("tool_calls") or []), *(m.get("tool_calls") or [])]
            if calls:
                merged["tool_calls"] = calls
            out[-1] = merged
        else:
            out.append(m)
    return out


class Recorder:
    """A FunctionModel body: records each request beside the compressor's context at that moment,
    calls the weather tool when asked about the weather, answers otherwise."""

    def __init__(self, hc: Compressor, cid: str) -> None:
        self.hc, self.cid = hc, cid
        self.calls: list[tuple[list[ModelMessage], Any, AgentInfo]] = []

    async def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.calls.append((list(messages), await context(self.hc, self.cid), info))
        last = messages[-1]
        prompts = [p for p in last.parts if isinstance(p, UserPromptPart)]
        if prompts and "weather" in str(prompts[-1].content):
            n = len(self.calls)
            weather = ToolCallPart("get_weather", {"city": "Oslo"}, tool_call_id=f"call_{n}_w")
            visit = ToolCallPart("log_visit", {"city": "Oslo"}, tool_call_id=f"call_{n}_v")
            return ModelResponse(parts=[TextPart("Let me check."), weather, visit])
        user = next((str(p.content) for p in reversed(prompts)), "the tool result")
        return ModelResponse(parts=[TextPart(answer_for(user))])


def weather_agent(hc: Compressor, recorder: Recorder, system: str = SYSTEM) -> Agent[None, str]:
    agent = Agent(
        FunctionModel(recorder),
        system_prompt=system,
        instructions="Answer in one paragraph.",
        capabilities=[pai.TieredHistory(hc, max_tokens=BUDGET)],
    )

    @agent.tool_plain
    def get_weather(city: str) -> str:
        return f"Sunny in {city}, 21 C."

    @agent.tool_plain
    def log_visit(city: str) -> None:  # returns nothing: an empty tool result
        return None

    return agent


def assert_pairs_intact(messages: list[ModelMessage]) -> None:
    """Every tool result follows the response that made its call, and every call is answered."""
    calls: dict[str, int] = {}
    returns: dict[str, int] = {}
    for i, message in enumerate(messages):
        for part in message.parts:
            if isinstance(part, ToolCallPart):
                calls[part.tool_call_id] = i
            elif isinstance(part, ToolReturnPart):
                returns[part.tool_call_id] = i
    assert set(calls) == set(returns)
    assert all(returns[k] == calls[k] + 1 for k in calls)


@pytest.mark.parametrize("blocking", [False, True], ids=["async", "sync"])
async def test_pydantic_ai_model_gets_the_compressed_context(url: str, blocking: bool) -> None:
    hc = compressor(url, blocking)
    recorder = Recorder(hc, "trip")
    agent = weather_agent(hc, recorder)
    try:
        for subject in SUBJECTS:
            await agent.run(prompt_for(subject), conversation_id="trip")
            await agent.run(f"What's the weather in {subject}?", conversation_id="trip")
        newest = "And what should I pack for Perth?"
        result = await agent.run(newest, conversation_id="trip")

        counter = TokenCounter()
        summaries_seen = empty_results_seen = 0
        for sent, ctx, info in recorder.calls:
            # What the model got is exactly the compressor's context at that moment, within budget.
            assert plain(pai.to_openai(sent)) == joined_responses(plain(ctx.to_messages()))
            assert ctx.total_tokens == counter.messages_tokens(ctx.to_messages()) <= BUDGET
            assert info.instructions == "Answer in one paragraph."  # still sent beside the history
            first = sent[0]
            systems = [p for m in sent for p in m.parts if isinstance(p, SystemPromptPart)]
            assert isinstance(first, ModelRequest) and first.parts[0] is systems[0]
            assert [p.content for p in systems] == [SYSTEM]
            assert_pairs_intact(sent[:-1] if isinstance(sent[-1], ModelResponse) else sent)
            rendered = {ctx.blocks[t] for t in ("bulk", "topic") if ctx.blocks.get(t)}
            texts = [p.content for m in sent for p in m.parts if isinstance(p, UserPromptPart)]
            assert rendered <= set(texts)  # summaries arrive as user-prompt text
            summaries_seen += bool(rendered)
            visits = [
                p
                for m in sent
                for p in m.parts
                if isinstance(p, ToolReturnPart) and p.tool_name == "log_visit"
            ]
            assert all(p.content == "" for p in visits)  # stored as "(no output)", given back empty
            empty_results_seen += len(visits)
        assert summaries_seen > 0, "the conversation never outgrew the budget"
        assert empty_results_seen > 0

        sent, ctx, _ = recorder.calls[-1]
        assert ctx.historical_topics or ctx.bulk_archives
        last = sent[-1]
        assert isinstance(last, ModelRequest) and last.parts[-1].content == newest  # type: ignore[union-attr]
        assert result.output == answer_for(newest)

        # Every message of every run was stored once, the final answers included; the tool that
        # returned None is no exception.
        stored = (await history(hc, "trip")).messages
        assert [m.role for m in stored].count("system") == 1
        assert sum(m.role == "user" for m in stored) == 2 * len(SUBJECTS) + 1
        assert sum(m.role == "tool" for m in stored) == 2 * len(SUBJECTS)
        assert sum(m.content == _common.EMPTY_TOOL_RESULT for m in stored) == len(SUBJECTS)
        assert stored[-1].role == "assistant" and stored[-1].content == answer_for(newest)
        after = await context(hc, "trip")
        assert plain(after.to_messages())[-1] == {"role": "assistant", "content": answer_for(newest)}
    finally:
        await close(hc)


async def test_pydantic_ai_restart_continues_the_conversation(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bot.db'}"
    said: list[str] = []
    for start in range(3):
        hc = HistoryCompressor.from_url(url, summarize_inline=True)
        recorder = Recorder(hc, "chat")
        agent = weather_agent(hc, recorder)
        said.append(f"Hello again, this is start {start}.")
        await agent.run(said[-1], conversation_id="chat")
        sent = recorder.calls[-1][0]
        prompts = [p.content for m in sent for p in m.parts if isinstance(p, UserPromptPart)]
        assert prompts == said  # the earlier starts' turns are there, in order
        answers = [p.content for m in sent for p in m.parts if isinstance(p, TextPart)]
        assert answers == [answer_for(s) for s in said[:-1]]
        assert [p.content for m in sent for p in m.parts if isinstance(p, SystemPromptPart)] == [SYSTEM]
        await hc.close()
    async with HistoryCompressor.from_url(url) as hc:
        stored = (await hc.get_history("chat")).messages
        assert [(m.role, m.pinned) for m in stored if m.role == "system"] == [("system", True)]
        # Editing the prompt replaces the pinned one: the model sees only the new text.
        recorder = Recorder(hc, "chat")
        await weather_agent(hc, recorder, system="You are a terse bot.").run(
            "Still there?", conversation_id="chat"
        )
        systems = [
            p.content for m in recorder.calls[-1][0] for p in m.parts if isinstance(p, SystemPromptPart)
        ]
        assert systems == ["You are a terse bot."]


async def test_pydantic_ai_message_history_passed_back_is_not_stored_twice() -> None:
    async with HistoryCompressor.from_url("memory://") as hc:
        recorder = Recorder(hc, "c")
        agent = weather_agent(hc, recorder)
        first = await agent.run("What's the weather in Oslo?", conversation_id="c")
        second = await agent.run("Thanks!", conversation_id="c", message_history=first.all_messages())
        await agent.run("Bye.", message_history=second.all_messages())  # conversation id inherited
        stored = (await hc.get_history("c")).messages
        first_run = ["system", "user", "assistant", "tool", "tool", "assistant"]
        assert [m.role for m in stored] == [*first_run, "user", "assistant", "user", "assistant"]
        assert all(m.metadata.get(pai.MARK) for m in second.all_messages())


async def test_pydantic_ai_conversation_id_from_the_capability_or_a_function() -> None:
    async with HistoryCompressor.from_url("memory://") as hc:
        model = FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart("ok")]))
        fixed = Agent(model, capabilities=[pai.TieredHistory(hc, "fixed")])
        await fixed.run("one")
        await fixed.run("two")
        by_deps = Agent(
            model, deps_type=str, capabilities=[pai.TieredHistory(hc, lambda ctx: f"user:{ctx.deps}")]
        )
        await by_deps.run("hi", deps="ann")
        assert [m.content for m in (await hc.get_history("fixed")).messages] == ["one", "ok", "two", "ok"]
        assert [m.content for m in (await hc.get_history("user:ann")).messages] == ["hi", "ok"]
        with pytest.raises(TypeError, match="HistoryCompressor"):
            pai.TieredHistory(object())  # type: ignore[arg-type]


def test_pydantic_ai_run_sync_and_streaming_store_the_answer(tmp_path: Path) -> None:
    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart("plain")])

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> Any:
        yield "streamed "
        yield "answer"

    async def streamed_run(agent: Agent[None, str]) -> str:
        async with agent.run_stream("two") as run:
            return await run.get_output()

    with SyncHistoryCompressor.from_url(f"sqlite:///{tmp_path / 's.db'}") as hc:
        model = FunctionModel(answer, stream_function=stream)
        agent = Agent(model, system_prompt="Be brief.", capabilities=[pai.TieredHistory(hc, "s")])
        assert agent.run_sync("one").output == "plain"
        assert asyncio.run(streamed_run(agent)) == "streamed answer"
        assert [(m.role, m.content) for m in hc.get_history("s").messages] == [
            ("system", "Be brief."),
            ("user", "one"),
            ("assistant", "plain"),
            ("user", "two"),
            ("assistant", "streamed answer"),
        ]


async def test_pydantic_ai_streamed_output_tool_answer_stays_in_the_history() -> None:
    # run_stream adds the output tool's return after the run ends: stored without it, the final
    # call stood unanswered and was never sent again (the answer gone from every later context).
    from pydantic import BaseModel
    from pydantic_ai.models.function import DeltaToolCall

    class Report(BaseModel):
        summary: str

    seen: list[list[ModelMessage]] = []

    def plain(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(messages)
        return ModelResponse(parts=[ToolCallPart("final_result", {"summary": "short"}, tool_call_id="p1")])

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> Any:
        seen.append(messages)
        # A function tool called beside the output tool: not run once the output is final.
        yield {0: DeltaToolCall(name="weather", json_args='{"city": "Lisbon"}', tool_call_id="t1")}
        yield {1: DeltaToolCall(name="final_result", json_args='{"summary": "Lisbon"}', tool_call_id="f1")}

    async with HistoryCompressor.from_url("memory://") as hc:
        model = FunctionModel(plain, stream_function=stream)
        agent = Agent(model, output_type=Report, capabilities=[pai.TieredHistory(hc, "s")])

        @agent.tool_plain
        def weather(city: str) -> str:
            return "sunny"

        async with agent.run_stream("Plan a trip to Lisbon.") as run:
            assert (await run.get_output()).summary == "Lisbon"
        await agent.run("How long was it?")
        sent = pai.to_openai(seen[-1])
        assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool", "user"]
        assert [c["id"] for c in sent[1]["tool_calls"]] == ["t1", "f1"]
        assert [m["tool_call_id"] for m in sent[2:4]] == ["t1", "f1"]


async def _run_a_tool_returning(
    hc: HistoryCompressor, conversation_id: str, returned: BinaryContent
) -> tuple[str, list[list[ModelMessage]]]:
    """A run whose model calls a tool that returns ``returned``, then answers: its output, and the
    messages the model got at each request."""
    seen: list[list[ModelMessage]] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(messages)
        if len(seen) == 1:
            return ModelResponse(parts=[ToolCallPart("fetch", {}, tool_call_id="c1")])
        return ModelResponse(parts=[TextPart("got it")])

    agent = Agent(FunctionModel(model), capabilities=[pai.TieredHistory(hc, conversation_id)])

    @agent.tool_plain
    def fetch() -> BinaryContent:
        return returned

    return (await agent.run("Fetch it and describe it.")).output, seen


async def test_pydantic_ai_an_image_a_tool_returns_reaches_the_model() -> None:
    # pydantic-ai sends a tool's file as "See file <id>." in the result and the file in a user
    # message after it; it used to be stored as the result's text alone, without the image.
    png = BinaryContent(data=b"\x89PNG\r\n\x1a\n" + b"0" * 32, media_type="image/png")
    async with HistoryCompressor.from_url("memory://") as hc:
        _, seen = await _run_a_tool_returning(hc, "img", png)
        images = [
            item
            for m in seen[1]
            for p in m.parts
            if isinstance(p, UserPromptPart) and not isinstance(p.content, str)
            for item in p.content
            if isinstance(item, BinaryContent)
        ]
        assert [i.data for i in images] == [png.data]
        stored = [(m.role, m.content) for m in (await hc.get_history("img")).messages]
        assert stored[2] == ("tool", f"See file {png.identifier}.")
        assert stored[3][0] == "user" and "[image]" in stored[3][1]


async def test_pydantic_ai_audio_of_a_format_pydantic_ai_cannot_name_is_kept_as_a_file() -> None:
    clip = BinaryContent(data=b"\x1aE\xdf\xa3" + b"0" * 32, media_type="audio/webm")
    async with HistoryCompressor.from_url("memory://") as hc:
        output, _ = await _run_a_tool_returning(hc, "audio", clip)
        assert output == "got it"  # storing it never fails the run
        [files] = [m for m in (await hc.get_history("audio")).messages if m.role == "user"][1:]
        assert files.to_openai()["content"][1] == {"type": "file", "file": {"file_data": clip.data_uri}}


async def test_pydantic_ai_request_only_parts_are_sent_not_stored() -> None:
    from pydantic_ai import RunContext
    from pydantic_ai.usage import RunUsage

    async with HistoryCompressor.from_url("memory://") as hc:
        history = pai.TieredHistory(hc)
        model = FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart("ok")]))
        ctx = RunContext(deps=None, model=model, usage=RunUsage(), conversation_id="n")
        nudge = SystemPromptPart("Answer now.", scope="request")
        request = ModelRequest(parts=[UserPromptPart("hi"), nudge], instructions="Be brief.", run_id="r1")
        out = await history.process(ctx, [request])
        assert [type(p) for p in out[-1].parts] == [UserPromptPart, SystemPromptPart]
        assert out[-1].parts[-1] is nudge
        assert (out[-1].instructions, out[-1].run_id) == ("Be brief.", "r1")  # type: ignore[union-attr]
        assert [(m.role, m.content) for m in (await hc.get_history("n")).messages] == [("user", "hi")]


async def test_pydantic_ai_history_processor_alone() -> None:
    from pydantic_ai.capabilities import ProcessHistory

    async with HistoryCompressor.from_url("memory://") as hc:
        seen: list[list[ModelMessage]] = []

        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            seen.append(messages)
            return ModelResponse(parts=[TextPart("ok")])

        history = pai.TieredHistory(hc, "p")
        agent = Agent(FunctionModel(model), capabilities=[ProcessHistory(history.process)])
        first = await agent.run("one")
        await agent.run("two", message_history=first.all_messages())
        assert plain(pai.to_openai(seen[-1])) == [
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "two"},
        ]


def _sample_pydantic_messages() -> list[ModelMessage]:
    png = BinaryContent(data=b"\x89PNG\r\n\x1a\n0000", media_type="image/png")
    wav = BinaryContent(data=b"RIFF0000WAVE", media_type="audio/wav")
    return [
        ModelRequest(parts=[SystemPromptPart("Be kind."), UserPromptPart("Hi")]),
        ModelResponse(
            parts=[ThinkingPart("greet", signature="sig-1", provider_name="anthropic"), TextPart("Hello")]
        ),
        ModelRequest(
            parts=[
                UserPromptPart(
                    [
                        "Look:",
                        ImageUrl(url="https://example.com/a.png"),
                        png,
                        wav,
                        DocumentUrl(url="https://x/d.pdf"),
                    ]
                )
            ]
        ),
        ModelResponse(
            parts=[
                ToolCallPart("describe", {"n": 1}, tool_call_id="call_a"),
                ToolCallPart("log_visit", '{"city": "Oslo"}', tool_call_id="call_b"),
            ],
            provider_name="anthropic",
        ),
        ModelRequest(
            parts=[
                ToolReturnPart("describe", {"kind": "cat"}, tool_call_id="call_a"),
                ToolReturnPart("log_visit", None, tool_call_id="call_b"),
            ]
        ),
        ModelResponse(parts=[TextPart("A cat.")]),
    ]


def test_pydantic_ai_converters_round_trip() -> None:
    original = _sample_pydantic_messages()
    dicts = pai.to_openai(original)
    assert plain(dicts) == [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": "Hello",
            "reasoning_content": "greet",
            "thinking_blocks": [{"type": "thinking", "thinking": "greet", "signature": "sig-1"}],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgowMDAw"}},
                {"type": "input_audio", "input_audio": {"data": "UklGRjAwMDBXQVZF", "format": "wav"}},
                {"type": "document_url", "document_url": {"url": "https://x/d.pdf"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "describe", "arguments": '{"n":1}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "log_visit", "arguments": '{"city": "Oslo"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": '{"kind":"cat"}'},
        {"role": "tool", "tool_call_id": "call_b", "content": _common.EMPTY_TOOL_RESULT},
        {"role": "assistant", "content": "A cat."},
    ]
    back = pai.from_openai(dicts)
    assert [type(m) for m in back] == [
        ModelRequest,
        ModelResponse,
        ModelRequest,
        ModelResponse,
        ModelRequest,
        ModelResponse,
    ]
    assert pai.to_openai(back) == dicts  # a fixed point
    thinking = back[1].parts[0]
    assert isinstance(thinking, ThinkingPart)
    assert (thinking.signature, thinking.provider_name) == ("sig-1", "anthropic")
    image = back[2].parts[0].content[2]  # type: ignore[union-attr,index]
    assert (image.data, image.media_type) == (b"\x89PNG\r\n\x1a\n0000", "image/png")  # type: ignore[union-attr]
    returns = back[4].parts
    assert [(r.tool_name, r.tool_call_id, r.content) for r in returns] == [  # type: ignore[union-attr]
        ("describe", "call_a", '{"kind":"cat"}'),
        ("log_visit", "call_b", ""),  # the empty result comes back empty
    ]


async def test_pydantic_ai_shapes_survive_the_store(url: str) -> None:
    async with HistoryCompressor.from_url(url) as hc:
        dicts = pai.to_openai(_sample_pydantic_messages())
        await hc.add_messages("shapes", dicts[1:])
        await hc.pin("shapes", dicts[0], key="system")
        ctx = await hc.get_context("shapes", 20_000)  # two images of unknown size: 1445 tokens each
        assert plain(ctx.to_messages()) == plain(dicts)
        back = pai.from_openai([m for m, _ in _common.context_entries(ctx)])
        assert back[-2].parts[1].tool_name == "log_visit"  # type: ignore[union-attr]


# -- LangChain ------------------------------------------------------------------------------------


class RecordingChatModel(FakeMessagesListChatModel):
    """A fake chat model that records the messages of every call."""

    received: list[list[BaseMessage]] = Field(default_factory=list)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.received.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


def lc_chain(hc: Compressor, model: RecordingChatModel) -> RunnableWithMessageHistory:
    prompt = ChatPromptTemplate.from_messages([MessagesPlaceholder("history"), ("human", "{input}")])
    return RunnableWithMessageHistory(
        prompt | model,  # type: ignore[arg-type]
        lc.session_history(hc, max_tokens=BUDGET, system_prompt=SYSTEM),
        input_messages_key="input",
        history_messages_key="history",
    )


@pytest.mark.filterwarnings("ignore:RunnableWithMessageHistory is deprecated")
@pytest.mark.parametrize("blocking", [False, True], ids=["async", "sync"])
async def test_langchain_history_gives_the_model_the_compressed_context(url: str, blocking: bool) -> None:
    hc = compressor(url, blocking)
    model = RecordingChatModel(responses=[AIMessage(answer_for(prompt_for(s))) for s in SUBJECTS])
    chain = lc_chain(hc, model)
    config: Any = {"configurable": {"session_id": "trip"}}
    counter = TokenCounter()
    try:
        summaries_seen = 0
        for subject in SUBJECTS:
            text = prompt_for(subject)
            before = await context(hc, "trip") if subject != SUBJECTS[0] else None
            if blocking:
                chain.invoke({"input": text}, config=config)
            else:
                await chain.ainvoke({"input": text}, config=config)
            sent = model.received[-1]
            assert sent[-1] == HumanMessage(text)  # the new input comes last
            if before is None:
                assert sent[:-1] == [SystemMessage(SYSTEM)]  # pinned on the first read
                continue
            # The history part is exactly the compressor's context, within budget.
            assert lc.to_openai(sent[:-1]) == plain(before.to_messages())
            assert before.total_tokens == counter.messages_tokens(before.to_messages()) <= BUDGET
            assert sent[0] == SystemMessage(SYSTEM) and sum(isinstance(m, SystemMessage) for m in sent) == 1
            rendered = {before.blocks[t] for t in ("bulk", "topic") if before.blocks.get(t)}
            assert rendered <= {m.content for m in sent if isinstance(m, HumanMessage)}
            summaries_seen += bool(rendered)
        assert summaries_seen > 0
        stored = (await history(hc, "trip")).messages
        assert [m.role for m in stored].count("system") == 1
        assert [m.content for m in stored if m.role == "user"] == [prompt_for(s) for s in SUBJECTS]
    finally:
        await close(hc)


async def test_langchain_tool_calls_round_trip(url: str) -> None:
    messages: list[BaseMessage] = [
        HumanMessage("Weather in Oslo and Lima?", name="ann"),
        AIMessage(
            "",
            tool_calls=[
                {"name": "get_weather", "args": {"city": "Oslo"}, "id": "call_1", "type": "tool_call"},
                {"name": "get_weather", "args": {"city": "Lima"}, "id": "call_2", "type": "tool_call"},
            ],
        ),
        ToolMessage("Sunny", tool_call_id="call_1"),
        ToolMessage("", tool_call_id="call_2"),
        AIMessage("Oslo is sunny; Lima did not say."),
        AIMessage("", tool_calls=[{"name": "chart", "args": {}, "id": "call_3", "type": "tool_call"}]),
        # A result that is an image alone: a result all the same, not an empty one.
        ToolMessage(
            [{"type": "image_url", "image_url": {"url": "https://example.com/c.png"}}], tool_call_id="call_3"
        ),
    ]
    with SyncHistoryCompressor.from_url(url) as hc:
        # (Room for the image: an image part is counted at a high-detail image's cost.)
        chat = lc.TieredChatMessageHistory(hc, "tools", max_tokens=4000, platform="discord", user_id="ann")
        chat.add_messages(messages)
        back = chat.messages
        assert back == messages
        assert back[1].tool_calls == messages[1].tool_calls  # type: ignore[attr-defined]
        assert [m.tool_call_id for m in back[2:4]] == ["call_1", "call_2"]  # type: ignore[attr-defined]
        # Stored in OpenAI's shape, so the same conversation serves a litellm bot too.
        sent = hc.get_context("tools", 4000).to_messages()
        assert sent[1] == {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "type": "function",
                    "id": "call_1",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                },
                {
                    "type": "function",
                    "id": "call_2",
                    "function": {"name": "get_weather", "arguments": '{"city": "Lima"}'},
                },
            ],
        }
        assert sent[2] == {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}
        info = hc.list_conversations()[0]
        assert (info.platform, info.users) == ("discord", ("ann",))


def test_langchain_arguments_that_are_not_json_are_kept() -> None:
    dicts = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{not json"}},
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "error: bad arguments"},
    ]  # fmt: skip
    back = lc.from_openai(dicts)
    assert back[1].invalid_tool_calls[0]["args"] == "{not json"  # type: ignore[attr-defined]
    assert lc.to_openai(back) == dicts


async def test_langchain_runnable_in_an_lcel_chain_with_a_tool_loop(url: str) -> None:
    call = {"name": "get_weather", "args": {"city": "Oslo"}, "id": "call_9", "type": "tool_call"}
    model = RecordingChatModel(responses=[AIMessage("", tool_calls=[call]), AIMessage("Sunny in Oslo.")])
    async with HistoryCompressor.from_url(url) as hc:
        history = lc.compressed_context(hc, BUDGET, system_prompt=SYSTEM)
        prompt = ChatPromptTemplate.from_messages([MessagesPlaceholder("history")])
        chain = RunnablePassthrough.assign(history=history) | prompt | model
        chat = lc.TieredChatMessageHistory(hc, "loop")
        await chat.aadd_messages([HumanMessage("Weather in Oslo?")])
        reply = await chain.ainvoke({"conversation_id": "loop"})
        await chat.aadd_messages([reply, ToolMessage("Sunny, 21 C", tool_call_id="call_9")])
        final = await chain.ainvoke({"conversation_id": "loop"})
        await chat.aadd_messages([final])
        assert model.received[0] == [SystemMessage(SYSTEM), HumanMessage("Weather in Oslo?")]
        assert model.received[1] == [
            SystemMessage(SYSTEM),
            HumanMessage("Weather in Oslo?"),
            AIMessage("", tool_calls=[call]),
            ToolMessage("Sunny, 21 C", tool_call_id="call_9"),
        ]
        assert (await chat.aget_messages())[-1] == AIMessage("Sunny in Oslo.")
        assert await history.ainvoke("loop") == await chat.aget_messages()  # the id alone works too
        by_config = lc.compressed_context(hc, BUDGET, key="session_id")
        assert await by_config.ainvoke({}, config={"configurable": {"session_id": "loop"}}) == (
            await chat.aget_messages()
        )
        assert await lc.compressed_context(hc).ainvoke("nobody") == []
        with pytest.raises(TypeError, match="SyncHistoryCompressor"):
            lc.compressed_context(hc).invoke("loop")
        with pytest.raises(TypeError, match="SyncHistoryCompressor"):
            chat.messages  # noqa: B018


def test_langchain_restart_and_clear(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bot.db'}"
    for start in range(3):
        with SyncHistoryCompressor.from_url(url) as hc:
            chat = lc.session_history(hc, max_tokens=BUDGET, system_prompt=SYSTEM)("chat")
            before = chat.messages
            assert before[0] == SystemMessage(SYSTEM)
            assert [m.content for m in before if isinstance(m, HumanMessage)] == [
                f"start {i}" for i in range(start)
            ]
            chat.add_messages([HumanMessage(f"start {start}"), AIMessage(f"hello {start}")])
    with SyncHistoryCompressor.from_url(url) as hc:
        assert [m.role for m in hc.get_history("chat").messages].count("system") == 1
        chat = lc.TieredChatMessageHistory(hc, "chat", system_prompt=SYSTEM)
        chat.clear()
        assert not hc.exists("chat")
        assert lc.TieredChatMessageHistory(hc, "chat").messages == []
        assert chat.messages == [SystemMessage(SYSTEM)]  # a new conversation gets the prompt again


# -- layout ---------------------------------------------------------------------------------------


async def test_context_entries_follow_to_messages() -> None:
    async with HistoryCompressor.from_url("memory://", summarize_inline=True) as hc:
        await hc.pin("c", SYSTEM, key="system")
        for subject in SUBJECTS:
            await hc.add_messages(
                "c",
                [{"role": "user", "content": prompt_for(subject)}, {"role": "assistant", "content": "ok"}],
            )
        for budget in (400, 700, 1500, 20_000):
            ctx = await hc.get_context("c", budget)
            assert [m for m, _ in _common.context_entries(ctx)] == ctx.to_messages()


def test_importing_tiered_history_imports_no_framework() -> None:
    code = (
        "import sys, tiered_history, tiered_history.integrations; "
        "roots = {m.split('.')[0] for m in sys.modules}; "
        "bad = roots & {'pydantic_ai', 'langchain_core', 'langchain'}; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])
