"""Safe defaults of the API (issue 17 §2): the Host allow-list, the persisted cursor secret and
token lifecycle (one 401 message, expiry, unambiguous revocation)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import subprocess
import sys
import threading

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from app.api import create_app
from app.app_secrets import CURSOR_HMAC, get_or_create_secret
from app.auth import LocalScopeResolver, TokenScopeResolver, create_scope, create_token, revoke_token
from app.cli import main
from app.db.engine import make_engine
from tests.api.conftest import png_bytes, upload
from tests.conftest import poll_until


def _app(settings, engine, orch, publisher, store, resolver=None):
    """An API instance as a process would build it: no explicit cursor key."""
    return create_app(scope_resolver=resolver or LocalScopeResolver(), settings=settings, orchestrator=orch,
                      engine=engine, publisher=publisher, store=store)


# --------------------------------------------------------------------------- Host allow-list
@pytest.mark.parametrize("path", ["/api/v1/images", "/healthz", "/ops/", "/api/openapi.json", "/nope"])
def test_unknown_host_is_400_invalid_host_on_every_route(client, path):
    r = client.get(path, headers={"Host": "rebind.attacker.example"})
    assert r.status_code == 400
    assert r.get_json()["error"] == "invalid_host"
    assert "MEMEFLOW_ALLOWED_HOSTS" in r.get_json()["message"]


def test_a_rebinding_post_changes_nothing(client, engine):
    r = upload(client, png_bytes(), headers={"Host": "rebind.attacker.example:5000"})
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_host"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM images")).scalar() == 0


@pytest.mark.parametrize("host", ["localhost", "localhost:5000", "127.0.0.1:5000", "[::1]:5000"])
def test_loopback_hosts_are_served(client, host):
    assert client.get("/api/v1/images", headers={"Host": host}).status_code == 200


def test_configured_hosts_and_star(settings, engine, orch, publisher, store):
    named = _app(settings.replace(allowed_hosts="memes.example.com"), engine, orch, publisher, store).test_client()
    assert named.get("/api/v1/images", headers={"Host": "memes.example.com"}).status_code == 200
    assert named.get("/api/v1/images", headers={"Host": "localhost"}).status_code == 400  # the list replaces
    anyhost = _app(settings.replace(allowed_hosts="*"), engine, orch, publisher, store).test_client()
    assert anyhost.get("/api/v1/images", headers={"Host": "whatever.example"}).status_code == 200


def test_token_mode_checks_the_host_before_the_token(settings, engine, orch, publisher, store, tokens):
    app = _app(settings, engine, orch, publisher, store, TokenScopeResolver(engine))
    auth = {"Authorization": f"Bearer {tokens['alpha']}"}
    r = app.test_client().get("/api/v1/images", headers={**auth, "Host": "evil.example"})
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_host"
    assert app.test_client().get("/api/v1/images", headers=auth).status_code == 200


@pytest.mark.parametrize("peer", ["10.0.0.7", "192.168.1.20", "2001:db8::5", "::ffff:10.0.0.7"])
def test_auth_none_answers_remote_peers_403_whatever_server_runs_it(client, engine, peer):
    """The second layer behind the bind guard: a plain ``gunicorn -b 0.0.0.0`` still serves no one else."""
    r = client.get("/api/v1/images", environ_base={"REMOTE_ADDR": peer})
    assert r.status_code == 403 and r.get_json()["error"] == "unauthenticated_remote"
    r = client.post("/api/v1/images", environ_base={"REMOTE_ADDR": peer})
    assert r.status_code == 403
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM images")).scalar() == 0


@pytest.mark.parametrize("peer", ["127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1", ""])
def test_auth_none_serves_local_peers(client, peer):
    assert client.get("/api/v1/images", environ_base={"REMOTE_ADDR": peer}).status_code == 200


def test_remote_peers_with_the_opt_in_or_in_token_mode(settings, engine, orch, publisher, store, token_app, tokens):
    remote = {"REMOTE_ADDR": "10.0.0.7"}
    opted = _app(settings.replace(allow_unauthenticated_remote=True), engine, orch, publisher, store).test_client()
    assert opted.get("/api/v1/images", environ_base=remote).status_code == 200
    c = token_app.test_client()
    assert c.get("/api/v1/images", environ_base=remote).status_code == 401
    auth = {"Authorization": f"Bearer {tokens['alpha']}"}
    assert c.get("/api/v1/images", environ_base=remote, headers=auth).status_code == 200


# --------------------------------------------------------------------------- cross-site writes
@pytest.mark.parametrize("headers", [
    {"Origin": "https://evil.example"},
    {"Origin": "null"},
    {"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"},
    {"Sec-Fetch-Site": "same-site"},
    {"Sec-Fetch-Site": "cross-site"},  # no Origin at all: the browser's word is enough
])
def test_auth_none_refuses_writes_from_other_sites_pages(client, engine, headers):
    r = upload(client, png_bytes(), headers=headers)
    assert r.status_code == 403 and r.get_json()["error"] == "cross_site_request"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM images")).scalar() == 0


def test_auth_none_serves_its_own_pages_and_non_browser_clients(client, engine):
    assert upload(client, png_bytes((1, 2, 3)), headers={"Origin": "http://localhost",
                                                        "Sec-Fetch-Site": "same-origin"}).status_code == 201
    assert upload(client, png_bytes((4, 5, 6))).status_code == 201  # curl, SDKs: neither header
    image_id = client.get("/api/v1/images").get_json()["items"][0]["id"]
    assert client.delete(f"/api/v1/images/{image_id}", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
    # a cross-site page may still *read* nothing: no CORS headers are ever sent
    r = client.get("/api/v1/images", headers={"Origin": "https://evil.example"})
    assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers


def test_token_mode_writes_are_not_judged_by_origin(token_app, tokens):
    auth = {"Authorization": f"Bearer {tokens['alpha']}", "Origin": "https://other.example"}
    assert upload(token_app.test_client(), png_bytes(), headers=auth).status_code == 201


# --------------------------------------------------------------------------- cursor secret
def _first_page_cursor(client) -> str:
    for i in range(3):
        assert upload(client, png_bytes((i * 40, 10, 10)), name=f"{i}.png").status_code == 201
    page = client.get("/api/v1/images?limit=1").get_json()
    assert page["next_cursor"]
    return page["next_cursor"]


def test_the_cursor_secret_survives_a_restart(settings, engine, orch, publisher, store):
    cursor = _first_page_cursor(_app(settings, engine, orch, publisher, store).test_client())
    # A "restart": a new engine and a new app instance, as a new process would build them.
    engine2 = make_engine(settings.database_url)
    try:
        again = _app(settings, engine2, orch, publisher, store).test_client()
        r = again.get("/api/v1/images", query_string={"limit": 1, "cursor": cursor})
        assert r.status_code == 200, r.get_json()
        assert len(r.get_json()["items"]) == 1
    finally:
        engine2.dispose()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM app_secrets WHERE name = :n"), {"n": CURSOR_HMAC}).scalar() == 1


def _sign(payload: bytes, key: bytes, kind: str = "images") -> str:
    sig = hmac.new(key, kind.encode() + b"\0" + payload, hashlib.sha256).digest()[:16]
    b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()  # noqa: E731
    return f"{b64(payload)}.{b64(sig)}"


def test_forged_and_tampered_cursors_are_422(settings, engine, orch, publisher, store):
    client = _app(settings, engine, orch, publisher, store).test_client()
    cursor = _first_page_cursor(client)
    body, _, sig = cursor.partition(".")
    payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    payload["created_at"] = "2000-01-01T00:00:00+00:00"
    raw = json.dumps(payload, separators=(",", ":")).encode()
    tampered = base64.urlsafe_b64encode(raw).rstrip(b"=").decode() + "." + sig
    # The key the old code derived from the database URL and var dir: anyone knowing them could forge.
    derived = hashlib.sha256(f"memeflow-cursor:{settings.database_url}:{settings.var_dir}".encode()).digest()
    for bad in (tampered, _sign(raw, derived), _sign(raw, b"")):
        r = client.get("/api/v1/images", query_string={"cursor": bad})
        assert r.status_code == 422 and r.get_json()["error"] == "invalid_cursor", bad
    # the stored key is random and not the derived one
    assert get_or_create_secret(engine, CURSOR_HMAC) != derived
    assert len(get_or_create_secret(engine, CURSOR_HMAC)) == 32


def test_memeflow_cursor_secret_overrides_the_stored_key(settings, engine, orch, publisher, store):
    stored_cursor = _first_page_cursor(_app(settings, engine, orch, publisher, store).test_client())
    env = settings.replace(cursor_secret="an operator-chosen secret of some length")
    a = _app(env, engine, orch, publisher, store).test_client()
    r = a.get("/api/v1/images", query_string={"cursor": stored_cursor})
    assert r.status_code == 422  # signed with the stored key, not this one
    own = a.get("/api/v1/images?limit=1").get_json()["next_cursor"]
    b = _app(env, engine, orch, publisher, store).test_client()
    assert b.get("/api/v1/images", query_string={"cursor": own}).status_code == 200


def test_a_short_cursor_secret_is_refused():
    from app.config import Settings, SettingsError

    with pytest.raises(SettingsError, match="MEMEFLOW_CURSOR_SECRET"):
        Settings.from_env({"MEMEFLOW_CURSOR_SECRET": "short"})
    assert Settings.from_env({"MEMEFLOW_CURSOR_SECRET": ""}).cursor_secret is None
    shown = repr(Settings(cursor_secret="operator secret 1234", flower_basic_auth="ops:pw-9", agent_api_key="sk-7"))
    assert "operator secret" not in shown and "pw-9" not in shown and "sk-7" not in shown


def test_concurrent_first_starts_agree_on_one_secret(db_url):
    """Threads (each its own connection) and separate processes race to create the secret."""
    engines = [make_engine(db_url) for _ in range(6)]
    for e in engines:  # connect first, so that the racers start together at the barrier
        with e.connect() as conn:
            conn.execute(text("SELECT 1"))
    barrier = threading.Barrier(len(engines))
    got: list[bytes] = []

    def start(eng) -> None:
        barrier.wait()
        got.append(get_or_create_secret(eng, "race_test"))

    threads = [threading.Thread(target=start, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for e in engines:
        e.dispose()
    assert len(got) == len(engines) and len(set(got)) == 1

    code = ("import sys; from app.app_secrets import get_or_create_secret; from app.db.engine import make_engine; "
            "print(get_or_create_secret(make_engine(sys.argv[1]), 'process_race').hex())")
    procs = [subprocess.Popen([sys.executable, "-c", code, db_url], stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(outs) == 1 and len(outs.pop()) == 64


def test_a_process_that_loses_the_insert_race_uses_the_winners_secret(engine, db_url):
    """Deterministic interleaving: the winner's insert is pending when the loser reads (nothing)
    and inserts (blocks); after the winner commits the loser must return the winner's value."""
    winner_value = b"w" * 32
    loser_engine = make_engine(db_url)
    result: list[bytes] = []
    with engine.connect() as winner:
        tx = winner.begin()
        winner.execute(text("INSERT INTO app_secrets (name, value) VALUES ('lost_race', :v)"), {"v": winner_value})
        t = threading.Thread(target=lambda: result.append(get_or_create_secret(loser_engine, "lost_race")))
        t.start()
        poll_until(lambda: _waiting_on_a_lock(engine), timeout=30, what="the loser's insert waits on the winner's")
        tx.commit()
    t.join(timeout=30)
    loser_engine.dispose()
    assert result == [winner_value]


def _waiting_on_a_lock(engine) -> bool:
    with engine.connect() as conn:
        return bool(conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO app_secrets%'")).scalar())


# --------------------------------------------------------------------------- tokens
def test_unknown_revoked_and_expired_tokens_get_the_same_401(token_app, tokens, engine):
    c = token_app.test_client()
    _, expired = create_token(engine, "beta", "short-lived")
    with engine.begin() as conn:  # the fact "it expired", set directly: no waiting on a clock
        conn.execute(text("UPDATE api_tokens SET expires_at = now() - interval '1 second' WHERE name = 'short-lived'"))
    revoke_token(engine, "alpha-key")
    bodies = []
    for token in ("mf_never_issued_" + "x" * 30, tokens["alpha"], expired):
        r = c.get("/api/v1/images", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 401
        bodies.append(r.get_json())
    assert bodies[0] == bodies[1] == bodies[2], bodies
    assert c.get("/api/v1/images", headers={"Authorization": f"Bearer {tokens['beta']}"}).status_code == 200


def test_a_token_with_expiry_works_until_it_expires(token_app, engine, tokens):
    from datetime import timedelta

    info, token = create_token(engine, "alpha", "month", expires_in=timedelta(days=30))
    assert info.expires_at is not None
    delta = info.expires_at - info.created_at
    assert timedelta(days=30) - timedelta(seconds=5) < delta <= timedelta(days=30)
    c = token_app.test_client()
    assert c.get("/api/v1/images", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    with engine.begin() as conn:
        conn.execute(text("UPDATE api_tokens SET expires_at = now() WHERE id = :i"), {"i": info.id})
    assert c.get("/api/v1/images", headers={"Authorization": f"Bearer {token}"}).status_code == 401


@pytest.fixture()
def cli(settings):
    from app.config import reset_settings

    reset_settings(settings)
    yield CliRunner()
    reset_settings(None)


def test_cli_token_expiry(cli, engine):
    create_scope(engine, "gamma")
    r = cli.invoke(main, ["tokens", "create", "gamma", "--name", "ci", "--expires-in", "30d"])
    assert r.exit_code == 0, r.output
    assert "expires" in r.stderr
    with engine.connect() as conn:
        days = conn.execute(text("SELECT extract(epoch FROM expires_at - created_at) / 86400 FROM api_tokens "
                                 "WHERE name = 'ci'")).scalar_one()
    assert 29.99 < float(days) <= 30
    assert "active, expires" in cli.invoke(main, ["tokens", "list"]).output
    for bad in ("0d", "30", "soon", "-1d"):
        r = cli.invoke(main, ["tokens", "create", "gamma", "--name", f"bad{bad}", "--expires-in", bad])
        assert r.exit_code == 2 and "--expires-in" in r.output, (bad, r.output)


def test_revoking_a_name_used_in_several_scopes_needs_scope(cli, engine, tokens):
    create_token(engine, "beta", "alpha-key")  # the same name in scope beta
    r = cli.invoke(main, ["tokens", "revoke", "alpha-key"])
    assert r.exit_code == 1
    assert "alpha, beta" in r.output and "--scope" in r.output
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM api_tokens WHERE revoked_at IS NOT NULL")).scalar() == 0
    r = cli.invoke(main, ["tokens", "revoke", "alpha-key", "--scope", "beta"])
    assert r.exit_code == 0 and "beta/alpha-key" in r.output
    with engine.connect() as conn:
        revoked = conn.execute(text("SELECT scope_id FROM api_tokens WHERE revoked_at IS NOT NULL")).scalars().all()
    assert revoked == ["beta"]
    # a name unique to one scope needs no --scope; an id never does
    assert cli.invoke(main, ["tokens", "revoke", "beta-key"]).exit_code == 0
    assert "no token" in cli.invoke(main, ["tokens", "revoke", "nothing-here"]).output


def test_the_cursor_secret_can_come_from_a_secret_file(settings, engine, orch, publisher, store, tmp_path):
    secret = tmp_path / "cursor_secret"
    secret.write_text("a mounted docker secret value\n")
    env = settings.replace(cursor_secret_file=str(secret))
    own = _first_page_cursor(_app(env, engine, orch, publisher, store).test_client())
    # another process with the same mount verifies it; the stored random key does not
    assert _app(env, engine, orch, publisher, store).test_client().get(
        "/api/v1/images", query_string={"cursor": own}).status_code == 200
    assert _app(settings, engine, orch, publisher, store).test_client().get(
        "/api/v1/images", query_string={"cursor": own}).status_code == 422
    secret.write_text("short\n")
    with pytest.raises(ValueError, match="MEMEFLOW_CURSOR_SECRET_FILE"):
        _app(env, engine, orch, publisher, store)
