"""SPEC §6 image endpoints through the Flask test client against real PostgreSQL."""

from __future__ import annotations

import hashlib
import io

from sqlalchemy import text

from tests.api.conftest import png_bytes, upload
from tests.conftest import poll_until
from tests.support.pipeline import Workers


def count(engine, table: str) -> int:
    with engine.connect() as conn:
        return conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()


def wait_job(client, job_id: str, status: str = "succeeded") -> dict:
    return poll_until(
        lambda: (j := client.get(f"/api/v1/jobs/{job_id}").get_json())["status"] == status and j,
        what=f"job {job_id} {status}",
    )


def test_upload_creates_image_job_and_hint(client, publisher, store, engine):
    data = png_bytes()
    r = upload(client, data, display_name="red")
    assert r.status_code == 201, r.get_json()
    body = r.get_json()
    assert body["created"] is True
    image, job = body["image"], body["job"]
    assert image["sha256"] == hashlib.sha256(data).hexdigest()
    assert (image["media_type"], image["width"], image["height"], image["size_bytes"]) == ("image/png", 32, 24, len(data))
    assert image["display_name"] == "red" and image["latest_job"]["id"] == job["id"]
    assert job["status"] == "queued" and [s["stage"] for s in job["stages"]] == ["visual", "agent", "text_embedding"]
    assert job["reverse_image_policy"] == "forbid" and job["mode"] == "auto"
    assert [h.lane for h in publisher.published] == ["visual"]
    assert list(store.iter_keys()) and store.read(next(store.iter_keys())) == data

    again = upload(client, data)
    assert again.status_code == 200
    assert again.get_json()["created"] is False
    assert again.get_json()["image"]["id"] == image["id"]
    assert again.get_json()["job"]["id"] == job["id"]
    assert (count(engine, "images"), count(engine, "processing_jobs")) == (1, 1)


def test_upload_formats_and_process_false(client):
    for fmt, mt in [("JPEG", "image/jpeg"), ("GIF", "image/gif"), ("WEBP", "image/webp")]:
        r = upload(client, png_bytes(fmt=fmt), name="whatever.png", process=False)
        assert r.status_code == 201, r.get_json()
        assert r.get_json()["image"]["media_type"] == mt
        assert r.get_json()["job"] is None
        assert r.get_json()["image"]["latest_job"] is None


def test_policy_conflict_on_upload(client, engine):
    data = png_bytes()
    assert upload(client, data).status_code == 201
    r = upload(client, data, reverse_image_policy="auto")
    assert (r.status_code, r.get_json()["error"]) == (409, "generation_policy_conflict")
    assert count(engine, "processing_jobs") == 1


def test_list_pagination_and_cursors(client):
    ids = [upload(client, png_bytes((i * 40, 10, 10)), process=False).get_json()["image"]["id"] for i in range(5)]
    seen, cursor = [], None
    while True:
        r = client.get("/api/v1/images", query_string={"limit": 2, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200
        page = r.get_json()
        assert len(page["items"]) <= 2
        seen += [i["id"] for i in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids) and len(seen) == 5
    first = client.get("/api/v1/images?limit=2").get_json()["next_cursor"]
    body, _, sig = first.partition(".")
    tampered = body[:-2] + ("AA" if body[-2:] != "AA" else "BB") + "." + sig
    for bad in (tampered, body + "." + sig[::-1], "x" + first):
        r = client.get("/api/v1/images", query_string={"cursor": bad})
        assert (r.status_code, r.get_json()["error"]) == (422, "invalid_cursor")
    # a cursor for images is not a cursor for jobs
    r = client.get("/api/v1/jobs", query_string={"cursor": first})
    assert (r.status_code, r.get_json()["error"]) == (422, "invalid_cursor")


def test_get_image_and_content_etag(client):
    data = png_bytes()
    image = upload(client, data).get_json()["image"]
    r = client.get(f"/api/v1/images/{image['id']}")
    assert r.status_code == 200 and r.get_json()["id"] == image["id"]
    assert r.get_json()["latest_job"]["status"] == "queued"
    c = client.get(f"/api/v1/images/{image['id']}/content")
    assert c.status_code == 200 and c.data == data and c.mimetype == "image/png"
    assert c.headers["ETag"] == f'"{image["sha256"]}"'
    nm = client.get(f"/api/v1/images/{image['id']}/content", headers={"If-None-Match": c.headers["ETag"]})
    assert nm.status_code == 304 and nm.data == b""
    other = client.get(f"/api/v1/images/{image['id']}/content", headers={"If-None-Match": '"abc"'})
    assert other.status_code == 200
    missing = "00000000-0000-4000-8000-000000000000"
    for path in (f"/api/v1/images/{missing}", f"/api/v1/images/{missing}/content"):
        r = client.get(path)
        assert (r.status_code, r.get_json()["error"]) == (404, "not_found")


def test_replace_content(client, store):
    old = png_bytes((1, 2, 3))
    body = upload(client, old).get_json()
    image_id, old_job = body["image"]["id"], body["job"]["id"]
    new = png_bytes((200, 200, 0), size=(20, 20))
    r = client.put(f"/api/v1/images/{image_id}/content", data={"file": (io.BytesIO(new), "n.png")},
                   content_type="multipart/form-data")
    assert r.status_code == 200, r.get_json()
    out = r.get_json()
    assert out["image"]["sha256"] == hashlib.sha256(new).hexdigest() and out["image"]["width"] == 20
    assert out["job"]["id"] != old_job and out["job"]["image_sha256"] == out["image"]["sha256"]
    assert client.get(f"/api/v1/jobs/{old_job}").get_json()["status"] == "target_changed"
    assert client.get(f"/api/v1/images/{image_id}/content").data == new
    assert [store.read(k) for k in store.iter_keys()] == [new]  # the old file went after the commit
    bad = client.put(f"/api/v1/images/{image_id}/content", data={"file": (io.BytesIO(b"nope"), "n.png")},
                     content_type="multipart/form-data")
    assert (bad.status_code, bad.get_json()["error"]) == (415, "unsupported_media_type")
    missing = client.put("/api/v1/images/00000000-0000-4000-8000-000000000000/content",
                         data={"file": (io.BytesIO(new), "n.png")}, content_type="multipart/form-data")
    assert (missing.status_code, missing.get_json()["error"]) == (404, "not_found")
    nofile = client.put(f"/api/v1/images/{image_id}/content", data={}, content_type="multipart/form-data")
    assert (nofile.status_code, nofile.get_json()["error"]) == (400, "missing_file")


def test_full_pipeline_patch_process_and_delete(client, orch, publisher, store, engine):
    body = upload(client, png_bytes((10, 120, 240))).get_json()
    image_id, job_id = body["image"]["id"], body["job"]["id"]
    with Workers(orch, publisher, n=2):
        job = wait_job(client, job_id)
        assert job["progress"] == 1.0 and all(s["status"] == "succeeded" for s in job["stages"])
        image = client.get(f"/api/v1/images/{image_id}").get_json()
        assert image["context_status"] == "ready" and image["metadata_hash"]

        # every stage valid → the latest job, created=false, no new task
        tasks_before = count(engine, "tasks")
        r = client.post(f"/api/v1/images/{image_id}/process", json={})
        assert r.status_code == 200 and r.get_json() == {"job": r.get_json()["job"], "created": False}
        assert r.get_json()["job"]["id"] == job_id and count(engine, "tasks") == tasks_before

        # forcing a stage creates a new revision (201)
        r = client.post(f"/api/v1/images/{image_id}/process", json={"force_stages": ["text_embedding"]})
        assert r.status_code == 201, r.get_json()
        forced = r.get_json()["job"]
        assert forced["revision"] == 2 and forced["mode"] == "full_retry"
        wait_job(client, forced["id"])

        # a context edit re-runs only the text stage
        r = client.patch(f"/api/v1/images/{image_id}", json={"context": {"title": "cat on a keyboard", "tags": ["cat"]}})
        assert r.status_code == 200, r.get_json()
        edited = r.get_json()
        assert edited["image"]["context"]["title"] == "cat on a keyboard"
        assert edited["image"]["context_status"] == "edited"
        done = wait_job(client, edited["job"]["id"])
        statuses = {s["stage"]: s["status"] for s in done["stages"]}
        assert statuses["visual"] == "reused" and statuses["agent"] == "reused"
        assert statuses["text_embedding"] == "succeeded"

        r = client.patch(f"/api/v1/images/{image_id}", json={"display_name": "renamed"})
        assert r.status_code == 200 and r.get_json()["image"]["display_name"] == "renamed"
        wait_job(client, r.get_json()["job"]["id"])

    task_id = done["stages"][2]["task_id"]
    t = client.get(f"/api/v1/tasks/{task_id}")
    assert t.status_code == 200 and t.get_json()["status"] == "succeeded" and t.get_json()["stage"] == "text_embedding"

    r = client.delete(f"/api/v1/images/{image_id}")
    assert r.status_code == 204 and r.data == b""
    for path in (f"/api/v1/images/{image_id}", f"/api/v1/jobs/{job_id}", f"/api/v1/tasks/{task_id}",
                 f"/api/v1/images/{image_id}/content"):
        assert client.get(path).status_code == 404, path
    assert client.delete(f"/api/v1/images/{image_id}").status_code == 404
    assert list(store.iter_keys()) == []


def test_process_conflict_and_unknown_image(client):
    image_id = upload(client, png_bytes()).get_json()["image"]["id"]
    r = client.post(f"/api/v1/images/{image_id}/process", json={"reverse_image_policy": "auto"})
    assert (r.status_code, r.get_json()["error"]) == (409, "generation_policy_conflict")
    r = client.post("/api/v1/images/00000000-0000-4000-8000-000000000000/process", json={})
    assert (r.status_code, r.get_json()["error"]) == (404, "not_found")
    r = client.patch("/api/v1/images/00000000-0000-4000-8000-000000000000", json={"display_name": "x"})
    assert (r.status_code, r.get_json()["error"]) == (404, "not_found")


def test_context_generation_in_progress(client, orch):
    body = upload(client, png_bytes()).get_json()
    image_id = body["image"]["id"]
    # run the visual stage, then hold the agent task claimed (running) without completing it
    from app.stages.providers import Providers
    from app.worker.run import run_task

    visual_task = body["job"]["stages"][0]["task_id"]
    run_task(orch, visual_task, "w1", Providers(orch.settings), _Sink())
    job = client.get(f"/api/v1/jobs/{body['job']['id']}").get_json()
    agent_task = job["stages"][1]["task_id"]
    assert orch.claim_task(agent_task, "w2") is not None
    r = client.patch(f"/api/v1/images/{image_id}", json={"context": {"title": "x"}})
    assert (r.status_code, r.get_json()["error"]) == (409, "context_generation_in_progress")


class _Sink:
    def publish(self, hints):
        pass
