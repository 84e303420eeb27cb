"""The web inspector through Starlette's TestClient: every page, escaping, read-only mode, CSRF,
the token, the host check, and the ``serve`` command's guards."""

from __future__ import annotations

import re
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import pytest

pytest.importorskip("starlette", reason="the web extra is not installed")

from starlette.testclient import TestClient
from typer.testing import CliRunner

from tiered_history import HistoryCompressor, StoredMessage, Summary, SyncHistoryCompressor
from tiered_history.cli import app as cli_app
from tiered_history.web import create_app, views
from tiered_history.web.app import TIMELINE_PAGE
from tiered_history.web.security import Security

HOSTILE = "<script>alert('x')</script><img src=x onerror=alert(1)>\"'&amp;"
EVIL_ID = "evil<b>\"'&id"
TOKEN = "correct-horse-battery-staple-42"
BASE = "http://127.0.0.1:8750"


def _fill(url: str) -> None:
    """Two conversations: one with sealed, summarised and archived topics; one hostile."""
    start = datetime.now(UTC) - timedelta(hours=3)
    with SyncHistoryCompressor(url, context_budget=300, bulk_merge_size=2) as h:
        h.pin("alpha", "You are a careful assistant.", key="system", platform="discord", channel="general")
        n = 0
        for topic in ("paris trip", "python traceback", "sourdough recipe", "garden tomatoes", "budget"):
            for i in range(6):
                n += 1
                text = f"New topic: {topic}." if i == 0 else f"More about the {topic}, point {i}."
                h.add_message(
                    "alpha",
                    {
                        "role": "user" if i % 2 == 0 else "assistant",
                        "content": text,
                        "timestamp": start + timedelta(minutes=n),
                    },
                    user_id="u1",
                )
        h.maintain("alpha")
        h.add_message(
            EVIL_ID,
            {"role": "user", "content": HOSTILE, "timestamp": start},
            platform="<i>plat</i>",
            channel="<u>chan</u>",
        )
        h.add_message(EVIL_ID, {"role": "assistant", "content": f"echo {HOSTILE}", "timestamp": start})


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'web.db'}"
    _fill(url)
    return url


def dump(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of a SQLite database."""
    path = url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        tables = [
            r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        ]
        return {t: sorted(conn.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables}


@pytest.fixture
def client(db: str) -> Iterator[TestClient]:
    with TestClient(create_app(db), base_url=BASE) as c:
        yield c


@pytest.fixture
def writer(db: str) -> Iterator[TestClient]:
    with TestClient(create_app(db, allow_writes=True), base_url=BASE) as c:
        yield c


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]{64})"', page) or re.search(
        r'"X-CSRF-Token": "([0-9a-f]{64})"', page
    )
    assert found, "the page carries no CSRF token"
    return found.group(1)


def conv(cid: str, **params: Any) -> str:
    return "/conversation?" + urlencode({"id": cid, **params})


# -- pages ------------------------------------------------------------------------------------


def test_conversation_list_shows_every_column(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200
    row = re.search(r'<tr class="conversation">.*?alpha.*?</tr>', page.text, re.S)
    assert row, page.text
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(0), re.S)
    assert cells[1:4] == ["discord", "general", "31"]  # platform, channel, messages (30 + the pin)
    assert int(cells[4].replace(",", "")) > 100  # tokens stored
    assert int(cells[5]) >= 4 and int(cells[6]) >= 1  # topics, archives
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", cells[7])
    assert cells[8] == "$0"  # the extractive summariser costs nothing
    assert f'href="/conversation?id={quote(EVIL_ID, safe="")}"' in page.text.replace("&amp;", "&")


def test_list_filters_and_search_across_conversations(client: TestClient) -> None:
    only = client.get("/?platform=discord").text
    assert ">alpha<" in only and "evil" not in only
    by_id = client.get("/?q=EVI").text  # case-insensitive id filter
    assert "evil" in by_id and ">alpha<" not in by_id
    assert "No conversation matches" in client.get("/?channel=none").text
    found = client.get("/?search=sourdough").text
    assert ">alpha<" in found and "<mark>sourdough</mark>" in found and "evil" not in found


def test_conversation_page_shows_context_timeline_and_actions_off(client: TestClient) -> None:
    page = client.get(conv("alpha"))
    assert page.status_code == 200
    text = page.text
    assert "What the model sees" in text and 'value="8000"' in text  # context_budget by default
    # Tier bars: one filled rect per shared tier, widths within their share.
    fills = re.findall(
        r'<rect class="fill tier-(\w+)" data-tier="\w+" data-used="(\d+)" data-allotted="(\d+)"', text
    )
    assert [f[0] for f in fills] == ["current", "topic", "bulk"]
    assert all(int(used) >= 0 and int(allotted) > 0 for _, used, allotted in fills)
    assert 'class="item tier-pinned"' in text and "You are a careful assistant." in text
    assert 'class="item tier-current"' in text
    # Timeline: topics with their reason, summary and archive, the open topic, lazy raw messages.
    assert text.count('<li class="topic') >= 4
    assert "explicit" in text and "in archive 1" in text
    assert "open topic" in text and "/conversation/messages?id=alpha&amp;first=" in text
    assert "Actions (seal the current topic" in text and 'action="/conversation/seal"' not in text
    assert "<dd>general</dd>" in text and "<dd>u1</dd>" in text  # channel and users, from the listing


def test_budget_changes_the_context_part(client: TestClient) -> None:
    def bars(budget: int) -> list[tuple[str, ...]]:
        part = client.get(f"/conversation/context?id=alpha&budget={budget}", headers={"hx-request": "true"})
        assert part.status_code == 200 and "<html" not in part.text  # a fragment for htmx
        pattern = (
            r'data-tier="(\w+)" data-used="(\d+)" data-allotted="(\d+)" x="[\d.]+" y="0" width="([\d.]+)"'
        )
        return re.findall(pattern, part.text)

    small, large = bars(120), bars(8000)
    assert [b[0] for b in small] == ["current", "topic", "bulk"]
    assert sum(int(b[1]) for b in small) < sum(int(b[1]) for b in large)  # fewer tokens used
    assert all(int(s[2]) < int(b[2]) for s, b in zip(small, large, strict=True))  # smaller shares
    assert sum(float(b[3]) for b in small) > sum(float(b[3]) for b in large)  # fuller bars
    too_small = client.get("/conversation/context?id=alpha&budget=5").text
    assert "below the minimum" in too_small
    assert client.get("/conversation/context?id=alpha&budget=abc").status_code == 400


def test_timeline_messages_search_and_archive_parts(client: TestClient) -> None:
    raw = client.get("/conversation/messages?id=alpha&first=1&last=200", headers={"hx-request": "true"}).text
    assert raw.count('class="item tier-raw"') == 31 and "More messages" not in raw
    paged = client.get(
        "/conversation/messages?id=alpha&first=1&last=200&cont=1", headers={"hx-request": "true"}
    )
    assert "<ol" not in paged.text.split("<li", 1)[0]
    found = client.get("/conversation/search?id=alpha&q=TOMATOES", headers={"hx-request": "true"}).text
    assert "<mark>tomatoes</mark>" in found and "in topic" in found
    assert "No stored message contains" in client.get("/conversation/search?id=alpha&q=zebra").text
    in_page = client.get(conv("alpha", q="python")).text
    assert "<mark>python</mark>" in in_page
    archive = client.get("/conversation/archive?id=alpha&n=1")
    assert archive.status_code == 200 and "archive 1" in archive.text
    assert client.get("/conversation/archive?id=alpha&n=99").status_code == 404
    full = client.get("/conversation/timeline?id=alpha")
    assert full.status_code == 200 and "<html" in full.text


def test_errors_are_pages_not_tracebacks(client: TestClient) -> None:
    assert client.get(conv("nobody")).status_code == 404
    assert client.get("/conversation").status_code == 400
    assert client.get(conv("x" * 300)).status_code == 400
    assert client.get("/conversation/messages?id=alpha&first=zz").status_code == 400
    assert client.get("/nowhere").status_code == 404
    assert client.get("/static/htmx.min.js").status_code == 200
    assert "Zero-Clause BSD" in client.get("/static/htmx.LICENSE.txt").text


def test_security_headers(client: TestClient) -> None:
    r = client.get("/")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert "unsafe" not in r.headers["content-security-policy"]
    assert r.headers["x-frame-options"] == "DENY" and r.headers["cache-control"] == "no-store"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie


# -- escaping ---------------------------------------------------------------------------------


def test_hostile_text_renders_as_text_on_every_page(client: TestClient) -> None:
    cid = quote(EVIL_ID, safe="")
    pages = [
        "/",
        "/?search=script",
        f"/conversation?id={cid}",
        f"/conversation?id={cid}&q=alert",
        f"/conversation/context?id={cid}&budget=4000",
        f"/conversation/messages?id={cid}&first=1&last=5",
        f"/conversation/search?id={cid}&q=onerror",
        f"/conversation/timeline?id={cid}",
    ]
    for path in pages:
        r = client.get(path)
        assert r.status_code == 200, path
        body = r.text
        assert "<script>alert" not in body and "<img src=x" not in body, path
        assert "<b>" not in body and "<i>plat" not in body and "<u>chan" not in body, path
    page = client.get(f"/conversation?id={cid}").text
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" in page
    assert "evil&lt;b&gt;&#34;&#39;&amp;id" in page  # the id too, in the heading
    assert "&lt;i&gt;plat&lt;/i&gt;" in page


# -- read-only --------------------------------------------------------------------------------


def _every_request(cid: str, csrf: str) -> list[tuple[str, str, dict[str, Any]]]:
    form = {"id": cid, "csrf": csrf, "confirm": cid}
    paths = [
        "/",
        "/conversation",
        "/conversation/context",
        "/conversation/timeline",
        "/conversation/archive",
        "/conversation/messages",
        "/conversation/search",
        "/conversation/seal",
        "/conversation/maintain",
        "/conversation/delete",
        "/login",
        "/logout",
    ]
    out: list[tuple[str, str, dict[str, Any]]] = []
    for path in paths:
        for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
            if method == "GET":
                out.append(
                    (method, path + "?" + urlencode({**form, "n": 1, "q": "topic", "budget": 300}), {})
                )
            else:
                out.append((method, path, {"data": form, "headers": {"x-csrf-token": csrf}}))
                out.append((method, path + "?" + urlencode(form), {"headers": {"x-csrf-token": csrf}}))
    return out


def test_without_allow_writes_no_request_changes_the_database(db: str, client: TestClient) -> None:
    before = dump(db)
    assert before["conversations"] and before["messages"] and before["summaries"]
    csrf = csrf_of(client.get(conv("alpha")).text)
    statuses: dict[str, set[int]] = {}
    for cid in ("alpha", EVIL_ID):
        for method, path, kwargs in _every_request(cid, csrf):
            r = client.request(method, path, **kwargs)
            statuses.setdefault(path.split("?")[0], set()).add(r.status_code)
            assert r.status_code < 500, (method, path, r.text)
    assert dump(db) == before
    for action in ("/conversation/seal", "/conversation/maintain", "/conversation/delete"):
        assert statuses[action] <= {403, 405}, (action, statuses[action])
        assert 403 in statuses[action]
    # And the library agrees: nothing was sealed, maintained or deleted.
    with SyncHistoryCompressor(db) as h:
        assert h.exists("alpha") and h.exists(EVIL_ID)


def test_read_only_refusal_happens_before_any_library_call(
    db: str, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*_: Any, **__: Any) -> None:
        raise AssertionError("a write method was called")

    for name in ("seal_current_topic", "maintain", "delete_conversation", "add_message", "add_messages"):
        monkeypatch.setattr(HistoryCompressor, name, boom)
    csrf = csrf_of(client.get(conv("alpha")).text)
    for action in ("seal", "maintain", "delete"):
        r = client.post(f"/conversation/{action}", data={"id": "alpha", "csrf": csrf, "confirm": "alpha"})
        assert r.status_code == 403 and "--allow-writes" in r.text


# -- writes and CSRF --------------------------------------------------------------------------


def test_actions_need_a_csrf_token(db: str, writer: TestClient) -> None:
    page = writer.get(conv("alpha")).text
    csrf = csrf_of(page)
    assert 'action="/conversation/seal"' in page and "writes on" in page
    before = dump(db)
    attempts: list[dict[str, Any]] = [
        {"data": {"id": "alpha"}},
        {"data": {"id": "alpha", "csrf": "0" * 64}},
        {"data": {"id": "alpha", "csrf": csrf}, "headers": {"origin": "http://evil.example"}},
        {"data": {"id": "alpha", "csrf": csrf}, "headers": {"sec-fetch-site": "cross-site"}},
    ]
    for kwargs in attempts:
        for action in ("seal", "maintain", "delete"):
            data = {**kwargs["data"], "confirm": "alpha"}
            r = writer.post(f"/conversation/{action}", data=data, headers=kwargs.get("headers"))
            assert r.status_code == 403, (action, kwargs)
    # Another browser's session cannot reuse this token.
    other = TestClient(writer.app, base_url=BASE)
    r = other.post("/conversation/seal", data={"id": "alpha", "csrf": csrf})
    assert r.status_code == 403
    assert dump(db) == before


def test_seal_maintain_delete_with_writes_on(db: str, writer: TestClient) -> None:
    csrf = csrf_of(writer.get(conv("alpha")).text)
    with SyncHistoryCompressor(db) as h:
        topics = h.stats("alpha")[0].topics
    r = writer.post("/conversation/seal", data={"id": "alpha", "csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303 and "done=sealed" in r.headers["location"]
    assert "Sealed the open topic as topic" in writer.get(r.headers["location"]).text
    r = writer.post("/conversation/seal", data={"id": "alpha", "csrf": csrf})  # nothing open now
    assert "Nothing to seal" in r.text
    r = writer.post("/conversation/maintain", headers={"x-csrf-token": csrf}, data={"id": "alpha"})
    assert r.status_code == 200 and "Maintenance ran: 0 sealed, 1 summarised" in r.text
    with SyncHistoryCompressor(db) as h:
        assert h.stats("alpha")[0].topics == topics + 1
    r = writer.post("/conversation/delete", data={"id": "alpha", "csrf": csrf, "confirm": "alph"})
    assert r.status_code == 400
    r = writer.post("/conversation/delete", data={"id": "alpha", "csrf": csrf, "confirm": "alpha"})
    assert r.status_code == 200 and "Deleted conversation <code>alpha</code>" in r.text
    assert "/conversation?id=alpha" not in r.text
    with SyncHistoryCompressor(db) as h:
        assert not h.exists("alpha") and h.exists(EVIL_ID)


def test_deleting_a_conversation_that_is_not_there_says_so(writer: TestClient) -> None:
    csrf = csrf_of(writer.get(conv("alpha")).text)
    r = writer.post("/conversation/delete", data={"id": "no-such", "csrf": csrf, "confirm": "no-such"})
    assert r.status_code == 404 and "Deleted" not in r.text


def test_a_read_only_inspector_shows_no_action_banner_whatever_the_link_says(client: TestClient) -> None:
    # The banners are read from the URL after an action: a read-only server took none.
    for params in ({"done": "sealed", "topic": "7"}, {"done": "maintained", "sealed": "3"}):
        page = client.get(conv("alpha", **params)).text
        assert "Sealed the open topic" not in page and "Maintenance ran" not in page
    assert "Deleted conversation" not in client.get("/?deleted=alpha").text


def test_odd_numbers_in_links_are_refused_or_ignored_not_errors(writer: TestClient) -> None:
    # int() takes '²' as a digit for isdigit() but not as a number; 5,000 digits it refuses; a
    # number past SQLite's integers it takes, and the database does not.
    for params in ({"done": "sealed", "topic": "²"}, {"done": "maintained", "sealed": "9" * 4400}):
        assert writer.get(conv("alpha", **params)).status_code == 200
    for value in ("9223372036854775759", str(2**63), "1" + "0" * 30, "²", "٣"):
        r = writer.get("/conversation/messages?" + urlencode({"id": "alpha", "first": value}))
        assert r.status_code == 400, value


# -- the token and the host check -------------------------------------------------------------


def test_each_login_is_its_own_and_ends_at_logout_restart_or_age(db: str) -> None:
    def login(c: TestClient) -> str:
        csrf = csrf_of(c.get("/login").text)
        r = c.post("/login", data={"token": TOKEN, "csrf": csrf, "next": "/"}, follow_redirects=False)
        assert r.status_code == 303
        return r.headers["set-cookie"].split(";")[0].split("=", 1)[1]

    app_ = create_app(db, token=TOKEN)
    with TestClient(app_, base_url=BASE) as a, TestClient(app_, base_url=BASE) as b:
        first, second = login(a), login(b)
        assert first != second and TOKEN not in first
        assert a.get("/").status_code == b.get("/").status_code == 200
        csrf = csrf_of(a.get("/").text)
        assert a.post("/logout", data={"csrf": csrf}, follow_redirects=False).status_code == 303
        name = next(iter(b.cookies.keys() - {k for k in b.cookies if k.startswith("th_session")}))
        stolen = TestClient(app_, base_url=BASE, cookies={name: first})
        assert stolen.get("/").status_code == 401  # logged out: that login is over
        assert b.get("/").status_code == 200  # the other one is not
    with TestClient(create_app(db, token=TOKEN), base_url=BASE, cookies={name: second}) as restarted:
        assert restarted.get("/").status_code == 401  # a new start, new logins
    sec = Security(token=TOKEN)
    value = sec.login_value(now=1_000_000)
    assert sec.valid_login(value, now=1_000_000 + 3600)
    assert not sec.valid_login(value, now=1_000_000 + 8 * 24 * 3600)  # older than its Max-Age
    assert not sec.valid_login(value.replace(".", ".x", 1))


def test_secure_cookies_behind_a_tls_proxy(db: str) -> None:
    with TestClient(create_app(db, token=TOKEN, secure_cookies=True), base_url=BASE) as c:
        assert "Secure" in c.get("/login").headers["set-cookie"]
        csrf = csrf_of(c.get("/login").text)
        r = c.post("/login", data={"token": TOKEN, "csrf": csrf, "next": "/"}, follow_redirects=False)
        assert "Secure" in r.headers["set-cookie"]
    with TestClient(create_app(db, token=TOKEN), base_url=BASE) as c:
        assert "Secure" not in c.get("/login").headers["set-cookie"]


def test_token_is_required_on_every_request(db: str) -> None:
    with TestClient(create_app(db, token=TOKEN, allow_writes=True), base_url=BASE) as c:
        r = c.get("/", headers={"accept": "text/html"}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/login?next=")
        for path in ("/", conv("alpha"), "/conversation/context?id=alpha", "/conversation/messages?id=alpha"):
            assert c.get(path).status_code == 401, path
        assert c.post("/conversation/delete", data={"id": "alpha", "confirm": "alpha"}).status_code == 401
        assert c.get("/", headers={"authorization": "Bearer wrong-token-wrong-token"}).status_code == 401
        assert c.get("/", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert c.get("/", headers={"x-tiered-history-token": TOKEN}).status_code == 200
        assert c.get("/static/style.css").status_code == 200  # public assets only
        # The login form: wrong token, then the right one sets a cookie that is not the token.
        login = c.get("/login?next=/conversation%3Fid%3Dalpha")
        csrf = csrf_of(login.text)
        r = c.post("/login", data={"token": "nope", "csrf": csrf, "next": "/"})
        assert r.status_code == 401 and "wrong token" in r.text
        r = c.post(
            "/login",
            data={"token": TOKEN, "csrf": csrf, "next": "/conversation?id=alpha"},
            follow_redirects=False,
        )
        assert r.status_code == 303 and r.headers["location"] == "/conversation?id=alpha"
        assert TOKEN not in r.headers["set-cookie"] and "HttpOnly" in r.headers["set-cookie"]
        assert c.get(conv("alpha")).status_code == 200
        # No open redirect after login.
        r = c.post(
            "/login", data={"token": TOKEN, "csrf": csrf, "next": "//evil.example/"}, follow_redirects=False
        )
        assert r.headers["location"] == "/"
        r = c.post("/logout", data={"csrf": csrf}, follow_redirects=False)
        assert r.status_code == 303
        assert c.get("/").status_code == 401


def test_loopback_server_refuses_foreign_host_names(db: str) -> None:
    from tiered_history.web import hosts_for

    with TestClient(create_app(db, allowed_hosts=hosts_for("127.0.0.1")), base_url=BASE) as c:
        assert c.get("/").status_code == 200
        assert c.get("/", headers={"host": "localhost:8750"}).status_code == 200
        assert c.get("/", headers={"host": "[::1]:8750"}).status_code == 200
        assert c.get("/", headers={"host": "rebound.example:8750"}).status_code == 400
    assert hosts_for("0.0.0.0") is None


# -- the serve command ------------------------------------------------------------------------


runner = CliRunner()


def test_serve_refuses_to_listen_off_loopback_without_a_token(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TIERED_HISTORY_WEB_TOKEN", raising=False)
    r = runner.invoke(cli_app, ["--database-url", db, "serve", "--host", "0.0.0.0"])
    assert r.exit_code == 2 and "needs --token" in r.stderr
    r = runner.invoke(cli_app, ["--database-url", db, "serve", "--token", "short"])
    assert r.exit_code == 2 and "16 characters" in r.stderr


def test_read_only_serve_never_creates_or_migrates(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    r = runner.invoke(cli_app, ["--database-url", f"sqlite:///{missing}", "serve"])
    assert r.exit_code == 1 and "no database" in r.stderr and not missing.exists()
    sqlite3.connect(tmp_path / "empty.db").close()
    r = runner.invoke(cli_app, ["--database-url", f"sqlite:///{tmp_path / 'empty.db'}", "serve"])
    assert r.exit_code == 1 and "db upgrade" in r.stderr


def test_serve_without_the_web_extra_says_how_to_install_it(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    import tiered_history

    monkeypatch.setattr(uvicorn.Server, "run", lambda self: pytest.fail("the server was started"))
    monkeypatch.setattr(tiered_history, "web", tiered_history.web)  # restored whatever the import does
    for name in [n for n in sys.modules if n == "tiered_history.web" or n.startswith("tiered_history.web.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "python_multipart", None)  # as if the extra were not installed
    r = runner.invoke(cli_app, ["--database-url", db, "serve"])
    assert r.exit_code == 1 and 'pip install "tiered-history[web]"' in r.stderr


def test_serve_shows_the_database_url_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    web = sys.modules["tiered_history.web"]  # the module the command imports from
    seen: dict[str, Any] = {}
    real = web.create_app

    def spy(target: str, **kwargs: Any) -> Any:
        seen.update(kwargs, target=target)
        return real(target, **kwargs)

    monkeypatch.setattr(web, "create_app", spy)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self: None)
    url = "postgresql://bot:s3cret-pass@127.0.0.1:1/history"
    r = runner.invoke(
        cli_app, ["--database-url", url, "serve", "--allow-writes", "--token", TOKEN, "--host", "0.0.0.0"]
    )
    assert r.exit_code == 0, r.stderr
    assert "s3cret" not in r.stdout and "***" in r.stdout
    assert seen["database"] == "postgresql://bot:***@127.0.0.1:1/history" and seen["token"] == TOKEN
    assert seen["allowed_hosts"] is None and seen["allow_writes"] is True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_runs_a_real_server(db: str, tmp_path: Path) -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tiered_history", "--database-url", db, "serve", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/conversation?id=alpha", timeout=5)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.2)
        assert r.status_code == 200 and "What the model sees" in r.text
        assert httpx.get(f"http://127.0.0.1:{port}/", headers={"host": "evil.example"}).status_code == 400
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert f"Inspector on http://127.0.0.1:{port}/" in out and "read-only" in out


# -- PostgreSQL -------------------------------------------------------------------------------


@pytest.mark.postgres
def test_pages_and_read_only_on_postgresql(pg_url: str) -> None:
    import psycopg

    _fill(pg_url)

    def pg_dump() -> dict[str, list[Any]]:
        with psycopg.connect(pg_url) as conn:
            tables = [
                r[0]
                for r in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
                ).fetchall()
            ]
            return {t: sorted(map(repr, conn.execute(f'SELECT * FROM "{t}"').fetchall())) for t in tables}

    before = pg_dump()
    with TestClient(create_app(pg_url), base_url=BASE) as c:
        assert ">alpha<" in c.get("/").text
        page = c.get(conv("alpha")).text
        assert "What the model sees" in page and '<li class="topic' in page
        assert "<dd>general</dd>" in page and "<dd>u1</dd>" in page  # found through the listing
        assert "<mark>tomatoes</mark>" in c.get("/conversation/search?id=alpha&q=tomatoes").text
        csrf = csrf_of(page)
        for method, path, kwargs in _every_request("alpha", csrf):
            assert c.request(method, path, **kwargs).status_code < 500, (method, path)
    assert pg_dump() == before


# -- big conversations ------------------------------------------------------------------------


def test_long_timelines_are_paged_and_get_history_is_never_called(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'long.db'}"
    topics = TIMELINE_PAGE + 15
    start = datetime.now(UTC) - timedelta(days=1)
    with SyncHistoryCompressor(url) as h:
        batch = [
            {
                "role": "user",
                "content": f"New topic: subject {i // 3}." if i % 3 == 0 else f"detail {i}",
                "timestamp": start + timedelta(seconds=i),
            }
            for i in range(3 * topics + 1)
        ]
        h.add_messages("long", batch)
    monkeypatch.setattr(
        HistoryCompressor, "get_history", lambda *a, **k: pytest.fail("get_history was called")
    )
    with TestClient(create_app(url), base_url=BASE) as c:
        page = c.get(conv("long")).text
        assert page.count('<li class="topic') == TIMELINE_PAGE
        older = re.search(r'hx-get="(/conversation/timeline\?[^"]*before=\d+)"', page)
        assert older
        rest = c.get(older.group(1).replace("&amp;", "&"), headers={"hx-request": "true"}).text
        assert rest.count('<li class="topic') == topics - TIMELINE_PAGE
        assert "Older topics" not in rest


def test_the_list_is_paged_and_filters_span_pages(tmp_path: Path) -> None:
    from tiered_history.web.app import LIST_PAGE, SEARCH_SCAN

    url = f"sqlite:///{tmp_path / 'many.db'}"
    total = 2 * LIST_PAGE + 20
    with SyncHistoryCompressor(url) as h:
        for i in range(total):
            h.add_message(
                f"c{i:03d}", {"role": "user", "content": f"note {i}" + (" needle" if i % 7 == 0 else "")}
            )
    ids = [f"c{i:03d}" for i in range(total)]

    def walk(c: TestClient, path: str) -> list[list[str]]:
        pages = []
        next_path: str | None = path
        while next_path:
            page = c.get(next_path).text
            pages.append(re.findall(r'class="cid" href="[^"]+">([^<]+)</a>', page))
            nxt = re.search(r'class="next" href="([^"]+)"', page)
            next_path = nxt.group(1).replace("&amp;", "&") if nxt else None
        return pages

    with TestClient(create_app(url), base_url=BASE) as c:
        pages = walk(c, "/")
        assert [len(p) for p in pages] == [LIST_PAGE, LIST_PAGE, 20]
        assert [i for p in pages for i in p] == ids
        with_zero = walk(c, "/?q=0")
        assert len(with_zero) > 1 and all(len(p) == LIST_PAGE for p in with_zero[:-1])
        assert [i for p in with_zero for i in p] == [i for i in ids if "0" in i]
        # Search looks at SEARCH_SCAN conversations per page, then offers to continue.
        searched = walk(c, "/?search=needle")
        assert len(searched) == -(-total // SEARCH_SCAN)
        assert searched[0] == [i for i in ids[:SEARCH_SCAN] if int(i[1:]) % 7 == 0]
        assert [i for p in searched for i in p] == [i for i in ids if int(i[1:]) % 7 == 0]


# -- pure helpers -----------------------------------------------------------------------------


def _message(seq: int, content: str = "hello") -> StoredMessage:
    now = datetime.now(UTC)
    return StoredMessage("c", seq, "user", content, now, 5, 5)


def _summary(seq: int, first: int, last: int, merged_into: int | None = None, tier: str = "topic") -> Summary:
    now = datetime.now(UTC)
    return Summary(
        id=seq + (1000 if tier == "bulk" else 0),
        conversation_id="c",
        tier=tier,  # type: ignore[arg-type]
        sequence=seq,
        first_sequence=first,
        last_sequence=last,
        content=f"summary {seq}",
        rendered=f"[summary {seq}]",
        token_count=10,
        source_tokens=100,
        started_at=now,
        ended_at=now,
        status="final",
        merged_into=merged_into,
    )


def test_highlight_keeps_case_and_marks_every_match() -> None:
    parts = views.highlight("Tokyo, then tokyo again", "TOKYO")
    assert parts == [("Tokyo", True), (", then ", False), ("tokyo", True), (" again", False)]
    long = "x" * 1000 + " needle " + "y" * 1000
    cut = views.highlight(long, "needle", width=100)
    assert cut[0] == ("…", False) and ("needle", True) in cut and cut[-1] == ("…", False)
    assert sum(len(t) for t, _ in cut) < 110
    assert views.highlight("a.b", ".") == [("a", False), (".", True), ("b", False)]  # not a regex


def test_recall_is_rendered_whatever_shape_it_takes() -> None:
    assert views.recall_groups(SimpleNamespace()) == []
    m, s = _message(7, "the recalled fact"), _summary(2, 10, 20)
    as_mapping = views.recall_groups(SimpleNamespace(recall={"where is lena?": [m, s]}))
    assert [(g.query, [i.label for i in g.items]) for g in as_mapping] == [
        ("where is lena?", ["#7", "topic 2 · messages 10–20"])
    ]
    as_objects = views.recall_groups(
        SimpleNamespace(
            recall=[SimpleNamespace(query="q1", items=[m]), SimpleNamespace(query="q1", message=s)]
        )
    )
    assert len(as_objects) == 1 and [i.tier for i in as_objects[0].items] == ["recall", "recall"]
    bare = views.recall_groups(SimpleNamespace(recall=[m]))
    assert bare[0].query == "" and bare[0].items[0].content == "the recalled fact"
    # A long message recalled as its matching sentences says so (not "head and tail").
    cut = replace(
        _message(8, "One. Two. Lena is in Oslo. Four."), truncated_content="[…] Lena is in Oslo. […]"
    )
    [item] = views.recall_groups(SimpleNamespace(recall=[cut]))[0].items
    assert item.content == "[…] Lena is in Oslo. […]" and "excerpt" in item.note
    assert (
        "head and tail"
        in views.message_item(replace(cut, truncated_content="On[truncated 9 chars]"), "recall").note
    )


def test_share_bars_follow_the_allocation() -> None:
    ctx = SimpleNamespace(
        allocation={"current": 500, "topic": 300, "bulk": 200},
        tier_tokens={"current": 250, "topic": 600, "bulk": 0, "pinned": 40, "framing": 3, "recent": 0},
        max_tokens=1100,
    )
    shares = views._share_segments(ctx)  # type: ignore[arg-type]
    assert [(s.tier, s.x, s.width, s.fill) for s in shares] == [
        ("current", 0.0, 50.0, 25.0),
        ("topic", 50.0, 30.0, 30.0),  # over its share (redistributed room): the bar is full
        ("bulk", 80.0, 20.0, 0.0),
    ]
    usage = views._usage_segments(ctx)  # type: ignore[arg-type]
    assert sum(s.width for s in usage) <= 100.0
    assert [s.tier for s in usage] == ["pinned", "bulk", "topic", "recent", "current", "framing"]


def test_long_tiers_are_listed_around_a_gap() -> None:
    rows = views._listed([_message(i) for i in range(1, 1001)], "current", 400)
    gaps = [r for r in rows if isinstance(r, views.Gap)]
    assert len(rows) == 401 and len(gaps) == 1 and gaps[0].count == 600
    assert rows[-1].label == "#1000"  # type: ignore[union-attr]


def test_timeline_pages_and_archive_chains() -> None:
    archives = [_summary(1, 1, 20, merged_into=1002, tier="bulk"), _summary(2, 1, 40, tier="bulk")]
    topics = [_summary(i, 10 * i - 9, 10 * i, merged_into=1001 if i <= 2 else None) for i in range(1, 6)]
    line = views.timeline(topics, archives, last_sequence=57, page=2)
    assert [r.topic.sequence for r in line.rows] == [5, 4] and line.older == 4
    assert (line.open_first, line.open_last) == (51, 57)
    nxt = views.timeline(topics, archives, 57, page=2, before=line.older)
    assert [r.topic.sequence for r in nxt.rows] == [3, 2]
    assert [a.sequence for a in nxt.rows[1].archives] == [1, 2]  # topic 2 -> archive 1 -> archive 2
    assert views.topic_of(15, topics) is topics[1] and views.topic_of(56, topics) is None
