"""Model facts from litellm's bundled tables (imported lazily: it is slow to import)."""

from __future__ import annotations

import os
from functools import lru_cache


@lru_cache(maxsize=32)
def input_window(model: str) -> int | None:
    """The model's input window in tokens, or None when litellm does not know the model."""
    if model.endswith("_base"):  # a tiktoken encoding name, not a model
        return None
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import litellm

        info = litellm.get_model_info(model)
    except Exception:
        return None
    value = info.get("max_input_tokens") or info.get("max_tokens")
    return int(value) if value else None
