"""Retention, speed and cost of tiered_history against peers on QMSum meetings.

    python -m bench.retention [--split test] [--limit N] [--budgets 1000,2000,4000,8000]
                              [--out docs/benchmarks.md] [--plot docs/retention.png]

Modules: :mod:`.data` (QMSum loading, the retention metric), :mod:`.peers` (token
counters and the peer systems), :mod:`.replay` (one meeting through every system),
:mod:`.speed` (latency, throughput), :mod:`.report` (markdown and plot).
"""
