"""The library page (``/``) without a browser: auth as /ops, strict headers, and the API honouring a
signed-in page's own requests only (same origin; the CSRF header on writes)."""

from __future__ import annotations

from tests.api.conftest import png_bytes, upload
from tests.ops.helpers import SAME_ORIGIN, page_csrf_token

PAGE = {"Sec-Fetch-Site": "same-origin", "Referer": f"{SAME_ORIGIN}/"}


def _sign_in(client, token: str, next_path: str = "/") -> str:
    form = client.get(f"/login?next={next_path}").get_data(as_text=True)
    resp = client.post("/login", headers={"Origin": SAME_ORIGIN},
                       data={"csrf_token": page_csrf_token(form), "token": token, "next": next_path})
    assert resp.status_code == 303 and resp.headers["Location"] == next_path
    return page_meta_csrf(client.get("/").get_data(as_text=True))


def page_meta_csrf(html: str) -> str:
    import re

    return re.search(r'<meta name="csrf-token" content="([^"]+)"', html).group(1)


def test_the_library_needs_a_sign_in_in_token_mode_and_none_in_local_mode(make_app, token_for):
    client = make_app("token").test_client()
    resp = client.get("/")
    assert resp.status_code == 303 and resp.headers["Location"] == "/login?next=/"
    assert client.get("/library/images/00000000-0000-0000-0000-000000000000").status_code == 303
    _, token = token_for("alpha")
    csrf = _sign_in(client, token)
    page = client.get("/")
    assert page.status_code == 200 and "Drop images here" in page.get_data(as_text=True)
    assert csrf and page.headers["Content-Security-Policy"].startswith("default-src 'none'; script-src 'self'")
    assert "'unsafe-inline'" not in page.headers["Content-Security-Policy"]
    assert page.headers["X-Frame-Options"] == "DENY"
    local = make_app("none").test_client().get("/")
    assert local.status_code == 200 and 'id="library-grid"' in local.get_data(as_text=True)


def test_no_inline_script_or_style_and_local_assets_only(make_app):
    client = make_app("none").test_client()
    upload(client, png_bytes(size=(64, 48)), name="cat.png", display_name="cat.png")
    html = client.get("/").get_data(as_text=True)
    assert "<script>" not in html and "style=" not in html and "<style" not in html and " on" + "click=" not in html
    assert "http://" not in html.replace(SAME_ORIGIN, "") and "https://" not in html
    with client.get("/library/static/library.js") as js, client.get("/library/static/library.css") as css:
        assert js.status_code == 200 and js.mimetype in ("text/javascript", "application/javascript")
        assert css.status_code == 200 and css.mimetype == "text/css"
        assert "innerHTML" not in js.get_data(as_text=True)  # user text is set as text only
    assert "cat.png" in html and "/thumbnail?size=256&amp;v=" in html


def test_the_api_takes_the_session_only_from_this_sites_page(make_app, token_for):
    _, alpha = token_for("alpha")
    _, beta = token_for("beta")
    client = make_app("token").test_client()
    csrf = _sign_in(client, alpha)
    # a read from the page's own script: the session's scope
    own = client.get("/api/v1/images", headers=PAGE)
    assert own.status_code == 200 and own.get_json()["items"] == []
    # the same cookie from anywhere else: as if there were none
    for foreign in ({"Sec-Fetch-Site": "same-site", "Referer": "http://localhost:8080/"},
                    {"Sec-Fetch-Site": "cross-site"}, {"Origin": "http://evil.example"},
                    {"Referer": "http://localhost:8080/x"}, {},
                    {"Origin": "http://["}, {"Referer": "http://[::1/x"}):  # unparsable: no origin at all
        for path in ("/api/v1/images", "/api/v1/events"):
            refused = client.get(path, headers=foreign)
            assert refused.status_code == 401 and refused.get_json()["error"] == "unauthorized", (path, foreign)
    # writes also need the session's CSRF secret in X-CSRF-Token
    write = {"Origin": SAME_ORIGIN, "Sec-Fetch-Site": "same-origin"}
    for headers in ({}, {"X-CSRF-Token": "wrong"}):
        denied = upload(client, png_bytes(), headers={**write, **headers})
        assert denied.status_code == 403 and denied.get_json()["error"] == "csrf_rejected"
    created = upload(client, png_bytes(), headers={**write, "X-CSRF-Token": csrf})
    assert created.status_code == 201
    image_id = created.get_json()["image"]["id"]
    assert client.get(f"/api/v1/images/{image_id}/thumbnail", headers=PAGE).status_code == 200
    # a bearer token always wins over the cookie, a bad one never falls back to it
    assert client.get(f"/api/v1/images/{image_id}", headers={**PAGE, "Authorization": f"Bearer {beta}"}) \
        .status_code == 404
    assert client.get("/api/v1/images", headers={**PAGE, "Authorization": "Bearer nope"}).status_code == 401
    # after sign-out the cookie is nothing
    client.post("/logout", headers={"Origin": SAME_ORIGIN}, data={"csrf_token": csrf})
    assert client.get("/api/v1/images", headers=PAGE).status_code == 401


def test_the_image_page_is_scope_checked(make_app, token_for):
    _, alpha = token_for("alpha")
    _, beta = token_for("beta")
    app = make_app("token")
    created = upload(app.test_client(), png_bytes(), headers={"Authorization": f"Bearer {alpha}"}).get_json()
    image_id = created["image"]["id"]
    mine, theirs = app.test_client(), app.test_client()
    _sign_in(mine, alpha)
    _sign_in(theirs, beta)
    page = mine.get(f"/library/images/{image_id}")
    assert page.status_code == 200 and 'id="context-form"' in page.get_data(as_text=True)
    assert theirs.get(f"/library/images/{image_id}").status_code == 404
    assert theirs.get(f"/api/v1/images/{image_id}/thumbnail", headers=PAGE).status_code == 404


def test_the_grid_pages_back_with_a_signed_cursor(make_app, monkeypatch):
    import re

    from app.library import views

    monkeypatch.setattr(views, "RECENT", 2)
    client = make_app("none").test_client()
    names = [f"img-{i}.png" for i in range(3)]
    for i, name in enumerate(names):
        upload(client, png_bytes(color=(i * 60, 10, 10)), name=name, display_name=name)
    first = client.get("/").get_data(as_text=True)
    shown = re.findall(r'class="name" href="[^"]+">([^<]+)</a>', first)
    assert shown == ["img-2.png", "img-1.png"]
    assert '<span id="library-total">3</span>' in first  # the scope's count, not the page's
    older = re.search(r'href="(/\?older=[^"]+)" id="older"', first).group(1).replace("&amp;", "&")
    second = client.get(older).get_data(as_text=True)
    assert re.findall(r'class="name" href="[^"]+">([^<]+)</a>', second) == ["img-0.png"]
    assert 'id="older"' not in second and 'id="newest"' in second
    gone = re.search(r'data-image-id="([0-9a-f-]{36})"', second).group(1)
    assert client.delete(f"/api/v1/images/{gone}").status_code == 204
    assert '<span id="library-total">2</span>' in client.get("/").get_data(as_text=True)
    forged = client.get("/?older=eyJjcmVhdGVkX2F0IjoiMjAyNi0wMS0wMSJ9.AAAA")
    assert forged.status_code == 422 and forged.get_json()["error"] == "invalid_cursor"


def test_page_uploads_share_the_rate_window_of_the_sessions_token(make_app, token_for):
    _, token = token_for("alpha")
    client = make_app("token", uploads_per_minute=2).test_client()
    csrf = _sign_in(client, token)
    page_write = {"Origin": SAME_ORIGIN, "Sec-Fetch-Site": "same-origin", "X-CSRF-Token": csrf}
    assert upload(client, png_bytes(color=(1, 1, 1)), headers={"Authorization": f"Bearer {token}"}).status_code == 201
    assert upload(client, png_bytes(color=(2, 2, 2)), headers=page_write).status_code == 201
    limited = upload(client, png_bytes(color=(3, 3, 3)), headers=page_write)
    assert limited.status_code == 429 and limited.get_json()["error"] == "rate_limited"
