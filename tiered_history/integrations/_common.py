"""What the adapters share: one way to call either compressor from async code, and the pinned prompt.

Frameworks call their hooks from async code. An async :class:`~tiered_history.HistoryCompressor` is
awaited there; a blocking :class:`~tiered_history.SyncHistoryCompressor` runs in a worker thread so
its database calls never stall the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, TypeAlias

from ..compressor import HistoryCompressor
from ..errors import ConversationNotFoundError
from ..models import CompressedContext, StoredMessage
from ..sync import SyncHistoryCompressor

Compressor: TypeAlias = HistoryCompressor | SyncHistoryCompressor
#: The pin key the adapters keep a framework's system prompt under (see ``HistoryCompressor.pin``).
SYSTEM_KEY = "system"


def check_compressor(compressor: object) -> Compressor:
    if not isinstance(compressor, HistoryCompressor | SyncHistoryCompressor):
        raise TypeError(
            f"expected a HistoryCompressor or SyncHistoryCompressor, not {type(compressor).__name__}"
        )
    return compressor


def require_sync(compressor: Compressor, what: str) -> SyncHistoryCompressor:
    """The blocking compressor, for a framework's synchronous entry point."""
    if isinstance(compressor, SyncHistoryCompressor):
        return compressor
    raise TypeError(
        f"{what} is synchronous and needs a SyncHistoryCompressor; with a HistoryCompressor (async) "
        "use the framework's async calls (ainvoke, aget_messages, aadd_messages, aclear)"
    )


async def add_messages(
    compressor: Compressor,
    conversation_id: str,
    messages: Sequence[object],
    *,
    platform: str | None = None,
    channel: str | None = None,
    user_id: str | None = None,
) -> None:
    where = {"platform": platform, "channel": channel, "user_id": user_id}
    if isinstance(compressor, HistoryCompressor):
        await compressor.add_messages(conversation_id, messages, **where)
    else:
        await asyncio.to_thread(lambda: compressor.add_messages(conversation_id, messages, **where))


async def get_context(
    compressor: Compressor, conversation_id: str, max_tokens: int | None
) -> CompressedContext:
    if isinstance(compressor, HistoryCompressor):
        return await compressor.get_context(conversation_id, max_tokens)
    return await asyncio.to_thread(compressor.get_context, conversation_id, max_tokens)


async def pin(compressor: Compressor, conversation_id: str, text: str, key: str) -> None:
    message = {"role": "system", "content": text}
    if isinstance(compressor, HistoryCompressor):
        await compressor.pin(conversation_id, message, key=key)
    else:
        await asyncio.to_thread(compressor.pin, conversation_id, message, key=key)


async def exists(compressor: Compressor, conversation_id: str) -> bool:
    if isinstance(compressor, HistoryCompressor):
        return await compressor.exists(conversation_id)
    return await asyncio.to_thread(compressor.exists, conversation_id)


async def delete_conversation(compressor: Compressor, conversation_id: str) -> bool:
    if isinstance(compressor, HistoryCompressor):
        return await compressor.delete_conversation(conversation_id)
    return await asyncio.to_thread(compressor.delete_conversation, conversation_id)


def pinned_text(ctx: CompressedContext, key: str) -> str | None:
    """The text pinned under ``key`` in this context, if any."""
    return next((m.content for m in ctx.pinned if m.pin_key == key), None)


async def context_with_pin(
    compressor: Compressor, conversation_id: str, max_tokens: int | None, system_prompt: str | None, key: str
) -> CompressedContext:
    """The compressed context, after pinning ``system_prompt`` under ``key`` if it is not what is pinned.

    Comparing with the pin the context already carries costs nothing in the usual case and keeps
    one copy across restarts: a prompt is pinned again only when it changed (or the conversation
    was deleted), never on every run.
    """
    try:
        ctx: CompressedContext | None = await get_context(compressor, conversation_id, max_tokens)
    except ConversationNotFoundError:
        if system_prompt is None:
            raise
        ctx = None
    if system_prompt is not None and (ctx is None or pinned_text(ctx, key) != system_prompt):
        await pin(compressor, conversation_id, system_prompt, key)
        ctx = await get_context(compressor, conversation_id, max_tokens)
    assert ctx is not None
    return ctx


def context_with_pin_sync(
    compressor: SyncHistoryCompressor,
    conversation_id: str,
    max_tokens: int | None,
    system_prompt: str | None,
    key: str,
) -> CompressedContext:
    """:func:`context_with_pin` for a blocking compressor, on the caller's thread."""
    try:
        ctx: CompressedContext | None = compressor.get_context(conversation_id, max_tokens)
    except ConversationNotFoundError:
        if system_prompt is None:
            raise
        ctx = None
    if system_prompt is not None and (ctx is None or pinned_text(ctx, key) != system_prompt):
        compressor.pin(conversation_id, {"role": "system", "content": system_prompt}, key=key)
        ctx = compressor.get_context(conversation_id, max_tokens)
    assert ctx is not None
    return ctx


#: Key, in a stored message's ``metadata``, of what an adapter needs to rebuild its framework's
#: message and an OpenAI dict cannot carry (metadata is never sent to a provider).
META_KEY = "integration"
#: Stored instead of an empty tool result, which ``add_message`` refuses though frameworks produce
#: one (a tool that returns ``None``); the adapters give the framework back the empty string.
EMPTY_TOOL_RESULT = "(no output)"


def context_entries(ctx: CompressedContext) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``ctx.to_messages()``, each beside the adapter metadata of the message it came from and its
    ``timestamp`` (a tier block or the recall note: its newest item's). A test checks the order is
    ``to_messages()``'s."""

    def entry(m: StoredMessage) -> tuple[dict[str, Any], dict[str, Any]]:
        return m.to_openai(), {**(m.metadata.get(META_KEY) or {}), "timestamp": m.timestamp}

    entries = [entry(m) for m in ctx.pinned]
    for tier, items in (("bulk", ctx.bulk_archives), ("topic", ctx.historical_topics)):
        if ctx.blocks.get(tier):
            end = max((s.ended_at for s in items), default=None)
            entries.append(({"role": "user", "content": ctx.blocks[tier]}, {"timestamp": end}))
    entries.extend(entry(m) for m in ctx.current_topic[: ctx.recall_at])
    if ctx.recall_note:
        end = max((m.timestamp for m in ctx.recalled), default=None)
        entries.append(({"role": "user", "content": ctx.recall_note}, {"timestamp": end}))
        entries.extend(entry(m) for m in ctx.recalled)
    entries.extend(entry(m) for m in ctx.current_topic[ctx.recall_at :])
    return entries


def tool_result(content: str, tool_name: str | None) -> tuple[str, dict[str, Any]]:
    """The content to store for a tool result and its adapter metadata."""
    meta: dict[str, Any] = {} if tool_name is None else {"tool_name": tool_name}
    if not content.strip():
        meta["empty"] = content
        content = EMPTY_TOOL_RESULT
    return content, meta


def tool_names(messages: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Tool name of every call id in these OpenAI messages (OpenAI's tool results carry only the id)."""
    names: dict[str, str] = {}
    for message in messages:
        for call in message.get("tool_calls") or ():
            if isinstance(call, dict) and isinstance(call.get("id"), str):
                body = call.get("function") or call.get("custom") or {}
                name = body.get("name") if isinstance(body, dict) else None
                if isinstance(name, str):
                    names[call["id"]] = name
    return names


def text_of(content: object) -> str:
    """The text of an OpenAI ``content``: the string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""
