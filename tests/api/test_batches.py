"""Batch endpoints: the HTTP contract (status codes, shapes, scope passing, validation).

The batch backend (``Orchestrator.create_batch/get_batch/cancel_batch``) is another issue; until
it lands these tests drive the endpoints through a scope-honouring stand-in with the documented
signatures, so the API side is pinned down now and the same tests run against the real one later.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from app.api import create_app
from app.auth import TokenScopeResolver
from app.orchestrator import Hint, NotFound, Orchestrator
from tests.api.conftest import png_bytes, upload


class BatchingOrchestrator(Orchestrator):
    """The real orchestrator plus batch methods with the documented contract."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches: dict[tuple[str, uuid.UUID], dict] = {}
        self.calls: list[tuple] = []

    def create_batch(self, scope_id, *, all, image_ids, reverse_image_policy):
        self.calls.append(("create", scope_id, all, list(image_ids), reverse_image_policy))
        for image_id in image_ids:
            self.get_image(scope_id, image_id)  # NotFound for foreign/missing ids
        batch = {"id": uuid.uuid4(), "status": "seeding", "total": len(image_ids), "counts": {}, "progress": 0.0,
                 "created_at": datetime.now(UTC), "completed_at": None}
        self.batches[(scope_id, batch["id"])] = batch
        return batch, [Hint(lane="visual", task_id=uuid.uuid4())]

    def get_batch(self, scope_id, batch_id):
        try:
            return self.batches[(scope_id, batch_id)]
        except KeyError:
            raise NotFound("batch not found") from None

    def cancel_batch(self, scope_id, batch_id):
        batch = self.get_batch(scope_id, batch_id)
        if batch["status"] in ("seeding", "running"):
            batch["status"] = "cancelled"
        return batch


@pytest.fixture()
def batch_client(settings, engine, publisher, store, tokens):
    orch = BatchingOrchestrator(engine, settings)
    app = create_app(scope_resolver=TokenScopeResolver(engine), settings=settings, orchestrator=orch,
                     engine=engine, publisher=publisher, store=store)
    return app.test_client(), orch


def test_batch_contract_and_scope_isolation(batch_client, tokens, publisher):
    c, orch = batch_client
    A = {"Authorization": f"Bearer {tokens['alpha']}"}
    B = {"Authorization": f"Bearer {tokens['beta']}"}
    image_id = upload(c, png_bytes(), headers=A, process=False).get_json()["image"]["id"]

    r = c.post("/api/v1/batches", json={"all": True}, headers=A)
    assert r.status_code == 202, r.get_json()
    batch = r.get_json()["batch"]
    assert batch["status"] == "seeding" and set(batch) >= {"id", "total", "counts", "progress", "created_at"}
    assert orch.calls[-1] == ("create", "alpha", True, [], "forbid")
    assert len(publisher.published) == 1  # hints published after the call returned

    r = c.post("/api/v1/batches", json={"image_ids": [image_id], "reverse_image_policy": "auto"}, headers=A)
    assert r.status_code == 202 and orch.calls[-1] == ("create", "alpha", False, [uuid.UUID(image_id)], "auto")
    r = c.post("/api/v1/batches", json={"image_ids": [image_id]}, headers=B)
    assert (r.status_code, r.get_json()["error"]) == (404, "not_found")

    assert c.get(f"/api/v1/batches/{batch['id']}", headers=A).get_json()["batch"]["id"] == batch["id"]
    for method, path in [("get", f"/api/v1/batches/{batch['id']}"), ("post", f"/api/v1/batches/{batch['id']}/cancel")]:
        r = getattr(c, method)(path, headers=B)
        assert (r.status_code, r.get_json()["error"]) == (404, "not_found"), path

    r = c.post(f"/api/v1/batches/{batch['id']}/cancel", headers=A)
    assert r.status_code == 200 and r.get_json()["batch"]["status"] == "cancelled"
    again = c.post(f"/api/v1/batches/{batch['id']}/cancel", headers=A)
    assert again.status_code == 200 and again.get_json()["batch"] == r.get_json()["batch"]


def test_batches_missing_backend_is_an_explicit_error(client):
    if hasattr(Orchestrator, "create_batch"):
        r = client.post("/api/v1/batches", json={"all": True})
        assert r.status_code == 202
    else:
        r = client.post("/api/v1/batches", json={"all": True})
        assert (r.status_code, r.get_json()["error"]) == (501, "not_implemented")
