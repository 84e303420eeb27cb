"""A tiny OpenAI-compatible chat-completions server on 127.0.0.1 for summariser tests.

It is a real HTTP server (stdlib ``ThreadingHTTPServer`` in a thread), so litellm
goes through its normal OpenAI client, timeouts and error mapping. Each test
scripts what the server answers and inspects what it received::

    def test_x(openai_server):
        openai_server.script(Reply(status=500), Reply(text="A summary."))
        ...  # call litellm with api_base=openai_server.url
        assert openai_server.requests[0]["max_tokens"] == 146
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

__all__ = ["OpenAIServer", "Reply", "openai_server"]

CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})


@dataclass(frozen=True)
class Reply:
    """One scripted answer. ``body`` (raw bytes/str) replaces the generated JSON entirely."""

    text: str | None = "A short summary."
    status: int = 200
    delay: float = 0.0
    body: bytes | str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str = "stop"


Responder = Callable[[dict[str, Any]], Reply]


def _rough_tokens(text: str) -> int:
    return max(1, len(text) // 4)


class OpenAIServer:
    """Serves scripted replies; records every request body as parsed JSON in :attr:`requests`."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []  # lower-cased names
        self.default = Reply()
        self._queue: deque[Reply] = deque()
        self._responder: Responder | None = None
        self._lock = threading.Lock()
        self._closing = threading.Event()  # wakes handlers sleeping in a scripted delay
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="openai-test-server"
        )
        self._thread.daemon = True
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *replies: Reply | str, responder: Responder | None = None) -> None:
        """Queue replies (a ``str`` is shorthand for ``Reply(text=...)``), answered in order.

        With ``responder``, every request not covered by the queue is answered by calling it
        with the request body; otherwise by :attr:`default`.
        """
        with self._lock:
            self._queue.extend(Reply(text=r) if isinstance(r, str) else r for r in replies)
            if responder is not None:
                self._responder = responder

    def close(self) -> None:
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    # -- request handling ---------------------------------------------------------------

    def _next_reply(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
            responder = self._responder
        return responder(body) if responder is not None else self.default

    def _render(self, reply: Reply, body: dict[str, Any]) -> tuple[int, bytes]:
        if reply.body is not None:
            raw = reply.body.encode() if isinstance(reply.body, str) else reply.body
            return reply.status, raw
        if reply.status >= 400:
            error = {"message": f"scripted HTTP {reply.status}", "type": "test_error", "code": None}
            return reply.status, json.dumps({"error": error}).encode()
        prompt_text = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        text = reply.text
        prompt_tokens = reply.prompt_tokens if reply.prompt_tokens is not None else _rough_tokens(prompt_text)
        completion_tokens = (
            reply.completion_tokens if reply.completion_tokens is not None else _rough_tokens(text or "")
        )
        payload = {
            "id": f"chatcmpl-test-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "unknown"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": reply.finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        return reply.status, json.dumps(payload).encode()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                path = self.path.split("?")[0]
                if path not in CHAT_PATHS:
                    self._send(404, b'{"error": {"message": "not found"}}')
                    return
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    self._send(400, b'{"error": {"message": "request body is not JSON"}}')
                    return
                with server._lock:
                    server.requests.append(body)
                    server.paths.append(path)
                    server.headers.append({k.lower(): v for k, v in self.headers.items()})
                reply = server._next_reply(body)
                if reply.delay and server._closing.wait(reply.delay):
                    return  # server closing: drop the request
                status, payload = server._render(reply, body)
                self._send(status, payload)

            def _send(self, status: int, payload: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test): nothing to do

        return Handler


@pytest.fixture
def openai_server() -> Iterator[OpenAIServer]:
    server = OpenAIServer()
    try:
        yield server
    finally:
        server.close()
