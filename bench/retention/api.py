"""What the installed tiered_history offers: the benchmark picks up newer features when they exist.

The context assembly of issue 13 adds a ``recall`` setting, a ``query=`` keyword on
``get_context`` and ``CompressedContext.maintenance_epoch``. Each is probed here, once,
so the harness runs against the library as it is today (rows that need a missing
feature are reported as n/a) and uses the feature as soon as it lands.
"""

from __future__ import annotations

import inspect
from typing import Any

from tiered_history import CompressedContext, HistoryCompressor, Settings

#: ``Settings.recall`` exists (``{"enabled": bool, "share": float}``).
HAS_RECALL: bool = "recall" in Settings.model_fields
#: ``get_context(..., query=...)`` exists. The benchmark does not pass it (the query is the
#: newest user message, as a bot would store it); recorded in the report only.
HAS_QUERY_ARG: bool = "query" in inspect.signature(HistoryCompressor.get_context).parameters


def recall_overrides(enabled: bool) -> dict[str, Any] | None:
    """Settings overrides for recall on or off; ``None`` when recall on is asked of a library without it.

    Without the setting the library has no recall at all, which is what "off" means.
    """
    if not HAS_RECALL:
        return None if enabled else {}
    return {"recall": {"enabled": enabled}}


def maintenance_epoch(ctx: CompressedContext) -> int | None:
    """``ctx.maintenance_epoch`` when the library exposes it."""
    value = getattr(ctx, "maintenance_epoch", None)
    return value if isinstance(value, int) else None


def recall_start(ctx: CompressedContext) -> int | None:
    """Index in ``ctx.to_messages()`` where the per-turn recall part starts, if the library says.

    Read from ``ctx.recall_start`` (an ``int``) when present; the cached-prefix part then
    checks that nothing before it changes between turns without a maintenance event.
    Without it the whole context counts (with recall on, recall changes then count too).
    """
    value = getattr(ctx, "recall_start", None)
    return value if isinstance(value, int) else None


def describe() -> str:
    """One line for the report: which of the new features this run used."""
    fields = getattr(CompressedContext, "__dataclass_fields__", {})
    epoch, start = "maintenance_epoch" in fields, hasattr(CompressedContext, "recall_start")
    return (
        f"recall setting {'present' if HAS_RECALL else 'absent (recall-on rows are n/a)'}; "
        f"get_context(query=) {'present (not passed)' if HAS_QUERY_ARG else 'absent'}; "
        f"CompressedContext.maintenance_epoch {'present' if epoch else 'absent (stats() counters used)'}; "
        f"CompressedContext.recall_start {'present' if start else 'absent (the whole context is checked)'}"
    )
