"""Tenant limits (issue 17): per-minute rate limits (429 ``rate_limited`` + Retry-After, per token
in token mode, per scope otherwise) and quotas (403 ``quota_exceeded``) decided in PostgreSQL with
the insert — a concurrent burst never overshoots, and a refused upload leaves no row and no file."""

from __future__ import annotations

import dataclasses
import http.client
import threading
import uuid
from datetime import datetime, timezone

from sqlalchemy import text
from werkzeug.serving import make_server

from app.api import create_app
from app.auth import LocalScopeResolver, TokenScopeResolver, create_scope, create_token
from app.orchestrator import Orchestrator, RecordingPublisher
from app.storage import FileStore
from tests.api.conftest import png_bytes, upload
from tests.support.clock import FakeClock


def _app(engine, settings, *, clock=None, token_mode=False, **limits):
    settings = dataclasses.replace(settings, auth="token" if token_mode else "none", **limits)
    orch = Orchestrator(engine, settings, clock=clock)
    resolver = TokenScopeResolver(engine) if token_mode else LocalScopeResolver()
    app = create_app(scope_resolver=resolver, settings=settings, orchestrator=orch, engine=engine,
                     publisher=RecordingPublisher(), store=FileStore(settings.storage_path),
                     cursor_secret_key="test-secret")
    return app, orch


def _count(engine, sql: str, **params) -> int:
    with engine.connect() as c:
        return c.execute(text(sql), params).scalar_one()


def _files(settings) -> int:
    return sum(1 for p in settings.storage_path.rglob("*") if p.is_file())


def test_an_upload_burst_gets_429_with_retry_after_and_stores_nothing_beyond_the_limit(engine, settings):
    clock = FakeClock(datetime(2026, 1, 1, 12, 0, 20, tzinfo=timezone.utc))
    app, _ = _app(engine, settings, clock=clock, uploads_per_minute=3)
    client = app.test_client()
    responses = [upload(client, png_bytes((i, 10, 10))) for i in range(7)]
    assert [r.status_code for r in responses] == [201] * 3 + [429] * 4
    refused = responses[-1]
    assert refused.get_json()["error"] == "rate_limited"
    assert refused.headers["Retry-After"] == "40"  # the window ends at 12:01:00
    assert _count(engine, "SELECT count(*) FROM images") == 3 and _files(settings) == 3
    clock.advance(40)  # a new window
    assert upload(client, png_bytes((99, 10, 10))).status_code == 201


def test_processing_requests_are_limited_per_minute(engine, settings):
    clock = FakeClock(datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc))
    app, _ = _app(engine, settings, clock=clock, processing_per_minute=2)
    client = app.test_client()
    image_id = upload(client, png_bytes((5, 6, 7)), process=False).get_json()["image"]["id"]
    statuses = [client.post(f"/api/v1/images/{image_id}/process", json={}).status_code for _ in range(2)]
    assert statuses[0] == 201 and statuses[1] in (200, 201)
    batch = client.post("/api/v1/batches", json={"all": True})
    assert batch.status_code == 429 and batch.headers["Retry-After"] == "60"
    assert _count(engine, "SELECT count(*) FROM batches") == 0
    assert upload(client, png_bytes((8, 6, 7))).status_code == 201  # uploads have their own limit


def _flash(client, resp) -> tuple[str, str] | None:
    """The /ops notice the retry's redirect leads to: ("msg" | "err", the start of its text)."""
    page = client.get(resp.headers["Location"]).get_data(as_text=True)
    for kind, element in (("msg", '<div class="flash" id="flash">'), ("err", '<div class="flash err" id="flash-error">')):
        if element in page:
            text_ = page.split(element, 1)[1]
            for start in ("retry requested", "rate_limited"):
                if text_.startswith(start):
                    return kind, start
            return kind, text_[:40]
    return None


def _latest_job(engine) -> str:
    return str(_count(engine, "SELECT id FROM processing_jobs ORDER BY created_at DESC, revision DESC LIMIT 1"))


def test_ops_retry_counts_against_the_processing_limit(engine, settings):
    """/ops' retry is the API's retry: the same window, so cancel + /ops retry is no way around it."""
    csrf = "c" * 32  # the double-submit cookie the page's form echoes (auth none: no session)

    def same_site_post(client, url):
        return client.post(url, data={"csrf_token": csrf}, headers={"Origin": "http://localhost"})

    clock = FakeClock(datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc))
    app, _ = _app(engine, settings, clock=clock, processing_per_minute=2)
    client = app.test_client()
    client.set_cookie("mf_csrf", csrf)
    job_id = upload(client, png_bytes((9, 9, 9))).get_json()["job"]["id"]  # uploads have their own limit
    assert client.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 200
    assert client.post(f"/api/v1/jobs/{job_id}/retry").status_code == 201  # 1 of 2
    job_id = _latest_job(engine)
    assert client.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 200
    done = same_site_post(client, f"/ops/jobs/{job_id}/retry")  # 2 of 2
    assert done.status_code == 303 and _flash(client, done) == ("msg", "retry requested")
    job_id = _latest_job(engine)
    assert client.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 200
    refused = same_site_post(client, f"/ops/jobs/{job_id}/retry")
    assert refused.status_code == 303 and _flash(client, refused) == ("err", "rate_limited")
    assert client.post(f"/api/v1/jobs/{job_id}/retry").status_code == 429
    assert _count(engine, "SELECT count(*) FROM processing_jobs") == 3
    clock.advance(60)  # a new window
    assert _flash(client, same_site_post(client, f"/ops/jobs/{job_id}/retry")) == ("msg", "retry requested")


def test_context_edits_count_against_the_processing_limit(engine, settings):
    """An edit plans a job (the text stage again), so it is a processing request."""
    clock = FakeClock(datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc))
    app, _ = _app(engine, settings, clock=clock, processing_per_minute=2)
    client = app.test_client()
    image_id = upload(client, png_bytes((4, 4, 4)), process=False).get_json()["image"]["id"]
    jobs_before = _count(engine, "SELECT count(*) FROM processing_jobs")
    codes = [client.patch(f"/api/v1/images/{image_id}", json={"context": {"title": f"t{i}"}}).status_code
             for i in range(5)]
    assert codes == [200, 200, 429, 429, 429]
    assert _count(engine, "SELECT count(*) FROM processing_jobs") - jobs_before <= 2


def test_the_rate_window_is_per_token_and_a_scope_override_wins(engine, settings):
    clock = FakeClock(datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc))
    app, orch = _app(engine, settings, clock=clock, token_mode=True, uploads_per_minute=1)
    create_scope(engine, "alpha")
    _, first = create_token(engine, "alpha", "first")
    _, second = create_token(engine, "alpha", "second")
    client = app.test_client()

    def up(token: str, seed: int):
        return upload(client, png_bytes((seed, 1, 1)), headers={"Authorization": f"Bearer {token}"})

    assert [up(first, 1).status_code, up(first, 2).status_code] == [201, 429]
    assert up(second, 3).status_code == 201  # another token of the same scope: its own window
    orch.set_scope_limits("alpha", {"uploads_per_minute": 3})
    # every request of the window counts, the refused one too: 2 so far, so one more fits in 3
    assert [up(first, s).status_code for s in (4, 5)] == [201, 429]
    orch.set_scope_limits("alpha", {"uploads_per_minute": 0})  # 0 = unlimited for this scope
    assert all(up(first, s).status_code == 201 for s in (7, 8, 9))


def _multipart(data: bytes) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    body = (
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.png\"\r\n"
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def _race(app, bodies: list[bytes]) -> list[tuple[int, dict]]:
    """POST every body at once (threads behind a barrier) to a real threaded HTTP server."""
    import json

    server = make_server("127.0.0.1", 0, app, threaded=True)
    serve = threading.Thread(target=server.serve_forever, daemon=True)
    serve.start()
    barrier = threading.Barrier(len(bodies))
    results: list[tuple[int, dict]] = []
    lock = threading.Lock()

    def one(data: bytes) -> None:
        body, ctype = _multipart(data)
        conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=60)
        barrier.wait()
        conn.request("POST", "/api/v1/images", body=body, headers={"Content-Type": ctype})
        resp = conn.getresponse()
        with lock:
            results.append((resp.status, json.loads(resp.read())))
        conn.close()

    threads = [threading.Thread(target=one, args=(b,)) for b in bodies]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        server.shutdown()
        serve.join(10)
    return results


def test_concurrent_uploads_never_overshoot_the_image_quota(engine, settings):
    app, _ = _app(engine, settings, scope_max_images=5)
    results = _race(app, [png_bytes((i, 40, 40)) for i in range(16)])
    statuses = sorted(s for s, _ in results)
    assert statuses == [201] * 5 + [403] * 11
    assert {b["error"] for s, b in results if s == 403} == {"quota_exceeded"}
    assert {b["details"]["quota"] for s, b in results if s == 403} == {"max_images"}
    assert _count(engine, "SELECT count(*) FROM images") == 5
    assert _count(engine, "SELECT image_count FROM scope_usage WHERE scope_id = 'local'") == 5
    assert _files(settings) == 5  # the refused uploads' files were removed
    assert _count(engine, "SELECT count(*) FROM processing_jobs") == 5


def test_the_byte_quota_counts_stored_bytes_and_frees_them_on_delete(engine, settings):
    sizes = [len(png_bytes((i, 50, 50), size=(40, 40))) for i in range(3)]
    app, orch = _app(engine, settings)
    create_scope(engine, "local")
    orch.set_scope_limits("local", {"max_bytes": sizes[0] + sizes[1]})  # an override of the global 0
    client = app.test_client()
    first = upload(client, png_bytes((0, 50, 50), size=(40, 40)))
    assert first.status_code == 201
    assert upload(client, png_bytes((1, 50, 50), size=(40, 40))).status_code == 201
    over = upload(client, png_bytes((2, 50, 50), size=(40, 40)))
    assert over.status_code == 403 and over.get_json()["details"] == {"quota": "max_bytes", "limit": sum(sizes[:2])}
    assert upload(client, png_bytes((0, 50, 50), size=(40, 40))).status_code == 200  # identical bytes: no new storage
    assert client.delete(f"/api/v1/images/{first.get_json()['image']['id']}").status_code == 204
    assert upload(client, png_bytes((2, 50, 50), size=(40, 40))).status_code == 201  # the freed bytes count
    assert _count(engine, "SELECT stored_bytes FROM scope_usage WHERE scope_id = 'local'") == (
        _count(engine, "SELECT sum(size_bytes) FROM images"))


def test_cli_sets_shows_and_resets_a_scopes_limits(settings, engine):
    from click.testing import CliRunner

    from app.cli import main
    from app.config import reset_settings

    reset_settings(dataclasses.replace(settings, uploads_per_minute=30))
    try:
        runner = CliRunner()
        create_scope(engine, "gamma")
        r = runner.invoke(main, ["scopes", "limits", "gamma", "--max-images", "10", "--max-bytes", "0"])
        assert r.exit_code == 0, r.output
        assert "max-images: 10 (scope)" in r.output and "max-bytes: unlimited (scope)" in r.output
        assert "uploads-per-minute: 30 (global)" in r.output
        r = runner.invoke(main, ["scopes", "limits", "gamma", "--max-images", "default"])
        assert "max-images: unlimited (global)" in r.output
        with engine.connect() as conn:
            row = conn.execute(text("SELECT max_images, max_bytes FROM scope_limits WHERE scope_id = 'gamma'")).one()
        assert tuple(row) == (None, 0)
        assert runner.invoke(main, ["scopes", "limits", "gamma", "--max-images", "-1"]).exit_code == 1
        assert runner.invoke(main, ["scopes", "limits", "gamma", "--max-images", "lots"]).exit_code == 2
        # past what the column holds: a usage error, not a database traceback
        for option, value in (("--max-images", str(2**31)), ("--max-bytes", "9" * 30)):
            r = runner.invoke(main, ["scopes", "limits", "gamma", option, value])
            assert r.exit_code == 2 and "is more than" in r.output, (r.output, r.exception)
        r = runner.invoke(main, ["scopes", "limits", "gamma", "--max-bytes", str(2**63 - 1)])
        assert r.exit_code == 0 and f"max-bytes: {2**63 - 1} (scope)" in r.output, r.output
        assert runner.invoke(main, ["scopes", "limits", "nosuch"]).exit_code == 1
    finally:
        reset_settings(None)


def test_the_rate_check_without_a_limit_opens_no_transaction(engine, settings, monkeypatch):
    """Every upload runs the rate check; with no limit it is one autocommit read, no BEGIN/COMMIT
    (docs/performance-log.md §24). With a limit it still counts, and refuses over it."""
    orch = Orchestrator(engine, settings)
    orch.ensure_scope("local")

    def no_transaction(*_a, **_k):
        raise AssertionError("take_request opened a transaction")

    monkeypatch.setattr(orch.engine, "begin", no_transaction)
    orch.take_request("uploads", "local", "scope:local")  # no limit: a read only
    clock = FakeClock(datetime(2026, 1, 1, 12, 0, 20, tzinfo=timezone.utc))  # both in one window
    limited = Orchestrator(engine, dataclasses.replace(settings, uploads_per_minute=1), clock=clock)
    monkeypatch.setattr(limited.engine, "begin", no_transaction)
    limited.take_request("uploads", "local", "scope:local")
    try:
        limited.take_request("uploads", "local", "scope:local")
    except Exception as exc:  # noqa: BLE001 - the second one is over the limit
        assert type(exc).__name__ == "RateLimited"
    else:
        raise AssertionError("the second request was not limited")


def test_replacing_content_with_smaller_bytes_is_allowed_over_a_lowered_quota(engine, settings):
    """An operator lowered the scope's byte quota below what it stores: a content replace that
    frees bytes was refused 403 like one that adds them."""
    import io

    big, small = png_bytes((9, 50, 50), size=(120, 120)), png_bytes((9, 51, 50), size=(8, 8))
    assert len(small) < len(big)
    app, orch = _app(engine, settings)
    create_scope(engine, "local")
    client = app.test_client()
    created = upload(client, big)
    assert created.status_code == 201
    image_id = created.get_json()["image"]["id"]
    orch.set_scope_limits("local", {"max_bytes": len(small) - 1})  # over quota, even after the replace

    def replace(data: bytes):
        return client.put(f"/api/v1/images/{image_id}/content", data={"file": (io.BytesIO(data), "n.png")},
                          content_type="multipart/form-data")

    r = replace(small)
    assert r.status_code == 200, r.get_json()
    assert _count(engine, "SELECT stored_bytes FROM scope_usage WHERE scope_id = 'local'") == len(small)
    grown = replace(png_bytes((9, 52, 50), size=(120, 120)))  # adding bytes over the quota: refused
    assert grown.status_code == 403 and grown.get_json()["details"]["quota"] == "max_bytes"
