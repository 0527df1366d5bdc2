"""20 parallel uploads of the same bytes over real HTTP → one image, one job."""

from __future__ import annotations

import http.client
import threading
import uuid

from sqlalchemy import text
from werkzeug.serving import make_server

from tests.api.conftest import png_bytes


def _multipart(data: bytes) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    body = (
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"same.png\"\r\n"
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def test_parallel_identical_uploads(app, engine, store):
    server = make_server("127.0.0.1", 0, app, threaded=True)
    port = server.server_port
    serve = threading.Thread(target=server.serve_forever, daemon=True)
    serve.start()
    data = png_bytes((77, 88, 99), size=(64, 64))
    body, ctype = _multipart(data)
    barrier = threading.Barrier(20)
    results: list[tuple[int, bytes]] = []
    lock = threading.Lock()

    def one() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        barrier.wait()
        conn.request("POST", "/api/v1/images", body=body, headers={"Content-Type": ctype})
        resp = conn.getresponse()
        with lock:
            results.append((resp.status, resp.read()))
        conn.close()

    try:
        threads = [threading.Thread(target=one) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        server.shutdown()
        server.server_close()
    statuses = sorted(s for s, _ in results)
    assert statuses.count(201) == 1 and statuses.count(200) == 19, results[:3]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM images")).scalar_one() == 1
        assert conn.execute(text("SELECT count(*) FROM processing_jobs")).scalar_one() == 1
        assert conn.execute(text("SELECT count(*) FROM tasks")).scalar_one() == 1
    assert len(list(store.iter_keys())) == 1 and not store.stale_temp_files()
