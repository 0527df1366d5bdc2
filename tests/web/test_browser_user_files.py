"""Uploaded bytes can never become a document of memeflow's origin, and no page can be framed.

In headless Chromium: a GIF whose comment holds an HTML page with a script (a valid image Pillow
decodes, so the upload keeps it) is opened directly at every route that serves stored bytes: it
stays an image (``nosniff`` + the sniffed ``image/gif``), even with the CSP switched off. Those
routes also answer ``Content-Disposition: inline`` with a file name of our making (never the
display name) and a ``sandbox`` CSP, so a browser that ever took them for a document would run
nothing and give it an opaque origin. SVG and HTML uploads are refused with a JSON 415 and leave
nothing behind. A page of another origin that frames any memeflow page gets an error frame."""

from __future__ import annotations

import io
import re

import pytest
from flask import Flask
from PIL import Image
from sqlalchemy import text

from tests.api.conftest import upload
from tests.conftest import poll_until
from tests.support.chromium import Browser
from tests.web.conftest import serving

POLYGLOT_HTML = b"<html><body><b id=pwn-gif>x</b><script>window.__pwned=1</script><img src=x onerror=window.__pwned=2>"


def _polyglot_gif() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (20, 10), (1, 2, 3)).save(buf, format="GIF", comment=POLYGLOT_HTML)
    data = buf.getvalue()
    assert POLYGLOT_HTML in data
    return data


def _file_routes(image_id: str) -> list[str]:
    return [f"/api/v1/images/{image_id}/content", f"/ops/images/{image_id}/content",
            f"/api/v1/images/{image_id}/thumbnail?size=128"]


def test_stored_bytes_are_served_as_sandboxed_inline_images_with_our_file_name(make_app):
    client = make_app("none").test_client()
    created = upload(client, _polyglot_gif(), name="evil.html", display_name='x"; filename="evil.html')
    assert created.status_code == 201, created.get_json()
    image_id = created.get_json()["image"]["id"]
    for path in _file_routes(image_id):
        resp = client.get(path)
        assert resp.status_code == 200, path
        assert resp.mimetype in ("image/gif", "image/webp") and resp.headers["X-Content-Type-Options"] == "nosniff"
        ext = "webp" if "thumbnail" in path else "gif"
        assert re.fullmatch(rf'inline; filename="{image_id}(-128)?\.{ext}"', resp.headers["Content-Disposition"]), \
            (path, resp.headers.get("Content-Disposition"))
        csp = [d.strip() for d in resp.headers["Content-Security-Policy"].split(";")]
        assert "sandbox" in csp and "default-src 'none'" in csp and "frame-ancestors 'none'" in csp, (path, csp)


@pytest.mark.parametrize("name,data", [
    ("a.svg", b'<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"><script>alert(1)</script></svg>'),
    ("a.html", b"<!doctype html><html><script>alert(1)</script></html>"),
    ("a.png", b"<html><script>alert(1)</script></html>"),  # an image's name, a page's bytes
])
def test_svg_and_html_uploads_are_refused_and_leave_nothing(make_app, engine, settings, name, data):
    client = make_app("none").test_client()
    resp = upload(client, data, name=name)
    assert resp.status_code == 415 and resp.get_json()["error"] == "unsupported_media_type"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM images")).scalar_one() == 0
    assert [p for p in settings.storage_path.rglob("*") if p.is_file()] == []


def test_polyglot_stays_an_image_in_chromium_and_no_page_can_be_framed(make_app, tmp_path):
    app = make_app("none")
    image_id = upload(app.test_client(), _polyglot_gif(), name="evil.gif").get_json()["image"]["id"]
    pages = ["/", "/ops", f"/ops/images/{image_id}", f"/library/images/{image_id}", "/api/docs", *_file_routes(image_id)]
    with serving(app) as base, Browser(tmp_path / "profile") as browser:
        for bypass_csp in (False, True):  # with the CSP off, Content-Type and nosniff alone must hold
            page = browser.new_page()
            page.send("Page.setBypassCSP", {"enabled": bypass_csp})
            for path in _file_routes(image_id):
                page.goto(base + path)
                shown = page.evaluate("[document.contentType, document.images.length, (document.images[0] || {}).naturalWidth,"
                                      " window.__pwned === undefined, document.getElementById('pwn-gif') === null]")
                assert shown[0] in ("image/gif", "image/webp") and shown[1:] == [1, shown[2], True, True], (path, bypass_csp, shown)
                assert shown[2] in (20, 128), (path, shown)  # the picture itself is shown

        evil = Flask("framer")

        @evil.get("/")
        def framer():
            return "".join(f'<iframe name="f{i}" src="{base}{p}"></iframe>' for i, p in enumerate(pages))

        with serving(evil) as evil_base:
            page = browser.new_page()
            page.goto(evil_base + "/")

            def framed() -> list[tuple[str, str]]:
                tree = page.send("Page.getFrameTree")["frameTree"]
                return [(f["frame"]["name"], f["frame"]["url"]) for f in tree.get("childFrames", [])]

            def all_refused() -> bool:
                frames = framed()
                return len(frames) == len(pages) and all(url.startswith("chrome-error://") for _, url in frames)

            poll_until(all_refused, timeout=30, what="every framed memeflow page to be refused")


def test_another_origin_cannot_embed_stored_images_in_chromium(make_app, tmp_path):
    """``Cross-Origin-Resource-Policy: same-origin``: in ``none`` mode the files need no credential,
    so without it any site the user visits could show (or, by load/error, probe for) the library's
    images; memeflow's own pages still show them."""
    app = make_app("none")
    image_id = upload(app.test_client(), _polyglot_gif(), name="a.gif").get_json()["image"]["id"]
    with serving(app) as base, Browser(tmp_path / "profile") as browser:
        evil = Flask("embedder")

        @evil.get("/")
        def embedder():
            return "".join(f'<img src="{base}{p}">' for p in _file_routes(image_id))

        with serving(evil) as evil_base:
            page = browser.new_page()
            page.goto(evil_base + "/")
            loaded = page.wait_until("[...document.images].every(i => i.complete) && "
                                     "[...document.images].map(i => i.naturalWidth)")
            assert loaded == [0, 0, 0], loaded
        page.goto(f"{base}/library/images/{image_id}")
        assert page.wait_until("document.querySelector('img.big').complete && "
                               "document.querySelector('img.big').naturalWidth") == 20
