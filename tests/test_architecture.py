"""Checks that keep the layout as it is meant to be (issue 12).

- every public method of the async compressor has a blocking twin with the same signature and docs;
- the pure core imports no I/O layer (store, service, CLI, sqlalchemy, asyncio...);
- nothing on the reply path imports litellm (it takes seconds and may reach the network).
"""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import tiered_history
from tiered_history import HistoryCompressor, SyncHistoryCompressor

PACKAGE = Path(tiered_history.__file__).parent
#: What the pure core must never reach, directly or through the package modules it imports.
FORBIDDEN = {
    "sqlalchemy",
    "asyncio",
    "psycopg",
    "sqlite3",
    "litellm",
    "socket",
    "threading",
    "subprocess",
    "tiered_history.store",
    "tiered_history.service",
    "tiered_history.compressor",
    "tiered_history.sync",
    "tiered_history.maintenance",
    "tiered_history.scheduler",
    "tiered_history.cli",
    "tiered_history.summarizers",
}


def _public_methods(cls: type) -> dict[str, object]:
    return {
        name: value
        for name, value in vars(cls).items()
        if callable(value) and not name.startswith("_") and name != "from_url"
    }


def test_every_async_method_has_a_blocking_twin_with_the_same_signature_and_docs() -> None:
    async_methods = _public_methods(HistoryCompressor)
    sync_methods = _public_methods(SyncHistoryCompressor)
    assert set(async_methods) == set(sync_methods)
    assert len(async_methods) >= 18
    for name, fn in async_methods.items():
        twin = sync_methods[name]
        assert inspect.iscoroutinefunction(fn), name
        assert not inspect.iscoroutinefunction(twin), name
        a, s = inspect.signature(fn), inspect.signature(twin)  # type: ignore[arg-type]
        assert list(a.parameters.values()) == list(s.parameters.values()), name
        assert a.return_annotation == s.return_annotation, name
        assert fn.__doc__ and fn.__doc__ == twin.__doc__, name


def _module_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved)."""
    module = _module_of(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rsplit(".", 1)[0]
            name = node.module or ""
            full = f"{base}.{name}".strip(".") if node.level else name
            out.add(full)
            out.update(f"{full}.{alias.name}" for alias in node.names)
    return out


def _file_of(module: str) -> Path | None:
    if not module.startswith("tiered_history"):
        return None
    rel = Path(*module.split(".")[1:])
    for candidate in (PACKAGE / rel.with_suffix(".py"), PACKAGE / rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def test_the_core_imports_no_io_layer() -> None:
    start = sorted((PACKAGE / "core").glob("*.py"))
    seen: set[Path] = set()
    todo = list(start)
    reached: dict[str, Path] = {}
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imports(path):
            reached.setdefault(name, path)
            found = _file_of(name)
            if found is not None and found not in seen:
                todo.append(found)
    bad = {
        name: str(path.relative_to(PACKAGE))
        for name, path in reached.items()
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)
    }
    assert bad == {}
    assert len(seen) >= 8  # the walk really read the core


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_get_context_never_imports_litellm(tmp_path: Path, store: str) -> None:
    # A fresh interpreter and (for SQLite) a fresh database file: the process's very first calls.
    url = "memory://" if store == "memory" else f"sqlite:///{tmp_path / 'h.db'}"
    code = """
import asyncio, sys, time
from tiered_history import HistoryCompressor

async def main():
    async with HistoryCompressor.from_url(sys.argv[1], model="gpt-4o-mini") as hc:
        await hc.add_message("c", {"role": "user", "content": "hi"})
        started = time.perf_counter()
        ctx = await hc.get_context("c")
        took = time.perf_counter() - started
    assert "litellm" not in sys.modules, "the reply path imported litellm"
    assert ctx.max_tokens > 100_000, ctx.max_tokens  # gpt-4o-mini's window, from litellm's table
    print(round(took * 1000, 1))

asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def _module_graph() -> dict[Path, set[Path]]:
    """Each module of the package and the package modules it imports (a package's ``__init__``
    only through an import of the package itself, so re-exports do not count as cycles)."""
    graph: dict[Path, set[Path]] = {}
    for path in PACKAGE.rglob("*.py"):
        targets = {_file_of(name) for name in _imports(path) if name != "tiered_history"}
        graph[path] = {t for t in targets if t is not None and t != path and t.name != "__init__.py"}
    return graph


def _cycle(graph: dict[Path, set[Path]]) -> list[Path]:
    """One import cycle among the package's modules, or []."""
    state: dict[Path, int] = {}
    stack: list[Path] = []

    def visit(p: Path) -> list[Path]:
        state[p] = 1
        stack.append(p)
        for q in sorted(graph.get(p, ())):
            if state.get(q) == 1:
                return [*stack[stack.index(q) :], q]
            if q not in state and (found := visit(q)):
                return found
        stack.pop()
        state[p] = 2
        return []

    for p in sorted(graph):
        if p not in state and (found := visit(p)):
            return found
    return []


def test_no_import_circle_between_the_package_modules() -> None:
    graph = _module_graph()
    assert len(graph) >= 40  # the walk really read the package
    cycle = _cycle(graph)
    assert cycle == [], " -> ".join(str(p.relative_to(PACKAGE)) for p in cycle)
    # The check is live: a module importing its importer is found.
    a, b = PACKAGE / "database.py", PACKAGE / "store" / "dialect.py"
    assert _cycle({**graph, b: {*graph[b], a}})
