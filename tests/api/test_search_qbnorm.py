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
