"""Chat framing: what a message costs around its content, and what counting a message needs.

The numbers are OpenAI's chat format (every other provider's framing costs no more), so a
budget checked with them holds when the request is sent. :class:`TokenCounting` is what the
core asks of a tokenizer; :class:`tiered_history.tokens.TokenCounter` implements it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

#: Tokens OpenAI adds around every chat message.
TOKENS_PER_MESSAGE = 3
#: Extra token when a message carries a ``name``.
TOKENS_PER_NAME = 1
#: Tokens that prime the assistant's reply (``<|start|>assistant<|message|>``).
REPLY_PRIMING_TOKENS = 3


class TokenCounting(Protocol):
    """Exact token counts with one model's tokenizer."""

    encoding_name: str

    def count(self, text: str) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, tokens: list[int]) -> str: ...

    def message_tokens(self, message: Mapping[str, Any]) -> int:
        """Framed cost of one chat message (without the reply priming)."""
        ...

    def messages_tokens(self, messages: Iterable[Mapping[str, Any]]) -> int:
        """Framed cost of a whole request: every message plus the reply priming."""
        ...
