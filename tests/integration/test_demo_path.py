"""`memeflow demo` in reduced form: a handful of sample memes through real Celery workers with the
real default providers (perceptual-v1, local-ocr, multilingual-e5-small+all-MiniLM-L6-v2); every job succeeds, an OCR'd
caption word finds its image by text search, and the near-duplicate finds its original."""

from __future__ import annotations

import io

import pytest

from app.auth import LocalScopeResolver
from app.cli.demo import stage_progress
from app.cli.ingest import image_files, ingest_files
from app.samples import generate_samples
from tests.conftest import poll_until

pytestmark = pytest.mark.slow

SCOPE = "demo"


def test_sample_memes_are_processed_and_found_by_their_words(live_stack, tmp_path):
    from app.api import create_app

    generate_samples(tmp_path, limit=4)
    paths = image_files(tmp_path)
    assert {p.name for p in paths} >= {"friday-deploy.png", "jiayou.png", "build-passes-small.jpg"}
    app = create_app(scope_resolver=LocalScopeResolver(SCOPE), settings=live_stack.settings)
    client = app.test_client()

    def upload(path, data, policy):
        resp = client.post("/api/v1/images", content_type="multipart/form-data",
                           data={"file": (io.BytesIO(data), path.name), "display_name": path.name})
        return resp.status_code, resp.get_json()

    report = ingest_files(paths, upload)
    assert not report.failed and len(report.created) == len(paths)
    ids = list(report.image_ids.values())

    def all_terminal():
        _, jobs = stage_progress(live_stack.engine, ids)
        return jobs if sum(jobs.values()) == len(ids) and set(jobs) <= {"succeeded", "failed", "blocked",
                                                                         "unknown_execution", "cancelled"} else None

    jobs = poll_until(all_terminal, timeout=150, interval=0.3, what="every sample's job terminal")
    assert jobs == {"succeeded": len(ids)}

    def search(q: str) -> list[dict]:
        resp = client.get("/api/v1/search/text", query_string={"q": q, "limit": 3})
        assert resp.status_code == 200, resp.get_json()
        body = resp.get_json()
        assert body["coverage"] == {"ready": len(ids), "total": len(ids)}
        return body["items"]

    top = search("deploy on friday")[0]["image"]
    assert top["display_name"] == "friday-deploy.png"
    assert "FRIDAY" in top["context"]["ocr_text"].upper()  # read from the pixels by local-ocr
    top = search("加油")[0]["image"]
    assert top["display_name"] == "jiayou.png" and "加油" in top["context"]["ocr_text"]

    resp = client.post("/api/v1/search/visual", json={"image_id": report.image_ids["build-passes-small.jpg"]})
    assert resp.status_code == 200
    assert resp.get_json()["items"][0]["image"]["display_name"] == "build-passes.png"
