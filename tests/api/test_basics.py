"""Health, OpenAPI, error format and the fail-closed factory."""

from __future__ import annotations

import pytest

from app.api import create_app
from tests.api.conftest import png_bytes, upload


def test_factory_fails_closed_without_resolver(settings, engine, orch):
    with pytest.raises(TypeError):
        create_app(scope_resolver=None, settings=settings, orchestrator=orch, engine=engine)


def test_healthz_readyz_metrics(client):
    assert client.get("/healthz").get_json() == {"status": "ok"}
    r = client.get("/readyz")
    assert r.status_code == 200, r.get_json()
    assert r.get_json()["checks"]["migrations"]["ok"] is True
    m = client.get("/metrics")
    assert m.status_code == 200
    assert b"memeflow_queue_depth" in m.data


def test_readyz_broker_down_is_503(settings, engine, orch, publisher, store):
    from app.auth import LocalScopeResolver

    app = create_app(
        scope_resolver=LocalScopeResolver(), settings=settings.replace(broker_url="redis://127.0.0.1:1/0"),
        orchestrator=orch, engine=engine, publisher=publisher, store=store,
    )
    c = app.test_client()
    r = c.get("/readyz")
    assert r.status_code == 503
    assert r.get_json()["checks"]["broker"]["ok"] is False
    assert r.get_json()["checks"]["database"]["ok"] is True
    # uploads do not depend on the broker: the hint is the sweep's to repair
    assert upload(c, png_bytes()).status_code == 201


def test_metrics_queue_gauges_are_db_truth(client, orch):
    upload(client, png_bytes())
    orch.sweep()  # the sweep computes the DB-truth gauges; /metrics serves its snapshot
    text = client.get("/metrics").get_data(as_text=True)
    assert 'memeflow_queue_depth{lane="visual"} 1.0' in text
    assert 'memeflow_queue_depth{lane="agent"} 0.0' in text


def test_openapi_covers_every_path(client):
    doc = client.get("/api/openapi.json").get_json()
    assert doc["openapi"] == "3.0.3"
    paths = set(doc["paths"])
    for p in [
        "/api/v1/images", "/api/v1/images/{image_id}", "/api/v1/images/{image_id}/content",
        "/api/v1/images/{image_id}/process", "/api/v1/jobs", "/api/v1/jobs/{job_id}",
        "/api/v1/jobs/{job_id}/retry", "/api/v1/jobs/{job_id}/cancel", "/api/v1/tasks/{task_id}",
        "/api/v1/batches", "/api/v1/batches/{batch_id}", "/api/v1/batches/{batch_id}/cancel",
        "/api/v1/search/text", "/api/v1/search/visual", "/healthz", "/readyz", "/metrics",
    ]:
        assert p in paths, p
    assert client.get("/api/docs").status_code == 200


def test_errors_are_json_never_html(client):
    for method, path in [("get", "/nope"), ("get", "/api/v1/images/not-a-uuid"), ("delete", "/api/v1/jobs")]:
        r = getattr(client, method)(path)
        assert r.is_json, (path, r.data[:200])
        assert set(r.get_json()) >= {"error", "message"}
    assert client.get("/nope").get_json()["error"] == "not_found"
    assert client.delete("/api/v1/jobs").get_json()["error"] == "method_not_allowed"


def test_ops_page_is_mounted(client):
    r = client.get("/ops")
    assert r.status_code == 200 and b"<html" in r.data.lower()


def test_default_publisher_never_breaks_uploads(settings, engine, orch, store):
    from app.api import default_publisher

    assert callable(getattr(default_publisher(settings), "publish", None))
