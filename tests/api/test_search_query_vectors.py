"""A search's query vector passes the check a stored vector does (app/stages/vectors.py): a text
or visual provider that answers a query with NaN, infinity, a value past float4 or all zeros gets
422 ``query_not_embeddable``, never a 500 from pgvector or a ranking by NaN."""

from __future__ import annotations

import pytest

from app.api import create_app
from app.auth import LocalScopeResolver
from app.orchestrator import Orchestrator
from tests.api.conftest import png_bytes, upload
from tests.api.test_images import wait_job
from tests.support import poison
from tests.support.pipeline import Workers


@pytest.fixture()
def poison_app(settings, engine, publisher, store):
    poison.reset()
    settings = settings.replace(text_provider="tests.support.poison:PoisonQueryText",
                                visual_provider="tests.support.poison:PoisonVectorVisual")
    orch = Orchestrator(engine, settings)
    app = create_app(scope_resolver=LocalScopeResolver(), settings=settings, orchestrator=orch, engine=engine,
                     publisher=publisher, store=store, cursor_secret_key="test-secret")
    yield app, orch
    poison.reset()


@pytest.mark.parametrize("query", ["poison pill", "zeroword", "hugeword"])
@pytest.mark.parametrize("mode", ["hybrid", "semantic"])
def test_text_search_with_an_unusable_query_vector_is_a_422(poison_app, publisher, query, mode):
    app, orch = poison_app
    client = app.test_client()
    with Workers(orch, publisher, n=1):
        body = upload(client, png_bytes(size=(40, 40)), display_name="poison pill zeroword hugeword").get_json()
        wait_job(client, body["job"]["id"])
    r = client.get("/api/v1/search/text", query_string={"q": query, "mode": mode})
    assert r.status_code == 422, (r.status_code, r.get_data(as_text=True)[:500])
    assert r.get_json()["error"] == "query_not_embeddable"
    # the lexical signal never embeds the query: it still answers
    r = client.get("/api/v1/search/text", query_string={"q": query, "mode": "lexical"})
    assert r.status_code == 200 and [h["image"]["id"] for h in r.get_json()["items"]] == [body["image"]["id"]]
    # and a query the provider embeds well is served as before
    r = client.get("/api/v1/search/text", query_string={"q": "pill", "mode": mode})
    assert r.status_code == 200 and r.get_json()["items"]


def test_visual_search_by_a_file_the_provider_cannot_embed_is_a_422(poison_app):
    app, _ = poison_app
    client = app.test_client()
    data = png_bytes(size=(poison.POISON_WIDTH, 20))
    r = client.post("/api/v1/search/visual", data={"file": (__import__("io").BytesIO(data), "q.png")},
                    content_type="multipart/form-data")
    assert r.status_code == 422, (r.status_code, r.get_data(as_text=True)[:500])
    assert r.get_json()["error"] == "query_not_embeddable"
    # by id: an image not embedded yet is embedded on the fly, through the same check
    image = upload(client, data, process="false").get_json()["image"]
    r = client.post("/api/v1/search/visual", json={"image_id": image["id"]})
    assert r.status_code == 422, (r.status_code, r.get_data(as_text=True)[:500])
    assert r.get_json()["error"] == "query_not_embeddable"
