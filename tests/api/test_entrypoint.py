"""The WSGI entry point and the streaming upload limit on chunked bodies."""

from __future__ import annotations

import http.client
import importlib
import threading

from werkzeug.serving import make_server

from app.api import create_app
from app.auth import LocalScopeResolver, TokenScopeResolver
from app.config import reset_settings


def test_wsgi_entry_point_uses_memeflow_auth(settings, monkeypatch):
    monkeypatch.setenv("MEMEFLOW_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("MEMEFLOW_BROKER_URL", settings.broker_url)
    monkeypatch.setenv("MEMEFLOW_VAR_DIR", str(settings.var_dir))
    for mode, resolver in (("token", TokenScopeResolver), ("none", LocalScopeResolver)):
        monkeypatch.setenv("MEMEFLOW_AUTH", mode)
        reset_settings(None)
        try:
            from app.api import wsgi

            wsgi = importlib.reload(wsgi)
            assert isinstance(wsgi.app.extensions["memeflow"].scope_resolver, resolver)
            status = wsgi.app.test_client().get("/api/v1/images").status_code
            assert status == (401 if mode == "token" else 200)
            wsgi.app.extensions["memeflow"].engine.dispose()
        finally:
            reset_settings(None)


def test_chunked_body_over_limit_is_413(settings, engine, orch, publisher, store):
    app = create_app(
        scope_resolver=LocalScopeResolver(), settings=settings.replace(max_upload_bytes=1000),
        orchestrator=orch, engine=engine, publisher=publisher, store=store,
    )
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=30)
        boundary = "b0undary"
        head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.png\"\r\n\r\n"
                "\x89PNG\r\n\x1a\n").encode()

        def chunks():
            yield head
            for _ in range(40):  # 40 x 4 KiB, far over MAX_CONTENT_LENGTH, no Content-Length sent
                yield b"\0" * 4096
            yield f"\r\n--{boundary}--\r\n".encode()

        conn.request("POST", "/api/v1/images", body=chunks(), encode_chunked=True,
                     headers={"Content-Type": f"multipart/form-data; boundary={boundary}",
                              "Transfer-Encoding": "chunked"})
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 413, body
        assert b"payload_too_large" in body
        conn.close()
    finally:
        server.shutdown()
        server.server_close()
    assert list(store.iter_keys()) == []
