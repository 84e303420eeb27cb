"""LangChain adapter: a chat message history and a runnable, both backed by a compressor.

::

    history = SyncHistoryCompressor.from_url("sqlite:///history.db")
    chain = RunnableWithMessageHistory(
        prompt | model,
        session_history(history, max_tokens=6000, system_prompt="You are a helpful bot."),
        input_messages_key="input", history_messages_key="history",
    )
    chain.invoke({"input": text}, config={"configurable": {"session_id": "discord:1234"}})

:class:`TieredChatMessageHistory` is a ``BaseChatMessageHistory``: ``messages`` is the compressed
context (pinned system prompt, summaries of earlier topics as human messages, the current topic
verbatim), ``add_messages`` stores, ``clear`` deletes the conversation (every row of it).
:func:`compressed_context` is a runnable from a conversation id to the same messages, for LCEL
chains that store the messages themselves.

Messages convert to OpenAI format and back: ``AIMessage.tool_calls`` <-> OpenAI ``tool_calls``
(ids kept, so a call and its result stay paired), ``ToolMessage.tool_call_id``, content blocks
through LangChain's own OpenAI converter.

The synchronous entry points (``messages``, ``add_messages``, ``clear``, ``invoke``) need a
:class:`~tiered_history.SyncHistoryCompressor`; the async ones (``aget_messages``,
``aadd_messages``, ``aclear``, ``ainvoke``) take either compressor.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    FunctionMessage,
    HumanMessage,
    InvalidToolCall,
    SystemMessage,
    ToolCall,
    ToolMessage,
)
from langchain_core.messages.utils import convert_to_openai_messages
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda

from ..errors import ConversationNotFoundError
from ..models import CompressedContext, has_media
from ._common import (
    META_KEY,
    SYSTEM_KEY,
    Compressor,
    add_messages,
    check_compressor,
    context_entries,
    context_with_pin,
    context_with_pin_sync,
    delete_conversation,
    require_sync,
    text_of,
    tool_result,
)

__all__ = [
    "TieredChatMessageHistory",
    "compressed_context",
    "from_openai",
    "session_history",
    "to_openai",
]


# -- conversions -------------------------------------------------------------------------------


def _to_openai_one(message: BaseMessage) -> dict[str, Any] | None:
    converted: dict[str, Any] = convert_to_openai_messages(message)
    if isinstance(message, AIMessage):
        # LangChain's converter drops calls whose arguments are not JSON; the provider sent them,
        # so they are kept (arguments as given) to pair with their results.
        calls = list(converted.get("tool_calls") or [])
        for bad in message.invalid_tool_calls:
            if bad.get("id"):
                function = {"name": bad.get("name") or "", "arguments": bad.get("args") or ""}
                calls.append({"id": bad["id"], "type": "function", "function": function})
        if calls:
            converted["tool_calls"] = calls
            if not text_of(converted.get("content")).strip():
                converted["content"] = None
        elif not text_of(converted.get("content")).strip() and not isinstance(converted.get("content"), list):
            return None  # an empty answer carries nothing to send back
    elif isinstance(message, ToolMessage):
        parts = converted.get("content")
        if has_media(parts):
            return converted  # an image (or other media) with no text is a result all the same
        content, meta = tool_result(text_of(parts), None)
        if meta:
            converted["content"] = content
            converted["metadata"] = {META_KEY: meta}
    return converted


def to_openai(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """OpenAI-format dicts for LangChain messages (LangChain's converter, plus: tool calls with
    arguments that are not JSON are kept, an empty AI message is left out, an empty tool result
    becomes ``"(no output)"`` with ``metadata`` telling :func:`from_openai` so)."""
    return [m for m in map(_to_openai_one, messages) if m is not None]


def _tool_call(call: Mapping[str, Any]) -> ToolCall | InvalidToolCall:
    body = call.get("function") or call.get("custom") or {}
    name = body.get("name") or ""
    raw = body.get("arguments", body.get("input")) or ""
    try:
        args = json.loads(raw) if raw.strip() else {}
    except ValueError:
        args = None
    if isinstance(args, dict):
        return ToolCall(name=name, args=args, id=call["id"], type="tool_call")
    return InvalidToolCall(name=name, args=raw, id=call["id"], error=None, type="invalid_tool_call")


def _from_openai_one(message: Mapping[str, Any], meta: Mapping[str, Any]) -> BaseMessage:
    role = message.get("role")
    content = message.get("content")
    body: str | list[Any] = content if isinstance(content, str | list) else ""
    name = message.get("name")
    if role in ("system", "developer"):
        extra = {"__openai_role__": "developer"} if role == "developer" else {}
        return SystemMessage(content=body, additional_kwargs=extra)
    if role == "assistant":
        calls = [_tool_call(c) for c in message.get("tool_calls") or ()]
        return AIMessage(
            content=body,
            name=name,
            tool_calls=[c for c in calls if c["type"] == "tool_call"],
            invalid_tool_calls=[c for c in calls if c["type"] == "invalid_tool_call"],
        )
    if role == "tool":
        text = meta["empty"] if isinstance(meta.get("empty"), str) else body
        return ToolMessage(content=text, tool_call_id=str(message.get("tool_call_id")))
    if role == "function":
        return FunctionMessage(content=body, name=str(name))
    return HumanMessage(content=body, name=name)


def from_openai(messages: Sequence[Mapping[str, Any]]) -> list[BaseMessage]:
    """LangChain messages for OpenAI-format dicts: system/developer -> ``SystemMessage``, user ->
    ``HumanMessage``, assistant -> ``AIMessage`` (``tool_calls`` parsed; arguments that are not a
    JSON object become ``invalid_tool_calls``), tool -> ``ToolMessage`` with its ``tool_call_id``."""
    return [_from_openai_one(m, (m.get("metadata") or {}).get(META_KEY) or {}) for m in messages]


def context_messages(ctx: CompressedContext) -> list[BaseMessage]:
    """The compressed context as LangChain messages (summaries as ``HumanMessage``)."""
    return [_from_openai_one(message, meta) for message, meta in context_entries(ctx)]


# -- the chat message history ------------------------------------------------------------------


class TieredChatMessageHistory(BaseChatMessageHistory):
    """One conversation of ``compressor`` as a LangChain chat message history.

    ``messages`` / ``aget_messages()``: the compressed context within ``max_tokens`` (default: the
    compressor's budget), read from the store on every call. ``system_prompt``: pinned under
    ``system_key`` and sent first; pinned again only when it changed, so restarts keep one copy.
    ``add_messages`` stores a batch in one transaction (with ``platform``, ``channel``, ``user_id``
    kept on the conversation); ``clear()`` deletes the conversation and everything derived from it.
    A conversation nobody wrote in yet has no messages (or just the system prompt).
    """

    def __init__(
        self,
        compressor: Compressor,
        conversation_id: str,
        *,
        max_tokens: int | None = None,
        system_prompt: str | None = None,
        system_key: str = SYSTEM_KEY,
        platform: str | None = None,
        channel: str | None = None,
        user_id: str | None = None,
    ) -> None:
        self.compressor = check_compressor(compressor)
        self.conversation_id = conversation_id
        self.max_tokens = max_tokens
        self.system_prompt = system_prompt
        self.system_key = system_key
        self.origin = {"platform": platform, "channel": channel, "user_id": user_id}

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]  # base: plain attribute; here I/O
        compressor = require_sync(self.compressor, "TieredChatMessageHistory.messages")
        try:
            ctx = context_with_pin_sync(
                compressor, self.conversation_id, self.max_tokens, self.system_prompt, self.system_key
            )
        except ConversationNotFoundError:
            return []
        return context_messages(ctx)

    async def aget_messages(self) -> list[BaseMessage]:
        try:
            ctx = await context_with_pin(
                self.compressor, self.conversation_id, self.max_tokens, self.system_prompt, self.system_key
            )
        except ConversationNotFoundError:
            return []
        return context_messages(ctx)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        compressor = require_sync(self.compressor, "TieredChatMessageHistory.add_messages")
        batch = to_openai(messages)
        if batch:
            compressor.add_messages(self.conversation_id, batch, **self.origin)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        batch = to_openai(messages)
        if batch:
            await add_messages(self.compressor, self.conversation_id, batch, **self.origin)

    def clear(self) -> None:
        require_sync(self.compressor, "TieredChatMessageHistory.clear").delete_conversation(
            self.conversation_id
        )

    async def aclear(self) -> None:
        await delete_conversation(self.compressor, self.conversation_id)


def session_history(
    compressor: Compressor,
    *,
    max_tokens: int | None = None,
    system_prompt: str | None = None,
    system_key: str = SYSTEM_KEY,
) -> Callable[[str], TieredChatMessageHistory]:
    """``get_session_history`` for ``RunnableWithMessageHistory``: a session id -> its history."""
    check_compressor(compressor)

    def get(session_id: str) -> TieredChatMessageHistory:
        return TieredChatMessageHistory(
            compressor, session_id, max_tokens=max_tokens, system_prompt=system_prompt, system_key=system_key
        )

    return get


# -- the runnable ------------------------------------------------------------------------------


def compressed_context(
    compressor: Compressor,
    max_tokens: int | None = None,
    *,
    key: str = "conversation_id",
    system_prompt: str | None = None,
    system_key: str = SYSTEM_KEY,
) -> Runnable[Any, list[BaseMessage]]:
    """A runnable from a conversation to its compressed context as LangChain messages.

    Its input is the conversation id, or a mapping holding it under ``key``; else the id is read
    from ``config["configurable"][key]``. Use it where a chain needs the history, after storing the
    user's message: ``RunnablePassthrough.assign(history=compressed_context(h, 6000)) | prompt | model``.
    ``invoke`` needs a :class:`~tiered_history.SyncHistoryCompressor`, ``ainvoke`` takes either.
    """
    check_compressor(compressor)

    def conversation(value: Any, config: RunnableConfig) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, Mapping) and isinstance(value.get(key), str):
            return str(value[key])
        configured = (config.get("configurable") or {}).get(key)
        if isinstance(configured, str):
            return configured
        raise ValueError(
            f"compressed_context needs a conversation id: the input, input[{key!r}] or configurable"
        )

    def run(value: Any, config: RunnableConfig) -> list[BaseMessage]:
        sync = require_sync(compressor, "compressed_context(...).invoke")
        cid = conversation(value, config)
        try:
            ctx = context_with_pin_sync(sync, cid, max_tokens, system_prompt, system_key)
        except ConversationNotFoundError:
            return []  # nobody wrote in it yet
        return context_messages(ctx)

    async def arun(value: Any, config: RunnableConfig) -> list[BaseMessage]:
        cid = conversation(value, config)
        try:
            ctx = await context_with_pin(compressor, cid, max_tokens, system_prompt, system_key)
        except ConversationNotFoundError:
            return []
        return context_messages(ctx)

    return RunnableLambda(run, afunc=arun, name="compressed_context")
