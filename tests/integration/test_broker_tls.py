"""A TLS Redis broker (``MEMEFLOW_BROKER_URL=rediss://…``, e.g. a managed Redis): the hints'
connection verifies the server's certificate, as the ``/readyz`` probe's redis-py client does,
unless the URL itself opts out (``?ssl_cert_reqs=none``). kombu's own default for a ``rediss://``
URL without options is an unverified TLS connection (logged once, then silent).

The TLS server is a small terminator in front of the session's real Redis, with a self-signed
certificate made by ``openssl`` for this test."""

from __future__ import annotations

import select
import socket
import ssl
import subprocess
import threading
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest

from app.orchestrator.hints import Hint
from app.publisher import CeleryHintPublisher, celery_app_for


@pytest.fixture()
def certificate(tmp_path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def _pipe(a: socket.socket, b: socket.socket) -> None:
    with a, b:
        while True:
            ready, _, _ = select.select([a, b], [], [], 30)
            if not ready:
                return
            for src in ready:
                try:
                    data = src.recv(65536)
                except (OSError, ssl.SSLError):
                    return
                if not data:
                    return
                (b if src is a else a).sendall(data)


@pytest.fixture()
def tls_redis(broker_url, certificate):
    """(host:port of a TLS endpoint forwarding to the test's Redis, its db path, the CA file)."""
    cert, key = certificate
    upstream = urlparse(broker_url)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except OSError:
                return
            try:
                client = context.wrap_socket(raw, server_side=True)
            except (OSError, ssl.SSLError):  # a client that refused our certificate
                raw.close()
                continue
            server = socket.create_connection((upstream.hostname, upstream.port))
            threading.Thread(target=_pipe, args=(client, server), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}", upstream.path, cert
    finally:
        stop.set()
        listener.close()
        thread.join(timeout=5)


def _publish(url: str) -> None:
    """One hint through the client app the API and CLI use (no retries: the first failure raises)."""
    app = celery_app_for(url, "memeflow-tls-test")
    app.conf.broker_connection_retry = False
    app.conf.broker_transport_options = {**app.conf.broker_transport_options, "max_retries": 0}
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1)
        conn.default_channel.client.ping()
    CeleryHintPublisher(app).publish([Hint("agent", uuid.uuid4())])


def test_a_rediss_broker_verifies_the_servers_certificate_by_default(tls_redis):
    endpoint, db, ca = tls_redis
    with pytest.raises(Exception) as caught:  # noqa: PT011 - kombu wraps the TLS error in its own types
        _publish(f"rediss://{endpoint}{db}")
    assert "certificate" in repr(caught.value).lower() or isinstance(caught.value, ssl.SSLError), caught.value


def test_a_rediss_broker_with_its_ca_or_an_explicit_opt_out_connects(tls_redis):
    endpoint, db, ca = tls_redis
    _publish(f"rediss://{endpoint}{db}?ssl_ca_certs={ca}")
    _publish(f"rediss://{endpoint}{db}?ssl_cert_reqs=none")


def test_the_workers_app_verifies_a_rediss_broker_too(tmp_path):
    """The worker, beat and Flower read celeryconfig: the same default as the client app."""
    import os
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "MEMEFLOW_BROKER_URL": "rediss://:pw@127.0.0.1:6390/0",
           "MEMEFLOW_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none", "MEMEFLOW_VAR_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    code = ("from app.worker.celery_app import celery_app as a; import ssl; c = a.connection_for_write(); "
            "print(c.ssl == {'ssl_cert_reqs': ssl.CERT_REQUIRED}, type(c.transport).__name__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    # over TLS too, the workers consume through the channel that drops hostile messages
    # (app.worker.broker.RedisTransport, tests/integration/test_hostile_broker.py)
    assert out.stdout.strip().splitlines()[-1:] == ["True RedisTransport"], out.stderr[-2000:]


def test_a_rediss_broker_is_served_by_the_hardened_transport_over_tls(tls_redis):
    """The transport that drops malformed messages keeps TLS (``broker_use_ssl``) on a rediss URL:
    the hint goes through the TLS endpoint, verified against its CA."""
    endpoint, db, ca = tls_redis
    app = celery_app_for(f"rediss://{endpoint}{db}?ssl_ca_certs={ca}", "memeflow-tls-test")
    with app.connection_for_write() as conn:
        assert type(conn.transport).__name__ == "RedisTransport"
        assert conn.ssl and conn.ssl.get("ssl_ca_certs") == str(ca)
        conn.ensure_connection(max_retries=1)
        import redis

        assert issubclass(conn.default_channel.client.connection_pool.connection_class, redis.SSLConnection)
    _publish(f"rediss://{endpoint}{db}?ssl_ca_certs={ca}")
