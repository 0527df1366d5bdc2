"""Query-bank normalisation through the served search: stored bank vectors, read back, re-ranked."""

from __future__ import annotations

import dataclasses

import pytest

from tests.api.conftest import png_bytes, upload
from tests.api.test_images import wait_job
from tests.support.pipeline import Workers
from tests.support.textmodels import HUB_SPEC


@pytest.fixture()
def settings(settings):
    return dataclasses.replace(settings, text_provider=HUB_SPEC)


def test_the_hub_loses_its_near_tie_to_the_target(client, orch, publisher):
    ids = {}
    with Workers(orch, publisher, n=2):
        for width in (40, 41, 42):
            body = upload(client, png_bytes((200, 30, 30), size=(width, 30)), display_name=f"w{width}").get_json()
            ids[width] = body["image"]["id"]
            wait_job(client, body["job"]["id"])
    out = client.get("/api/v1/search/text", query_string={"q": "anything", "mode": "semantic"}).get_json()
    assert out["model"] == "hub-scored+hub-bank" and [m["name"] for m in out["models"]] == ["hub-scored"]
    assert out["query_bank"] == {"applied": True}
    order = [h["image"]["id"] for h in out["items"]]
    assert order[0] == ids[41], out["items"]  # by cosine alone the hub (40) would be first
    assert order.index(ids[40]) > 0
    scores = [h["score"] for h in out["items"]]
    assert scores == sorted(scores, reverse=True)
    assert out["items"][0]["score"] == pytest.approx(0.805, abs=1e-3)  # the served cosines, handed out anew
    hybrid = client.get("/api/v1/search/text", query_string={"q": "anything"}).get_json()
    assert hybrid["query_bank"] == {"applied": True} and hybrid["items"][0]["image"]["id"] == ids[41]


def test_stored_vectors_read_back_exactly_in_binary_form(client, orch, publisher, engine):
    """The query bank reads its vectors as pgvector's binary form: the same float32 values the text
    form holds, in order, for every dimension — and a malformed binary value is refused."""
    import numpy as np
    from pgvector import Vector
    from sqlalchemy import text

    from app.search import queries as Q

    with Workers(orch, publisher, n=2):
        body = upload(client, png_bytes((10, 120, 30), size=(44, 30)), display_name="w44").get_json()
        wait_job(client, body["job"]["id"])
    image_id = body["image"]["id"]
    with engine.connect() as conn:
        row = conn.execute(text("SELECT scope_id, model, dims, embedding::text AS e FROM text_embeddings"
                                " WHERE image_id = :i"), {"i": image_id}).one()
    got = Q.text_vectors(engine, row.scope_id, [image_id], model=row.model, dims=row.dims)
    want = np.asarray(Vector.from_text(row.e).to_list(), dtype=np.float32)
    assert list(got) == [image_id] and got[image_id].dtype == np.float32
    assert got[image_id].shape == (row.dims,) and np.array_equal(got[image_id], want)
    assert np.abs(want).max() > 0  # a real vector, not zeros read as zeros
    with pytest.raises(ValueError):
        Q.vector_from_binary(b"\x00\x03\x00\x00" + b"\x00" * 8)  # 3 dims declared, 2 present
