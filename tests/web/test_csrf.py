"""/ops actions need a same-origin request AND the page's CSRF token; a refusal changes nothing.

Against the full app with the real orchestrator: a cancelled job is the retry target, and "nothing
changed" is read from the database (its revisions), not from a recorder."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from tests.api.conftest import png_bytes, upload
from tests.ops.helpers import SAME_ORIGIN, page_csrf_token


def _cancelled_job(client, headers: dict | None = None) -> tuple[str, str]:
    """Upload an image and cancel its job (a retryable state); returns (image_id, job_id)."""
    resp = upload(client, png_bytes(), headers=headers)
    assert resp.status_code == 201, resp.get_json()
    body = resp.get_json()
    job_id = body["job"]["id"]
    assert client.post(f"/api/v1/jobs/{job_id}/cancel", headers=headers or {}).status_code == 200
    return body["image"]["id"], job_id


def _revisions(engine, image_id: str) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM processing_jobs WHERE image_id = :i"), {"i": image_id}).scalar()


def _token_from(client, page: str = "/ops/images/{image}", **fmt) -> str:
    return page_csrf_token(client.get(page.format(**fmt)).get_data(as_text=True))


REFUSED = {
    "foreign Origin": lambda tok: ({"csrf_token": tok}, {"Origin": "http://evil.example"}),
    "Origin null": lambda tok: ({"csrf_token": tok}, {"Origin": "null"}),
    "foreign Referer, no Origin": lambda tok: ({"csrf_token": tok}, {"Referer": "http://evil.example/x"}),
    "neither Origin nor Referer": lambda tok: ({"csrf_token": tok}, {}),
    "unparsable Origin": lambda tok: ({"csrf_token": tok}, {"Origin": "http://["}),
    "unparsable Referer, no Origin": lambda tok: ({"csrf_token": tok}, {"Referer": "http://[::1/x"}),
    "cross-site fetch metadata": lambda tok: ({"csrf_token": tok}, {"Origin": SAME_ORIGIN,
                                                                  "Sec-Fetch-Site": "same-site"}),
    "no token": lambda tok: ({}, {"Origin": SAME_ORIGIN}),
    "wrong token": lambda tok: ({"csrf_token": tok[:-2] + "xx"}, {"Origin": SAME_ORIGIN}),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_cross_site_retry_is_refused_and_changes_nothing(make_app, engine, case):
    client = make_app("none").test_client()
    image_id, job_id = _cancelled_job(client)
    token = _token_from(client, image=image_id)
    form, headers = REFUSED[case](token)
    resp = client.post(f"/ops/jobs/{job_id}/retry", data=form, headers=headers)
    assert resp.status_code == 403
    assert "forbidden" in resp.get_data(as_text=True)
    assert _revisions(engine, image_id) == 1


def test_same_site_retry_with_its_token_is_carried_out(make_app, engine):
    client = make_app("none").test_client()
    image_id, job_id = _cancelled_job(client)
    token = _token_from(client, image=image_id)
    resp = client.post(f"/ops/jobs/{job_id}/retry", data={"csrf_token": token},
                       headers={"Origin": SAME_ORIGIN, "Sec-Fetch-Site": "same-origin"})
    assert resp.status_code == 303 and "retry requested" in client.get(resp.headers["Location"]).get_data(as_text=True)
    assert _revisions(engine, image_id) == 2
    # a Referer from this origin stands in for a missing Origin
    second = client.post(f"/ops/jobs/{job_id}/retry", data={"csrf_token": token},
                         headers={"Referer": f"{SAME_ORIGIN}/ops/images/{image_id}"})
    assert second.status_code == 303  # past the CSRF checks (whatever the orchestrator then decides)


def test_double_submit_token_is_bound_to_its_cookie(make_app, engine):
    """Another browser's token (a different cookie) does not pass."""
    app = make_app("none")
    victim, attacker = app.test_client(), app.test_client()
    image_id, job_id = _cancelled_job(victim)
    _token_from(victim, image=image_id)  # the victim's browser has its own cookie
    attacker_token = _token_from(attacker, image=image_id)
    resp = victim.post(f"/ops/jobs/{job_id}/retry", data={"csrf_token": attacker_token},
                       headers={"Origin": SAME_ORIGIN})
    assert resp.status_code == 403
    assert _revisions(engine, image_id) == 1


def test_the_csrf_cookie_is_http_only_and_strict(make_app, engine):
    client = make_app("none").test_client()
    image_id, _ = _cancelled_job(client)
    cookie = client.get(f"/ops/images/{image_id}").headers["Set-Cookie"]
    assert cookie.startswith("mf_csrf=") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "Secure" not in cookie
    fresh = client.application.test_client()
    assert "Secure" in fresh.get(f"/ops/images/{image_id}", base_url="https://localhost").headers["Set-Cookie"]


def test_ops_messages_never_come_from_the_query_string(make_app, engine):
    """``/ops?msg=…&err=…`` shows nothing: a link from anywhere could otherwise put words of its
    choosing in the page's own notice boxes ("token revoked, sign in at https://evil.example").
    The retry's outcome reaches the next page in a short-lived HttpOnly, SameSite=Strict cookie,
    shown once."""
    client = make_app("none").test_client()
    spoof = "your token was revoked: sign in again at https://evil.example/login"
    page = client.get("/ops", query_string={"msg": spoof, "err": spoof}).get_data(as_text=True)
    assert "evil.example" not in page and 'id="flash' not in page

    image_id, job_id = _cancelled_job(client)
    token = _token_from(client, image=image_id)
    resp = client.post(f"/ops/jobs/{job_id}/retry", data={"csrf_token": token}, headers={"Origin": SAME_ORIGIN})
    assert resp.status_code == 303 and resp.headers["Location"] == "/ops/"
    flash_cookie = next(c for c in resp.headers.getlist("Set-Cookie") if c.startswith("mf_flash="))
    assert "HttpOnly" in flash_cookie and "SameSite=Strict" in flash_cookie and "Path=/ops" in flash_cookie
    shown = client.get(resp.headers["Location"])
    assert f"retry requested for job {job_id}" in shown.get_data(as_text=True)
    assert any(c.startswith("mf_flash=;") for c in shown.headers.getlist("Set-Cookie"))  # shown once
    assert "retry requested" not in client.get("/ops").get_data(as_text=True)
    # a refusal: its code and message, from the same cookie
    refused = client.post(f"/ops/jobs/{uuid.uuid4()}/retry", data={"csrf_token": token}, headers={"Origin": SAME_ORIGIN})
    assert refused.status_code == 303 and refused.headers["Location"] == "/ops/"
    assert 'id="flash-error">not_found' in client.get("/ops").get_data(as_text=True)
    # a forged or garbled cookie shows nothing and breaks nothing
    for value in ("garbage", "eyJ0ZXh0IjogMX0", "%%%"):
        client.set_cookie("mf_flash", value, path="/ops")
        assert client.get("/ops").status_code == 200
