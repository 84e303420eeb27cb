"""Tool units: a call and the results that answer it, kept or dropped together. No I/O.

Two wire shapes make a unit:

* an assistant message with ``tool_calls`` and the ``role: "tool"`` results naming their ids;
* OpenAI's legacy function calling: an assistant message with ``function_call`` and the
  ``role: "function"`` result after it, naming the function (one call, one result).

A legacy call has no id: :func:`legacy_call_id` gives it one from the function's name, so that
the conversation state tracks both shapes as open calls alike (a seal never falls inside a unit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..models import StoredMessage

#: Prefix of the id a legacy function call is tracked under (never sent: ids stay ours).
LEGACY_CALL = "function_call:"
#: Roles of a call's result (a tool result, a legacy function result): never the start of a unit.
RESULT_ROLES = ("tool", "function")


def legacy_call_id(name: str | None) -> str:
    """The id an open legacy ``function_call`` of ``name`` is tracked under."""
    return f"{LEGACY_CALL}{name or ''}"


def legacy_call(wire: Mapping[str, Any] | None) -> str | None:
    """The id a message's legacy ``function_call`` is tracked under (None: it makes no such call)."""
    call = wire.get("function_call") if wire else None
    return legacy_call_id(str(call.get("name", ""))) if isinstance(call, Mapping) else None


def calls_of(m: StoredMessage) -> set[str]:
    """Ids of the calls ``m`` makes (its tool calls', or its legacy function call's)."""
    if m.tool_calls:
        return {str(c.get("id")) for c in m.tool_calls}
    if m.extra is not None and m.role == "assistant":
        call = legacy_call(m.extra)
        if call is not None:
            return {call}
    return set()


def answers(m: StoredMessage) -> str | None:
    """The id of the call result ``m`` answers (None: it is no result)."""
    if m.role == "tool":
        return str(m.tool_call_id)
    if m.role == "function":
        return legacy_call_id(m.name)
    return None


def in_unit(m: StoredMessage) -> bool:
    """``m`` makes a call or is a call's result."""
    return m.role in RESULT_ROLES or bool(calls_of(m))


def group_units(
    messages_oldest_first: Sequence[StoredMessage], open_end: bool = True
) -> list[list[StoredMessage]]:
    """Group messages into units that must be kept or dropped together.

    A call and the results that answer it form one unit; every other message is a unit of its
    own. Sent without all of its parts a unit is a 400 from the provider, so incomplete units are
    left out: results whose call was cut off by paging, and calls abandoned without results. Only
    the newest unit may still await results (the bot is running the tools right now), unless
    ``open_end`` is false (a sealed range). A legacy function result with no call before it at all
    (a bot that sends them on their own) stays a message of its own, as it was stored; at the
    start of the messages its call may lie before them, so it is left out there.
    """
    units: list[list[StoredMessage]] = []
    awaiting: dict[int, set[str]] = {}  # unit index -> ids of its calls not answered yet
    pending: set[str] = set()
    for m in messages_oldest_first:
        role = m.role
        if role == "tool":
            if m.tool_call_id in pending:
                units[-1].append(m)
                pending.discard(str(m.tool_call_id))
            continue
        if role == "function":
            key = legacy_call_id(m.name)
            if key in pending:
                units[-1].append(m)
                pending.discard(key)
                continue
            if not units:
                continue  # its call may be before the first message read
        units.append([m])
        if m.tool_calls:
            pending = awaiting[len(units) - 1] = {str(c.get("id")) for c in m.tool_calls}
        elif m.extra is not None and role == "assistant" and "function_call" in m.extra:
            pending = awaiting[len(units) - 1] = calls_of(m)
        elif pending:
            pending = set()
    # Runs on every read over the whole window: most windows hold no unanswered call at all.
    last = len(units) - 1 if open_end else -1
    if not any(ids for i, ids in awaiting.items() if i != last):
        return units
    return [u for i, u in enumerate(units) if i == last or not awaiting.get(i)]


#: Largest tool unit recall completes (a call with this many results around a hit).
MAX_UNIT = 32


def unit_of(hit: StoredMessage, around: Mapping[int, StoredMessage]) -> tuple[StoredMessage, ...]:
    """The whole unit ``hit`` belongs to (the call and all its results), or () if incomplete.

    ``around`` holds the messages near it by sequence (:data:`MAX_UNIT` either side)."""
    seq = hit.sequence
    if hit.role == "function":
        call = around.get(seq - 1)
        if call is None or answers(hit) not in calls_of(call):
            return (hit,)  # sent on its own (no call before it): a message of its own, as in a window
        return (call, hit)
    if hit.role == "tool":
        while seq in around and around[seq].role == "tool":
            seq -= 1
        call = around.get(seq)
    else:
        call = hit
    wanted = calls_of(call) if call is not None else set()
    if call is None or not wanted:
        return ()
    unit = [call]
    nxt = call.sequence + 1
    while wanted and nxt in around and (key := answers(around[nxt])) in wanted:
        wanted.discard(str(key))
        unit.append(around[nxt])
        nxt += 1
    return tuple(unit) if not wanted else ()
