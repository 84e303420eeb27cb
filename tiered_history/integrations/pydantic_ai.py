"""pydantic-ai adapter: the agent's history lives in a compressor, the model gets the compressed context.

::

    history = HistoryCompressor.from_url("sqlite:///history.db")
    agent = Agent("openai:gpt-4o-mini", system_prompt="You are a helpful bot.",
                  capabilities=[TieredHistory(history, max_tokens=6000)])
    result = await agent.run(text, conversation_id="discord:1234")  # no message_history needed

:class:`TieredHistory` is a capability (pydantic-ai 2 took ``history_processors=`` off ``Agent``;
capabilities replaced it). Its history processor, :meth:`TieredHistory.process`, runs before every
model request: it stores the messages the compressor has not seen yet (the user prompt, tool calls,
tool results...), pins the agent's system prompt under ``system_key`` (again only if it changed, so
restarts keep one copy) and hands the model the compressed context: the pinned prompt, summaries of
earlier topics as user-prompt text, the current topic verbatim. Its ``after_run`` hook stores what
the run added after the last request -- the final answer -- which no history processor ever sees.

Every message the adapter stored or produced carries ``metadata["tiered_history"]``, so passing
``result.all_messages()`` back as ``message_history`` stores nothing twice; unmarked messages in a
``message_history`` are stored as new (a way to import an existing history).

Where it differs from pydantic-ai's own history (known, kept):

* The run's messages are the compressed context: ``result.all_messages()`` and
  ``result.new_messages()`` hold what the model was sent (summaries, recalled excerpts), not the
  full history, which lives in the compressor (``get_history``).
* A prompt is stored before the model is called: a run that fails stores its prompt, and running
  it again stores it a second time.
* Retry feedback (a tool's or validator's ``ModelRetry``) is stored as a user message.
* Files a tool returns are stored as pydantic-ai sends them to a text-only tool API: "See file
  <id>." in the result, the file in a user message after the results.
* ``run_stream``'s final message objects are not the ones ``after_run`` saw: passing its
  ``all_messages()`` back as ``message_history`` stores the final answer again (leave
  ``message_history`` out: the capability keeps the history).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, replace
from datetime import datetime
from typing import Any, TypeAlias

from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    AudioUrl,
    BinaryContent,
    DocumentUrl,
    ImageUrl,
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    RetryFeedbackPart,
    SystemPromptPart,
    TextContent,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserContent,
    UserPromptPart,
    VideoUrl,
)
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.run import AgentRunResult

from ..models import has_media
from ._common import (
    META_KEY,
    SYSTEM_KEY,
    Compressor,
    add_messages,
    check_compressor,
    context_entries,
    context_with_pin,
    exists,
    pin,
    text_of,
    tool_names,
    tool_result,
)

__all__ = ["MARK", "TieredHistory", "from_openai", "to_openai"]

#: Key, in a ``ModelRequest``/``ModelResponse``'s ``metadata``, marking it as stored (or produced) by
#: the adapter: ``{"conversation_id": ...}``.
MARK = "tiered_history"

ConversationIdSource: TypeAlias = "str | Callable[[RunContext[Any]], str] | None"
_URL_KINDS: dict[str, type[AudioUrl | DocumentUrl | VideoUrl]] = {
    "audio_url": AudioUrl,
    "document_url": DocumentUrl,
    "video_url": VideoUrl,
}


# -- pydantic-ai -> OpenAI ---------------------------------------------------------------------


def _user_content(content: str | Sequence[UserContent]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for item in content:
        if isinstance(item, str):
            parts.append({"type": "text", "text": item})
        elif isinstance(item, TextContent):
            parts.append({"type": "text", "text": item.content})
        elif isinstance(item, ImageUrl):
            parts.append({"type": "image_url", "image_url": {"url": item.url}})
        elif isinstance(item, BinaryContent):
            if item.is_image:
                parts.append({"type": "image_url", "image_url": {"url": item.data_uri}})
            elif item.is_audio and (audio_format := _format_of(item)) is not None:
                parts.append(
                    {"type": "input_audio", "input_audio": {"data": item.base64, "format": audio_format}}
                )
            else:
                parts.append({"type": "file", "file": {"file_data": item.data_uri}})
        elif isinstance(item, AudioUrl | DocumentUrl | VideoUrl):
            # No OpenAI chat part holds a media URL: kept as a part of its own kind, which
            # add_message stores as given and from_openai turns back into the same URL object.
            kind = item.kind.replace("-", "_")
            parts.append({"type": kind, kind: {"url": item.url}})
        # A cache point or an uploaded file's provider handle means nothing outside this provider.
    return parts


def _format_of(item: BinaryContent) -> str | None:
    """The file format pydantic-ai names for ``item`` (None for a media type it does not know,
    such as audio/webm: then kept as a file part, never failing the run that stores it)."""
    try:
        return item.format
    except ValueError:
        return None


def _request_parts(
    request: ModelRequest, timestamps: bool
) -> tuple[list[str], list[dict[str, Any]], list[ModelRequestPart]]:
    """(conversation system prompts, OpenAI messages to store, parts not stored) of one request."""
    system: list[str] = []
    stored: list[dict[str, Any]] = []
    rest: list[ModelRequestPart] = []
    files: list[UserContent] = []  # what tools returned beyond text (images...), as pydantic-ai sends it
    for part in request.parts:
        message: dict[str, Any] | None = None
        if isinstance(part, SystemPromptPart):
            if part.scope == "conversation" and part.content.strip():
                system.append(part.content)
                continue
        elif isinstance(part, UserPromptPart):
            content = _user_content(part.content)
            if text_of(content).strip() or has_media(content):  # an empty prompt is nothing to remember
                message = {"role": "user", "content": content, "timestamp": part.timestamp}
        elif isinstance(part, ToolReturnPart):
            # Files a tool returned go in a user message after the results ("See file <id>." in the
            # result), as pydantic-ai sends them to a model whose tool results are text only.
            said, returned = part.model_response_str_and_user_content()
            for item in returned:
                # Its provenance tags are left out: read back as a user prompt, they would be
                # taken for tags a user wrote (pydantic-ai then warns the model about them).
                if not isinstance(item, str):
                    name = getattr(item, "identifier", None) or "?"
                    files.extend([f"This is file {name}, returned by the tool {part.tool_name}:", item])
            text, meta = tool_result(said, part.tool_name)
            message = {"role": "tool", "tool_call_id": part.tool_call_id, "content": text}
            message.update(metadata={META_KEY: meta}, timestamp=part.timestamp)
        elif isinstance(part, RetryFeedbackPart):
            message = {"role": "user", "content": part.model_response(), "timestamp": part.timestamp}
        if message is None:
            rest.append(part)
            continue
        if not timestamps:
            del message["timestamp"]
        stored.append(message)
    if files:
        message = {"role": "user", "content": _user_content(files)}
        if timestamps:
            message["timestamp"] = request.timestamp
        stored.append(message)
    return system, stored, rest


def _response_message(response: ModelResponse, timestamps: bool) -> dict[str, Any] | None:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thinking: list[ThinkingPart] = []
    for part in response.parts:
        if isinstance(part, TextPart):
            texts.append(part.content)
        elif isinstance(part, ToolCallPart):
            # Arguments as the model wrote them (pydantic-ai would wrap invalid JSON in an object).
            raw = part.args if isinstance(part.args, str) else part.args_as_json_str()
            function = {"name": part.tool_name, "arguments": raw}
            calls.append({"id": part.tool_call_id, "type": "function", "function": function})
        elif isinstance(part, ThinkingPart):
            thinking.append(part)
        # Provider-run tools (web search...), files and compaction markers have no OpenAI form.
    text = "\n\n".join(t for t in texts if t)
    if not text.strip() and not calls:
        return None  # nothing a model could be shown again
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = "\n\n".join(t.content for t in thinking if t.content)
        blocks = [
            {"type": "thinking", "thinking": t.content, "signature": t.signature}
            for t in thinking
            if t.signature
        ]
        if blocks:
            message["thinking_blocks"] = blocks
        # What a provider needs to accept its own reasoning back, and OpenAI dicts cannot carry.
        detail = [
            {k: v for k, v in (("id", t.id), ("provider_name", t.provider_name)) if v is not None}
            for t in thinking
        ]
        if any(detail):
            message["metadata"] = {META_KEY: {"thinking": detail}}
    if response.provider_name is not None:
        message.setdefault("metadata", {META_KEY: {}})[META_KEY]["provider_name"] = response.provider_name
    if timestamps:
        message["timestamp"] = response.timestamp
    return message


def to_openai(messages: Sequence[ModelMessage]) -> list[dict[str, Any]]:
    """OpenAI-format dicts for pydantic-ai messages: system prompts as system messages, user
    prompts (text, images, audio, documents as content parts), tool calls with their ids, tool
    results by ``tool_call_id``, thinking as ``reasoning_content``/``thinking_blocks``.

    Parts with no OpenAI form (provider-run tools, files a model returned, bookkeeping parts) are
    left out, and so is a response with nothing left to show; an empty tool result becomes
    ``"(no output)"``, which ``add_message`` accepts. Each dict may carry ``metadata`` for
    :func:`from_openai`, which ``add_message`` keeps and never sends to a provider.
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, ModelRequest):
            system, stored, _ = _request_parts(message, timestamps=False)
            out.extend({"role": "system", "content": text} for text in system)
            out.extend(stored)
        else:
            reply = _response_message(message, timestamps=False)
            if reply is not None:
                out.append(reply)
    return out


# -- OpenAI -> pydantic-ai ---------------------------------------------------------------------


def _binary(url: str) -> BinaryContent | None:
    try:
        return BinaryContent.from_data_uri(url)
    except (ValueError, binascii.Error):
        return None


def _user_content_back(content: object) -> str | list[UserContent]:
    if isinstance(content, str) or not isinstance(content, list):
        return text_of(content)
    items: list[UserContent] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        body = part.get(kind) if isinstance(kind, str) else None
        if kind == "text" and isinstance(part.get("text"), str):
            items.append(part["text"])
        elif kind == "image_url":
            url = body.get("url") if isinstance(body, dict) else body
            if isinstance(url, str):
                items.append((_binary(url) if url.startswith("data:") else None) or ImageUrl(url=url))
        elif kind == "input_audio" and isinstance(body, dict) and isinstance(body.get("data"), str):
            try:
                data = base64.b64decode(body["data"], validate=True)
            except (ValueError, binascii.Error):
                continue
            items.append(BinaryContent(data=data, media_type=f"audio/{body.get('format') or 'wav'}"))
        elif kind == "file" and isinstance(body, dict) and isinstance(body.get("file_data"), str):
            binary = _binary(body["file_data"])
            if binary is not None:
                items.append(binary)
        elif kind in _URL_KINDS and isinstance(body, dict) and isinstance(body.get("url"), str):
            items.append(_URL_KINDS[kind](url=body["url"]))
        elif isinstance(part.get("text"), str):
            items.append(part["text"])
    if len(items) == 1 and isinstance(items[0], str):
        return items[0]
    return items


def _stamp(meta: dict[str, Any]) -> dict[str, Any]:
    """The stored time of a message, for the parts rebuilt from it (a summary: the end of its topic)."""
    ts = meta.get("timestamp")
    return {"timestamp": ts} if isinstance(ts, datetime) else {}


def _response_back(message: dict[str, Any], meta: dict[str, Any], mark: dict[str, Any]) -> ModelResponse:
    parts: list[ModelResponsePart] = []
    detail = meta.get("thinking") or []
    blocks = message.get("thinking_blocks")
    if isinstance(blocks, list) and blocks:
        for i, block in enumerate(b for b in blocks if isinstance(b, dict)):
            extra = detail[i] if i < len(detail) and isinstance(detail[i], dict) else {}
            parts.append(
                ThinkingPart(
                    content=str(block.get("thinking") or ""),
                    signature=block.get("signature"),
                    id=extra.get("id"),
                    provider_name=extra.get("provider_name"),
                )
            )
    elif isinstance(message.get("reasoning_content"), str) and message["reasoning_content"]:
        extra = detail[0] if detail and isinstance(detail[0], dict) else {}
        parts.append(
            ThinkingPart(
                content=message["reasoning_content"],
                id=extra.get("id"),
                provider_name=extra.get("provider_name"),
            )
        )
    text = text_of(message.get("content")) or (message.get("refusal") or "")
    if text:
        parts.append(TextPart(content=text))
    for call in message.get("tool_calls") or ():
        body = call.get("function") or call.get("custom") or {}
        args = body.get("arguments", body.get("input"))
        parts.append(ToolCallPart(tool_name=body.get("name", ""), args=args or None, tool_call_id=call["id"]))
    return ModelResponse(
        parts=parts, provider_name=meta.get("provider_name"), metadata=dict(mark), **_stamp(meta)
    )


def _request_part_back(
    message: dict[str, Any], meta: dict[str, Any], names: dict[str, str]
) -> ModelRequestPart:
    role = message.get("role")
    if role in ("system", "developer"):
        return SystemPromptPart(content=text_of(message.get("content")), **_stamp(meta))
    if role == "tool":
        call_id = str(message.get("tool_call_id"))
        content = meta["empty"] if isinstance(meta.get("empty"), str) else text_of(message.get("content"))
        name = meta.get("tool_name") or names.get(call_id) or "tool"
        return ToolReturnPart(tool_name=name, content=content, tool_call_id=call_id, **_stamp(meta))
    if role == "function":  # OpenAI's legacy function result: no call id to pair it with
        text = f"[{message.get('name')} returned] {text_of(message.get('content'))}"
        return UserPromptPart(content=text, **_stamp(meta))
    return UserPromptPart(content=_user_content_back(message.get("content")), **_stamp(meta))


def _from_entries(
    entries: Sequence[tuple[dict[str, Any], dict[str, Any]]], mark: dict[str, Any]
) -> list[ModelMessage]:
    names = tool_names([m for m, _ in entries])
    out: list[ModelMessage] = []
    pending: list[ModelRequestPart] = []
    for message, meta in entries:
        if message.get("role") == "assistant":
            if pending:
                out.append(ModelRequest(parts=pending, metadata=dict(mark)))
                pending = []
            out.append(_response_back(message, meta, mark))
        else:
            pending.append(_request_part_back(message, meta, names))
    if pending:
        out.append(ModelRequest(parts=pending, metadata=dict(mark)))
    return out


def from_openai(messages: Sequence[dict[str, Any]]) -> list[ModelMessage]:
    """pydantic-ai messages for OpenAI-format dicts (the inverse of :func:`to_openai`).

    Consecutive system, user and tool messages become one ``ModelRequest``, each assistant message
    a ``ModelResponse``; a tool result gets the name of the call it answers.
    """
    entries = [(dict(m), dict((m.get("metadata") or {}).get(META_KEY) or {})) for m in messages]
    return _from_entries(entries, {})


# -- the capability ----------------------------------------------------------------------------


def _marked(message: ModelMessage) -> bool:
    return bool(message.metadata and MARK in message.metadata)


def _mark(message: ModelMessage, conversation_id: str) -> None:
    message.metadata = {**(message.metadata or {}), MARK: {"conversation_id": conversation_id}}


@dataclass
class TieredHistory(AbstractCapability[Any]):
    """A pydantic-ai capability keeping the agent's conversation in ``compressor``.

    ``conversation_id``: a fixed id, a function of the run context (``lambda ctx: ctx.deps.chat_id``)
    or ``None`` (the default) for the id the run was given: ``agent.run(..., conversation_id=...)``.
    ``max_tokens``: the context's budget (default: the compressor's); instructions and tool
    definitions are sent beside it, so leave room for them. ``system_key``: the pin key the agent's
    system prompt is kept under. Works with :class:`~tiered_history.HistoryCompressor` and with
    :class:`~tiered_history.SyncHistoryCompressor` (its calls run in a worker thread).
    """

    compressor: Compressor
    conversation_id: ConversationIdSource = None
    _: KW_ONLY
    max_tokens: int | None = None
    system_key: str = SYSTEM_KEY

    def __post_init__(self) -> None:
        check_compressor(self.compressor)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds a live compressor: not constructible from an agent spec

    def resolve_conversation_id(self, ctx: RunContext[Any]) -> str:
        source = self.conversation_id
        if callable(source):
            return source(ctx)
        if source is not None:
            return source
        if ctx.conversation_id is None:
            raise ValueError("TieredHistory needs a conversation id: pass one to it or to agent.run()")
        return ctx.conversation_id

    async def _store_new(self, conversation_id: str, messages: Sequence[ModelMessage]) -> str | None:
        """Store the unmarked messages in one batch and mark them; return the newest system prompt
        among them (pinned first if the conversation is new, as it came first)."""
        system: list[str] = []
        batch: list[dict[str, Any]] = []
        new = [m for m in messages if not _marked(m)]
        for message in new:
            if isinstance(message, ModelRequest):
                prompts, stored, _ = _request_parts(message, timestamps=True)
                system = prompts or system
                batch.extend(stored)
            elif (reply := _response_message(message, timestamps=True)) is not None:
                batch.append(reply)
        prompt = "\n\n".join(system) if system else None
        if prompt is not None and not await exists(self.compressor, conversation_id):
            await pin(self.compressor, conversation_id, prompt, self.system_key)
        if batch:
            await add_messages(self.compressor, conversation_id, batch)
        for message in new:
            _mark(message, conversation_id)
        return prompt

    async def process(self, ctx: RunContext[Any], messages: list[ModelMessage]) -> list[ModelMessage]:
        """The history processor: store what is new, return the compressed context.

        Usable on its own as ``ProcessHistory(history.process)``, but then a run's final answer is
        stored only if the next run passes it back in ``message_history``: prefer the capability.
        """
        conversation_id = self.resolve_conversation_id(ctx)
        system = await self._store_new(conversation_id, messages)
        context = await context_with_pin(
            self.compressor, conversation_id, self.max_tokens, system, self.system_key
        )
        out = _from_entries(context_entries(context), {MARK: {"conversation_id": conversation_id}})
        newest = messages[-1] if messages else None
        if isinstance(newest, ModelRequest):
            # The request being sent keeps its own fields (instructions, run id) and the parts that
            # are not history (request-scoped prompts, bookkeeping).
            rest = _request_parts(newest, timestamps=False)[2]
            if out and isinstance(out[-1], ModelRequest):
                out[-1] = replace(newest, parts=[*out[-1].parts, *rest])
            elif rest:
                out.append(replace(newest, parts=rest))
        return out

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        messages = await self.process(ctx, list(request_context.messages))
        request_context.messages = messages.copy()
        ctx.messages[:] = messages
        return request_context

    async def after_run(self, ctx: RunContext[Any], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        messages = list(result.all_messages())
        await self._store_new(self.resolve_conversation_id(ctx), messages + _output_returns(result, messages))
        return result


#: What pydantic-ai answers an output tool's call with (``_tool_execution._FINAL_RESULT_PROCESSED``).
FINAL_RESULT_PROCESSED = "Final result processed."
#: What it answers the other calls of that response with.
NOT_EXECUTED = "Tool not executed - a final result was already processed."


def _output_returns(result: AgentRunResult[Any], messages: Sequence[ModelMessage]) -> list[ModelMessage]:
    """The output tool's return a streamed run adds only after ``after_run`` (``run_stream``): stored
    without it, the final call would stand unanswered, and an unanswered call is never sent again,
    so the run's answer would be missing from every later context."""
    name = getattr(result, "_output_tool_name", None)
    last = messages[-1] if messages else None
    if not isinstance(name, str) or not isinstance(last, ModelResponse):
        return []
    calls = [p for p in last.parts if isinstance(p, ToolCallPart)]
    if not any(c.tool_name == name for c in calls):
        return []
    # The other calls of that response are not run once the output is final: answered as
    # pydantic-ai answers them, so that the unit is whole.
    parts: list[ModelRequestPart] = [
        ToolReturnPart(
            tool_name=c.tool_name,
            content=FINAL_RESULT_PROCESSED if c.tool_name == name else NOT_EXECUTED,
            tool_call_id=c.tool_call_id,
        )
        for c in calls
    ]
    return [ModelRequest(parts=parts)]
