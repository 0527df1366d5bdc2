"""openai-compatible agent: the connect phase (TCP, TLS handshake, a proxy's CONNECT) is bounded
by the call's deadline, and a call that never got past it is reported as not executed — while a
deadline that passes once the request has started leaves the outcome unknown.

Real local peers: a raw TCP server that stalls the handshake, and the chat-completions fake
served over TLS with a certificate the test makes."""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
import time
import uuid

import pytest
from PIL import Image

from app.stages.agent.openai_compatible import OpenAICompatibleAgent
from app.stages.agent.watched_http import WATCHDOG_THREAD
from app.stages.errors import OutcomeUnknownError, RetryableError
from tests.conftest import poll_until

from .helpers import decoded
from .test_openai_compatible import FakeServer, _describe

DEADLINE_S = 1.0
# generous: the stalling peers below would hold an unbounded call 30 s, the connect timeout is 30 s
BOUND_S = DEADLINE_S + 4.0
DRIP_S, DRIP_MAX = 0.05, 600  # one byte every 50 ms, for 30 s at most


class StallingPeer:
    """A TCP server that lets every connection in and never lets it finish connecting.

    ``silent``: reads the ClientHello, answers nothing. ``tlsdrip``: answers a TLS handshake record
    header announcing 16 KiB, then one byte of it every 50 ms (no read ever waits long).
    ``connectdrip`` (an HTTP proxy): answers the CONNECT with a status line, then drips a header.
    ``first`` holds what each connection sent first (a ClientHello, a CONNECT line)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.first: list[bytes] = []
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)  # the accept loop notices the stop
        self.port = self._listener.getsockname()[1]
        self._accepting = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> StallingPeer:
        self._accepting.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._accepting.join(10)
        for thread in self._threads:
            thread.join(10)
        for conn in self._conns:
            conn.close()
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            self._conns.append(conn)
            thread = threading.Thread(target=self._stall, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _stall(self, conn: socket.socket) -> None:
        try:
            self.first.append(conn.recv(4096))
            if self.mode == "tlsdrip":
                self._drip(conn, b"\x16\x03\x03\x40\x00", b"\x00")
            elif self.mode == "connectdrip":
                self._drip(conn, b"HTTP/1.1 200 Connection established\r\nX-Slow: ", b"a")
            else:
                self._stop.wait()
        except OSError:
            pass  # the client gave up: the point of the test

    def _drip(self, conn: socket.socket, start: bytes, byte: bytes) -> None:
        conn.sendall(start)
        for _ in range(DRIP_MAX):
            if self._stop.wait(DRIP_S):
                return
            conn.sendall(byte)


@pytest.fixture(scope="module")
def image():
    return decoded(Image.new("RGB", (64, 48), (200, 30, 30)))


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    """The chat-completions fake behind TLS, with a certificate for 127.0.0.1 made here."""
    home = tmp_path_factory.mktemp("tls")
    cert, key = home / "cert.pem", home / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    fake = FakeServer()
    fake.httpd.socket = context.wrap_socket(fake.httpd.socket, server_side=True)
    fake.url = fake.url.replace("http://", "https://")
    fake.cafile = str(cert)
    fake.thread.start()
    yield fake
    fake.release.set()
    fake.httpd.shutdown()
    fake.httpd.server_close()


def _trusting(agent: OpenAICompatibleAgent, cafile: str) -> OpenAICompatibleAgent:
    agent.session.trust_env = False  # the environment's CA bundle would override ``verify``
    agent.session.verify = cafile
    return agent


def _watchdogs() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == WATCHDOG_THREAD and t.is_alive()]


def _stalled_call(agent: OpenAICompatibleAgent, image) -> tuple[pytest.ExceptionInfo, float]:
    started = time.monotonic()
    with pytest.raises((RetryableError, OutcomeUnknownError)) as info:
        _describe(agent, image)
    return info, time.monotonic() - started


@pytest.mark.parametrize("mode", ["silent", "tlsdrip"])
def test_a_stalled_tls_handshake_ends_at_the_deadline_and_sent_nothing(image, mode):
    """The connect timeout (30 s) is far past the deadline (1 s). The peer takes the connection and
    the ClientHello, then never completes the handshake: the call ends at about the deadline, and
    since the request never started, it provably did not reach the provider (safe to retry)."""
    with StallingPeer(mode) as peer:
        agent = OpenAICompatibleAgent(base_url=f"https://127.0.0.1:{peer.port}/v1", model="m",
                                      connect_timeout_s=30, timeout_s=30, deadline_s=DEADLINE_S)
        info, elapsed = _stalled_call(agent, image)
        assert peer.first and peer.first[0][:1] == b"\x16"  # a TLS handshake record: TCP did connect
    assert elapsed < BOUND_S, elapsed
    assert isinstance(info.value, RetryableError), info.value
    assert info.value.not_executed is True and info.value.code == "agent_unreachable"
    poll_until(lambda: not _watchdogs(), timeout=10, what="the exchange's watchdog to end")


def test_a_proxy_dripping_its_connect_answer_ends_at_the_deadline_and_sent_nothing(image):
    """Through an HTTP proxy the tunnel's CONNECT answer is read before the request, one socket read
    at a time: a proxy dripping it byte by byte must still be stopped by the deadline (before the
    watchdog covered the connect, this call took the whole 30 s drip)."""
    with StallingPeer("connectdrip") as proxy:
        agent = OpenAICompatibleAgent(base_url="https://provider.test/v1", model="m",
                                      connect_timeout_s=30, timeout_s=30, deadline_s=DEADLINE_S)
        agent.session.trust_env = False
        agent.session.proxies = {"https": f"http://127.0.0.1:{proxy.port}"}
        info, elapsed = _stalled_call(agent, image)
        assert proxy.first and proxy.first[0].startswith(b"CONNECT provider.test:443")
    assert elapsed < BOUND_S, elapsed
    assert isinstance(info.value, RetryableError), info.value
    assert info.value.not_executed is True and info.value.code == "agent_unreachable"


def test_a_call_over_tls_succeeds(tls_server, image):
    agent = _trusting(tls_server.agent("good", deadline_s=30), tls_server.cafile)
    assert _describe(agent, image).context["title"] == "Sleepy cat"


@pytest.mark.parametrize("mode", ["headerdrip", "drip"])
def test_a_deadline_after_the_tls_handshake_is_outcome_unknown(tls_server, image, mode):
    """Once the handshake is done and the request started, the provider may have it: the deadline
    passing while the answer drips in is an unknown outcome, never a retryable one."""
    agent = _trusting(tls_server.agent(mode, timeout_s=5, deadline_s=DEADLINE_S), tls_server.cafile)
    attempt_id = uuid.uuid4().hex
    started = time.monotonic()
    with pytest.raises(OutcomeUnknownError) as info:
        _describe(agent, image, attempt_id)
    assert time.monotonic() - started < BOUND_S
    assert info.value.code == "agent_deadline_exceeded"
    assert not isinstance(info.value, RetryableError)
    poll_until(lambda: any(r["headers"]["Idempotency-Key"] == attempt_id for r in tls_server.requests),
               timeout=30, what="the TLS server to record the request whose answer passed the deadline")


def test_the_watchdog_shuts_a_tls_in_tls_tunnel_at_its_plain_socket():
    """Through an HTTPS proxy the connection's socket is urllib3's SSLTransport, no socket object:
    the watchdog shuts the plain socket under it (it used to raise TypeError in the timer thread)."""
    from urllib3.util.ssltransport import SSLTransport

    from app.stages.agent.watched_http import Watch

    ours, peer = socket.socketpair()

    class Transport(SSLTransport):  # the attributes the watchdog reads, over a real socket
        def __init__(self, sock):
            self.socket = sock

    class Conn:
        sock = Transport(ours)

    try:
        with Watch(time.monotonic() + 0.05) as watch:
            assert watch.publish(Conn(), Conn.sock)
            poll_until(lambda: watch.fired, timeout=10)
            ours.settimeout(10)
            assert ours.recv(1) == b""  # shut down: the blocked read returns at once
    finally:
        ours.close()
        peer.close()


class Blackhole:
    """A listener whose accept queue is full: a TCP connect to it is never answered (the kernel
    drops the SYN), as with an address behind a firewall that drops packets."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        self.port = self.listener.getsockname()[1]
        self.filler = socket.create_connection(("127.0.0.1", self.port), timeout=5)  # the one queued

    def __enter__(self) -> Blackhole:
        return self

    def __exit__(self, *exc: object) -> None:
        self.filler.close()
        self.listener.close()


@pytest.fixture
def resolver(monkeypatch):
    """The system resolver with two test names: ``stall.test`` is never answered (until the test
    ends), ``many.test`` resolves to every address in ``many`` (a list the test fills)."""
    real, release, many, asked = socket.getaddrinfo, threading.Event(), [], []

    def getaddrinfo(host, port, *args, **kwargs):
        if host == "stall.test":
            asked.append(host)
            release.wait(60)
            raise socket.gaierror(socket.EAI_AGAIN, "released")
        if host == "many.test":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", address) for address in many]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield many, asked
    release.set()


def test_a_name_that_never_resolves_ends_at_the_deadline_and_sent_nothing(image, resolver):
    """The system resolver has no timeout of ours: a name server that never answers held the call
    for as long as the resolver liked. Resolution is now waited for only until the deadline."""
    agent = OpenAICompatibleAgent(base_url="http://stall.test/v1", model="m",
                                  connect_timeout_s=30, timeout_s=30, deadline_s=DEADLINE_S)
    info, elapsed = _stalled_call(agent, image)
    assert resolver[1] == ["stall.test"]
    assert elapsed < DEADLINE_S + 1.5, elapsed
    assert isinstance(info.value, RetryableError), info.value
    assert info.value.not_executed is True and info.value.code == "agent_unreachable"


def test_stuck_resolutions_hold_a_bounded_pool_and_every_call_ends_at_its_deadline(image, resolver):
    """Eight calls at once against a name that never resolves: each ends at about its deadline,
    and at most RESOLVER_THREADS threads are ever stuck in the resolver."""
    from app.bounded_dns import RESOLVER_THREADS

    results: list[tuple[BaseException, float]] = []

    def call() -> None:
        agent = OpenAICompatibleAgent(base_url="http://stall.test/v1", model="m",
                                      connect_timeout_s=30, timeout_s=30, deadline_s=DEADLINE_S)
        started = time.monotonic()
        try:
            _describe(agent, image)
        except Exception as exc:  # noqa: BLE001 - the test asserts the kind below
            results.append((exc, time.monotonic() - started))

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    resolving = [t for t in threading.enumerate() if t.name.startswith("agent-resolver")]
    assert len(results) == 8
    assert all(isinstance(exc, RetryableError) and exc.not_executed for exc, _ in results), results
    assert max(elapsed for _, elapsed in results) < DEADLINE_S + 1.5, results
    assert 1 <= len(resolving) <= RESOLVER_THREADS


def test_a_name_with_many_unreachable_addresses_ends_at_the_deadline(image, resolver):
    """Five addresses, none answering the TCP connect: urllib3 waited the connect timeout (cut to
    the deadline) for each in turn, five times the deadline in all. Every address now shares the
    one deadline."""
    with Blackhole() as hole:
        resolver[0].extend([("127.0.0.1", hole.port)] * 5)
        agent = OpenAICompatibleAgent(base_url=f"http://many.test:{hole.port}/v1", model="m",
                                      connect_timeout_s=30, timeout_s=30, deadline_s=DEADLINE_S)
        info, elapsed = _stalled_call(agent, image)
    assert elapsed < DEADLINE_S + 1.5, elapsed
    assert isinstance(info.value, RetryableError), info.value
    assert info.value.not_executed is True and info.value.code == "agent_unreachable"


def test_a_later_address_that_answers_is_used(image, resolver):
    """The first address refuses, the second is the provider: the call succeeds through it."""
    fake = FakeServer()
    fake.thread.start()
    try:
        refused = socket.socket()
        refused.bind(("127.0.0.1", 0))
        dead_port = refused.getsockname()[1]
        refused.close()  # nothing listens there: the connect is refused at once
        port = int(fake.url.rsplit(":", 1)[1])
        resolver[0].extend([("127.0.0.1", dead_port), ("127.0.0.1", port)])
        agent = OpenAICompatibleAgent(base_url=f"http://many.test:{port}/good/v1", model="m", deadline_s=10)
        assert _describe(agent, image).context["title"]
    finally:
        fake.release.set()
        fake.httpd.shutdown()
        fake.httpd.server_close()


def test_a_forked_child_resolves_with_its_own_pool(resolver):
    """A worker forked after its parent resolved a name (prefork pools) must not queue on the
    parent's resolver threads, which do not exist in the child."""
    import os

    from app.stages.agent.watched_http import resolve

    assert resolve("localhost", 80, time.monotonic() + 10)  # the parent's pool now has a thread
    pid = os.fork()
    if pid == 0:  # the child: exit 0 when it resolves in time
        try:
            os._exit(0 if resolve("localhost", 80, time.monotonic() + 5) else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
