"""The web inspector: ``tiered-history serve`` (needs ``pip install "tiered-history[web]"``).

:func:`create_app` builds the ASGI application; the command line serves it with uvicorn.
See docs/inspector.md.
"""

from __future__ import annotations

#: What to tell someone whose installation lacks the web stack.
INSTALL_HINT = 'the web inspector needs its extra: pip install "tiered-history[web]"'

try:
    import python_multipart  # noqa: F401  (Starlette parses the action forms with it)

    from .app import create_app
    from .security import LOOPBACK_HOSTS, TOKEN_ENV, hosts_for, is_loopback
except ImportError as exc:  # starlette, jinja2 or python-multipart missing
    raise ImportError(f"{INSTALL_HINT} ({exc})") from exc

__all__ = ["INSTALL_HINT", "LOOPBACK_HOSTS", "TOKEN_ENV", "create_app", "hosts_for", "is_loopback"]
