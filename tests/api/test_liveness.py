"""/readyz reports liveness (degraded, still 200) without versions and reuses its connections;
/metrics serves the sweep's snapshot (no count per scrape) and can require a bearer token."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
import redis as redis_lib

from app.api import create_app
from app.auth import LocalScopeResolver, TokenScopeResolver
from app.orchestrator.liveness import WorkerIdentity, register_worker
from app.orchestrator.store import sweep as sweep_q
from app.orchestrator.store import workers as workers_q
from tests.api.conftest import png_bytes, upload


@pytest.fixture()
def slow_settings(settings):
    # a sweep interval long enough that "the sweep is recent" cannot lapse while the test runs
    return settings.replace(sweep_interval_s=60.0)


def _app(slow_settings, engine, orch, publisher, store, **changes):
    return create_app(
        scope_resolver=LocalScopeResolver(), settings=slow_settings.replace(**changes), orchestrator=orch,
        engine=engine, publisher=publisher, store=store, cursor_secret_key="test-secret",
    )


@pytest.fixture()
def live_client(slow_settings, engine, orch, publisher, store):
    return _app(slow_settings, engine, orch, publisher, store).test_client()


def _register(engine, node: str, *lanes: str) -> None:
    from datetime import UTC, datetime

    register_worker(engine, WorkerIdentity(node=node, lanes=lanes, started_at=datetime.now(UTC), host="h", pid=1))


def test_readyz_is_degraded_but_200_without_a_sweep_and_with_unserved_work(live_client, engine, orch):
    r = live_client.get("/readyz")
    assert r.status_code == 200
    body = r.get_json()
    assert body["status"] == "degraded" and [x["code"] for x in body["reasons"]] == ["sweep_stale"]
    assert body["checks"]["sweep"]["ok"] is False and body["checks"]["sweep"]["last_success_at"] is None

    orch.sweep()
    body = live_client.get("/readyz").get_json()
    assert body["status"] == "ready" and body["reasons"] == [] and body["checks"]["sweep"]["ok"] is True

    assert upload(live_client, png_bytes()).status_code == 201  # a queued visual task, no worker anywhere
    r = live_client.get("/readyz")
    assert r.status_code == 200
    body = r.get_json()
    assert body["status"] == "degraded"
    assert body["reasons"] == [{"code": "lane_unserved", "message": "lane visual has queued work and no live worker"}]
    assert body["checks"]["workers"]["lanes"]["visual"] == {"workers": 0, "queued": True, "unserved": True}

    _register(engine, "visual@h", "visual", "maintenance")
    body = live_client.get("/readyz").get_json()
    assert body["status"] == "ready", body
    assert body["checks"]["workers"]["lanes"]["maintenance"]["workers"] == 1


def test_readyz_flags_a_sweep_older_than_three_intervals(live_client, engine):
    with engine.begin() as conn:
        now = workers_q.db_now(conn)
        sweep_q.record_sweep_txn(conn, now - timedelta(seconds=181), 0.01, {})
    body = live_client.get("/readyz").get_json()
    assert body["status"] == "degraded" and body["reasons"][0]["code"] == "sweep_stale"
    assert "more than 3x the 60s interval" in body["reasons"][0]["message"]
    with engine.begin() as conn:
        sweep_q.record_sweep_txn(conn, now - timedelta(seconds=170), 0.01, {})
    assert live_client.get("/readyz").get_json()["status"] == "ready"


def test_readyz_reveals_no_version_strings(live_client, orch):
    from app.api.health import _code_head

    orch.sweep()
    body = live_client.get("/readyz").get_json()

    def strings(node):  # every key and string value of the JSON body
        if isinstance(node, dict):
            for key, value in node.items():
                yield key
                yield from strings(value)
        elif isinstance(node, list):
            for value in node:
                yield from strings(value)
        elif isinstance(node, str):
            yield node

    texts = list(strings(body))
    # no migration revision (a value naming it, or a "revision"/"head" field: the bare id, e.g.
    # '0022', may well occur inside a timestamp's microseconds, which is no leak)
    assert _code_head() and not any(t == _code_head() or "revision" in t or t == "head" for t in texts)
    assert not any(re.search(r"PostgreSQL|redis_version|\b\d+\.\d+\.\d+\b", t) for t in texts)
    migrations = live_client.get("/readyz").get_json()["checks"]["migrations"]
    assert migrations == {"ok": True}


def test_readyz_reuses_one_redis_connection(live_client, slow_settings):
    client = redis_lib.Redis.from_url(slow_settings.broker_url)
    try:
        live_client.get("/readyz")  # the first probe may open the pool's connection
        before = client.info("stats")["total_connections_received"]
        for _ in range(10):
            assert live_client.get("/readyz").get_json()["checks"]["broker"]["ok"] is True
        after = client.info("stats")["total_connections_received"]
    finally:
        client.close()
    assert after - before == 0, "each /readyz opened a new broker connection"


def test_metrics_serve_the_sweeps_snapshot_and_liveness_gauges(live_client, engine, orch):
    upload(live_client, png_bytes((1, 2, 3)))
    orch.sweep()
    _register(engine, "agent@h", "agent", "maintenance")
    text = live_client.get("/metrics").get_data(as_text=True)
    assert 'memeflow_queue_depth{lane="visual"} 1.0' in text
    assert 'memeflow_lane_workers{lane="agent"} 1.0' in text
    assert 'memeflow_lane_workers{lane="visual"} 0.0' in text
    assert 'memeflow_lane_workers{lane="maintenance"} 1.0' in text
    with engine.connect() as conn:
        at = sweep_q.sweep_state(conn)["last_success_at"].timestamp()
    [stamp] = re.findall(r"^memeflow_sweep_last_success_timestamp (\S+)$", text, re.M)
    assert float(stamp) == pytest.approx(at, abs=1e-3)
    # a second upload is not counted until the next sweep: a scrape never counts the tasks table
    upload(live_client, png_bytes((4, 5, 6)))
    assert 'memeflow_queue_depth{lane="visual"} 1.0' in live_client.get("/metrics").get_data(as_text=True)
    orch.sweep()
    assert 'memeflow_queue_depth{lane="visual"} 2.0' in live_client.get("/metrics").get_data(as_text=True)


def test_metrics_can_require_a_bearer_token(slow_settings, engine, orch, publisher, store):
    client = _app(slow_settings, engine, orch, publisher, store, metrics_token="s3cret-scrape").test_client()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-scrape"}):
        r = client.get("/metrics", headers=headers)
        assert r.status_code == 401 and r.get_json()["error"] == "unauthorized", headers
    ok = client.get("/metrics", headers={"Authorization": "Bearer s3cret-scrape"})
    assert ok.status_code == 200 and b"memeflow_lane_workers" in ok.data
    assert client.get("/healthz").status_code == 200  # only /metrics is guarded


def test_token_mode_metrics_without_a_metrics_token_serve_this_machine_only(slow_settings, engine, orch, publisher,
                                                                              store, tokens):
    """Every tenant's activity is no tenant's to read: with MEMEFLOW_AUTH=token and no metrics token,
    a remote peer, a tenant's bearer and a request relayed by a local proxy are all refused."""
    def token_app(**changes):
        return create_app(scope_resolver=TokenScopeResolver(engine), settings=slow_settings.replace(auth="token", **changes),
                          orchestrator=orch, engine=engine, publisher=publisher, store=store,
                          cursor_secret_key="test-secret").test_client()

    client = token_app()
    remote = {"REMOTE_ADDR": "10.0.0.7"}
    refused = [client.get("/metrics", environ_base=remote),
               client.get("/metrics", environ_base=remote, headers={"Authorization": f"Bearer {tokens['alpha']}"}),
               client.get("/metrics", headers={"X-Forwarded-For": "203.0.113.9"}),
               client.get("/metrics", headers={"Forwarded": "for=203.0.113.9"})]
    assert [(r.status_code, r.get_json()["error"]) for r in refused] == [(401, "unauthorized")] * 4
    assert "MEMEFLOW_METRICS_TOKEN" in refused[0].get_json()["message"]
    local = client.get("/metrics", environ_base={"REMOTE_ADDR": "127.0.0.1"})
    assert local.status_code == 200 and b"memeflow_lane_workers" in local.data
    scraper = token_app(metrics_token="s3cret-scrape")
    ok = scraper.get("/metrics", environ_base=remote, headers={"Authorization": "Bearer s3cret-scrape"})
    assert ok.status_code == 200



def test_readyz_names_a_failed_sweep_step_without_its_error_text(slow_settings, engine, orch, publisher, store,
                                                                   monkeypatch):
    """/readyz answers anyone (no token), and a sweep step's exception text may hold a tenant's
    data — a database error's DETAIL names the key that clashed, SQLAlchemy's text the statement's
    parameters. The record says which step failed and the exception's class (and SQLSTATE); the
    text goes to the log only."""
    from sqlalchemy.exc import IntegrityError

    from app.orchestrator import sweep as sweep_mod

    class Pg(Exception):
        sqlstate = "23505"

    def broken(orch, report):
        raise IntegrityError("INSERT INTO images ...", {"scope_id": "alpha", "display_name": "alpha's secret"},
                             Pg('duplicate key value violates unique constraint\n'
                                'DETAIL: Key (scope_id, sha256)=(alpha, 5e3c) already exists.'))

    monkeypatch.setattr(sweep_mod, "STEPS", [(name, broken if name == "serving" else fn)
                                             for name, fn in sweep_mod.STEPS])
    report = orch.sweep()
    assert report.failed_steps == [{"step": "serving", "error": "IntegrityError (23505)"}]
    client = create_app(scope_resolver=TokenScopeResolver(engine), settings=slow_settings.replace(auth="token"),
                        orchestrator=orch, engine=engine, publisher=publisher, store=store,
                        cursor_secret_key="test-secret").test_client()
    resp = client.get("/readyz")
    body = resp.get_data(as_text=True)
    assert resp.get_json()["checks"]["sweep"]["failed_steps"] == [{"step": "serving", "error": "IntegrityError (23505)"}]
    assert "alpha" not in body and "secret" not in body and "DETAIL" not in body


def test_readyz_is_degraded_when_agent_workers_were_given_different_lane_limits(live_client, engine, orch, settings):
    from datetime import UTC, datetime

    orch.sweep()
    for node, limit in (("agent-a@h1", 4), ("agent-b@h2", 0)):
        register_worker(engine, WorkerIdentity.of(settings.replace(agent_lane_limit=limit), node, ("agent",),
                                                  datetime.now(UTC)))
    r = live_client.get("/readyz")
    assert r.status_code == 200
    body = r.get_json()
    assert body["status"] == "degraded" and [x["code"] for x in body["reasons"]] == ["lane_limits_disagree"]
    assert body["checks"]["workers"]["agent_limits"]["in_force"] == {"lane": 4, "resource": 0}
