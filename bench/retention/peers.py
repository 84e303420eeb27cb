"""Token counters and the systems compared, all counted with one tokenizer.

Every system is measured with ``tiered_history.tokens.TokenCounter`` (tiktoken
``cl100k_base``) and OpenAI's chat framing: 3 tokens per message, 1 more for a
``name``, 3 to prime the reply. A context fits a budget when that count is at most
the budget.

Peers:

- recency truncation (written here): the newest messages whose framed cost fits;
- langchain-core ``trim_messages(strategy="last")`` with a tiktoken list counter;
- summarization-pydantic-ai's ``SlidingWindowProcessor`` (token trigger and keep =
  the budget, tiktoken counter);
- summarization-pydantic-ai's ``SummarizationProcessor`` with a pydantic-ai
  ``FunctionModel`` that answers the processor's summary prompt with
  tiered_history's ``ExtractiveSummarizer`` (no network): trigger at the budget,
  keep the newest half of the budget verbatim, summaries of at most the other half.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tiered_history import ExtractiveSummarizer, SummaryInput, SummaryPiece, SummaryResult
from tiered_history.tokens import REPLY_PRIMING_TOKENS, TokenCounter

from .data import START, Turn

# -- summariser accounting ----------------------------------------------------------------------------


@dataclass
class Cost:
    """Summariser calls and the tokens that went in and came out (payload only, no prompt template)."""

    calls: int = 0
    merge_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0

    def add(self, other: Cost) -> None:
        self.calls += other.calls
        self.merge_calls += other.merge_calls
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.seconds += other.seconds


def _transcript(messages: Sequence[SummaryInput]) -> str:
    """What a model would read of ``messages``: ``name: content`` per message."""
    return "\n".join(f"{m.name or m.role}: {m.content}" for m in messages)


class CountingSummarizer:
    """tiered_history's extractive summariser behind the ``Summarizer`` protocol, counting its use.

    Passed as ``summarizer=``: the compressor then calls it as it would call an LLM
    summariser (it is not an ``ExtractiveSummarizer`` instance), so every call is seen.
    Input tokens are those of the transcript a model would read (``name: content`` per
    message, or the summaries being merged); output tokens those of the summary.
    """

    name = "extractive"

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.inner = ExtractiveSummarizer(counter)
        self.cost = Cost()

    #: As the library's own: told what the summaries before this one say (``earlier=``), where
    #: the library has that (an LLM would read those texts too: they are not counted as input).
    reads_earlier = getattr(ExtractiveSummarizer, "reads_earlier", False)

    async def summarize(
        self, messages: Sequence[SummaryInput], target_tokens: int, *, earlier: Sequence[str] = ()
    ) -> SummaryResult:
        started = time.perf_counter()
        transcript = _transcript(messages)
        more = {"earlier": earlier} if earlier else {}
        result = await self.inner.summarize(messages, target_tokens, **more)
        self.cost.calls += 1
        self.cost.input_tokens += self.counter.count(transcript)
        self.cost.output_tokens += self.counter.count(result.text)
        self.cost.seconds += time.perf_counter() - started
        return result

    #: As the library's own: a roll-up hands it the messages its archives stand for.
    reads_sources = True

    async def merge(
        self,
        pieces: Sequence[SummaryPiece],
        target_tokens: int,
        *,
        sources: Sequence[Sequence[SummaryInput] | None] | None = None,
        earlier: Sequence[str] = (),
    ) -> SummaryResult:
        started = time.perf_counter()
        more = {"earlier": earlier} if earlier else {}
        result = await self.inner.merge(pieces, target_tokens, sources=sources, **more)
        self.cost.calls += 1
        self.cost.merge_calls += 1
        texts = [
            _transcript(src) if src else p.text
            for p, src in zip(pieces, sources or [None] * len(pieces), strict=True)
        ]
        self.cost.input_tokens += self.counter.count("\n".join(texts))
        self.cost.output_tokens += self.counter.count(result.text)
        self.cost.seconds += time.perf_counter() - started
        return result


# -- counters -----------------------------------------------------------------------------------------


class Framed:
    """Framed token cost of OpenAI-style message dicts, optionally memoised by content."""

    def __init__(self, counter: TokenCounter, memo: bool) -> None:
        self.counter = counter
        self.memo: dict[tuple[str, str, str], int] | None = {} if memo else None

    def one(self, role: str, content: str, name: str | None = None) -> int:
        if self.memo is None:
            return self._count(role, content, name)
        key = (role, content, name or "")
        n = self.memo.get(key)
        if n is None:
            n = self.memo[key] = self._count(role, content, name)
        return n

    def _count(self, role: str, content: str, name: str | None) -> int:
        msg: dict[str, Any] = {"role": role, "content": content}
        if name:
            msg["name"] = name
        return self.counter.message_tokens(msg)


# -- recency truncation -------------------------------------------------------------------------------


def recency(costs: Sequence[int], budget: int) -> int:
    """Index of the first kept message: the newest messages whose framed costs fit ``budget``."""
    used = REPLY_PRIMING_TOKENS
    i = len(costs)
    while i > 0 and used + costs[i - 1] <= budget:
        used += costs[i - 1]
        i -= 1
    return i


def recency_call(framed: Framed, messages: Sequence[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
    """Recency truncation over a full message list, counting every message (the speed benchmark)."""
    used = REPLY_PRIMING_TOKENS
    i = len(messages)
    while i > 0:
        m = messages[i - 1]
        cost = framed.one(m["role"], m["content"], m.get("name"))
        if used + cost > budget:
            break
        used += cost
        i -= 1
    return list(messages[i:])


# -- langchain-core -----------------------------------------------------------------------------------


def langchain_messages(turns: Sequence[Turn]) -> list[Any]:
    from langchain_core.messages import HumanMessage

    return [HumanMessage(content=t.content, name=t.name) for t in turns]


def langchain_generated(messages: Sequence[dict[str, Any]]) -> list[Any]:
    from langchain_core.messages import AIMessage, HumanMessage

    return [
        HumanMessage(content=m["content"]) if m["role"] == "user" else AIMessage(content=m["content"])
        for m in messages
    ]


_LC_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


def langchain_counter(framed: Framed) -> Callable[[list[Any]], int]:
    """A ``token_counter`` for ``trim_messages``: tiktoken with OpenAI framing, over a message list."""

    def count(messages: list[Any]) -> int:
        total = REPLY_PRIMING_TOKENS
        for m in messages:
            content = m.content if isinstance(m.content, str) else str(m.content)
            total += framed.one(_LC_ROLES.get(m.type, "user"), content, m.name)
        return total

    return count


def langchain_trim(messages: list[Any], budget: int, counter: Callable[[list[Any]], int]) -> list[Any]:
    from langchain_core.messages import trim_messages

    return trim_messages(messages, strategy="last", token_counter=counter, max_tokens=budget)


def langchain_dicts(messages: Sequence[Any]) -> list[dict[str, Any]]:
    return [
        {"role": _LC_ROLES.get(m.type, "user"), "content": str(m.content), "name": m.name} for m in messages
    ]


# -- summarization-pydantic-ai ------------------------------------------------------------------------


def pydantic_messages(turns: Sequence[Turn]) -> list[Any]:
    """One ``ModelRequest`` per turn (user parts have no ``name``: the speaker prefixes the text)."""
    return [pydantic_request(t) for t in turns]


def pydantic_request(turn: Turn) -> Any:
    """A meeting turn (or a chat's user turn) as a request; a chat's assistant turn as a response."""
    from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

    if turn.role == "assistant":
        return ModelResponse(parts=[TextPart(content=turn.content)], timestamp=turn.timestamp)
    text = f"{turn.name}: {turn.content}" if turn.name else turn.content
    return ModelRequest(parts=[UserPromptPart(content=text, timestamp=turn.timestamp)])


def pydantic_generated(messages: Sequence[dict[str, Any]]) -> list[Any]:
    from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

    out: list[Any] = []
    for m in messages:
        if m["role"] == "user":
            out.append(ModelRequest(parts=[UserPromptPart(content=m["content"], timestamp=START)]))
        else:
            out.append(ModelResponse(parts=[TextPart(content=m["content"])], timestamp=START))
    return out


def pydantic_dicts(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """pydantic-ai messages as the OpenAI messages they become."""
    from pydantic_ai.messages import (
        ModelRequest,
        ModelResponse,
        SystemPromptPart,
        TextPart,
        ToolReturnPart,
        UserPromptPart,
    )

    out: list[dict[str, Any]] = []
    for msg in messages:
        if isinstance(msg, ModelRequest):
            for part in msg.parts:
                if isinstance(part, SystemPromptPart):
                    out.append({"role": "system", "content": part.content})
                elif isinstance(part, UserPromptPart):
                    content = part.content if isinstance(part.content, str) else str(part.content)
                    out.append({"role": "user", "content": content})
                elif isinstance(part, ToolReturnPart):
                    out.append({"role": "tool", "content": str(part.content)})
        elif isinstance(msg, ModelResponse):
            text = "".join(p.content for p in msg.parts if isinstance(p, TextPart))
            out.append({"role": "assistant", "content": text})
    return out


def pydantic_counter(framed: Framed) -> Callable[[Sequence[Any]], int]:
    """A ``token_counter`` for the processors: tiktoken with OpenAI framing."""

    def count(messages: Sequence[Any]) -> int:
        return REPLY_PRIMING_TOKENS + sum(
            framed.one(m["role"], m["content"]) for m in pydantic_dicts(messages)
        )

    return count


def sliding_window(budget: int, counter: Callable[[Sequence[Any]], int]) -> Any:
    from pydantic_ai_summarization import SlidingWindowProcessor

    return SlidingWindowProcessor(trigger=("tokens", budget), keep=("tokens", budget), token_counter=counter)


#: Tokens kept free for the summary message's framing and "Summary of previous conversation:" prefix.
SUMMARY_OVERHEAD = 16


def summary_target(budget: int) -> int:
    return budget - budget // 2 - SUMMARY_OVERHEAD


_PROMPT_START = "Messages to summarize:\n"
_PROMPT_END = "\n</messages>"
_SPEAKER_PREFIXES = ("User: ", "Assistant: ", "System: ")


def parse_formatted(payload: str) -> list[SummaryInput]:
    """``format_messages_for_summary`` output back into messages for the extractive summariser.

    Lines starting ``User:``/``Assistant:``/``System:`` open a message; our speaker
    prefix (``Name: ``) becomes its ``name``; lines of an earlier summary
    (``Name (user): ...``) become messages of their own; ``Topic:`` keyword lines and
    the continuation header are dropped.
    """
    import re

    named = re.compile(r"^([A-Za-z0-9_-]{1,64}): (.*)$", re.S)
    summary_line = re.compile(r"^([A-Za-z0-9_-]{1,64}) \((?:user|assistant|system|tool)\): (.*)$")
    items: list[tuple[str, str | None, str]] = []
    for line in payload.split("\n"):
        prefix = next((p for p in _SPEAKER_PREFIXES if line.startswith(p)), None)
        if prefix is not None:
            role = prefix[:-2].lower()
            body = line[len(prefix) :]
            m = named.match(body)
            if m and not body.startswith("Summary of previous conversation:"):
                items.append((role, m.group(1), m.group(2)))
            else:
                items.append((role, None, body))
            continue
        s = summary_line.match(line)
        if s:
            items.append(("user", s.group(1), s.group(2)))
        elif line.strip() and not line.startswith("Topic: ") and items:
            role, name, body = items[-1]
            items[-1] = (role, name, body + "\n" + line)
        elif line.strip() and not line.startswith("Topic: "):
            items.append(("user", None, line))
    out: list[SummaryInput] = []
    for role, name, body in items:
        body = body.replace("Summary of previous conversation:", "").strip()
        if body:
            out.append(SummaryInput(len(out) + 1, role, body, START, name))
    return out


@dataclass
class ExtractiveModel:
    """A pydantic-ai ``FunctionModel`` answering the summary prompt with ``ExtractiveSummarizer``."""

    counter: TokenCounter
    target: int
    cost: Cost = field(default_factory=Cost)
    template_tokens: int = 0
    """Tokens of the prompt template around the messages (what an LLM would also read per call)."""

    def model(self) -> Any:
        from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
        from pydantic_ai.models.function import AgentInfo, FunctionModel

        summarizer = ExtractiveSummarizer(self.counter)

        async def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            started = time.perf_counter()
            prompt = ""
            for msg in messages:
                if isinstance(msg, ModelRequest):
                    for part in msg.parts:
                        if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                            prompt = part.content
            payload = prompt
            if _PROMPT_START in prompt:
                payload = prompt.split(_PROMPT_START, 1)[1].rsplit(_PROMPT_END, 1)[0]
            in_tokens = self.counter.count(payload)
            self.template_tokens = max(self.template_tokens, self.counter.count(prompt) - in_tokens)
            inputs = parse_formatted(payload)
            text = (await summarizer.summarize(inputs, self.target)).text if inputs else ""
            self.cost.calls += 1
            self.cost.input_tokens += in_tokens
            self.cost.output_tokens += self.counter.count(text)
            self.cost.seconds += time.perf_counter() - started
            return ModelResponse(parts=[TextPart(content=text)])

        return FunctionModel(answer, model_name="tiered-history-extractive")


def summarization(budget: int, counter: Callable[[Sequence[Any]], int], model: Any) -> Any:
    from pydantic_ai_summarization import SummarizationProcessor

    return SummarizationProcessor(
        model=model, trigger=("tokens", budget), keep=("tokens", budget // 2), token_counter=counter
    )
