"""``python -m tiered_history``: the same command line as ``tiered-history``."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    main()
