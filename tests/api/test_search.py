"""Text and visual search over current embeddings only, scope-filtered, using the HNSW index."""

from __future__ import annotations

import io

from sqlalchemy import text

from app.db.engine import ensure_vector_index
from tests.api.conftest import png_bytes, upload
from tests.api.test_images import wait_job
from tests.support.pipeline import Workers


def _process_three(client, orch, publisher):
    ids = []
    with Workers(orch, publisher, n=2):
        for i, color in enumerate([(250, 10, 10), (245, 15, 12), (10, 10, 250)]):
            body = upload(client, png_bytes(color, size=(40, 40)), display_name=f"img{i}").get_json()
            ids.append(body["image"]["id"])
            wait_job(client, body["job"]["id"])
    return ids


def test_text_search_current_only(client, orch, publisher):
    ids = _process_three(client, orch, publisher)
    r = client.get("/api/v1/search/text", query_string={"q": "img1", "limit": 10})
    assert r.status_code == 200, r.get_json()
    out = r.get_json()
    assert out["model"] == "deterministic-text-v1"
    assert out["coverage"] == {"ready": 3, "total": 3}
    assert sorted(h["image"]["id"] for h in out["items"]) == sorted(ids)
    scores = [h["score"] for h in out["items"]]
    assert scores == sorted(scores, reverse=True)
    assert client.get("/api/v1/search/text", query_string={"q": "x", "limit": 1}).get_json()["items"].__len__() == 1

    # edit the context without running the text stage: the old embedding is history, not current
    r = client.patch(f"/api/v1/images/{ids[0]}", json={"context": {"title": "changed"}})
    assert r.status_code == 200
    out = client.get("/api/v1/search/text", query_string={"q": "img0", "mode": "semantic"}).get_json()
    assert out["coverage"] == {"ready": 2, "total": 3}
    assert ids[0] not in {h["image"]["id"] for h in out["items"]}
    # the exact scan counts the coverage along (semantic, hybrid); lexical mode counts it apart:
    # the same figures, and nothing of that count leaks into an image
    for mode in ("hybrid", "semantic", "lexical"):
        got = client.get("/api/v1/search/text", query_string={"q": "img1", "mode": mode}).get_json()
        assert got["coverage"] == {"ready": 2, "total": 3}, mode
        assert got["items"] and all(set(h["image"]).isdisjoint({"current_text", "current_total", "cosine"})
                                    for h in got["items"]), mode
    # …while its lexical terms are the edited text's, written with it
    out = client.get("/api/v1/search/text", query_string={"q": "changed", "mode": "lexical"}).get_json()
    assert [h["image"]["id"] for h in out["items"]] == [ids[0]]
    assert out["items"][0]["matched"]["lexical"]["terms"] == ["chang"]
    assert out["items"][0]["highlight"] == {"field": "title", "text": "changed", "marks": [[0, 7]]}


def test_visual_search_by_id_and_file(client, orch, publisher):
    ids = _process_three(client, orch, publisher)
    r = client.post("/api/v1/search/visual", json={"image_id": ids[0], "limit": 5})
    assert r.status_code == 200, r.get_json()
    hits = r.get_json()["items"]
    assert ids[0] not in {h["image"]["id"] for h in hits}  # excludes itself
    assert {h["image"]["id"] for h in hits} == {ids[1], ids[2]}
    r = client.post(
        "/api/v1/search/visual",
        data={"file": (io.BytesIO(png_bytes((250, 10, 10), size=(40, 40))), "q.png"), "limit": "2"},
        content_type="multipart/form-data",
    )
    assert r.status_code == 200, r.get_json()
    hits = r.get_json()["items"]
    assert len(hits) == 2 and hits[0]["image"]["id"] == ids[0] and hits[0]["score"] > 0.99
    missing = client.post("/api/v1/search/visual", json={"image_id": "00000000-0000-4000-8000-000000000000"})
    assert (missing.status_code, missing.get_json()["error"]) == (404, "not_found")
    bad = client.post("/api/v1/search/visual", data={"file": (io.BytesIO(b"text"), "q.png")},
                      content_type="multipart/form-data")
    assert (bad.status_code, bad.get_json()["error"]) == (415, "unsupported_media_type")
    nofile = client.post("/api/v1/search/visual", data={"limit": "3"}, content_type="multipart/form-data")
    assert (nofile.status_code, nofile.get_json()["error"]) == (400, "missing_file")
    other = client.post("/api/v1/search/visual", data="x", content_type="text/plain")
    assert (other.status_code, other.get_json()["error"]) == (415, "unsupported_media_type")


def test_visual_search_before_embedding_embeds_on_the_fly(client):
    a = upload(client, png_bytes((1, 1, 1))).get_json()["image"]["id"]
    r = client.post("/api/v1/search/visual", json={"image_id": a})
    assert r.status_code == 200 and r.get_json()["items"] == []
    assert r.get_json()["coverage"] == {"ready": 0, "total": 1}


def test_search_query_uses_the_hnsw_expression_index(engine):
    from app.search.queries import candidates

    with engine.begin() as conn:
        ensure_vector_index(conn, "text_embeddings", "m", 3)
    assert candidates(engine, "local", model="m", dims=3, vector=[1, 0, 0], terms=[], k=5) == []
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        plan = "\n".join(r[0] for r in conn.execute(text(
            "EXPLAIN SELECT id FROM text_embeddings t WHERE t.scope_id = 'local' AND t.model = 'm' AND t.dims = 3 "
            "ORDER BY t.embedding::vector(3) <=> CAST('[1,0,0]' AS vector(3)) LIMIT 5"
        )))
    assert "ix_text_embeddings_hnsw_m_3" in plan, plan


def test_visual_search_reranks_the_nearest_by_the_stored_originals_pixels(client, orch, publisher):
    from bench.search_data import BY_ID, encode, render, render_twin

    ids = {}
    with Workers(orch, publisher, n=2):
        for meme_id in ("en-040", "en-052", "zh-008", "zh-023"):
            body = upload(client, encode(BY_ID[meme_id]), display_name=f"{meme_id}.png").get_json()
            ids[meme_id] = body["image"]["id"]
            wait_job(client, body["job"]["id"])
    for meme_id in ("en-040", "zh-023"):  # a resized, cropped, JPEG-compressed look-alike of each
        twin = render_twin(BY_ID[meme_id], render(BY_ID[meme_id]))
        r = client.post("/api/v1/search/visual", data={"file": (io.BytesIO(twin), "twin.jpg"), "limit": "2"},
                        content_type="multipart/form-data")
        assert r.status_code == 200, r.get_json()
        hits = r.get_json()["items"]
        assert len(hits) == 2 and hits[0]["image"]["id"] == ids[meme_id]
        assert hits[0]["pixels"] > 0.9 and hits[0]["lookalike"] > hits[1]["lookalike"]
        assert -1.0 <= hits[0]["score"] <= 1.0  # the descriptor's cosine, as before
    # by id: the stored original is the query; it is excluded, the others are re-ranked
    hits = client.post("/api/v1/search/visual", json={"image_id": ids["en-040"]}).get_json()["items"]
    assert ids["en-040"] not in {h["image"]["id"] for h in hits} and len(hits) == 3
    assert all("pixels" in h for h in hits)
    looks = [h["lookalike"] for h in hits]
    assert looks == sorted(looks, reverse=True)
