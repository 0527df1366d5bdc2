"""Batch endpoints against the real batch backend: contract, progress, cancel, scope isolation."""

from __future__ import annotations

from app.orchestrator import Orchestrator
from tests.api.conftest import png_bytes, upload
from tests.conftest import poll_until
from tests.support.pipeline import Workers


def test_batch_contract_progress_and_scope_isolation(token_app, tokens, publisher, engine, settings):
    c = token_app.test_client()
    A = {"Authorization": f"Bearer {tokens['alpha']}"}
    B = {"Authorization": f"Bearer {tokens['beta']}"}
    ids = [upload(c, png_bytes((10 * i, 50, 90)), headers=A, process=False).get_json()["image"]["id"] for i in range(3)]
    upload(c, png_bytes((1, 2, 3)), headers=B, process=False)

    r = c.post("/api/v1/batches", json={"all": True}, headers=A)
    assert r.status_code == 202, r.get_json()
    batch = r.get_json()["batch"]
    assert batch["total"] == 3 and set(batch) >= {"id", "status", "counts", "progress", "created_at", "completed_at"}
    # published after commit: one visual hint, whose wake-up group the other seeded jobs' tasks joined
    assert len(publisher.published) == 1

    # B sees nothing of A's batch, and cannot name A's images
    for method, path in [("get", f"/api/v1/batches/{batch['id']}"), ("post", f"/api/v1/batches/{batch['id']}/cancel")]:
        r = getattr(c, method)(path, headers=B)
        assert (r.status_code, r.get_json()["error"]) == (404, "not_found"), path
    r = c.post("/api/v1/batches", json={"image_ids": [ids[0]]}, headers=B)
    assert (r.status_code, r.get_json()["error"]) == (404, "not_found")

    orch = Orchestrator(engine, settings)
    with Workers(orch, publisher, n=2):
        def finished():
            pub_hints = orch.sweep().hints
            publisher.publish(pub_hints)
            got = c.get(f"/api/v1/batches/{batch['id']}", headers=A).get_json()["batch"]
            return got if got["status"] == "completed" else None
        done = poll_until(finished, timeout=60, interval=0.1, what="batch completed")
    assert done["progress"] == 1.0 and done["counts"] == {"succeeded": 3}
    # cancelling a finished batch returns it unchanged
    again = c.post(f"/api/v1/batches/{batch['id']}/cancel", headers=A)
    assert again.status_code == 200 and again.get_json()["batch"]["status"] == "completed"


def test_batch_over_ids_cancel_and_validation(token_app, tokens):
    c = token_app.test_client()
    A = {"Authorization": f"Bearer {tokens['alpha']}"}
    image_id = upload(c, png_bytes((7, 7, 7)), headers=A, process=False).get_json()["image"]["id"]
    r = c.post("/api/v1/batches", json={"image_ids": [image_id], "reverse_image_policy": "auto"}, headers=A)
    assert r.status_code == 202 and r.get_json()["batch"]["total"] == 1
    r = c.post(f"/api/v1/batches/{r.get_json()['batch']['id']}/cancel", headers=A)
    assert r.status_code == 200 and r.get_json()["batch"]["status"] == "cancelled"
    for body in ({"all": True, "scope_id": "beta"}, {"image_ids": ["nope"]}, {"all": "maybe"}, {},
                 {"all": True, "reverse_image_policy": "sometimes"}):
        r = c.post("/api/v1/batches", json=body, headers=A)
        assert r.status_code == 422, (body, r.get_json())
