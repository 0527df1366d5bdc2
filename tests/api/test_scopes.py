"""Two scopes, two tokens: nothing of one scope is visible or reachable from the other."""

from __future__ import annotations

import io

from sqlalchemy import text

from tests.api.conftest import png_bytes, upload
from tests.conftest import poll_until
from tests.support.pipeline import Workers


def test_scopes_never_see_each_other(token_app, tokens, orch, publisher, engine):
    c = token_app.test_client()
    A = {"Authorization": f"Bearer {tokens['alpha']}"}
    B = {"Authorization": f"Bearer {tokens['beta']}"}

    def job_a() -> dict:
        return c.get(f"/api/v1/jobs/{a['job']['id']}", headers=A).get_json()

    data = png_bytes((9, 99, 199))
    with Workers(orch, publisher, n=2):
        a = upload(c, data, headers=A).get_json()
        assert a["created"] is True
        poll_until(lambda: job_a()["status"] == "succeeded", what="alpha job")
    image_id, job_id = a["image"]["id"], a["job"]["id"]
    task_id = job_a()["stages"][0]["task_id"]

    # identical bytes in another scope are a different image
    b = upload(c, data, headers=B, process=False).get_json()
    assert b["created"] is True and b["image"]["id"] != image_id
    with engine.connect() as conn:
        keys = [r[0] for r in conn.execute(text("SELECT storage_key FROM images ORDER BY scope_id"))]
    assert keys[0].split("/")[0] != keys[1].split("/")[0]  # separate namespaces

    not_found = [
        ("get", f"/api/v1/images/{image_id}", None),
        ("get", f"/api/v1/images/{image_id}/content", None),
        ("patch", f"/api/v1/images/{image_id}", {"display_name": "stolen"}),
        ("post", f"/api/v1/images/{image_id}/process", {}),
        ("delete", f"/api/v1/images/{image_id}", None),
        ("get", f"/api/v1/jobs/{job_id}", None),
        ("post", f"/api/v1/jobs/{job_id}/retry", None),
        ("post", f"/api/v1/jobs/{job_id}/cancel", None),
        ("get", f"/api/v1/tasks/{task_id}", None),
        ("post", "/api/v1/search/visual", {"image_id": image_id}),
    ]
    for method, path, body in not_found:
        kwargs = {"headers": B, **({"json": body} if body is not None else {})}
        r = getattr(c, method)(path, **kwargs)
        assert (r.status_code, r.get_json()["error"]) == (404, "not_found"), (method, path)
    r = c.put(f"/api/v1/images/{image_id}/content", headers=B, data={"file": (io.BytesIO(png_bytes()), "x.png")},
              content_type="multipart/form-data")
    assert r.status_code == 404

    # lists and search of beta show only beta's own image
    assert [i["id"] for i in c.get("/api/v1/images", headers=B).get_json()["items"]] == [b["image"]["id"]]
    assert c.get("/api/v1/jobs", headers=B).get_json()["items"] == []
    assert c.get("/api/v1/jobs", headers=B, query_string={"image_id": image_id}).get_json()["items"] == []
    text_b = c.get("/api/v1/search/text", headers=B, query_string={"q": "anything"}).get_json()
    assert text_b["items"] == [] and text_b["coverage"] == {"ready": 0, "total": 1}
    vis = c.post("/api/v1/search/visual", headers=B, data={"file": (io.BytesIO(data), "q.png")},
                 content_type="multipart/form-data").get_json()
    assert vis["items"] == []
    # ... while alpha sees its processed image
    vis_a = c.post("/api/v1/search/visual", headers=A, data={"file": (io.BytesIO(data), "q.png")},
                   content_type="multipart/form-data").get_json()
    assert [h["image"]["id"] for h in vis_a["items"]] == [image_id]
    assert c.get(f"/api/v1/images/{image_id}", headers=A).get_json()["display_name"] is None

    # a scope_id in a body or form is refused; in a query string it is ignored
    r = c.post(f"/api/v1/images/{b['image']['id']}/process", headers=B, json={"scope_id": "alpha"})
    assert (r.status_code, r.get_json()["error"]) == (422, "validation_error")
    r = upload(c, png_bytes((1, 1, 1)), headers=B, scope_id="alpha")
    assert (r.status_code, r.get_json()["error"]) == (422, "validation_error")
    r = c.get("/api/v1/images", headers=B, query_string={"scope_id": "alpha"})
    assert [i["id"] for i in r.get_json()["items"]] == [b["image"]["id"]]  # query scope ignored


def test_a_cursor_of_another_scope_is_refused_like_a_forged_one(token_app, tokens):
    """A keyset cursor is signed for the scope it was issued to: in another scope it is 422
    invalid_cursor (it used to page that scope's own rows from the other scope's position)."""
    c = token_app.test_client()
    A = {"Authorization": f"Bearer {tokens['alpha']}"}
    B = {"Authorization": f"Bearer {tokens['beta']}"}
    for i in range(2):
        assert upload(c, png_bytes((i, 50, 90)), headers=A, process=False).status_code == 201
        assert upload(c, png_bytes((i, 90, 50)), headers=B, process=False).status_code == 201
    for path in ("/api/v1/images", "/api/v1/jobs"):
        if path == "/api/v1/jobs":
            for h in (A, B):
                ids = [i["id"] for i in c.get("/api/v1/images", headers=h).get_json()["items"]]
                for image_id in ids:
                    assert c.post(f"/api/v1/images/{image_id}/process", headers=h, json={}).status_code == 201
        cursor = c.get(path, headers=A, query_string={"limit": 1}).get_json()["next_cursor"]
        assert c.get(path, headers=A, query_string={"cursor": cursor}).status_code == 200  # its own scope's
        r = c.get(path, headers=B, query_string={"cursor": cursor})
        assert (r.status_code, r.get_json()["error"]) == (422, "invalid_cursor"), path
