"""One deadline for a whole webhook exchange, connect and TLS handshake included: the watchdog that
shuts the socket when the deadline passes finds no socket while the connection is being made, so
the connect and the handshake are bounded by what is left of the deadline themselves, and an
answer that completes after it is not a delivery."""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
import time

from app.worker import webhook_sender
from app.worker.webhook_sender import send_event
from tests.db.test_webhooks import _loopback
from tests.support.receiver import Receiver

EVENT = {"id": 1, "type": "batch.progress"}


def _slow_connect(monkeypatch, delay_s: float) -> None:
    """Every connection takes ``delay_s`` to open (a long round trip, within the timeout)."""
    real = socket.create_connection

    def connect(address, timeout=None, *a, **kw):
        time.sleep(delay_s)
        return real(address, timeout, *a, **kw)

    monkeypatch.setattr(webhook_sender.socket, "create_connection", connect)


def test_an_https_receiver_cannot_hold_a_worker_past_the_deadline(tmp_path, monkeypatch):
    """The connect takes 0.6 s of the 1 s, the receiver starts its TLS handshake 0.5 s later and
    then trickles its answer a byte every 0.25 s (never idle for the timeout): the handshake gets
    only what is left, so the worker is free at about the deadline, not after the trickle (~9 s)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the receiver's certificate is trusted
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    stop = threading.Event()

    def serve() -> None:
        raw, _ = srv.accept()
        conn = None
        try:
            stop.wait(0.5)
            conn = ctx.wrap_socket(raw, server_side=True)
            conn.recv(65536)
            for b in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n":
                if stop.wait(0.25):
                    return
                conn.sendall(bytes([b]))
        except OSError:
            pass
        finally:
            (conn or raw).close()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    _slow_connect(monkeypatch, 0.6)
    started = time.monotonic()
    try:
        result = send_event(f"https://127.0.0.1:{srv.getsockname()[1]}/hook", "whsec_x", EVENT, timeout_s=1.0,
                            max_response_bytes=1024, networks=_loopback())
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        srv.close()
        server.join(5)
    assert not result.ok and result.code == "timeout", result
    assert elapsed < 4.0, f"send_event(timeout_s=1) held the worker {elapsed:.1f}s"


def test_an_answer_completed_after_the_deadline_is_not_a_delivery(monkeypatch):
    """The connection opens only after the deadline (the watchdog fired with no socket to shut): a
    2xx that follows is a timeout, not a success."""
    receiver = Receiver().start()
    try:
        _slow_connect(monkeypatch, 0.5)
        result = send_event(receiver.url("/ok"), "whsec_x", EVENT, timeout_s=0.2, max_response_bytes=1024,
                            networks=_loopback())
    finally:
        receiver.stop()
    assert not result.ok and result.code == "timeout", result
