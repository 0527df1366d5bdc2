"""Jobs and tasks endpoints: list/filter/paginate, get, cancel, retry."""

from __future__ import annotations

from tests.api.conftest import png_bytes, upload

MISSING = "00000000-0000-4000-8000-000000000000"


def test_jobs_list_filter_get_cancel_retry(client, publisher):
    bodies = [upload(client, png_bytes((i * 50, 0, 0))).get_json() for i in range(3)]
    job_ids = [b["job"]["id"] for b in bodies]

    r = client.get("/api/v1/jobs")
    assert r.status_code == 200
    assert sorted(j["id"] for j in r.get_json()["items"]) == sorted(job_ids)
    page = client.get("/api/v1/jobs?limit=2").get_json()
    assert len(page["items"]) == 2 and page["next_cursor"]
    rest = client.get("/api/v1/jobs", query_string={"limit": 2, "cursor": page["next_cursor"]}).get_json()
    assert len(rest["items"]) == 1 and rest["next_cursor"] is None
    by_image = client.get("/api/v1/jobs", query_string={"image_id": bodies[1]["image"]["id"]}).get_json()
    assert [j["id"] for j in by_image["items"]] == [job_ids[1]]

    job = client.get(f"/api/v1/jobs/{job_ids[0]}").get_json()
    assert job["progress"] == 0.0 and job["error"] is None and job["stages"][0]["status"] == "queued"
    assert job["stages"][0]["task_id"]
    task = client.get(f"/api/v1/tasks/{job['stages'][0]['task_id']}").get_json()
    assert task["status"] == "queued" and task["lane"] == "visual" and "available_at" in task

    r = client.post(f"/api/v1/jobs/{job_ids[0]}/retry")
    assert (r.status_code, r.get_json()["error"]) == (409, "job_not_retryable")
    r = client.post(f"/api/v1/jobs/{job_ids[0]}/cancel")
    assert r.status_code == 200 and r.get_json()["job"]["status"] == "cancelled"
    r = client.post(f"/api/v1/jobs/{job_ids[0]}/cancel")
    assert (r.status_code, r.get_json()["error"]) == (409, "job_not_active")
    assert client.get("/api/v1/jobs?status=cancelled").get_json()["items"][0]["id"] == job_ids[0]
    assert client.get("/api/v1/jobs?status=queued").get_json()["items"].__len__() == 2

    before = len(publisher.published)
    r = client.post(f"/api/v1/jobs/{job_ids[0]}/retry")
    assert r.status_code == 201, r.get_json()
    new = r.get_json()["job"]
    assert new["id"] != job_ids[0] and new["revision"] == 2 and new["status"] == "queued"
    assert new["mode"] == "explicit" and len(publisher.published) == before + 1

    for method, path in [("get", f"/api/v1/jobs/{MISSING}"), ("post", f"/api/v1/jobs/{MISSING}/retry"),
                         ("post", f"/api/v1/jobs/{MISSING}/cancel"), ("get", f"/api/v1/tasks/{MISSING}")]:
        r = getattr(client, method)(path)
        assert (r.status_code, r.get_json()["error"]) == (404, "not_found"), path
