"""What tiered_history keeps of a long conversation, against peers, on QMSum meetings.

    python -m bench.retention [--split test] [--limit N] [--budgets 1000,2000,4000,8000]
                              [--only query|static|prefix] [--quick] [--store memory|sqlite]
                              [--out docs/benchmarks.md] [--plot docs/retention.png]

Three parts, each its own section of the benchmarks document:

- query retention: each QMSum specific query stored as the newest user message after
  the meeting; the share of its evidence words in the context (ours, recency, a BM25
  retrieval baseline, pydantic-ai's summarisation processor);
- static retention: the context at the end of the meeting, no query (plus summariser
  cost and per-call speed);
- cached-prefix share: how much of each turn's context repeats the previous one's prefix
  over a long replay with maintenance running, beside "append, then drop the oldest half".

Modules: :mod:`.data` (QMSum loading, the retention metric), :mod:`.api` (probes for
library features), :mod:`.systems` (one class per system, the registry),
:mod:`.bm25` (the retrieval baseline), :mod:`.peers` (token counters, peer adapters),
:mod:`.replay` (one meeting through every system), :mod:`.prefix` (the cached-prefix
replay), :mod:`.speed` (latency, throughput), :mod:`.report` and :mod:`.render`
(tables, sections, plot).
"""
