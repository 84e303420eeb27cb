"""Model facts (input windows) from the table litellm ships, read as a file: litellm is never imported.

Importing litellm takes seconds and may reach the network; reading its bundled JSON takes about
20 ms once, so the first ``get_context()`` without ``max_tokens`` stays fast.
"""

from __future__ import annotations

import importlib.util
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

_TABLE = "model_prices_and_context_window_backup.json"


@lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return {}
    for location in spec.submodule_search_locations:
        path = Path(location) / _TABLE
        if path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return {}
            return data if isinstance(data, dict) else {}
    return {}


@lru_cache(maxsize=64)
def input_window(model: str) -> int | None:
    """The model's input window in tokens, or None when the table does not know the model."""
    if model.endswith("_base"):  # a tiktoken encoding name, not a model
        return None
    table = _table()
    # litellm names models with or without their provider ("openai/gpt-4o-mini", "gpt-4o-mini").
    candidates = [model, model.split("/", 1)[-1]]
    for name in candidates:
        info = table.get(name)
        if isinstance(info, dict):
            value = info.get("max_input_tokens") or info.get("max_tokens")
            if isinstance(value, int) and value > 0:
                return value
    return None
