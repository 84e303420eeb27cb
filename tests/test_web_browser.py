"""The web inspector in a real headless Chromium (Debian's ``chromium``), driven by Playwright.

Playwright only drives the system browser (``executable_path``): nothing is downloaded at test
time. Skipped locally when Chromium or Playwright is missing; under ``CI=true`` that fails instead
(``.ci/run`` installs Chromium). Screenshots go to ``$TIERED_HISTORY_SCREENSHOTS`` (a directory)
when it is set, else to the test's temporary directory.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.conftest import IN_CI

CHROMIUM = (
    os.environ.get("TIERED_HISTORY_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
)
HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"> <b>not bold</b>'
HOSTILE_ID = "hostile<i>id</i>"
CID = "discord:lena-trip"
CONV = f"/conversation?id={quote(CID, safe='')}"


def _require_browser() -> None:
    why = None
    try:
        import playwright.sync_api  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        why = f"playwright or uvicorn is not installed ({exc})"
    if why is None and not CHROMIUM:
        why = "no chromium on PATH (apt-get install chromium)"
    if why is not None:
        if IN_CI:
            pytest.fail(f"the browser tests must run in CI: {why}")
        pytest.skip(why)


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The bundled sample conversation (a trip, a traceback, a recipe, ...) replayed to end two
    minutes ago and maintained at a 2,000-token budget, as ``tiered-history demo`` does; two
    small conversations beside it, one of them hostile."""
    _require_browser()
    from importlib import resources

    from tiered_history import SyncHistoryCompressor
    from tiered_history.transcripts import read_transcript

    url = f"sqlite:///{tmp_path_factory.mktemp('browser') / 'inspector.db'}"
    with resources.as_file(resources.files("tiered_history") / "data" / "sample_conversation.jsonl") as path:
        entries = read_transcript(path)
    shift = datetime.now(UTC) - timedelta(minutes=2) - max(e.message.timestamp for e in entries)
    messages = [e.message.model_copy(update={"timestamp": e.message.timestamp + shift}) for e in entries]
    with SyncHistoryCompressor(url, context_budget=2000, summarizer={"kind": "extractive"}) as h:
        h.add_messages(CID, messages, platform="discord", channel="travel-help", user_id="lena")
        h.maintain(CID)
        now = datetime.now(UTC)
        h.add_message(
            "telegram:4711",
            {"role": "user", "content": "Remind me to water the tomatoes.", "timestamp": now},
            platform="telegram",
            channel="dm",
            user_id="4711",
        )
        h.add_message(HOSTILE_ID, {"role": "user", "content": HOSTILE, "timestamp": now}, platform="web")
    return url


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(database: str) -> Iterator[str]:
    """The inspector, writes on, served by uvicorn on a free loopback port."""
    import uvicorn

    from tiered_history.web import create_app, hosts_for

    port = _free_port()
    app = create_app(database, allow_writes=True, allowed_hosts=hosts_for("127.0.0.1"), database=database)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the inspector did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def browser(server: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any, server: str) -> Iterator[Any]:
    """A fresh browser tab that fails the test on any script error, console error or dialog."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=server)
    tab = context.new_page()
    problems: list[str] = []
    tab.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    tab.on("pageerror", lambda e: problems.append(f"page error: {e}"))

    def dialog(d: Any) -> None:
        problems.append(f"dialog: {d.message}")
        d.dismiss()

    tab.on("dialog", dialog)
    yield tab
    context.close()
    assert problems == []


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = os.environ.get("TIERED_HISTORY_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _bars(page: Any) -> list[tuple[str, str, str, str]]:
    return page.eval_on_selector_all(
        "svg.shares rect.fill",
        "els => els.map(e => [e.dataset.tier, e.dataset.used, e.dataset.allotted, e.getAttribute('width')])",
    )


def test_open_the_list_then_a_conversation(page: Any, shots: Path) -> None:
    page.goto("/")
    assert page.locator("tr.conversation").count() == 3
    row = page.locator("tr.conversation", has_text=CID)
    cells = row.locator("td").all_inner_texts()
    assert cells[:3] == [CID, "discord", "travel-help"] and int(cells[3].replace(",", "")) > 200  # messages
    assert int(cells[5]) > 3  # topics
    page.screenshot(path=str(shots / "inspector-list.png"))
    row.get_by_role("link", name=CID).click()
    page.wait_for_url(re.compile(r"/conversation\?id=discord%3Alena-trip$"))
    assert page.get_by_role("heading", name="What the model sees").is_visible()
    assert page.evaluate("typeof htmx") == "object"  # the vendored htmx loaded under the CSP
    assert page.locator("li.item.tier-current").count() > 0
    assert page.locator("li.topic").count() > 3


def test_changing_the_budget_changes_the_tier_bars(page: Any, shots: Path) -> None:
    page.goto(CONV)
    before = _bars(page)
    assert [b[0] for b in before] == ["current", "topic", "bulk"]
    url = page.url
    with page.expect_response(lambda r: "/conversation/context" in r.url and r.status == 200):
        page.fill("#budget", "2000")
        page.press("#budget", "Enter")
    page.wait_for_function(
        "old => JSON.stringify([...document.querySelectorAll('svg.shares rect.fill')]"
        ".map(e => e.dataset.allotted)) !== old",
        arg=__import__("json").dumps([b[2] for b in before]),
    )
    after = _bars(page)
    assert page.url == url  # swapped in place by htmx, not a new page
    assert [int(b[2]) for b in after] != [int(b[2]) for b in before]  # allotted tokens follow the budget
    assert [b[3] for b in after] != [b[3] for b in before]  # so do the drawn widths
    assert page.input_value("#budget") == "2000"
    assert "of 2,000 tokens" in page.locator("#context .summary-line").inner_text()
    page.screenshot(path=str(shots / "inspector.png"))
    page.screenshot(path=str(shots / "inspector-full.png"), full_page=True)


def test_search_highlights_matches(page: Any) -> None:
    page.goto(CONV)
    with page.expect_response(lambda r: "/conversation/search" in r.url):
        page.fill("form.search input[name=q]", "tokyo")
        page.press("form.search input[name=q]", "Enter")
    marks = page.locator("#search-results mark")
    marks.first.wait_for()
    assert marks.count() >= 3
    assert {t.lower() for t in marks.all_inner_texts()} == {"tokyo"}
    assert "messages containing" in page.locator("#search-results").inner_text()


def test_expanding_a_topic_loads_its_raw_messages(page: Any) -> None:
    page.goto(CONV)
    topic = page.locator("li.topic").last  # the oldest topic on the first page
    topic.locator("summary").click()
    with page.expect_response(lambda r: "/conversation/messages" in r.url):
        topic.locator("a.expand").click()
    raw = topic.locator(".raw li.item")
    raw.first.wait_for()
    assert raw.count() >= 2
    assert raw.first.locator(".label").inner_text() == "#1"


def test_a_hostile_message_renders_as_text(page: Any) -> None:
    page.goto(f"/conversation?id={quote(HOSTILE_ID, safe='')}")
    assert page.locator("h1.cid").inner_text() == HOSTILE_ID
    contents = page.locator("li.item .content").all_inner_texts()
    assert HOSTILE in contents  # shown exactly as typed
    assert page.evaluate("window.__pwned") is None  # neither the script nor the onerror ran
    assert page.locator("main img").count() == 0 and page.locator("main b").count() == 0
    with page.expect_response(lambda r: "/conversation/search" in r.url):
        page.fill("form.search input[name=q]", "onerror")
        page.press("form.search input[name=q]", "Enter")
    page.locator("#search-results mark").first.wait_for()
    assert page.evaluate("window.__pwned") is None and page.locator("main img").count() == 0


def test_seal_the_current_topic_with_writes_on(page: Any) -> None:
    page.goto(CONV)
    topics = page.locator("li.topic").count()
    first_topic = page.locator("li.topic .tag").first.inner_text()
    open_range = re.search(r"messages (\d+)–(\d+)", page.locator(".open-topic").inner_text())
    assert open_range, "the open topic is empty"
    page.click("#seal")
    page.wait_for_url(re.compile(r"done=sealed"))
    assert "Sealed the open topic as topic" in page.locator(".flash").inner_text()
    assert page.locator(".open-topic").inner_text().strip().endswith("empty")
    newest = page.locator("li.topic .tag").first.inner_text()
    assert newest != first_topic and int(newest.split()[-1]) == int(first_topic.split()[-1]) + 1
    assert page.locator("li.topic").count() in (topics, topics + 1)  # one page of the timeline
    sealed = page.locator("li.topic").first.inner_text()
    assert "manual" in sealed and f"messages {open_range[1]}–{open_range[2]}" in sealed
