"""Test helpers for users of tiered-history (needs pytest).

* :class:`StoreConformance`: the storage contract's conformance suite. A third-party backend
  subclasses it in a test module and provides a ``store`` fixture; every test then runs
  against that backend. tiered-history runs it on its own three backends in CI.
* :class:`ScriptedSummarizer`: a summariser that returns the texts you give it and records
  what it was asked, for testing a bot without a model.
"""

from __future__ import annotations

from .conformance import StoreConformance
from .summarizer import ScriptedSummarizer

__all__ = ["ScriptedSummarizer", "StoreConformance"]
