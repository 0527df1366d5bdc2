"""HTTP connections whose whole exchange has one deadline: name resolution, the TCP connect to
every address tried, the TLS handshake, a proxy's CONNECT, the request and the answer's headers.

Used by the ``openai-compatible`` agent (:mod:`app.stages.agent.openai_compatible`), whose error
classification needs to know whether a byte of the request can have left: the connection records
the moment its request starts (``Watch.request_started``), so a failure before it proves the
provider never saw the call.

* **Name resolution** runs in a small pool of resolver threads (:mod:`app.bounded_dns`) and is waited
  for only until the deadline: the system resolver has no timeout of ours, and a resolver that
  never answers would otherwise hold the call (and its lane slot) for as long as it likes. A
  resolution abandoned at the deadline finishes in its pool thread; with every pool thread stuck,
  later calls wait in the pool's queue and end at their own deadlines — never more threads.
  Address literals are not sent to the pool.
* **The TCP connect** to each address waits at most the connect timeout cut to what is left of the
  deadline, so a name with several unreachable addresses cannot multiply the deadline.
* From the moment the socket exists until the headers have arrived, a **watchdog** timer shuts the
  socket down at the deadline, so a slow drip of handshake or header bytes cannot stretch the call.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.util.connection import allowed_gai_family

from app.bounded_dns import getaddrinfo_by

__all__ = ["WATCHDOG_THREAD", "DeadlineAdapter", "Watch"]

_watch = threading.local()  # .current: the Watch of this thread's exchange, or None
WATCHDOG_THREAD = "agent-header-watchdog"


def _left(deadline: float, what: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"the call's deadline passed {what}")
    return left


def resolve(host: str, port: int, deadline: float) -> list[tuple[Any, ...]]:
    """``getaddrinfo`` for a TCP connection to ``host``, waited for until ``deadline`` at most (the
    ``agent`` resolver pool, :mod:`app.bounded_dns`). TimeoutError past the deadline;
    socket.gaierror when the name does not resolve."""
    try:
        return getaddrinfo_by("agent", deadline, host, port, allowed_gai_family(), socket.SOCK_STREAM)
    except TimeoutError:
        raise TimeoutError("the call's deadline passed during name resolution") from None


def connect_by(
    host: str, port: int, deadline: float, connect_timeout: Any,
    source_address: tuple[str, int] | None = None, socket_options: Any = None,
) -> socket.socket:
    """A TCP socket connected to ``host`` (the first of its addresses that answers), urllib3's
    ``create_connection`` under one deadline: the resolution and every address's connect wait at
    most what is left of it (and each connect at most ``connect_timeout``, when it is a number)."""
    error: OSError | None = None
    for family, kind, proto, _, address in resolve(host, port, deadline):
        left = _left(deadline, "while connecting")
        sock = socket.socket(family, kind, proto)
        try:
            for option in socket_options or ():
                sock.setsockopt(*option)
            sock.settimeout(min(left, connect_timeout) if isinstance(connect_timeout, int | float) else left)
            if source_address:
                sock.bind(source_address)
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    if error is not None:
        raise error
    raise OSError("getaddrinfo returns an empty list")


class Watch:
    """The watchdog of one exchange, and its record of how far the exchange got.

    Connecting (TCP, TLS handshake, a proxy's CONNECT), sending the request and reading the status
    line and headers happen inside urllib3 and http.client, where each socket read waits up to a
    timeout: a peer dripping bytes would stretch the call without end. From entry to exit a timer
    shuts the socket of the connection carrying the exchange down when the deadline passes (the
    blocked read returns at once). The connection (``WatchedConnection``) reports to it: its
    socket as soon as it exists, and the moment the request starts — before that moment no byte
    of the request can have left, so a failure proves the provider never saw the call."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline  # time.monotonic() at which the exchange ends
        self.fired = False
        self.watched = False  # a watched connection carries the exchange (then the flag below is exact)
        self.request_started = False  # request bytes may have left (never reset)
        self._conn: HTTPConnection | None = None
        self._stopped = False
        self._lock = threading.Lock()  # the timer's check and shutdown vs. publish, start and stop
        self._timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._expire)
        self._timer.name, self._timer.daemon = WATCHDOG_THREAD, True

    def __enter__(self) -> Watch:
        _watch.current = self
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            # a timer that fires from now on (cancel() cannot stop a callback already running)
            # must not touch the connection: back in the pool, it may carry the next call
            self._stopped = True
        self._timer.cancel()
        _watch.current = None

    def nothing_sent(self) -> bool:
        """True when a watched connection carried the exchange and its request never started."""
        return self.watched and not self.request_started

    def publish(self, conn: HTTPConnection, sock: socket.socket) -> bool:
        """Make ``sock`` ``conn``'s socket, where the timer can shut it, before the TLS handshake
        or anything else uses it; False (the caller drops it) when the deadline already passed."""
        with self._lock:
            if self.fired:
                return False
            self._conn, conn.sock = conn, sock
            return True

    def start_request(self, conn: HTTPConnection) -> bool:
        """Record that ``conn`` starts sending the request; False when the deadline already
        passed (nothing is sent)."""
        with self._lock:
            self.watched = True
            if self.fired:
                return False
            self._conn, self.request_started = conn, True
            return True

    def _expire(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self.fired = True
            sock = getattr(self._conn, "sock", None)
            while sock is not None and not isinstance(sock, socket.socket):
                sock = getattr(sock, "socket", None)  # TLS inside a TLS proxy tunnel: urllib3's SSLTransport
            if sock is not None:
                try:  # the plain socket's shutdown (an SSLSocket's would also drop its TLS state)
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except OSError:
                    pass


class WatchedConnection:
    """A urllib3 connection that reports to its thread's exchange ``Watch``: its socket as soon
    as the TCP connect returns, and the start of the request, which it sends only once connected
    (urllib3 connects HTTPS before the request; plain HTTP would connect inside it)."""

    def _new_conn(self) -> socket.socket:
        watch = getattr(_watch, "current", None)
        if watch is None:
            return super()._new_conn()  # type: ignore[misc]
        watch.watched = True
        try:
            sock = connect_by(
                self._dns_host, self.port, watch.deadline, self.timeout,  # type: ignore[attr-defined]
                self.source_address, self.socket_options,  # type: ignore[attr-defined]
            )
        except socket.gaierror as exc:
            raise NameResolutionError(self.host, self, exc) from exc  # type: ignore[attr-defined,arg-type]
        except TimeoutError as exc:
            raise ConnectTimeoutError(self, f"connecting timed out: {exc}") from exc
        except OSError as exc:
            raise NewConnectionError(self, f"Failed to establish a new connection: {exc}") from exc  # type: ignore[arg-type]
        sys.audit("http.client.connect", self, self.host, self.port)  # type: ignore[attr-defined]
        if not watch.publish(self, sock):  # type: ignore[arg-type]
            sock.close()
            raise TimeoutError("the call's deadline passed while connecting")
        return sock

    def _tunnel(self) -> None:
        super()._tunnel()  # type: ignore[misc]
        watch = getattr(_watch, "current", None)
        # http.client takes an EOF in the proxy's CONNECT answer for its end: one the watchdog
        # caused is no tunnel (and TLS over the dead socket would fail, leaking it in ssl.py)
        if watch is not None and watch.fired:
            raise TimeoutError("the call's deadline passed while the proxy tunnel was made")

    def request(self, *args: Any, **kwargs: Any) -> Any:
        if self.sock is None:  # type: ignore[attr-defined]
            self.connect()  # type: ignore[attr-defined]
        watch = getattr(_watch, "current", None)
        if watch is not None and not watch.start_request(self):  # type: ignore[arg-type]
            raise TimeoutError("the call's deadline passed before the request was sent")
        return super().request(*args, **kwargs)  # type: ignore[misc]


class WatchedHTTPConnection(WatchedConnection, HTTPConnection):
    pass


class WatchedHTTPSConnection(WatchedConnection, HTTPSConnection):
    pass


class WatchedHTTPPool(HTTPConnectionPool):
    ConnectionCls = WatchedHTTPConnection


class WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = WatchedHTTPSConnection


class DeadlineAdapter(HTTPAdapter):
    """requests' adapter whose connections honour the exchange's deadline (``WatchedConnection``)."""

    _POOLS = {"http": WatchedHTTPPool, "https": WatchedHTTPSPool}

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(self._POOLS)

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> requests.Response:
        response = super().send(request, *args, **kwargs)
        watch = getattr(_watch, "current", None)
        if watch is not None:  # an answer came, so a request went out, on whatever connection: a
            watch.request_started = True  # redirect's next hop failing early must not look unsent
        return response

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if not proxy.lower().startswith("socks"):  # SOCKS pools are their own classes: not watched
            manager.pool_classes_by_scheme = dict(self._POOLS)
        return manager


