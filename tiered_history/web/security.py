"""Who may talk to the inspector, and which requests may change anything.

* Host check: bound to loopback, only loopback ``Host`` headers are served, so a web page
  that rebinds its own DNS name to 127.0.0.1 cannot read the inspector.
* Token (required off loopback): ``Authorization: Bearer T``, ``X-Tiered-History-Token: T`` or
  the cookie the login form sets, which holds an HMAC of the token rather than the token.
  Compared in constant time on every request but ``/login`` and the static files.
* CSRF: every browser gets a random session cookie (HttpOnly, SameSite=Strict); an action must
  carry ``HMAC(server secret, session)`` in its form or an ``X-CSRF-Token`` header, and a
  cross-site ``Origin`` or ``Sec-Fetch-Site`` is refused outright.
* Headers: a strict Content-Security-Policy (scripts and styles from this server only, no
  inline script, no eval), no framing, no referrer to other sites (same-origin: a
  form POST then carries a real ``Origin``), no caching of pages.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: The environment variable ``tiered-history serve`` reads the token from.
TOKEN_ENV = "TIERED_HISTORY_WEB_TOKEN"
#: Host names a loopback-bound server answers to.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]
_OPEN_PATHS = ("/login", "/static/")
#: How long a login lasts (the cookie's Max-Age, checked here too).
LOGIN_SECONDS = 7 * 24 * 3600


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``: addresses no other machine can reach."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _digest(key: str | bytes, message: str) -> str:
    raw = key.encode() if isinstance(key, str) else key
    return hmac.new(raw, message.encode(), hashlib.sha256).hexdigest()


def same(a: str | None, b: str) -> bool:
    """Constant-time equality of two strings (False for a missing one)."""
    return a is not None and hmac.compare_digest(a.encode(), b.encode())


@dataclass
class Security:
    """The inspector's secrets and switches, shared by the middleware and the handlers."""

    token: str | None = None
    allowed_hosts: tuple[str, ...] | None = None
    """``Host`` names served (``None``: any, for a server behind its own token)."""
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    """Signs CSRF tokens and logins; new on every start, so a restart invalidates old forms and
    logs every browser out."""
    secure_cookies: bool = False
    """Mark cookies ``Secure`` whatever the request's scheme (behind a TLS-terminating proxy,
    which the inspector sees as plain HTTP)."""
    logged_out: dict[str, int] = field(default_factory=dict)
    """Logins ended by a logout before their time: nonce -> when issued (dropped once expired)."""

    def login_value(self, now: float | None = None) -> str:
        """A new login cookie's value: when it was issued, a nonce, and their HMAC under a key made
        of the token and this start's secret. Never the token itself (a stolen cookie does not
        reveal it); each login its own, ended by its logout, its age or a restart."""
        issued = str(int(time.time() if now is None else now))
        nonce = secrets.token_urlsafe(12)
        return f"{issued}.{nonce}.{self._login_mac(issued, nonce)}"

    def valid_login(self, value: str | None, now: float | None = None) -> bool:
        parts = (value or "").split(".")
        if len(parts) != 3 or not parts[0].isascii() or not parts[0].isdigit() or len(parts[0]) > 12:
            return False
        issued, nonce, mac = parts
        if not same(mac, self._login_mac(issued, nonce)) or nonce in self.logged_out:
            return False
        return 0 <= (time.time() if now is None else now) - int(issued) < LOGIN_SECONDS

    def log_out(self, value: str | None, now: float | None = None) -> None:
        if not self.valid_login(value, now):
            return
        issued, nonce, _ = (value or "").split(".")
        if len(self.logged_out) >= 10_000:  # what has expired needs no remembering
            oldest = (time.time() if now is None else now) - LOGIN_SECONDS
            self.logged_out = {n: t for n, t in self.logged_out.items() if t >= oldest}
        self.logged_out[nonce] = int(issued)

    def _login_mac(self, issued: str, nonce: str) -> str:
        key = _digest(self.secret, "login:" + (self.token or ""))
        return _digest(key, f"{issued}.{nonce}")

    def csrf_for(self, session: str) -> str:
        return _digest(self.secret, "csrf:" + session)

    def cookie_names(self, scope: Scope) -> tuple[str, str]:
        # Cookies ignore ports: name them after the port so two inspectors do not clobber each other.
        port = (scope.get("server") or ("", 0))[1] or 0
        return f"th_session_{port}", f"th_auth_{port}"


def session_of(request: Request) -> str:
    """The browser's session id (set by :class:`Guard` before the handler runs)."""
    value = request.scope.get("th_session")
    return value if isinstance(value, str) else ""


def csrf_token(request: Request, security: Security) -> str:
    return security.csrf_for(session_of(request))


def check_csrf(request: Request, security: Security, submitted: str | None) -> str | None:
    """None if the request may act, else why not."""
    headers = request.headers
    if headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return "cross-site request refused"
    origin = headers.get("origin")
    if origin is not None:
        parts = urlsplit(origin)
        if origin == "null" or parts.netloc.lower() != headers.get("host", "").lower():
            return "cross-origin request refused"
    token = submitted or headers.get("x-csrf-token")
    if not session_of(request) or not same(token, csrf_token(request, security)):
        return "missing or stale CSRF token: reload the page and try again"
    return None


def safe_next(target: str | None) -> str:
    """A local path to go back to after login (never another site)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


class Guard:
    """ASGI middleware: host check, token check, session cookie, security headers."""

    def __init__(self, app: ASGIApp, security: Security) -> None:
        self.app = app
        self.security = security

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sec = self.security
        headers = Headers(scope=scope)
        if sec.allowed_hosts is not None and _host_name(headers.get("host", "")) not in sec.allowed_hosts:
            await PlainTextResponse("unknown host", status_code=400)(scope, receive, send)
            return
        session_name, auth_name = sec.cookie_names(scope)
        request = Request(scope)
        path: str = scope["path"]
        if sec.token is not None and not path.startswith(_OPEN_PATHS) and not self._authorized(request):
            await self._refuse(request)(scope, receive, send)
            return
        session = request.cookies.get(session_name, "")
        new_session = None
        if len(session) != 43:  # secrets.token_urlsafe(32): anything else is not ours
            session = new_session = secrets.token_urlsafe(32)
        scope["th_session"] = session
        scope["th_auth_cookie"] = auth_name
        secure = sec.secure_cookies or scope.get("scheme") == "https"

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                raw: list[tuple[bytes, bytes]] = list(message.get("headers", []))
                present = {k.lower() for k, _ in raw}
                raw.extend(h for h in _HEADERS if h[0] not in present)
                if not path.startswith("/static/"):
                    raw.append((b"cache-control", b"no-store"))
                if new_session is not None:
                    raw.append((b"set-cookie", _cookie(session_name, new_session, secure).encode()))
                message["headers"] = raw
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _authorized(self, request: Request) -> bool:
        sec = self.security
        assert sec.token is not None
        bearer = request.headers.get("authorization", "")
        if bearer[:7].lower() == "bearer " and same(bearer[7:].strip(), sec.token):
            return True
        if same(request.headers.get("x-tiered-history-token"), sec.token):
            return True
        _, auth_name = sec.cookie_names(request.scope)
        return sec.valid_login(request.cookies.get(auth_name))

    @staticmethod
    def _refuse(request: Request) -> Response:
        wants_page = request.method == "GET" and "text/html" in request.headers.get("accept", "")
        if wants_page and "hx-request" not in request.headers:
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse("/login?next=" + quote(target, safe=""), status_code=303)
        return PlainTextResponse(
            "token required", status_code=401, headers={"www-authenticate": 'Bearer realm="tiered-history"'}
        )


def _host_name(host_header: str) -> str:
    host = host_header.strip().lower()
    if host.startswith("["):  # [::1]:8750
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _cookie(name: str, value: str, secure: bool, max_age: int | None = None) -> str:
    parts = [f"{name}={value}", "Path=/", "HttpOnly", "SameSite=Strict"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def login_cookie(request: Request, security: Security) -> str:
    """The ``Set-Cookie`` value that logs this browser in (for a week)."""
    name = request.scope.get("th_auth_cookie")
    assert isinstance(name, str)
    return _cookie(name, security.login_value(), _secure(request, security), max_age=LOGIN_SECONDS)


def logout_cookie(request: Request, security: Security) -> str:
    """The ``Set-Cookie`` value that logs this browser out; its login cannot be used again."""
    name = request.scope.get("th_auth_cookie")
    assert isinstance(name, str)
    security.log_out(request.cookies.get(name))
    return _cookie(name, "", _secure(request, security), max_age=0)


def _secure(request: Request, security: Security) -> bool:
    return security.secure_cookies or request.scope.get("scheme") == "https"


def hosts_for(bind: str, extra: Iterable[str] = ()) -> tuple[str, ...] | None:
    """The ``Host`` names to accept when bound to ``bind``: loopback names on loopback, else any."""
    if is_loopback(bind):
        return (*LOOPBACK_HOSTS, *extra)
    return None
