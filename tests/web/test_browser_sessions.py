"""Token mode in a browser: /login exchanges a token for a session cookie bound to that token;
revoking the token or signing out ends it; the cookie opens /ops only, never the API."""

from __future__ import annotations

import hashlib
import re

from sqlalchemy import text

from app.auth import revoke_token
from tests.api.conftest import png_bytes, upload
from tests.ops.helpers import SAME_ORIGIN, page_csrf_token


def _sign_in(client, token: str, *, next_path: str = "/ops", base_url: str = "http://localhost"):
    form = client.get(f"/login?next={next_path}", base_url=base_url).get_data(as_text=True)
    origin = base_url
    return client.post("/login", base_url=base_url, headers={"Origin": origin},
                       data={"csrf_token": page_csrf_token(form), "token": token, "next": next_path})


def _sessions(engine) -> list:
    with engine.connect() as conn:
        return conn.execute(text("SELECT id_sha256, token_id, csrf_token FROM browser_sessions")).all()


def _session_cookie(resp) -> str:
    cookie = next(c for c in resp.headers.getlist("Set-Cookie") if c.startswith("mf_session="))
    return cookie


def test_sign_in_sets_a_strict_http_only_cookie_bound_to_the_token(make_app, engine, token_for):
    _, token = token_for("alpha")
    client = make_app("token").test_client()
    to_login = client.get("/ops/")
    assert to_login.status_code == 303 and to_login.headers["Location"] == "/login?next=/ops/"
    resp = _sign_in(client, token)
    assert resp.status_code == 303 and resp.headers["Location"] == "/ops"
    cookie = _session_cookie(resp)
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert "Secure" not in cookie
    value = re.match(r"mf_session=([^;]+)", cookie).group(1)
    [row] = _sessions(engine)
    assert row.id_sha256 == hashlib.sha256(value.encode()).hexdigest()  # only the digest is stored
    with engine.connect() as conn:
        assert conn.execute(text("SELECT scope_id FROM api_tokens WHERE id = :t"), {"t": row.token_id}).scalar() \
            == "alpha"
    page = client.get("/ops")
    assert page.status_code == 200 and "scope <b>alpha</b>" in page.get_data(as_text=True)
    assert 'id="logout"' in page.get_data(as_text=True)


def test_sign_in_over_tls_sets_a_secure_cookie(make_app, token_for):
    _, token = token_for("alpha")
    client = make_app("token").test_client()
    resp = _sign_in(client, token, base_url="https://localhost")
    assert resp.status_code == 303
    cookie = next(c for c in resp.headers.getlist("Set-Cookie") if c.startswith("__Host-mf_session="))
    assert "Secure" in cookie and "Path=/" in cookie and "Domain" not in cookie
    assert client.get("/ops", base_url="https://localhost").status_code == 200


def test_over_tls_a_planted_unprefixed_session_cookie_is_ignored(make_app, token_for):
    """Over TLS the session cookie is ``__Host-`` prefixed, which a sibling subdomain or a plain-HTTP
    man in the middle cannot set; a plain ``mf_session`` — which they can — opens nothing there,
    even when it names a live session (the attacker's own)."""
    _, token = token_for("alpha")
    attacker = make_app("token").test_client()
    planted = re.match(r"mf_session=([^;]+)", _session_cookie(_sign_in(attacker, token))).group(1)
    victim = make_app("token").test_client()
    victim.set_cookie("mf_session", planted, domain="localhost")
    assert victim.get("/ops", base_url="http://localhost").status_code == 200  # plain HTTP: it is the cookie
    resp = victim.get("/ops", base_url="https://localhost")
    assert resp.status_code == 303 and resp.headers["Location"].startswith("/login")


def test_unknown_or_revoked_token_is_refused_with_the_form_again(make_app, engine, token_for):
    name, token = token_for("alpha")
    client = make_app("token").test_client()
    for bad in ("mf_not-a-token", "", "x" * 300):
        resp = _sign_in(client, bad)
        assert resp.status_code == 401 and "unknown or revoked token" in resp.get_data(as_text=True)
    revoke_token(engine, name)
    resp = _sign_in(client, token)
    assert resp.status_code == 401
    assert not any(c.startswith("mf_session=") for c in resp.headers.getlist("Set-Cookie"))
    assert _sessions(engine) == []


def test_sign_in_form_is_csrf_protected(make_app, engine, token_for):
    _, token = token_for("alpha")
    client = make_app("token").test_client()
    form = client.get("/login").get_data(as_text=True)
    csrf = page_csrf_token(form)
    foreign = client.post("/login", data={"csrf_token": csrf, "token": token}, headers={"Origin": "http://evil.example"})
    missing = client.post("/login", data={"token": token}, headers={"Origin": SAME_ORIGIN})
    assert foreign.status_code == 403 and missing.status_code == 403
    # an Origin or Referer that does not parse names no origin, so not this one
    for unparsable in ({"Origin": "http://["}, {"Referer": "http://[::1/x"}):
        resp = client.post("/login", data={"csrf_token": csrf, "token": token}, headers=unparsable)
        assert resp.status_code == 403, unparsable
    assert _sessions(engine) == []


def test_the_api_never_accepts_the_session_cookie(make_app, token_for):
    _, alpha = token_for("alpha")
    _, beta = token_for("beta")
    client = make_app("token").test_client()
    assert _sign_in(client, alpha).status_code == 303
    assert client.get("/ops").status_code == 200  # the cookie is live
    refused = client.get("/api/v1/images")
    assert refused.status_code == 401 and refused.get_json()["error"] == "unauthorized"
    assert upload(client, png_bytes()).status_code == 401  # a write neither
    # with a bearer token the API uses that token's scope, whatever the cookie says
    created = upload(client, png_bytes(), headers={"Authorization": f"Bearer {beta}"})
    assert created.status_code == 201
    image_id = created.get_json()["image"]["id"]
    listed = client.get("/api/v1/images", headers={"Authorization": f"Bearer {beta}"}).get_json()
    assert [i["id"] for i in listed["items"]] == [image_id]
    # and /ops in the cookie's scope (alpha) cannot see beta's image
    assert client.get(f"/ops/images/{image_id}").status_code == 404


def test_a_bad_authorization_header_does_not_fall_back_to_the_cookie(make_app, token_for):
    _, token = token_for("alpha")
    client = make_app("token").test_client()
    _sign_in(client, token)
    assert client.get("/ops", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_retry_in_a_session_needs_the_session_csrf_token(make_app, engine, token_for):
    _, token = token_for("alpha")
    bearer = {"Authorization": f"Bearer {token}"}
    client = make_app("token").test_client()
    created = upload(client, png_bytes(), headers=bearer).get_json()
    job_id, image_id = created["job"]["id"], created["image"]["id"]
    client.post(f"/api/v1/jobs/{job_id}/cancel", headers=bearer)
    pre_login_token = page_csrf_token(client.get("/login").get_data(as_text=True))
    _sign_in(client, token)
    [session] = _sessions(engine)
    stale = client.post(f"/ops/jobs/{job_id}/retry", data={"csrf_token": pre_login_token},
                        headers={"Origin": SAME_ORIGIN})
    assert stale.status_code == 403  # the double-submit value of the anonymous page is not the session's
    page_token = page_csrf_token(client.get(f"/ops/images/{image_id}").get_data(as_text=True))
    assert page_token == session.csrf_token
    ok = client.post(f"/ops/jobs/{job_id}/retry", data={"csrf_token": page_token}, headers={"Origin": SAME_ORIGIN})
    assert ok.status_code == 303 and "retry requested" in client.get(ok.headers["Location"]).get_data(as_text=True)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM processing_jobs WHERE image_id = :i"), {"i": image_id}).scalar() == 2


def test_revocation_expiry_and_sign_out_end_the_session(make_app, engine, token_for):
    name, token = token_for("alpha")
    client = make_app("token").test_client()
    _sign_in(client, token)
    assert client.get("/ops").status_code == 200
    revoke_token(engine, name)
    assert client.get("/ops").status_code == 303  # revoked token: the same cookie opens nothing

    _, token2 = token_for("alpha")
    _sign_in(client, token2)
    assert client.get("/ops").status_code == 200
    with engine.begin() as conn:
        conn.execute(text("UPDATE browser_sessions SET expires_at = now() - interval '1 second'"))
    assert client.get("/ops").status_code == 303  # expired

    _sign_in(client, token2)  # expired rows are dropped by the next sign-in
    assert len(_sessions(engine)) == 1
    csrf = page_csrf_token(client.get("/ops").get_data(as_text=True))
    out = client.post("/logout", data={"csrf_token": csrf}, headers={"Origin": SAME_ORIGIN})
    assert out.status_code == 303 and out.headers["Location"] == "/login"
    assert any(c.startswith("mf_session=;") for c in out.headers.getlist("Set-Cookie"))
    assert _sessions(engine) == []
    assert client.get("/ops").status_code == 303


def test_sign_out_from_another_site_is_refused(make_app, engine, token_for):
    _, token = token_for("alpha")
    client = make_app("token").test_client()
    _sign_in(client, token)
    csrf = page_csrf_token(client.get("/ops").get_data(as_text=True))
    assert client.post("/logout", data={"csrf_token": csrf}, headers={"Origin": "http://evil.example"}).status_code == 403
    assert client.post("/logout", data={"csrf_token": csrf}, headers={"Origin": "http://["}).status_code == 403
    assert len(_sessions(engine)) == 1


def test_next_is_never_an_open_redirect(make_app, token_for):
    _, token = token_for("alpha")
    for target in ("//evil.example/ops", "https://evil.example/", "/ops\\..\\x", "/api/v1/images"):
        resp = _sign_in(make_app("token").test_client(), token, next_path=target)
        assert resp.status_code == 303 and resp.headers["Location"] == "/ops/", target


def test_none_mode_needs_no_sign_in(make_app):
    client = make_app("none").test_client()
    assert client.get("/ops").status_code == 200
    resp = client.get("/login")
    assert resp.status_code == 303 and resp.headers["Location"] == "/ops/"


def test_a_second_sign_in_ends_the_browsers_previous_session(make_app, engine, token_for):
    """Signing in again in the same browser (a POST /login while signed in) replaces the session:
    the first one's row is deleted, so its cookie — copied, or planted before — opens nothing more."""
    _, alpha = token_for("alpha")
    _, beta = token_for("beta")
    client = make_app("token").test_client()
    form = client.get("/login?next=/ops").get_data(as_text=True)
    csrf = page_csrf_token(form)
    first = client.post("/login", headers={"Origin": SAME_ORIGIN},
                        data={"csrf_token": csrf, "token": alpha, "next": "/ops"})
    assert first.status_code == 303
    old_cookie = re.match(r"mf_session=([^;]+)", _session_cookie(first)).group(1)
    second = client.post("/login", headers={"Origin": SAME_ORIGIN},
                         data={"csrf_token": csrf, "token": beta, "next": "/ops"})
    assert second.status_code == 303
    [row] = _sessions(engine)
    assert row.id_sha256 != hashlib.sha256(old_cookie.encode()).hexdigest()
    assert "scope <b>beta</b>" in client.get("/ops").get_data(as_text=True)
