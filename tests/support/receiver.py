"""A real local HTTP receiver for webhook tests (http.server in a thread).

Paths choose the behaviour: ``/ok`` answers 204; ``/fail/<n>`` answers 500 to the first n requests
of each event id, then 200;
``/failfirst/<n>`` to the first n requests of all; ``/down`` always 500; ``/hang`` never answers until released;
``/huge`` answers 200 with an endless body; ``/redirect`` answers 302 to ``/ok``; ``/garbage``
answers a status line of NUL and control bytes (no HTTP at all). Every request is recorded (path,
headers, body, status sent)."""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int

    @property
    def event(self) -> dict:
        return json.loads(self.body)


@dataclass
class Receiver:
    requests: list[Received] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _fails: Counter = field(default_factory=Counter)

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status = receiver._status(self.path, body)
                if status == 0:  # hang
                    receiver._record(self.path, self.headers, body, 0)
                    receiver.release.wait(120)
                    return
                receiver._record(self.path, self.headers, body, status)
                if self.path.startswith("/garbage"):  # not HTTP: what a hostile or broken peer may send
                    self.wfile.write(b"\x00\x01BOGUS\x00 \x1b[31m\r\n\r\n")
                    self.close_connection = True
                    return
                if self.path.startswith("/huge"):
                    self.send_response(200)
                    self.send_header("Content-Length", str(1 << 34))
                    self.end_headers()
                    try:
                        while not receiver.release.is_set():
                            self.wfile.write(b"x" * 65536)
                    except OSError:
                        return
                    return
                self.send_response(status)
                if status == 302:
                    self.send_header("Location", "/ok")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def _status(self, path: str, body: bytes) -> int:
        if path.startswith("/ok"):
            return 204
        if path.startswith("/down"):
            return 500
        if path.startswith("/hang"):
            return 0
        if path.startswith("/redirect"):
            return 302
        if path.startswith("/huge"):
            return 200
        if path.startswith("/garbage"):
            return -1
        if path.startswith("/failfirst/"):
            with self._lock:
                self._fails[path] += 1
                return 500 if self._fails[path] <= int(path.split("/")[2]) else 200
        if path.startswith("/fail/"):
            n = int(path.split("/")[2])
            key = (path, json.loads(body)["id"])
            with self._lock:
                self._fails[key] += 1
                return 500 if self._fails[key] <= n else 200
        return 404

    def _record(self, path: str, headers, body: bytes, status: int) -> None:
        with self._lock:
            self.requests.append(Received(path, dict(headers.items()), body, status))

    def at(self, prefix: str) -> list[Received]:
        with self._lock:
            return [r for r in self.requests if r.path.startswith(prefix)]
