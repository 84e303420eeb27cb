"""Adapters for agent frameworks, each an optional extra imported explicitly.

* :mod:`tiered_history.integrations.pydantic_ai` (``pip install "tiered-history[pydantic-ai]"``):
  :class:`~tiered_history.integrations.pydantic_ai.TieredHistory`, a pydantic-ai capability whose
  history processor stores each run's messages in a compressor and sends the model the compressed
  context instead of the full history.
* :mod:`tiered_history.integrations.langchain` (``pip install "tiered-history[langchain]"``):
  :class:`~tiered_history.integrations.langchain.TieredChatMessageHistory`, a LangChain
  ``BaseChatMessageHistory`` whose ``messages`` are the compressed context, and
  :func:`~tiered_history.integrations.langchain.compressed_context`, a runnable for LCEL chains.

Importing this package imports neither framework; ``import tiered_history`` does not import it.
"""
