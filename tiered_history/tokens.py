"""Token counting with the model's real tokenizer, OpenAI chat framing included.

tiktoken normally downloads its BPE files; many servers (and CI) cannot. litellm
ships cl100k_base, o200k_base and p50k_base, so unless the user has set
``TIKTOKEN_CACHE_DIR`` we point tiktoken at that copy. Only the file system is
touched: litellm itself is not imported here (it is slow to import).
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import tiktoken

from .errors import ConfigurationError

#: Tokens OpenAI adds around every chat message.
TOKENS_PER_MESSAGE = 3
#: Extra token when a message carries a ``name``.
TOKENS_PER_NAME = 1
#: Tokens that prime the assistant's reply (``<|start|>assistant<|message|>``).
REPLY_PRIMING_TOKENS = 3

_SHIPPED = {"cl100k_base", "o200k_base", "p50k_base"}
_lock = threading.Lock()


def _point_tiktoken_at_litellm_copy() -> None:
    if os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR"):
        return
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "litellm_core_utils" / "tokenizers"
        if candidate.is_dir():
            os.environ["TIKTOKEN_CACHE_DIR"] = str(candidate)
            return


def encoding_name_for(model: str) -> str:
    """Map a model name (``gpt-4o``, ``openai/gpt-4o-mini``, ``cl100k_base``) to a tiktoken encoding."""
    if model in tiktoken.list_encoding_names() or model in _SHIPPED:
        return model
    bare = model.split("/")[-1]
    try:
        return tiktoken.encoding_name_for_model(bare)
    except KeyError:
        # Non-OpenAI models (Claude, Llama, Gemini...): cl100k_base is the closest
        # offline approximation; the budget keeps a safety margin for them.
        return "cl100k_base"


@lru_cache(maxsize=8)
def get_encoding(name: str) -> tiktoken.Encoding:
    with _lock:
        _point_tiktoken_at_litellm_copy()
        try:
            return tiktoken.get_encoding(name)
        except Exception as exc:  # tiktoken raises bare requests/OSError when offline
            raise ConfigurationError(
                f"cannot load tiktoken encoding {name!r} (offline and not cached; "
                "set TIKTOKEN_CACHE_DIR to a directory holding it)"
            ) from exc


class TokenCounter:
    """Counts tokens the way OpenAI's chat API bills them."""

    def __init__(self, model: str = "cl100k_base") -> None:
        self.model = model
        self.encoding_name = encoding_name_for(model)
        self._enc = get_encoding(self.encoding_name)

    def count(self, text: str) -> int:
        if not text:
            return 0
        return len(self._enc.encode(text, disallowed_special=()))

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(text, disallowed_special=())

    def decode(self, tokens: list[int]) -> str:
        return self._enc.decode(tokens)

    def message_tokens(self, message: Mapping[str, Any]) -> int:
        """Framed cost of one chat message dict (without the reply priming)."""
        total = TOKENS_PER_MESSAGE
        for key, value in message.items():
            if value is None:
                continue
            text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
            total += self.count(text)
            if key == "name":
                total += TOKENS_PER_NAME
        return total

    def messages_tokens(self, messages: Iterable[Mapping[str, Any]]) -> int:
        """Framed cost of a whole request: every message plus the reply priming."""
        return REPLY_PRIMING_TOKENS + sum(self.message_tokens(m) for m in messages)
