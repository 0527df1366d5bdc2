"""Security headers on every class of response: API JSON, API errors, an unexpected 500, /ops and
the sign-in page, /api/docs and its assets, the stylesheet, /metrics, /healthz, the OpenAPI JSON."""

from __future__ import annotations

import uuid

import pytest

from app.web.headers import HTML_CSP, NON_HTML_CSP

ROUTES = {  # path -> (status, mimetype) in the given auth mode
    "none": {
        "/api/v1/images": (200, "application/json"),
        "/api/v1/images/not-a-uuid": (404, "application/json"),
        "/api/v1/no-such-thing": (404, "application/json"),
        "/api/openapi.json": (200, "application/json"),
        "/healthz": (200, "application/json"),
        "/metrics": (200, "text/plain"),
        "/ops": (200, "text/html"),
        "/ops/static/ops.css": (200, "text/css"),
        "/api/docs": (200, "text/html"),
        "/api/docs/swagger-ui/swagger-ui-bundle.js": (200, "text/javascript"),
        "/api/docs/swagger-init.js": (404, "application/json"),
        "/api/docs/static/swagger-init.js": (200, "text/javascript"),
        "/boom": (500, "application/json"),
    },
    "token": {
        "/api/v1/images": (401, "application/json"),
        "/ops": (303, "text/html"),
        "/login": (200, "text/html"),
        "/ops/static/ops.css": (200, "text/css"),
    },
}


def _with_boom(app):
    @app.get("/boom")
    def boom():
        raise RuntimeError("an unexpected failure")

    return app


@pytest.mark.parametrize("auth,path", [(a, p) for a, routes in ROUTES.items() for p in routes])
def test_every_response_carries_the_security_headers(make_app, auth, path):
    client = _with_boom(make_app(auth)).test_client()
    with client.get(path) as resp:  # closed: static files are streamed
        _check_headers(resp, *ROUTES[auth][path])


def _check_headers(resp, status: int, mimetype: str) -> None:
    assert (resp.status_code, resp.mimetype) == (status, mimetype)
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert resp.headers["X-Frame-Options"] == "DENY"
    assert resp.headers["Referrer-Policy"] == "same-origin"
    assert resp.headers["Cross-Origin-Resource-Policy"] == "same-origin"
    csp = resp.headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in csp
    assert csp == (HTML_CSP if mimetype == "text/html" else NON_HTML_CSP)
    assert "Strict-Transport-Security" not in resp.headers  # plain HTTP: no HSTS


def test_html_csp_is_self_only_without_inline_code():
    directives = dict(d.strip().split(" ", 1) for d in HTML_CSP.split(";"))
    assert directives["script-src"] == "'self'" and directives["style-src"] == "'self'"
    assert directives["default-src"] == "'none'" and directives["base-uri"] == "'none'"
    assert "unsafe" not in HTML_CSP and "http" not in HTML_CSP


def test_hsts_only_over_tls(make_app):
    client = make_app("none").test_client()
    assert client.get("/healthz", base_url="https://localhost").headers["Strict-Transport-Security"] \
        == "max-age=31536000"
    assert "Strict-Transport-Security" not in client.get("/healthz").headers


def test_forwarded_proto_is_believed_only_from_trusted_proxies(make_app):
    forwarded = {"X-Forwarded-Proto": "https"}
    untrusted = make_app("token").test_client()
    assert "Strict-Transport-Security" not in untrusted.get("/login", headers=forwarded).headers

    trusted = make_app("token", trusted_proxy_hops=1).test_client()
    resp = trusted.get("/login", headers=forwarded)
    assert resp.headers["Strict-Transport-Security"] == "max-age=31536000"
    assert "Secure" in resp.headers["Set-Cookie"]  # the CSRF cookie follows the scheme


def test_swagger_ui_serves_only_its_own_assets(make_app):
    client = make_app("none").test_client()
    assert client.get("/api/docs/swagger-ui/../../../etc/passwd").status_code == 404
    assert client.get("/api/docs/swagger-ui/oauth2-redirect.html").status_code == 404
    page = client.get("/api/docs").get_data(as_text=True)
    assert "<script>" not in page and "cdn" not in page.lower() and "style=" not in page


def test_private_responses_are_never_stored_by_a_cache(make_app):
    """A scope's pages and API answers (names, captions, OCR text, search hits) carry
    ``Cache-Control: no-store``: no shared cache may serve them to another user, and no browser
    keeps them on disk after sign-out. Responses that set their own policy keep it."""
    import io

    from tests.api.conftest import png_bytes

    client = make_app("none").test_client()
    up = client.post("/api/v1/images", data={"file": (io.BytesIO(png_bytes()), "a.png"), "display_name": "private"},
                     content_type="multipart/form-data")
    assert up.status_code == 201, up.get_json()
    image_id = up.get_json()["image"]["id"]
    for path in ["/", f"/library/images/{image_id}", "/ops", f"/ops/images/{image_id}",
                 "/api/v1/images", f"/api/v1/images/{image_id}", "/api/v1/search/text?q=private",
                 "/api/v1/jobs", f"/api/v1/images/{uuid.uuid4()}", "/?older=forged"]:
        resp = client.get(path)
        assert resp.status_code in (200, 404, 422), (path, resp.status_code)
        assert resp.headers.get("Cache-Control") == "no-store", (path, resp.headers.get("Cache-Control"))
    # their own policies stand: validated bytes, immutable versioned thumbnails, the event stream
    assert client.get(f"/api/v1/images/{image_id}/content").headers["Cache-Control"] == "private, no-cache"
    with client.get("/library/static/library.js") as static:
        assert static.headers.get("Cache-Control") != "no-store"
