"""Stable error codes of the REST contract (SPEC §6): the code names what was wrong with the request."""

from __future__ import annotations

import uuid

from tests.api.conftest import png_bytes, upload
from tests.api.test_bad_input import unchanged  # noqa: F401 - fixture


def test_an_unknown_field_is_validation_error_whatever_its_name(client, unchanged):  # noqa: F811
    """An unknown field named like another endpoint's field (``url``, ``force_stages``, ``cursor``…)
    is a plain 422 validation_error: the field-specific codes are for the endpoint's own fields.
    It was answered with that other field's code (PATCH {"url": …} was invalid_webhook_url)."""
    some = uuid.uuid4()
    for method, path, body in [
        ("patch", f"/api/v1/images/{some}", {"url": "https://example.com/"}),
        ("patch", f"/api/v1/images/{some}", {"display_name": "x", "force_stages": ["visual"]}),
        ("patch", f"/api/v1/images/{some}", {"reverse_image_policy": "auto"}),
        ("patch", f"/api/v1/images/{some}", {"context": {"title": "t", "cursor": "x"}}),
        ("post", "/api/v1/batches", {"all": True, "force_stages": ["visual"]}),
        ("post", "/api/v1/batches", {"all": True, "event_types": []}),
        ("post", f"/api/v1/images/{some}/process", {"url": "x"}),
        ("post", "/api/v1/search/visual", {"image_id": str(some), "after": 1}),
    ]:
        r = getattr(client, method)(path, json=body)
        assert (r.status_code, r.get_json()["error"]) == (422, "validation_error"), (path, body, r.get_json())
    r = upload(client, png_bytes(), reverse_image_policy="forbid", force_stages="visual")
    assert (r.status_code, r.get_json()["error"]) == (422, "validation_error"), r.get_json()
    # the endpoint's own field keeps its specific code
    r = client.post(f"/api/v1/images/{some}/process", json={"force_stages": ["ocr"], "url": "x"})
    assert (r.status_code, r.get_json()["error"]) == (422, "invalid_stage"), r.get_json()
    r = client.post("/api/v1/batches", json={"all": True, "reverse_image_policy": "x"})
    assert (r.status_code, r.get_json()["error"]) == (422, "invalid_reverse_image_policy"), r.get_json()


def test_visual_search_with_a_body_that_is_not_json_is_400_invalid_json(client, unchanged):  # noqa: F811
    """Like every other JSON endpoint: a body that does not parse is 400 invalid_json (it was a 422
    validation_error "the body must be a JSON object", indistinguishable from a wrong object)."""
    for body in [b"{not json", b'{"image_id": "x"}{}', b"\xff\xfe", b'{"image_id": "' + b"\xff" + b'"}']:
        r = client.post("/api/v1/search/visual", data=body, content_type="application/json")
        assert (r.status_code, r.get_json()["error"]) == (400, "invalid_json"), (body, r.get_json())
    for body in [b"[]", b"null", b"1", b""]:
        r = client.post("/api/v1/search/visual", data=body, content_type="application/json")
        assert (r.status_code, r.get_json()["error"]) == (422, "validation_error"), (body, r.get_json())


def test_a_retry_that_creates_no_revision_is_200_not_201(client, engine):
    """Retrying a job whose image already has a newer active job returns that job: nothing was
    created, so it is 200 (as POST /images/{id}/process answers), not 201 Created — and no new
    revision appears. A retry that does create one stays 201."""
    from sqlalchemy import text

    job_id = upload(client, png_bytes((5, 6, 7))).get_json()["job"]["id"]
    assert client.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 200
    first = client.post(f"/api/v1/jobs/{job_id}/retry")
    assert first.status_code == 201, first.get_json()
    again = client.post(f"/api/v1/jobs/{job_id}/retry")
    assert again.status_code == 200, again.get_json()
    assert again.get_json()["job"]["id"] == first.get_json()["job"]["id"]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM processing_jobs")).scalar_one() == 2


def test_the_openapi_document_lists_the_errors_each_operation_answers(client):
    """Every orchestrator error a view can answer is in its OpenAPI responses with its code: the
    rate limit (429 rate_limited) of every view that calls limit_rate, the quota (403
    quota_exceeded) of the two that store bytes, the 409 of a webhook delete that meets a delivery
    in flight. They were left to the anonymous ``default`` response."""
    doc = client.get("/api/openapi.json").get_json()
    expected = {
        ("post", "/api/v1/images"): {"403": "quota_exceeded", "429": "rate_limited"},
        ("put", "/api/v1/images/{image_id}/content"): {"403": "quota_exceeded", "429": "rate_limited"},
        ("patch", "/api/v1/images/{image_id}"): {"415": "unsupported_media_type", "429": "rate_limited"},
        ("post", "/api/v1/images/{image_id}/process"): {"415": "unsupported_media_type", "429": "rate_limited"},
        ("post", "/api/v1/jobs/{job_id}/retry"): {"429": "rate_limited"},
        ("post", "/api/v1/batches"): {"415": "unsupported_media_type", "429": "rate_limited"},
        ("post", "/api/v1/webhooks"): {"415": "unsupported_media_type"},
        ("delete", "/api/v1/webhooks/{webhook_id}"): {"409": "webhook_delivery_in_flight"},
    }
    missing = []
    for (method, path), codes in expected.items():
        responses = doc["paths"][path][method]["responses"]
        for status, code in codes.items():
            if status not in responses or code not in responses[status].get("description", ""):
                missing.append((method, path, status, code))
    assert not missing, missing


def test_a_json_limit_that_is_not_an_integer_is_422(client):
    """``limit`` in a JSON body is an integer (the OpenAPI type): 1.5 was truncated to 1 and "5"
    accepted as 5; both are 422 validation_error now, like a query string's limit=1.5."""
    image_id = upload(client, png_bytes((8, 8, 8)), process=False).get_json()["image"]["id"]
    for limit in [1.5, 0.5, 100.5, "5", True, [5], {"n": 5}, None]:
        r = client.post("/api/v1/search/visual", json={"image_id": image_id, "limit": limit})
        assert (r.status_code, r.get_json()["error"]) == (422, "validation_error"), (limit, r.get_json())
    assert client.post("/api/v1/search/visual", json={"image_id": image_id, "limit": 5}).status_code == 200


def test_a_json_endpoint_refuses_a_body_of_another_media_type_with_415(client, engine):
    """A body sent as text/plain, a form or multipart to an endpoint that reads JSON was ignored
    as if none had been sent: POST /process with {"force_stages": ["visual"]} as text/plain
    answered 200 "already valid" without forcing anything. It is 415 unsupported_media_type now,
    nothing written; an empty body (no options) is still accepted."""
    from sqlalchemy import text

    image_id = upload(client, png_bytes((3, 1, 4)), process=False).get_json()["image"]["id"]
    with engine.connect() as conn:
        before = conn.execute(text("SELECT count(*) FROM processing_jobs")).scalar_one()
    body = b'{"force_stages": ["visual"], "display_name": "n", "all": true, "url": "https://example.com/"}'
    for method, path in [("post", f"/api/v1/images/{image_id}/process"), ("patch", f"/api/v1/images/{image_id}"),
                         ("post", "/api/v1/batches"), ("post", "/api/v1/webhooks")]:
        for ct in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                   "application/octet-stream"]:
            r = getattr(client, method)(path, data=body, content_type=ct)
            assert (r.status_code, r.get_json()["error"]) == (415, "unsupported_media_type"), (path, ct, r.get_json())
        r = getattr(client, method)(path, data=body, headers={"Content-Type": ""})
        assert (r.status_code, r.get_json()["error"]) == (415, "unsupported_media_type"), (path, r.get_json())
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM processing_jobs")).scalar_one() == before
        assert conn.execute(text("SELECT count(*) FROM batches")).scalar_one() == 0
    # no body at all: the defaults
    r = client.post(f"/api/v1/images/{image_id}/process")
    assert r.status_code == 201, r.get_json()
    r = client.post(f"/api/v1/images/{image_id}/process", data=b"", content_type="text/plain")
    assert r.status_code == 200, r.get_json()
