"""The gunicorn worker that serves the API: errors raised by the server layer are JSON too.

Flask's one error handler (``app/api/errors.py``) covers everything the app sees. Two kinds of
error never reach it, and stock gunicorn answers them with an HTML page or nothing:

* a request gunicorn itself cannot parse (bad request line, header too large, bad chunking):
  400/414/431/501 ``{"error": <code>, "message": …}``;
* a worker timeout: the arbiter aborts (SIGABRT) a worker that stopped reporting within
  ``timeout``; every request of that worker whose response has not started gets
  503 ``worker_timeout`` before the worker exits, instead of a dropped connection (or, with the
  sync worker, gunicorn's HTML 500). A response already under way is cut, never followed by a
  second one.

It is gunicorn's threaded worker (``gthread``, see :mod:`app.api.gunicorn_conf`) with those two
changes; ``app.api.gunicorn_conf`` selects it, so ``memeflow api``, ``memeflow up`` and
docker-compose all run it.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any

from gunicorn import util
from gunicorn.workers.gthread import ThreadWorker

# gunicorn's status for a server-layer error -> our stable snake_case code.
SERVER_CODES = {
    400: "bad_request",
    403: "forbidden",
    414: "uri_too_long",
    417: "expectation_failed",
    431: "request_header_fields_too_large",
    500: "internal_error",
    501: "not_implemented",
}
TIMEOUT_STATUS, TIMEOUT_REASON, TIMEOUT_CODE = 503, "Service Unavailable", "worker_timeout"


def json_error_bytes(status: int, reason: str, code: str, message: str) -> bytes:
    """A complete HTTP/1.1 response (``Connection: close``) with the API's JSON error body."""
    body = json.dumps({"error": code, "message": message}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


def write_json_error(sock: socket.socket, status_int: int, reason: str, mesg: str) -> None:
    """Drop-in for ``gunicorn.util.write_error`` that writes JSON instead of HTML."""
    code = SERVER_CODES.get(status_int, "server_error")
    message = mesg if 400 <= status_int < 500 and mesg else reason.lower()
    util.write_nonblock(sock, json_error_bytes(status_int, reason, code, message[:500]))


class JsonErrorWorker(ThreadWorker):
    """gunicorn's threaded worker whose own error responses are the API's JSON error bodies."""

    def init_process(self) -> None:
        # gunicorn writes its error pages (parse errors, 431, 414, ...) only through
        # util.write_error; replaced in this worker process alone (the arbiter is not touched).
        util.write_error = write_json_error
        self._computing: dict[int, socket.socket] = {}  # requests whose response has not started
        self._computing_lock = threading.Lock()
        super().init_process()

    def load_wsgi(self) -> None:
        super().load_wsgi()
        self.wsgi = self._tracked(self.wsgi)

    def _tracked(self, app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
        """``app`` recording which client sockets still wait for their response to start."""
        computing, lock = self._computing, self._computing_lock

        def tracked(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            sock = environ.get("gunicorn.socket")
            key = id(sock)
            if sock is not None:
                with lock:
                    computing[key] = sock

            def started(status: str, headers: list, exc_info: Any = None) -> Any:
                with lock:
                    computing.pop(key, None)
                return start_response(status, headers, exc_info)

            try:
                return app(environ, started)
            finally:
                with lock:
                    computing.pop(key, None)

        return tracked

    def handle_abort(self, sig: int, frame: Any) -> None:
        """The arbiter's timeout abort: answer every request still computing, then exit."""
        with self._computing_lock:
            socks, self._computing = list(self._computing.values()), {}
        self.log.error("worker timeout: aborting %d request(s) in progress (timeout %ss)", len(socks),
                       self.cfg.timeout)
        for sock in socks:
            try:
                util.write_nonblock(sock, json_error_bytes(
                    TIMEOUT_STATUS, TIMEOUT_REASON, TIMEOUT_CODE, "the server worker timed out; retry later"))
                sock.shutdown(socket.SHUT_RDWR)  # the request's thread can write nothing after this
            except OSError:
                pass  # the client is gone
        super().handle_abort(sig, frame)
