"""Errors from the server layer are JSON too: a real ``memeflow api`` (gunicorn) started by the test.

What Flask's handler never sees — requests gunicorn cannot parse, a worker aborted by the
timeout — and what werkzeug raises before a view runs (413, malformed multipart, wrong
Content-Type, 404/405, HEAD/OPTIONS) all answer ``{"error": code, "message": …}``.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psycopg2
import pytest

from tests.conftest import poll_until

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serving(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


@pytest.fixture()
def api_server(settings, tmp_path):
    """``memeflow api --workers 1`` on a free port (upload limit 1000 bytes)."""
    port = _free_port()
    env = dict(os.environ)
    env.update(
        MEMEFLOW_DATABASE_URL=settings.database_url, MEMEFLOW_BROKER_URL=settings.broker_url,
        MEMEFLOW_VAR_DIR=str(settings.var_dir), MEMEFLOW_AUTH="none", MEMEFLOW_API_HOST="127.0.0.1",
        MEMEFLOW_API_PORT=str(port), MEMEFLOW_MAX_UPLOAD_BYTES="1000",
        MEMEFLOW_LOG_JSON="0", PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p),
    )
    log = open(tmp_path / "api.log", "wb")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "api", "--workers", "1"], env=env, cwd=str(ROOT),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        poll_until(lambda: proc.poll() is not None or _serving(port), timeout=60, interval=0.2, what="gunicorn up")
        assert proc.poll() is None, (tmp_path / "api.log").read_text()
        yield port, tmp_path / "api.log", proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _request(port: int, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for key, value in (headers or {}).items():
            conn.putheader(key, value)
        if body is not None and "Content-Length" not in (headers or {}):
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read()
    finally:
        conn.close()


def _raw(port: int, data: bytes) -> tuple[int, str, bytes]:
    """Send raw bytes; parse the one HTTP/1.1 response the server answers with."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), headers.get("Content-Type", ""), body


def _json_error(status_ct_body, status: int, code: str | None = None) -> dict:
    got_status, content_type, body = status_ct_body
    assert got_status == status, (got_status, body[:300])
    assert content_type.startswith("application/json"), (content_type, body[:300])
    data = json.loads(body)
    assert set(data) >= {"error", "message"}, data
    if code:
        assert data["error"] == code, data
    return data


def test_server_layer_errors_are_json(api_server):
    port, _, _ = api_server
    multipart = "multipart/form-data; boundary=XyZ"
    _json_error(_request(port, "GET", "/no/such/route"), 404, "not_found")
    _json_error(_request(port, "GET", "/api/v1/nope"), 404, "not_found")
    _json_error(_request(port, "DELETE", "/api/v1/batches"), 405, "method_not_allowed")
    _json_error(_request(port, "PATCH", "/healthz", b"{}", {"Content-Type": "application/json"}), 405)
    _json_error(_request(port, "OPTIONS", "/no/such/route"), 404, "not_found")
    status, content_type, body = _request(port, "HEAD", "/no/such/route")
    assert (status, body) == (404, b"") and content_type.startswith("application/json")
    assert _request(port, "HEAD", "/api/v1/images")[0] == 200
    assert _request(port, "OPTIONS", "/api/v1/images")[0] == 200

    # 413 from werkzeug's MAX_CONTENT_LENGTH, before a byte of the body is read
    for path, content_type in (("/api/v1/images", multipart), ("/api/v1/batches", "application/json"),
                               ("/api/v1/search/visual", multipart)):
        _json_error(_request(port, "POST", path, b"x", {"Content-Type": content_type,
                                                        "Content-Length": str(10**9)}), 413, "payload_too_large")
    # malformed multipart, wrong or missing Content-Type, non-JSON and non-object JSON
    for body, content_type in ((b"garbage without boundaries", multipart),
                               (b"--XyZ\r\nContent-Disposition: form-data\r\n\r\nx", multipart),
                               (b"--XyZ\r\n\r\n--XyZ--\r\n", multipart),
                               (b"x", "multipart/form-data"),
                               (b"x", "multipart/form-data; boundary="),
                               (b"{}", "application/json"), (b"plain", "text/plain"), (b"x", "")):
        status, ct, raw = _request(port, "POST", "/api/v1/images", body, {"Content-Type": content_type})
        assert 400 <= status < 500, (body, content_type, status, raw[:200])
        _json_error((status, ct, raw), status)
    for body, content_type in ((b"{\"all\": tru", "application/json"), (b"[1, 2]", "application/json"),
                               (b"\"x\"", "application/json"), (b"all=true", "application/x-www-form-urlencoded"),
                               (b"\xff\xfe", "application/json"), (b'{"all": true}', "text/plain")):
        status, ct, raw = _request(port, "POST", "/api/v1/batches", body, {"Content-Type": content_type})
        assert 400 <= status < 500, (body, content_type, status, raw[:200])
        _json_error((status, ct, raw), status)

    # what gunicorn itself rejects before the app
    _json_error(_raw(port, b"GARBAGE\r\n\r\n"), 400, "bad_request")
    _json_error(_raw(port, b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"), 414, "uri_too_long")
    _json_error(_raw(port, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Big: " + b"b" * 9000 + b"\r\n\r\n"), 431)
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(200))
    _json_error(_raw(port, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + many + b"\r\n"), 431,
                "request_header_fields_too_large")
    _json_error(_raw(port, b"POST /api/v1/batches HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n"
                           b"Content-Type: application/json\r\n\r\nzz\r\n"), 400)
    # and the server still serves
    assert _request(port, "GET", "/api/v1/images")[0] == 200


def test_worker_timeout_is_json_503(api_server, settings):
    """The arbiter's timeout abort (SIGABRT to the worker, what gunicorn sends a worker that stopped
    reporting within ``timeout``) answers a request still in progress — here one waiting behind a
    table lock — with 503 ``worker_timeout`` JSON instead of dropping it."""
    import threading

    import psutil

    port, log_path, master = api_server
    assert _request(port, "GET", "/api/v1/images")[0] == 200  # scope row and connections warm
    raw_url = settings.database_url.split("://", 1)[1]
    locker = psycopg2.connect("postgresql://" + raw_url)
    answer: list = []
    try:
        with locker.cursor() as cur:
            cur.execute("BEGIN; LOCK TABLE images IN ACCESS EXCLUSIVE MODE")
        client = threading.Thread(target=lambda: answer.append(_request(port, "GET", "/api/v1/images")))
        client.start()

        def waiting() -> bool:
            with locker.cursor() as cur:
                # in the locker's open transaction pg_stat_activity is read once: drop that snapshot
                cur.execute("SELECT pg_stat_clear_snapshot()")
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
                return cur.fetchone()[0] > 0

        poll_until(waiting, timeout=30, interval=0.05, what="the request waits on the lock")
        (worker,) = psutil.Process(master).children()
        os.kill(worker.pid, signal.SIGABRT)
        client.join(timeout=30)
        assert not client.is_alive()
    finally:
        locker.rollback()
        locker.close()
    data = _json_error(answer[0], 503, "worker_timeout")
    assert "Traceback" not in data["message"]
    # the arbiter replaces the aborted worker; the API serves again
    poll_until(lambda: _serving(port), timeout=60, interval=0.2, what="a fresh worker")
    assert "worker timeout" in log_path.read_text(errors="replace")
