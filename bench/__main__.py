"""Run every benchmark and rewrite docs/benchmarks.md: ``python -m bench`` (about 20 minutes on 2 cores).

Each step rewrites only its own marked section of the file; the load benchmark's printed
tables go into the ``load`` section.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ._common import update_section

DOC = Path("docs/benchmarks.md")

STEPS: list[list[str]] = [
    ["bench.latency", "--backend", "all", "--sizes", "1000,10000,100000", "--out", str(DOC)],
    ["bench.writes", "--out", str(DOC)],
    ["bench.boundaries", "--out", str(DOC)],
    ["bench.retention", "--out", str(DOC)],
    ["bench.retention", "--only", "prefix", "--prefix-data", "chat", "--out", str(DOC)],
    ["bench.chat_facts", "--out", str(DOC)],
    ["bench.llm_cost", "--out", str(DOC)],
    ["bench.inspector", "--messages", "100000", "--out", str(DOC)],
    ["bench.startup", "--out", str(DOC)],
]
LOAD = ["--conversations", "1000", "--clients", "4", "--workers", "2", "--seconds", "30"]


def main() -> int:
    for step in STEPS:
        print("==", " ".join(step), flush=True)
        subprocess.run([sys.executable, "-m", *step], check=True)
    tables = []
    for backend in ("postgresql", "sqlite"):
        cmd = [sys.executable, "-m", "bench.load", "--backend", backend, *LOAD]
        print("==", " ".join(cmd[2:]), flush=True)
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        print(done.stdout, flush=True)
        tables.append(f"`python -m bench.load --backend {backend} {' '.join(LOAD)}`\n\n{done.stdout.strip()}")
    update_section(DOC, "load", "\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
