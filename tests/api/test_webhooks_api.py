"""/api/v1/webhooks: create (secret once), list, delete, per scope; bad URLs are 422 with stable codes."""

from __future__ import annotations

import pytest

from app.api import create_app
from app.auth import TokenScopeResolver
from app.orchestrator import Orchestrator


@pytest.fixture()
def hook_app(settings, engine, publisher, store):
    s = settings.replace(webhook_allowed_networks="127.0.0.0/8", auth="token")
    return create_app(scope_resolver=TokenScopeResolver(engine), settings=s, orchestrator=Orchestrator(engine, s),
                      engine=engine, publisher=publisher, store=store, cursor_secret_key="test-secret")


def test_create_list_delete_per_scope(hook_app, tokens):
    client = hook_app.test_client()
    alpha = {"Authorization": f"Bearer {tokens['alpha']}"}
    beta = {"Authorization": f"Bearer {tokens['beta']}"}
    resp = client.post("/api/v1/webhooks", json={"url": "http://127.0.0.1:9/hook", "event_types": ["job.succeeded"]},
                       headers=alpha)
    assert resp.status_code == 201, resp.get_json()
    body = resp.get_json()
    assert body["secret"].startswith("whsec_") and body["webhook"]["event_types"] == ["job.succeeded"]
    hook_id = body["webhook"]["id"]
    listed = client.get("/api/v1/webhooks", headers=alpha).get_json()["items"]
    assert [w["id"] for w in listed] == [hook_id] and "secret" not in listed[0]
    assert body["secret"] not in client.get("/api/v1/webhooks", headers=alpha).get_data(as_text=True)
    assert client.get("/api/v1/webhooks", headers=beta).get_json()["items"] == []
    assert client.delete(f"/api/v1/webhooks/{hook_id}", headers=beta).status_code == 404
    assert client.delete(f"/api/v1/webhooks/{hook_id}", headers=alpha).status_code == 204
    assert client.delete(f"/api/v1/webhooks/{hook_id}", headers=alpha).status_code == 404
    assert client.get("/api/v1/webhooks").status_code == 401


@pytest.mark.parametrize(("body", "code"), [
    ({"url": "ftp://example.com/"}, "invalid_webhook_url"),
    ({"url": "not a url"}, "invalid_webhook_url"),
    ({"url": "http://example.com/" + "a" * 3000}, "webhook_url_too_long"),
    ({"url": "http://10.0.0.8/x"}, "webhook_url_forbidden"),
    ({"url": "http://169.254.169.254/"}, "webhook_url_forbidden"),
    ({"url": "http://127.0.0.1:9/x", "event_types": ["nope"]}, "invalid_event_type"),
    ({"url": "http://127.0.0.1:9/x", "event_types": "job.failed"}, "invalid_event_type"),
    ({"url": 5}, "invalid_webhook_url"),
    ({}, "invalid_webhook_url"),
    ({"url": "http://127.0.0.1:9/x", "secret": "mine"}, "validation_error"),
])
def test_bad_input_is_422_with_a_stable_code(hook_app, tokens, body, code):
    client = hook_app.test_client()
    resp = client.post("/api/v1/webhooks", json=body, headers={"Authorization": f"Bearer {tokens['alpha']}"})
    assert resp.status_code == 422 and resp.get_json()["error"] == code, resp.get_json()


def test_loopback_is_refused_without_the_explicit_setting(client):
    resp = client.post("/api/v1/webhooks", json={"url": "http://127.0.0.1:8080/hook"})
    assert resp.status_code == 422 and resp.get_json()["error"] == "webhook_url_forbidden"


def test_a_delete_that_outwaits_a_delivery_in_flight_is_409_not_500(settings, engine, publisher, store, tokens,
                                                                     monkeypatch):
    """A delivery holding the subscription longer than a DELETE waits (webhook_timeout_s + a margin,
    here 0.2 s + 0): a stable 409 the client retries, never a 500."""
    from sqlalchemy import text

    from app.orchestrator.store import webhooks as webhooks_q

    monkeypatch.setattr(webhooks_q, "DELETE_WAIT_MARGIN_S", 0.0)
    s = settings.replace(webhook_allowed_networks="127.0.0.0/8", auth="token", webhook_timeout_s=0.2)
    app = create_app(scope_resolver=TokenScopeResolver(engine), settings=s, orchestrator=Orchestrator(engine, s),
                     engine=engine, publisher=publisher, store=store, cursor_secret_key="test-secret")
    client = app.test_client()
    alpha = {"Authorization": f"Bearer {tokens['alpha']}"}
    hook_id = client.post("/api/v1/webhooks", json={"url": "http://127.0.0.1:9/hook"}, headers=alpha
                          ).get_json()["webhook"]["id"]
    with engine.connect() as c, c.begin():  # a delivery in flight: the row share-locked
        c.execute(text("SELECT 1 FROM webhook_subscriptions WHERE id = :i FOR KEY SHARE"), {"i": hook_id})
        resp = client.delete(f"/api/v1/webhooks/{hook_id}", headers=alpha)
    assert resp.status_code == 409, resp.get_data(as_text=True)
    assert resp.get_json()["error"] == "webhook_delivery_in_flight"
    assert client.delete(f"/api/v1/webhooks/{hook_id}", headers=alpha).status_code == 204


def test_every_terminal_job_event_type_can_be_subscribed_to(hook_app, tokens):
    client = hook_app.test_client()
    types = ["job.cancelled", "job.superseded", "job.target_changed"]
    resp = client.post("/api/v1/webhooks", json={"url": "http://127.0.0.1:9/hook", "event_types": types},
                       headers={"Authorization": f"Bearer {tokens['alpha']}"})
    assert resp.status_code == 201 and resp.get_json()["webhook"]["event_types"] == types, resp.get_json()
    every = client.post("/api/v1/webhooks", json={"url": "http://127.0.0.1:9/all"},
                        headers={"Authorization": f"Bearer {tokens['alpha']}"}).get_json()["webhook"]
    assert set(types) <= set(every["event_types"])
