"""Token auth, scope/token administration and the CLI around them."""

from __future__ import annotations

from click.testing import CliRunner
from sqlalchemy import text

from app.auth import create_token, hash_token, list_tokens, revoke_token
from app.cli import main


def test_tokens_are_stored_hashed(engine, tokens):
    with engine.connect() as conn:
        stored = {r.token_sha256 for r in conn.execute(text("SELECT token_sha256 FROM api_tokens"))}
    assert stored == {hash_token(t) for t in tokens.values()}
    assert not stored & set(tokens.values())


def test_token_auth_401s(token_app, tokens, engine):
    c = token_app.test_client()
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic abc"},
                    {"Authorization": "Bearer"}, {"Authorization": f"bearer {tokens['alpha']}x"}):
        r = c.get("/api/v1/images", headers=headers)
        assert r.status_code == 401, headers
        assert r.get_json()["error"] == "unauthorized"
    ok = c.get("/api/v1/images", headers={"Authorization": f"Bearer {tokens['alpha']}"})
    assert ok.status_code == 200
    revoke_token(engine, "alpha-key")
    r = c.get("/api/v1/images", headers={"Authorization": f"Bearer {tokens['alpha']}"})
    assert r.status_code == 401
    # health and docs need no token
    assert c.get("/healthz").status_code == 200
    assert c.get("/api/openapi.json").status_code == 200


def test_token_admin_functions(engine, tokens):
    info, token = create_token(engine, "alpha", "second")
    assert token.startswith("mf_") and len(token) > 30
    names = {(t.scope_id, t.name) for t in list_tokens(engine)}
    assert {("alpha", "alpha-key"), ("alpha", "second"), ("beta", "beta-key")} <= names
    assert revoke_token(engine, str(info.id))[0].revoked_at is not None
    assert revoke_token(engine, "missing") == []


def test_cli_scopes_and_tokens(settings, engine, monkeypatch):
    from app.config import reset_settings

    reset_settings(settings)
    try:
        runner = CliRunner()
        r = runner.invoke(main, ["scopes", "create", "gamma"])
        assert r.exit_code == 0, r.output
        assert "created: gamma" in r.output
        assert runner.invoke(main, ["scopes", "create", "../x"]).exit_code != 0
        r = runner.invoke(main, ["scopes", "list"])
        assert "gamma" in r.output
        r = runner.invoke(main, ["tokens", "create", "gamma", "--name", "ci"])
        assert r.exit_code == 0, r.output
        token = r.stdout.strip().splitlines()[-1]
        with engine.connect() as conn:
            assert conn.execute(
                text("SELECT scope_id FROM api_tokens WHERE token_sha256 = :h"), {"h": hash_token(token)}
            ).scalar_one() == "gamma"
        assert runner.invoke(main, ["tokens", "create", "nosuch", "--name", "ci"]).exit_code != 0
        r = runner.invoke(main, ["tokens", "revoke", "ci"])
        assert r.exit_code == 0 and "revoked" in r.output
        assert "revoked" in runner.invoke(main, ["tokens", "list"]).output
    finally:
        reset_settings(None)


def test_a_concurrent_create_of_the_same_token_name_is_the_usual_refusal(engine, tokens):
    """The name check read before the other create committed; the insert then hit the unique
    constraint and the CLI showed an IntegrityError traceback."""
    import threading
    import time

    import pytest

    other = engine.connect()
    other.execute(text("INSERT INTO api_tokens (id, scope_id, name, token_sha256)"
                       " VALUES (gen_random_uuid(), 'alpha', 'racing', md5('x'))"))  # not committed yet
    outcome: list = []

    def create():
        try:
            outcome.append(create_token(engine, "alpha", "racing"))
        except Exception as exc:  # noqa: BLE001 - the test inspects what escaped
            outcome.append(exc)

    racer = threading.Thread(target=create)
    racer.start()
    deadline = time.monotonic() + 30

    def racer_waits() -> bool:
        # each look in a transaction of its own: pg_stat_activity is read once per transaction
        # (stats_fetch_consistency), so a first look taken before the racer waited saw it never
        with engine.connect() as watch:
            return bool(watch.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'")).scalar())

    while not outcome and time.monotonic() < deadline and not racer_waits():  # on the row's unique entry
        time.sleep(0.02)
    other.commit()
    other.close()
    racer.join(timeout=30)
    assert len(outcome) == 1
    with pytest.raises(ValueError, match="already has a token named 'racing'"):
        raise outcome[0]
