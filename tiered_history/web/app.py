"""The inspector's Starlette application: server-rendered pages, htmx for the partial updates.

Everything goes through :class:`~tiered_history.HistoryCompressor`'s public methods except the
timeline's summaries, which no public method returns without every message (``get_history``
reads them all): they come from the store contract's ``read_summaries``, a read. Requests that
change anything are POSTs that need ``allow_writes`` and a CSRF token; nothing else writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.applications import Starlette
from starlette.datastructures import FormData, QueryParams
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import (
    BudgetTooSmallError,
    ConversationNotFoundError,
    ConversationStats,
    HistoryCompressor,
    Settings,
    StoredMessage,
    StoreError,
    Summary,
    TieredHistoryError,
    __version__,
)
from ..models import ConversationInfo
from . import views
from .security import Guard, Security, check_csrf, csrf_token, login_cookie, logout_cookie, safe_next, same

#: Conversations per page of the list.
LIST_PAGE = 50
#: Most conversations one list page looks at when filtering by id text (the rest: "continue").
LIST_SCAN = 5_000
#: Conversations read from the library per listing call.
LIST_BATCH = 200
#: Most conversations one list page searches (one query each).
SEARCH_SCAN = 100
#: Topics per page of the timeline.
TIMELINE_PAGE = 40
#: Raw messages per page when a topic is expanded.
MESSAGES_PAGE = 50
#: Matches shown by a search within one conversation, and per conversation in the list.
SEARCH_LIMIT = 50
LIST_SEARCH_LIMIT = 3
#: Largest budget the page accepts (the library's own ceiling for ``context_budget``).
MAX_BUDGET = 10_000_000


@dataclass
class Inspector:
    """What every handler needs: the compressor, the switches, the templates."""

    compressor: HistoryCompressor
    security: Security
    allow_writes: bool
    database: str
    templates: jinja2.Environment

    def page(self, request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        html = self.templates.get_template(name).render(
            request=request,
            csrf=csrf_token(request, self.security),
            allow_writes=self.allow_writes,
            database=self.database,
            token_on=self.security.token is not None,
            hx="hx-request" in request.headers,
            version=__version__,
            **context,
        )
        return HTMLResponse(html, status_code=status_code)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("tiered_history.web", "templates"),
        autoescape=True,  # every template, whatever its name: message text is hostile input
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["when"] = views.when
    env.filters["money"] = views.money
    env.filters["number"] = views.number
    env.globals["TIER_LABELS"] = views.TIER_LABELS
    env.globals["qs"] = lambda **kw: urlencode({k: v for k, v in kw.items() if v is not None})
    return env


def create_app(
    target: str | HistoryCompressor,
    *,
    settings: Settings | None = None,
    allow_writes: bool = False,
    token: str | None = None,
    allowed_hosts: tuple[str, ...] | None = None,
    database: str | None = None,
    secure_cookies: bool = False,
) -> Starlette:
    """The inspector as an ASGI app.

    ``target``: a database URL (the app opens a compressor on start and closes it on stop) or a
    compressor you own. ``token``: required on every request when set. ``allowed_hosts``: the
    ``Host`` names served (``None``: any). ``database``: how the page names the database
    (already masked; default: "(given compressor)" or nothing). ``secure_cookies``: cookies
    are ``Secure`` even over plain HTTP (behind a TLS-terminating proxy).
    """
    security = Security(token=token or None, allowed_hosts=allowed_hosts, secure_cookies=secure_cookies)
    state: dict[str, Inspector] = {}
    label = database if database is not None else ("" if isinstance(target, str) else "(given compressor)")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if isinstance(target, str):
            compressor = HistoryCompressor(target, settings=settings)
            await compressor.initialize()
        else:
            compressor = target
        state["app"] = Inspector(compressor, security, allow_writes, label, _environment())
        try:
            yield
        finally:
            if isinstance(target, str):
                await compressor.close()

    def handler(
        fn: Callable[[Inspector, Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            app = state["app"]
            try:
                return await fn(app, request)
            except ConversationNotFoundError as exc:
                return app.page(request, "error.html", 404, title="Not found", message=str(exc))
            except StoreError as exc:
                return app.page(request, "error.html", 503, title="Database error", message=str(exc))
            except TieredHistoryError as exc:
                return app.page(request, "error.html", 400, title="Bad request", message=str(exc))
            except _Refused as exc:
                return app.page(request, "error.html", exc.status, title=exc.title, message=exc.message)

        run.__name__ = fn.__name__
        return run

    routes = [
        Route("/", handler(conversations), methods=["GET"]),
        Route("/conversation", handler(conversation), methods=["GET"]),
        Route("/conversation/context", handler(context_part), methods=["GET"]),
        Route("/conversation/timeline", handler(timeline_part), methods=["GET"]),
        Route("/conversation/archive", handler(archive_part), methods=["GET"]),
        Route("/conversation/messages", handler(messages_part), methods=["GET"]),
        Route("/conversation/search", handler(search_part), methods=["GET"]),
        Route("/conversation/seal", handler(seal), methods=["POST"]),
        Route("/conversation/maintain", handler(maintain), methods=["POST"]),
        Route("/conversation/delete", handler(delete), methods=["POST"]),
        Route("/login", handler(login), methods=["GET", "POST"]),
        Route("/logout", handler(logout), methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("tiered_history.web", "static")]), name="static"),
    ]

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        app = state.get("app")
        if app is None or exc.status_code not in (404, 405):
            return Response(exc.detail, status_code=exc.status_code, headers=exc.headers)
        title = "Not found" if exc.status_code == 404 else "Method not allowed"
        return app.page(request, "error.html", exc.status_code, title=title, message=exc.detail)

    return Starlette(
        routes=routes,
        middleware=[Middleware(Guard, security=security)],
        lifespan=lifespan,
        exception_handlers={HTTPException: http_error},
    )


class _Refused(Exception):
    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status, self.title, self.message = status, title, message


# -- helpers ----------------------------------------------------------------------------------


def _cid(params: QueryParams | FormData) -> str:
    value = params.get("id")
    if not isinstance(value, str) or not value:
        raise _Refused(400, "Bad request", "which conversation? (the id parameter is missing)")
    return value


#: A whole number a page takes (sequence, budget, count): ASCII digits, at most 2**62-ish.
_NUMBER = re.compile(r"-?[0-9]{1,18}")
#: A count in an action's banner.
_COUNT = re.compile(r"[0-9]{1,9}")


def _int(params: QueryParams, name: str, default: int | None = None) -> int | None:
    raw = params.get(name)
    if raw is None or raw.strip() == "":
        return default
    if not _NUMBER.fullmatch(raw.strip()):  # digits only: int() takes '²' or 5,000 digits badly
        raise _Refused(400, "Bad request", f"{name} must be a whole number")
    return int(raw)


async def _gather(*aws: Awaitable[Any]) -> list[Any]:
    return list(await asyncio.gather(*aws))


async def _summaries(app: Inspector, conversation_id: str) -> tuple[list[Summary], list[Summary]]:
    """Every topic summary and archive of a conversation, without reading its messages.

    API gap: ``get_history`` is the only public method that returns them, and it reads every
    message too. The store contract's ``read_summaries`` is read-only and on every backend.
    """
    store = app.compressor.store
    topics, archives = await asyncio.gather(
        store.read_summaries(conversation_id, "topic"), store.read_summaries(conversation_id, "bulk")
    )
    return topics, archives


async def _info(app: Inspector, conversation_id: str) -> ConversationInfo | None:
    """The conversation's list entry (channel, users, dates), if the listing can find it cheaply.

    API gap: there is no ``list_conversations`` by id; ``after`` is compared in the database's
    collation, so start just before the id and look at a few entries.
    """
    code = ord(conversation_id[-1]) - 1
    if 0xD800 <= code <= 0xDFFF:  # no lone surrogates: they are not text to any database
        code = 0xD7FF
    after = conversation_id[:-1] + chr(code) if code > 31 else conversation_id[:-1] or None
    with contextlib.suppress(TieredHistoryError, ValueError, UnicodeError):
        for info in await app.compressor.list_conversations(after=after, limit=20):
            if info.conversation_id == conversation_id:
                return info
    return None


def _default_budget(app: Inspector) -> int:
    # API gap: the conversation's last budget is not exposed, so the configured budget stands in.
    return app.compressor.settings.context_budget


async def _context(app: Inspector, conversation_id: str, budget: int) -> tuple[views.ContextView | None, str]:
    if not 1 <= budget <= MAX_BUDGET:
        return None, f"the budget must be between 1 and {MAX_BUDGET:,} tokens"
    try:
        ctx = await app.compressor.get_context(conversation_id, budget, record=False)
    except BudgetTooSmallError as exc:
        return None, str(exc)
    return views.context_view(ctx), ""


# -- pages ------------------------------------------------------------------------------------


async def _listing(
    app: Inspector, platform: str | None, channel: str | None, needle: str, text: str, after: str | None
) -> tuple[list[ConversationInfo], dict[str, list[views.Hit]], str | None, int]:
    """Up to ``LIST_PAGE`` conversations after ``after`` whose id contains ``needle`` and (if
    ``text``) that have a message containing it; the matches; the cursor of the next page (None
    at the end); how many conversations were looked at."""
    comp = app.compressor
    rows: list[ConversationInfo] = []
    found: dict[str, list[views.Hit]] = {}
    scanned, cursor = 0, after
    limit = SEARCH_SCAN if text else LIST_SCAN
    while True:
        batch = await comp.list_conversations(
            platform=platform, channel=channel, after=cursor, limit=LIST_BATCH
        )
        last_batch = len(batch) < LIST_BATCH
        step = 10 if text else LIST_BATCH
        for i in range(0, len(batch), step):
            chunk = batch[i : i + step]
            kept = [c for c in chunk if needle.casefold() in c.conversation_id.casefold()]
            if text:
                # API gap: no search across conversations yet, so one search per conversation.
                results = await _gather(
                    *(comp.search(c.conversation_id, text, LIST_SEARCH_LIMIT) for c in kept)
                )
                found.update(
                    (c.conversation_id, views.hits(ms, text, []))
                    for c, ms in zip(kept, results, strict=True)
                    if ms
                )
                kept = [c for c in kept if c.conversation_id in found]
            keep = {c.conversation_id for c in kept}
            for info in chunk:
                scanned += 1
                cursor = info.conversation_id
                if info.conversation_id in keep:
                    rows.append(info)
                if len(rows) == LIST_PAGE or scanned >= limit:
                    at_end = last_batch and info is batch[-1]
                    return rows, found, None if at_end else cursor, scanned
        if last_batch:
            return rows, found, None, scanned


async def conversations(app: Inspector, request: Request) -> Response:
    q = request.query_params
    platform = (q.get("platform") or "").strip() or None
    channel = (q.get("channel") or "").strip() or None
    needle = (q.get("q") or "").strip()
    text = (q.get("search") or "").strip()
    after = q.get("after") or None
    rows, found, more, scanned = await _listing(app, platform, channel, needle, text, after)
    stats_lists = await _gather(*(_stats_or_empty(app, r.conversation_id) for r in rows))
    stats = {s.conversation_id: s for lst in stats_lists for s in lst}
    filters = {"platform": platform, "channel": channel, "q": needle or None, "search": text or None}
    return app.page(
        request,
        "conversations.html",
        rows=rows,
        stats=stats,
        found={k: v for k, v in found.items() if any(r.conversation_id == k for r in rows)},
        filters=filters,
        more=more,
        scanned=scanned,
        first_page=after is None,
        deleted=q.get("deleted") if app.allow_writes else None,
    )


async def _stats_or_empty(app: Inspector, conversation_id: str) -> list[ConversationStats]:
    try:
        return await app.compressor.stats(conversation_id)
    except ConversationNotFoundError:  # deleted between the listing and now
        return []


_DONE = {
    "sealed": "Sealed the open topic as topic {topic}; the next maintenance summarises it.",
    "nothing": "Nothing to seal: the open topic is empty.",
    "maintained": "Maintenance ran: {sealed} sealed, {summarized} summarised, {merged} merged, "
    "{dropped} dropped, {errors} errors.",
}


def _flash(app: Inspector, q: QueryParams) -> str:
    # The banner after an action is read from the redirect's URL: a read-only inspector took no
    # action, so whatever a link says, it shows none.
    template = _DONE.get(q.get("done") or "") if app.allow_writes else None
    if template is None:
        return ""
    numbers = {k: int(v) if _COUNT.fullmatch(v) else 0 for k, v in q.items() if k != "done"}
    keys = ("topic", "sealed", "summarized", "merged", "dropped", "errors")
    return template.format(**{k: numbers.get(k, 0) for k in keys})


async def conversation(app: Inspector, request: Request) -> Response:
    q = request.query_params
    cid = _cid(q)
    budget = _int(q, "budget", _default_budget(app)) or 0
    text = (q.get("q") or "").strip()
    comp = app.compressor
    stats_list, (topics, archives), info, (ctx, ctx_error) = await _gather(
        comp.stats(cid), _summaries(app, cid), _info(app, cid), _context(app, cid, budget)
    )
    stats: ConversationStats = stats_list[0]
    line = views.timeline(topics, archives, stats.messages, TIMELINE_PAGE)
    found = views.hits(await comp.search(cid, text, SEARCH_LIMIT), text, topics) if text else None
    return app.page(
        request,
        "conversation.html",
        cid=cid,
        stats=stats,
        info=info,
        budget=budget,
        ctx=ctx,
        ctx_error=ctx_error,
        line=line,
        query=text,
        found=found,
        flash=_flash(app, q),
        messages_page=MESSAGES_PAGE,
    )


async def context_part(app: Inspector, request: Request) -> Response:
    q = request.query_params
    cid = _cid(q)
    budget = _int(q, "budget", _default_budget(app)) or 0
    await app.compressor.stats(cid)  # 404 for an unknown conversation
    ctx, ctx_error = await _context(app, cid, budget)
    return app.page(request, "context.html", cid=cid, budget=budget, ctx=ctx, ctx_error=ctx_error)


async def timeline_part(app: Inspector, request: Request) -> Response:
    """A page of older topics (``before``) or of older archives (``archives_before``)."""
    q = request.query_params
    cid = _cid(q)
    before, archives_before = _int(q, "before"), _int(q, "archives_before")
    stats_list, (topics, archives) = await _gather(app.compressor.stats(cid), _summaries(app, cid))
    line = views.timeline(topics, archives, stats_list[0].messages, TIMELINE_PAGE, before, archives_before)
    return app.page(
        request,
        "timeline.html",
        cid=cid,
        line=line,
        part="archives" if archives_before is not None else "topics",
        messages_page=MESSAGES_PAGE,
    )


async def archive_part(app: Inspector, request: Request) -> Response:
    """One archive (by ordinal), with the archives that merged it."""
    q = request.query_params
    cid = _cid(q)
    n = _int(q, "n")
    _, archives = await _summaries(app, cid)
    found = [a for a in archives if a.sequence == n]
    if not found:
        await app.compressor.stats(cid)  # 404 for an unknown conversation first
        raise _Refused(404, "Not found", f"conversation {cid!r} has no archive {n}")
    return app.page(request, "archive.html", cid=cid, a=found[0], open=True)


async def messages_part(app: Inspector, request: Request) -> Response:
    q = request.query_params
    cid = _cid(q)
    first = max(_int(q, "first", 1) or 1, 1)
    last = _int(q, "last")
    end = first + MESSAGES_PAGE - 1 if last is None else min(last, first + MESSAGES_PAGE - 1)
    page: list[StoredMessage] = await app.compressor.get_messages(cid, first, end)
    more = None
    if page and (last is None or end < last):
        probe = await app.compressor.get_messages(cid, end + 1, end + 1)
        more = end + 1 if probe else None
    items = [views.message_item(m, "raw") for m in page]
    return app.page(
        request,
        "messages.html",
        cid=cid,
        items=items,
        first=first,
        last=last,
        more=more,
        cont=q.get("cont") == "1",
    )


async def search_part(app: Inspector, request: Request) -> Response:
    q = request.query_params
    cid = _cid(q)
    text = (q.get("q") or "").strip()
    found = None
    if text:
        found_msgs, (topics, _) = await _gather(
            app.compressor.search(cid, text, SEARCH_LIMIT), _summaries(app, cid)
        )
        found = views.hits(found_msgs, text, topics)
    else:
        await app.compressor.stats(cid)
    return app.page(request, "search.html", cid=cid, query=text, found=found, messages_page=MESSAGES_PAGE)


# -- actions (POST, --allow-writes, CSRF) -----------------------------------------------------


async def _action(app: Inspector, request: Request) -> FormData:
    """The form of an allowed action; refuses before anything is read or written otherwise."""
    if not app.allow_writes:
        raise _Refused(403, "Actions are off", "Start the inspector with --allow-writes to use actions.")
    form = await request.form()
    submitted = form.get("csrf")
    why = check_csrf(request, app.security, submitted if isinstance(submitted, str) else None)
    if why is not None:
        raise _Refused(403, "Refused", why)
    return form


def _back(cid: str, **params: Any) -> RedirectResponse:
    return RedirectResponse("/conversation?" + urlencode({"id": cid, **params}), status_code=303)


async def seal(app: Inspector, request: Request) -> Response:
    form = await _action(app, request)
    cid = _cid(form)
    sealed = await app.compressor.seal_current_topic(cid)
    if sealed is None:
        return _back(cid, done="nothing")
    return _back(cid, done="sealed", topic=sealed.sequence)


async def maintain(app: Inspector, request: Request) -> Response:
    form = await _action(app, request)
    cid = _cid(form)
    report = await app.compressor.maintain(cid)
    return _back(
        cid,
        done="maintained",
        sealed=report.sealed,
        summarized=report.summarized,
        merged=report.merged,
        dropped=report.dropped,
        errors=len(report.errors),
    )


async def delete(app: Inspector, request: Request) -> Response:
    form = await _action(app, request)
    cid = _cid(form)
    if form.get("confirm") != cid:
        raise _Refused(400, "Not deleted", "Type the conversation id exactly to confirm the deletion.")
    if not await app.compressor.delete_conversation(cid):
        raise _Refused(404, "Not found", f"There is no conversation {cid!r} to delete.")
    return RedirectResponse("/?" + urlencode({"deleted": cid}), status_code=303)


# -- login ------------------------------------------------------------------------------------


async def login(app: Inspector, request: Request) -> Response:
    sec = app.security
    target = safe_next(request.query_params.get("next"))
    if sec.token is None:
        return RedirectResponse(target, status_code=303)
    if request.method == "GET":
        return app.page(request, "login.html", next=target, error="")
    form = await request.form()
    submitted = form.get("csrf")
    why = check_csrf(request, sec, submitted if isinstance(submitted, str) else None)
    given = form.get("token")
    if why is None and isinstance(given, str) and same(given, sec.token):
        done = RedirectResponse(safe_next(str(form.get("next") or "/")), status_code=303)
        done.headers.append("set-cookie", login_cookie(request, sec))
        return done
    await asyncio.sleep(0.5)  # slows guessing down a little; the token's length does the rest
    return app.page(request, "login.html", 401, next=target, error=why or "wrong token")


async def logout(app: Inspector, request: Request) -> Response:
    form = await request.form()
    submitted = form.get("csrf")
    if check_csrf(request, app.security, submitted if isinstance(submitted, str) else None) is not None:
        raise _Refused(403, "Refused", "missing or stale CSRF token")
    done = RedirectResponse("/login", status_code=303)
    done.headers.append("set-cookie", logout_cookie(request, app.security))
    return done
