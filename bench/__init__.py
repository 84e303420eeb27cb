"""Benchmarks for tiered_history (not part of the installed package).

Run from the repository root:

    python -m bench.latency --backend all --sizes 1000,10000,100000
    python -m bench.boundaries
"""
