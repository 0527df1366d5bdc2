"""POST one event to a webhook receiver: signed, bounded, never redirected, never to a forbidden
address.

* **Signature**: ``Memeflow-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>``,
  with ``Memeflow-Timestamp``, ``Memeflow-Event-Id``, ``Memeflow-Event-Type`` and
  ``Idempotency-Key: <event id>`` (a redelivery carries the same id: at-least-once).
* **SSRF**: the URL is checked and resolved again right before each delivery
  (:func:`resolve_receiver`, :func:`app.netguard.check_outbound_url`) and the connection goes to
  one of the checked addresses (TLS still verifies the certificate against the URL's host name): a
  DNS answer that changes between subscription and delivery, or between check and connect, cannot
  redirect it. The lane resolves before it takes the subscription's row lock and hands the
  checked target in (``target=``), so a slow resolver never makes a DELETE wait; with the target
  given, everything :func:`send_event` does is bounded by the exchange's deadline.
* **Bounds**: one deadline for the whole exchange (a watchdog shuts the socket down when it
  passes, so a receiver that trickles bytes cannot hold a worker; the connect and the TLS
  handshake, before there is a socket to shut, are bounded by what is left of it; an answer
  completed after it is a timeout), at most
  ``max_response_bytes`` of the answer are read, redirects are not followed (a 3xx is a failure).
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from app.netguard import OutboundRefused, check_outbound_url

USER_AGENT = "memeflow-webhooks/1"
#: Kept as is in a request target (every printable ASCII character: an existing %XX stays as typed).
_ASCII_PRINTABLE = "".join(map(chr, range(0x21, 0x7F)))


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The hex HMAC-SHA256 a receiver recomputes: key = the secret, message = ``"<t>." + body``."""
    return hmac.new(secret.encode("utf-8"), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def verify(secret: str, header: str, body: bytes, *, tolerance_s: float = 300.0, now: float | None = None) -> bool:
    """What a receiver does: parse ``t=…,v1=…``, check the timestamp is recent and the MAC matches."""
    try:
        parts = dict(p.split("=", 1) for p in header.split(","))
        ts = int(parts["t"])
    except (ValueError, KeyError):
        return False
    if abs((now if now is not None else time.time()) - ts) > tolerance_s:
        return False
    return hmac.compare_digest(parts.get("v1", ""), signature(secret, ts, body))


@dataclass(frozen=True)
class SendResult:
    ok: bool
    status: int | None = None
    code: str = ""  # stable error code when not ok
    message: str = ""

    def error(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message[:500], "status": self.status}


class _Deadline:
    """The exchange's absolute deadline, for the connection's own connect: the watchdog shuts a
    socket down when the deadline passes, but while the connection is being made (TCP connect, TLS
    handshake) there is no ``conn.sock`` to shut, so the connect bounds itself by what is left."""

    def __init__(self, timeout_s: float) -> None:
        self.at = time.monotonic() + timeout_s
        self.expired = threading.Event()  # set by the watchdog when it fires

    def left(self, timeout: float) -> float:
        """The time an operation of the connect may take: ``timeout``, cut to the deadline."""
        left = self.at - time.monotonic()
        if left <= 0 or self.expired.is_set():
            raise TimeoutError("the webhook deadline passed while connecting")
        return min(timeout, left)

    def check_connected(self, sock: socket.socket) -> None:
        """After ``conn.sock`` is set: if the watchdog already fired it found no socket — fail now
        (either the watchdog sees this socket, or this sees ``expired``)."""
        if self.expired.is_set() or time.monotonic() >= self.at:
            sock.close()
            raise TimeoutError("the webhook deadline passed while connecting")


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, address: str, timeout: float, deadline: _Deadline) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address, self._deadline = address, deadline

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self._deadline.left(self.timeout))
        self.sock.settimeout(self.timeout)
        self._deadline.check_connected(self.sock)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, address: str, timeout: float, deadline: _Deadline) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address, self._deadline = address, deadline

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self._deadline.left(self.timeout))
        try:
            sock.settimeout(self._deadline.left(self.timeout))  # CPython bounds the whole handshake by it
            self.sock = self._context.wrap_socket(sock, server_hostname=self.host)
            self.sock.settimeout(self.timeout)
        except BaseException:
            sock.close()
            raise
        self._deadline.check_connected(self.sock)


#: A checked receiver: (scheme, host, port, the allowed addresses it resolved to).
Target = tuple[str, str, int, list[str]]


def resolve_receiver(url: str, networks: tuple = (), *, timeout_s: float | None = None) -> Target | SendResult:
    """Check and resolve ``url`` for one delivery: its :data:`Target`, or the failed
    :class:`SendResult` a refused or unresolvable URL is recorded as (not bounded by the exchange's
    deadline, so call it holding no lock).

    ``timeout_s``: an answer that takes longer (a receiver's dead or stalling nameserver — the
    resolver's own timeouts can add up to tens of seconds) is a ``timeout`` failure, so a claim's
    lease (> 2 × the exchange's timeout) outlasts resolving plus the exchange, and a hostile
    nameserver holds a lane thread no longer than a hostile receiver does. The lookup itself goes
    on in the ``webhooks`` resolver pool (:mod:`app.bounded_dns`: a few threads per process, never
    one per delivery) until the resolver gives up."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        return check_outbound_url(url, networks, deadline=deadline)
    except OutboundRefused as exc:
        return SendResult(False, None, exc.code, str(exc))
    except TimeoutError:
        return SendResult(False, None, "timeout", f"the receiver's name did not resolve within {timeout_s:g}s")


def send_event(
    url: str, secret: str, event: dict[str, Any], *, timeout_s: float, max_response_bytes: int,
    networks: tuple = (), now: float | None = None, target: Target | None = None,
) -> SendResult:
    """Deliver ``event`` to ``url`` once. 2xx = delivered; anything else is a failure to retry.
    ``target``: ``url`` checked and resolved already (:func:`resolve_receiver`); without it this
    resolves first."""
    if target is None:
        target = resolve_receiver(url, networks)
        if isinstance(target, SendResult):
            return target
    scheme, host, port, addresses = target
    body = json.dumps(event, separators=(",", ":")).encode("utf-8")
    ts = int(now if now is not None else time.time())
    headers = {
        "Content-Type": "application/json", "User-Agent": USER_AGENT,
        "Memeflow-Event-Id": str(event["id"]), "Memeflow-Event-Type": event["type"],
        "Memeflow-Timestamp": str(ts), "Memeflow-Signature": f"t={ts},v1={signature(secret, ts, body)}",
        "Idempotency-Key": str(event["id"]), "Connection": "close",
    }
    parts = urlsplit(url)
    # http.client sends the request line as ASCII: a path or query typed with non-ASCII characters
    # (an IRI, which the URL check accepts) goes out percent-encoded as UTF-8, as browsers send it
    target = quote((parts.path or "/") + (f"?{parts.query}" if parts.query else ""), safe=_ASCII_PRINTABLE)
    conn_cls = _PinnedHTTPS if scheme == "https" else _PinnedHTTP
    deadline = _Deadline(timeout_s)
    conn = conn_cls(host, port, addresses[0], timeout_s, deadline)
    expired = deadline.expired

    def _expire() -> None:  # the deadline covers the whole exchange, not each read
        expired.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    watchdog = threading.Timer(timeout_s, _expire)
    watchdog.daemon = True
    watchdog.start()
    try:
        conn.request("POST", target, body=body, headers=headers)
        resp = conn.getresponse()
        resp.read(max_response_bytes)  # read (bounded) and drop: a receiver's answer is not used
        status = resp.status
    except (OSError, http.client.HTTPException, ValueError) as exc:  # ValueError: a request it cannot encode
        if expired.is_set() or isinstance(exc, TimeoutError | socket.timeout):
            return SendResult(False, None, "timeout", f"no complete answer within {timeout_s:g}s")
        return SendResult(False, None, "connection_error", f"{type(exc).__name__}: {exc}")
    finally:
        watchdog.cancel()
        conn.close()
    if expired.is_set():  # complete, but late: the exchange is bounded, so this counts as no answer
        return SendResult(False, status, "timeout", f"no complete answer within {timeout_s:g}s")
    if 200 <= status < 300:
        return SendResult(True, status)
    if 300 <= status < 400:
        return SendResult(False, status, "redirect_refused", f"HTTP {status}: redirects are not followed")
    return SendResult(False, status, "http_error", f"HTTP {status}")
