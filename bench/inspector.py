"""How fast the web inspector serves a 100k-message conversation.

One conversation is filled through ``add_messages`` (batches of 1,000) with real meeting turns
(QMSum's training transcripts, cycled, 20 s apart and ending now), ``maintain()`` writes its
topic summaries and archives, then the inspector is served by uvicorn on 127.0.0.1 and each
page is fetched over HTTP ``--repeat`` times after one warm-up. Beside it: ``get_context`` and
``stats`` alone, the library calls the page is built on. Usage (from the repository root)::

    python -m bench.inspector [--messages 100000] [--database-url URL] [--repeat 7] [--out FILE]

Without ``--database-url`` a temporary SQLite file is used; a PostgreSQL URL is used as given
(the conversation ``bench-inspector`` in it is replaced).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlencode

if __package__ in (None, ""):  # run as ``python bench/inspector.py``
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx
import uvicorn

from bench._common import REPO, git_revision, machine, table, update_section
from tiered_history import ConversationStats, HistoryCompressor
from tiered_history.database import mask_url
from tiered_history.web import create_app

DATA = REPO.parent / "shared" / "data" / "qmsum" / "train"
CONVERSATION = "bench-inspector"
BATCH = 1_000


def turns() -> list[str]:
    """Every non-empty turn of QMSum's training meetings, as "Speaker: text"."""
    out: list[str] = []
    for path in sorted(DATA.glob("*.json")):
        for turn in json.loads(path.read_text(encoding="utf-8"))["meeting_transcripts"]:
            text = " ".join(str(turn.get("content", "")).split())
            if text:
                out.append(f"{turn.get('speaker', '?')}: {text}")
    if not out:
        raise SystemExit(f"no transcripts under {DATA}")
    return out


async def fill(url: str, n: int) -> tuple[float, float, ConversationStats]:
    """Store ``n`` messages, then maintain: (seconds filling, seconds maintaining, its stats)."""
    texts = turns()
    start = datetime.now(UTC) - timedelta(seconds=20 * n)
    async with HistoryCompressor(url) as history:
        if await history.exists(CONVERSATION):
            await history.delete_conversation(CONVERSATION)
        began = time.perf_counter()
        for first in range(0, n, BATCH):
            batch = [
                {
                    "role": "user" if i % 2 == 0 else "assistant",
                    "content": texts[i % len(texts)],
                    "timestamp": start + timedelta(seconds=20 * i),
                }
                for i in range(first, min(n, first + BATCH))
            ]
            await history.add_messages(CONVERSATION, batch, platform="bench", channel="meetings")
        filled = time.perf_counter() - began
        began = time.perf_counter()
        for _ in range(20):  # until a pass finds nothing left to do
            report = await history.maintain(CONVERSATION)
            if not (report.sealed or report.summarized or report.merged or report.dropped):
                break
        maintained = time.perf_counter() - began
        return filled, maintained, (await history.stats(CONVERSATION))[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(url: str) -> Iterator[str]:
    """The inspector on a free loopback port, in a thread, for the duration of the block."""
    port = _free_port()
    config = uvicorn.Config(
        create_app(url), host="127.0.0.1", port=port, log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the inspector did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    fn()  # warm-up: caches, connections, templates
    out = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        out.append(time.perf_counter() - began)
    return out


async def timed_async(fn: Callable[[], Awaitable[object]], repeat: int) -> list[float]:
    await fn()
    out = []
    for _ in range(repeat):
        began = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - began)
    return out


async def library_times(url: str, budget: int, repeat: int) -> dict[str, list[float]]:
    async with HistoryCompressor(url) as history:
        return {
            f"get_context(max_tokens={budget})": await timed_async(
                lambda: history.get_context(CONVERSATION, budget), repeat
            ),
            "stats(conversation)": await timed_async(lambda: history.stats(CONVERSATION), repeat),
        }


def ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:.0f} ms (max {max(samples) * 1000:.0f})"


def run(url: str, n: int, repeat: int) -> str:
    filled, maintained, stats = asyncio.run(fill(url, n))
    shape = (
        f"{stats.messages:,} messages, {stats.message_tokens:,} tokens, {stats.topics:,} topics, "
        f"{stats.archives:,} archives"
    )
    print(f"filled in {filled:.1f} s, maintain() {maintained:.1f} s: {shape}", flush=True)
    budget = 8000
    rows: list[tuple[str, str, str]] = []
    with serving(url) as base, httpx.Client(base_url=base, timeout=60) as client:
        cid = urlencode({"id": CONVERSATION})
        pages = {
            "conversation page (default budget)": f"/conversation?{cid}",
            "conversation page, budget 32000": f"/conversation?{cid}&budget=32000",
            "context part (budget change)": f"/conversation/context?{cid}&budget=2000",
            "timeline, next page": f"/conversation/timeline?{cid}&before=500",
            "raw messages, one page": f"/conversation/messages?{cid}&first=50000&last=50200",
            "search within the conversation": f"/conversation/search?{cid}&q=remote%20control",
            "conversations list": "/",
        }
        for name, path in pages.items():
            sizes: list[int] = []

            def get(path: str = path, sizes: list[int] = sizes) -> None:
                response = client.get(path, headers={"accept": "text/html"})
                response.raise_for_status()
                sizes.append(len(response.content))

            samples = timed(get, repeat)
            rows.append((name, ms(samples), f"{sizes[-1] / 1024:.0f} KiB"))
            print(f"{name}: {ms(samples)}", flush=True)
    for name, samples in asyncio.run(library_times(url, budget, repeat)).items():
        rows.append((f"library: {name}", ms(samples), "–"))
        print(f"library {name}: {ms(samples)}", flush=True)
    head = (
        f"`python -m bench.inspector --messages {n}` on {mask_url(url).split(':')[0]}, "
        f"{shape}; median of {repeat} requests over loopback HTTP "
        f"after one warm-up. {machine()}; revision {git_revision()}."
    )
    return head + "\n\n" + table(["what", "time", "size"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--database-url", default=None, help="default: a temporary SQLite file")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--out", type=Path, default=None, help="markdown file to update (section 'inspector-<backend>')"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-inspector-") as folder:
        url = args.database_url or f"sqlite:///{Path(folder) / 'inspector.db'}"
        result = run(url, args.messages, args.repeat)
    print()
    print(result)
    if args.out is not None:  # one section per backend: inspector-sqlite, inspector-postgresql
        backend = "sqlite" if args.database_url is None else mask_url(args.database_url).split(":")[0]
        update_section(args.out, f"inspector-{backend.split('+')[0]}", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
