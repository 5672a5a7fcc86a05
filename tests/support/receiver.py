"""A real HTTP receiver on loopback for the alert tests: records every request, answers as told."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any


@dataclass
class Answer:
    status: int = 200
    body: Any = None  # JSON value, bytes or None (empty)
    headers: dict[str, str] = field(default_factory=dict)


class Receiver:
    """`ThreadingHTTPServer` on 127.0.0.1:<free port>. `answers` is a queue of Answer for the next
    requests; when empty, `default` answers. `stop()` closes the port (connection refused), `start()`
    opens it again on the same port."""

    def __init__(self, port: int = 0) -> None:
        self.requests: list[Recorded] = []
        self.answers: list[Answer] = []
        self.default = Answer(200, {"ok": True})
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.port = port
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def answer(self, *answers: Answer) -> None:
        with self._lock:
            self.answers.extend(answers)

    def _next(self) -> Answer:
        with self._lock:
            return self.answers.pop(0) if self.answers else self.default

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body: Any = json.loads(raw) if raw else None
                except ValueError:
                    body = raw
                split = urllib.parse.urlsplit(self.path)
                with receiver._lock:
                    receiver.requests.append(
                        Recorded("POST", split.path, urllib.parse.parse_qs(split.query), dict(self.headers), body)
                    )
                answer = receiver._next()
                data = (
                    answer.body
                    if isinstance(answer.body, bytes)
                    else b""
                    if answer.body is None
                    else json.dumps(answer.body).encode()
                )
                self.send_response(answer.status)
                for key, value in answer.headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@contextmanager
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.stop()
