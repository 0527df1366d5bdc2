"""The search response, /api/v1/search/serving, /ops and the CLI during a text model change."""

from __future__ import annotations

from app.api import create_app
from app.auth import LocalScopeResolver, TokenScopeResolver
from app.orchestrator import Orchestrator
from tests.api.conftest import png_bytes, upload
from tests.api.test_images import wait_job
from tests.support.pipeline import Workers
from tests.support.textmodels import SPEC_B

A, B = "deterministic-text-v1", "deterministic-text-b"


def _app(settings, engine, publisher, store, resolver=None):
    orch = Orchestrator(engine, settings)
    app = create_app(scope_resolver=resolver or LocalScopeResolver(), settings=settings, orchestrator=orch,
                     engine=engine, publisher=publisher, store=store, cursor_secret_key="test-secret")
    return app.test_client(), orch


def _process(client, orch, publisher, n=3):
    with Workers(orch, publisher, n=2):
        for i in range(n):
            body = upload(client, png_bytes((40 * i, 200, 30), size=(40, 40)), display_name=f"img{i}").get_json()
            wait_job(client, body["job"]["id"])


def _semantic(client, q="image"):
    r = client.get("/api/v1/search/text", query_string={"q": q, "mode": "semantic", "limit": 10})
    assert r.status_code == 200, r.get_json()
    return r.get_json()


def test_serving_model_in_search_response_and_operator_switches(settings, engine, publisher, store):
    old, old_orch = _app(settings, engine, publisher, store)
    _process(old, old_orch, publisher)
    assert _semantic(old)["serving"]["state"] == "unset"  # before the sweep's first run
    old_orch.sweep()
    out = _semantic(old)
    assert out["serving"] == {"state": "serving", "epoch": 0, "model": A, "target": None, "switched_at": None}

    new, new_orch = _app(settings.replace(text_provider=SPEC_B, search_cutover_check_s=3600.0), engine, publisher,
                         store)
    new_orch.sweep()  # backfill towards B; its fill batch is queued (no worker runs here)
    out = _semantic(new)
    assert out["model"] == A and len(out["items"]) == 3  # the API configured with B answers from A
    assert out["serving"]["state"] == "backfill" and out["serving"]["target"]["model"] == B
    state = new.get("/api/v1/search/serving").get_json()
    assert state["target"]["coverage"] == {"ready": 0, "total": 3} and state["coverage"] == {"ready": 3, "total": 3}
    assert state["target"]["batch_id"]
    assert [e["action"] for e in state["events"]] == ["backfill", "bootstrap"]

    assert new.post("/api/v1/search/serving/resume").get_json()["error"] == "serving_state_conflict"
    r = new.post("/api/v1/search/serving/cutover")
    assert r.status_code == 200 and (r.get_json()["model"], r.get_json()["epoch"]) == (B, 1)
    r = new.post("/api/v1/search/serving/cutover")
    assert r.status_code == 409 and r.get_json()["error"] == "serving_state_conflict"
    assert _semantic(new)["model"] == B

    r = new.post("/api/v1/search/serving/rollback")
    assert r.status_code == 200 and (r.get_json()["state"], r.get_json()["model"], r.get_json()["epoch"]) == (
        "pinned", A, 2)
    out = _semantic(new)
    assert out["model"] == A and len(out["items"]) == 3

    page = new.get("/ops/")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert 'data-serving-state="pinned"' in html and A in html


def test_serving_endpoints_are_scoped_by_the_token(settings, engine, publisher, store, tokens):
    client, orch = _app(settings, engine, publisher, store, TokenScopeResolver(engine))
    orch.sweep()
    assert client.get("/api/v1/search/serving").status_code == 401
    alpha = {"Authorization": f"Bearer {tokens['alpha']}"}
    r = client.get("/api/v1/search/serving", headers=alpha)
    assert r.status_code == 200 and r.get_json()["scope_id"] == "alpha"
    r = client.post("/api/v1/search/serving/rollback", headers=alpha)
    assert r.status_code == 409 and r.get_json()["error"] == "serving_state_conflict"


def test_cli_search_model_and_status(settings, engine, publisher, store):
    import json

    from click.testing import CliRunner

    from app.cli import main
    from app.config import reset_settings

    client, orch = _app(settings, engine, publisher, store)
    _process(client, orch, publisher, n=2)
    orch.sweep()
    new_settings = settings.replace(text_provider=SPEC_B, search_cutover_check_s=3600.0)
    Orchestrator(engine, new_settings).sweep()
    reset_settings(new_settings)
    try:
        runner = CliRunner(env={"COLUMNS": "200"})
        r = runner.invoke(main, ["search-model", "status"])
        assert r.exit_code == 0, r.output
        assert "backfill" in r.output and "0/2" in r.output
        r = runner.invoke(main, ["search-model", "status", "--scope", "local", "--json"])
        doc = json.loads(r.output)
        assert (doc["state"], doc["model"], doc["target"]["model"]) == ("backfill", A, B)
        r = runner.invoke(main, ["status", "--json"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["search_serving"]["target"]["coverage"] == {"ready": 0, "total": 2}
        r = runner.invoke(main, ["status"])
        assert f"search: {A} (backfill, epoch 0" in r.output and f"backfilling {B}: 0/2" in r.output
        r = runner.invoke(main, ["search", "image", "--json", "--mode", "semantic"])
        assert json.loads(r.output)["serving"]["model"] == A
        r = runner.invoke(main, ["search-model", "resume", "--scope", "local"])
        assert r.exit_code == 1 and "serving_state_conflict" in r.output
        r = runner.invoke(main, ["search-model", "cutover", "--scope", "local"])
        assert r.exit_code == 0 and f"serving {B}" in r.output and "epoch 1" in r.output, r.output
        r = runner.invoke(main, ["search-model", "rollback", "--scope", "local"])
        assert r.exit_code == 0 and "pinned, epoch 2" in r.output, r.output
        assert "early_cutover" in runner.invoke(main, ["search-model", "status", "--scope", "local"]).output
    finally:
        reset_settings(None)


def test_a_pending_change_shows_in_the_api_ops_and_cli(settings, engine, publisher, store):
    """A model change the sweeps have not acted on yet (MEMEFLOW_SEARCH_CONFIG_GRACE_S) is shown
    where operators look, so a change that has not begun does not look ignored."""
    from click.testing import CliRunner

    from app.cli import main
    from app.config import reset_settings

    client, orch = _app(settings, engine, publisher, store)
    _process(client, orch, publisher, n=1)
    orch.sweep()
    new_settings = settings.replace(text_provider=SPEC_B, search_config_grace_s=3600.0)
    new, new_orch = _app(new_settings, engine, publisher, store)
    new_orch.sweep()  # the disagreement is noted; the backfill waits for the grace
    state = new.get("/api/v1/search/serving").get_json()
    assert state["state"] == "serving" and state["target"] is None
    assert state["pending_change"]["model"] == B and state["pending_change"]["since"]
    html = new.get("/ops/").get_data(as_text=True)
    assert 'data-pending-change="text"' in html and B in html
    reset_settings(new_settings)
    try:
        r = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["search-model", "status", "--scope", "local"])
        assert r.exit_code == 0 and f"pending change to {B}" in r.output, r.output
    finally:
        reset_settings(None)
    orch.sweep()  # a sweep configured with the serving model agrees: nothing is pending any more
    assert new.get("/api/v1/search/serving").get_json()["pending_change"] is None
    assert "data-pending-change" not in new.get("/ops/").get_data(as_text=True)
