"""Start-up cost: import time and a process's first calls, each beside its floor in the same run.

    python -m bench.startup [--runs 5] [--model gpt-4o-mini] [--out FILE]

Every figure is the median over ``--runs`` fresh interpreters, run in turn with their floor so
that load on the machine weighs on both alike.

- **Import**: wall time of a whole ``python -c "<statement>"`` process, timed by the parent,
  beside ``python -c pass`` (the interpreter's floor). The bytecode is cached (as in an installed
  package: pip compiles it): the children write it under a temporary ``PYTHONPYCACHEPREFIX``,
  warmed by one untimed run. One row repeats the compressor's import with the bytecode compiled
  afresh each time (``PYTHONDONTWRITEBYTECODE=1``, as in this project's dev environment, where
  ``-X importtime`` therefore shows our modules several times slower than installed).
- **First calls**: a fresh interpreter opens a new SQLite database file with ``--model`` (a model
  litellm's table knows: its context window is read from litellm's bundled JSON, litellm is never
  imported), adds one message (this first call migrates the new database) and asks for the
  context twice; a second fresh interpreter is a restart on that database: it asks for the
  context first. Each call is timed inside the child. The floor is a bare ``sqlite3`` connect and
  SELECT on the same file, in a fresh interpreter too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._common import REPO, git_revision, log, machine, table, update_section

DEPENDENCIES = "import asyncio, pydantic\nclass M(pydantic.BaseModel):\n    x: int = 0"
IMPORTS: list[tuple[str, str]] = [
    ("interpreter floor", "pass"),
    ("package", "import tiered_history"),
    ("what a bot imports", "from tiered_history import HistoryCompressor"),
    # pydantic loads most of itself when the first model class is built, hence the class.
    ("floor of its dependencies: asyncio, pydantic and one model", DEPENDENCIES),
]

FIRST_CALLS = """
import json, sys, time
t0 = time.perf_counter()
import asyncio
from tiered_history import HistoryCompressor
t_import = time.perf_counter() - t0

async def main(url, model, restart):
    out = {"import": t_import}
    t = time.perf_counter()
    hc = HistoryCompressor.from_url(url, model=model)
    out["construct"] = time.perf_counter() - t
    if not restart:
        t = time.perf_counter()
        await hc.add_message("c", {"role": "user", "content": "Hello, what can you do?"})
        out["first add_message"] = time.perf_counter() - t
    t = time.perf_counter()
    ctx = await hc.get_context("c")
    out["first get_context"] = time.perf_counter() - t
    t = time.perf_counter()
    await hc.get_context("c")
    out["second get_context"] = time.perf_counter() - t
    await hc.close()
    out["process"] = time.perf_counter() - t0
    out["max_tokens"] = ctx.max_tokens
    out["modules"] = sorted(m for m in ("litellm", "alembic") if m in sys.modules)
    print(json.dumps(out))

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] == "restart"))
"""

FLOORS = """
import json, sys, time
import sqlite3
out = {}
t = time.perf_counter()
con = sqlite3.connect(sys.argv[1])
con.execute("SELECT count(*) FROM sqlite_master").fetchall()
out["connect+select"] = time.perf_counter() - t
con.close()
# What constructing a compressor cannot avoid: the model's tokenizer and SQLAlchemy with an engine.
from tiered_history.tokens import _point_tiktoken_at_litellm_copy, encoding_name_for
t = time.perf_counter()
import tiktoken
_point_tiktoken_at_litellm_copy()
tiktoken.get_encoding(encoding_name_for(sys.argv[2]))
out["tokenizer"] = time.perf_counter() - t
t = time.perf_counter()
import sqlalchemy
with sqlalchemy.create_engine("sqlite:///" + sys.argv[1]).connect() as c:
    c.exec_driver_sql("SELECT 1").fetchall()
out["sqlalchemy"] = time.perf_counter() - t
print(json.dumps(out))
"""


def _env(cache: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(REPO)
    if cache is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    else:
        env["PYTHONPYCACHEPREFIX"] = str(cache)
    return env


def _process_ms(code: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, check=True)
    return (time.perf_counter() - start) * 1000


def _child(code: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, cwd=REPO, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def heaviest_imports(statement: str, env: dict[str, str], top: int = 6) -> str:
    """Where the statement's import time goes by ``-X importtime`` (one run): the self time of
    this package's modules together, then of the heaviest other top-level packages."""
    prof = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    by_package: dict[str, int] = {}
    for line in prof.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            package = parts[2].strip().split(".")[0]
            self_us = int(parts[0].split(":")[1])
            by_package[package] = by_package.get(package, 0) + self_us
    ours = by_package.pop("tiered_history", 0)
    heavy = sorted(by_package.items(), key=lambda kv: -kv[1])[:top]
    return (
        f"tiered_history's own module bodies (dataclasses, regexes, pydantic models) {ours / 1000:.0f} ms; "
        + ", ".join(f"{n} {us / 1000:.0f} ms" for n, us in heavy)
    )


def measure_imports(runs: int, cache: Path) -> tuple[dict[str, list[float]], list[float]]:
    cached, fresh = _env(cache), _env(None)
    for _, code in IMPORTS:
        _process_ms(code, cached)  # writes the bytecode
    samples: dict[str, list[float]] = {code: [] for _, code in IMPORTS}
    uncached: list[float] = []
    for _ in range(runs):
        for _, code in IMPORTS:
            samples[code].append(_process_ms(code, cached))
        uncached.append(_process_ms(IMPORTS[2][1], fresh))
    return samples, uncached


def measure_first_calls(runs: int, model: str, cache: Path) -> dict[str, dict[str, list[Any]]]:
    env = _env(cache)
    out: dict[str, dict[str, list[Any]]] = {"new database": {}, "restart": {}, "floor": {}}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        for i in range(runs + 1):  # run 0 warms the bytecode cache, untimed
            db = Path(tmp) / f"h{i}.db"
            url = f"sqlite:///{db}"
            new = _child(FIRST_CALLS, [url, model, "new"], env)
            restart = _child(FIRST_CALLS, [url, model, "restart"], env)
            floor = _child(FLOORS, [str(db), model], env)
            if i == 0:
                continue
            for name, result in (("new database", new), ("restart", restart), ("floor", floor)):
                for key, value in result.items():
                    out[name].setdefault(key, []).append(value)
    return out


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f}"


def render(
    imports: dict[str, list[float]],
    uncached: list[float],
    heavy: str,
    calls: dict[str, dict[str, list[Any]]],
    args: argparse.Namespace,
) -> str:
    floor = statistics.median(imports["pass"])
    rows = []
    for what, code in IMPORTS:
        med = statistics.median(imports[code])
        shown = (
            "`import asyncio, pydantic; class M(pydantic.BaseModel): ...`"
            if code == DEPENDENCIES
            else f"`{code}`"
        )
        rows.append([shown, what, f"{med:.0f}", "-" if code == "pass" else f"{med - floor:.0f}"])
    med = statistics.median(uncached)
    rows.append(
        [
            f"`{IMPORTS[2][1]}`",
            "bytecode compiled afresh (PYTHONDONTWRITEBYTECODE=1)",
            f"{med:.0f}",
            f"{med - floor:.0f}",
        ]
    )
    new, restart, floors = calls["new database"], calls["restart"], calls["floor"]

    def modules(runs: list[list[str]]) -> str:
        return ", ".join(sorted({m for ms in runs for m in ms})) or "none"

    call_rows = [
        [
            "`import asyncio; from tiered_history import HistoryCompressor`",
            _ms(new["import"]),
            _ms(restart["import"]),
        ],
        ["construct (`from_url`)", _ms(new["construct"]), _ms(restart["construct"])],
        [
            "*floor: load the model's tokenizer + import SQLAlchemy, engine, SELECT 1*",
            f"{_ms(floors['tokenizer'])} + {_ms(floors['sqlalchemy'])}",
            "same",
        ],
        ["first `add_message` (migrates the new database)", _ms(new["first add_message"]), "-"],
        ["**first `get_context`**", _ms(new["first get_context"]), _ms(restart["first get_context"])],
        ["*floor: bare `sqlite3` connect + SELECT*", _ms(floors["connect+select"]), "same"],
        ["second `get_context`", _ms(new["second get_context"]), _ms(restart["second get_context"])],
        ["whole process after the interpreter's start", _ms(new["process"]), _ms(restart["process"])],
        ["litellm / alembic imported", modules(new["modules"]), modules(restart["modules"])],
    ]
    lines = [
        "### Start-up",
        "",
        f"- Machine: {machine()}",
        f"- Library: git {git_revision()}",
        f"- Command: `python -m bench.startup --runs {args.runs} --model {args.model}`; medians of "
        f"{args.runs} fresh interpreters, each beside its floor in the same run.",
        "",
        "Import: wall time of the whole `python -c` process (bytecode cached, as installed).",
        "",
        table(["statement", "what", "process (ms)", "minus interpreter floor (ms)"], rows),
        "",
        f"Import time of `{IMPORTS[2][1]}` by package (`-X importtime` self times, one run): {heavy}.",
        "",
        f"A process's first calls on SQLite, model `{args.model}` (context window "
        f"{new['max_tokens'][0]:,} tokens from litellm's bundled table), timed inside the process (ms):",
        "",
        table(["step", "new database file", "restart on it"], call_rows),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--runs", type=int, default=5, help="fresh interpreters per figure")
    p.add_argument("--model", default="gpt-4o-mini", help="a model litellm's table knows")
    p.add_argument("--out", type=Path, help="update the startup section of this markdown file")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-pyc-") as cache:
        log("import times...")
        imports, uncached = measure_imports(args.runs, Path(cache))
        heavy = heaviest_imports(IMPORTS[2][1], _env(Path(cache)))
        log("first calls...")
        calls = measure_first_calls(args.runs, args.model, Path(cache))
    md = render(imports, uncached, heavy, calls, args)
    if args.out:
        update_section(args.out, "startup", md)
        log(f"updated {args.out}")
    else:
        print(md)


if __name__ == "__main__":
    main()
