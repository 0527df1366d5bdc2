"""Text search after a content replace: the context written for the old bytes is history.

A replace keeps the image's context (``pending`` now: it describes the bytes it replaced) and
re-makes its lexical terms from the display name alone; nothing a search scores or shows may come
from that stale context — not a near (one edit away) match, not a highlight.
"""

from __future__ import annotations

import io

from tests.api.conftest import png_bytes, upload
from tests.api.test_images import wait_job
from tests.support.pipeline import Workers


def _replaced(client, orch, publisher, name: str) -> str:
    with Workers(orch, publisher, n=1):
        body = upload(client, png_bytes((30, 60, 90), size=(40, 40)), display_name=name).get_json()
        wait_job(client, body["job"]["id"])
    image_id = body["image"]["id"]
    image = client.get(f"/api/v1/images/{image_id}").get_json()
    assert image["context_status"] == "ready" and "still image" in image["context"]["title"]
    r = client.put(f"/api/v1/images/{image_id}/content",
                   data={"file": (io.BytesIO(png_bytes((90, 60, 30), size=(40, 40))), "n.png")},
                   content_type="multipart/form-data")
    assert r.status_code == 200, r.get_json()
    assert r.get_json()["image"]["context_status"] == "pending"  # no worker runs: the old context stays
    return image_id


def test_a_replaced_images_stale_context_gives_no_near_match(client, orch, publisher):
    image_id = _replaced(client, orch, publisher, "zebra")
    # "imaeg" is one swap from "image", a word of the old bytes' title only
    out = client.get("/api/v1/search/text", query_string={"q": "zebra imaeg", "mode": "lexical"}).get_json()
    assert [h["image"]["id"] for h in out["items"]] == [image_id]
    hit = out["items"][0]
    assert hit["matched"]["lexical"]["terms"] == ["zebra"]
    assert "near" not in hit["matched"], hit["matched"]


def test_a_replaced_images_highlight_is_not_in_its_stale_context(client, orch, publisher):
    image_id = _replaced(client, orch, publisher, "still life")
    out = client.get("/api/v1/search/text", query_string={"q": "still", "mode": "lexical"}).get_json()
    assert [h["image"]["id"] for h in out["items"]] == [image_id]
    assert out["items"][0]["highlight"] == {"field": "display_name", "text": "still life", "marks": [[0, 5]]}
