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


def _statements(engine, fn):
    """Run ``fn`` and count the SQL statements it sent through ``engine``."""
    from sqlalchemy import event

    seen: list[str] = []

    def count(conn, cursor, statement, *args):
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        result = fn()
    finally:
        event.remove(engine, "before_cursor_execute", count)
    return result, len(seen)


def test_batch_of_many_ids_is_set_based_deduplicated_and_bounded(client, engine, orch):
    """The snapshot costs the same statements for 20 ids or 4,000 (no query per id); duplicates
    count once; over MAX_IMAGE_IDS is a 422 before anything is written."""
    import uuid

    from sqlalchemy import text

    from app.api.schemas import MAX_IMAGE_IDS
    from app.orchestrator.batches import REQUEST_PAGE

    orch.ensure_scope("local")
    fill = text(
        "INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height, storage_key)"
        " SELECT gen_random_uuid(), 'local', md5(:salt || g::text) || md5(:salt || g::text), '.png', 'image/png',"
        " 1, 1, 1, 'k/' || :salt || g FROM generate_series(1, :n) g RETURNING id"
    )
    costs = {}
    for n in (20, 4000):
        with engine.begin() as conn:
            ids = [str(i) for i in conn.execute(fill, {"n": n, "salt": f"s{n}-"}).scalars()]
        body = {"image_ids": ids + ids[:10]}  # ten duplicates
        r, costs[n] = _statements(engine, lambda body=body: client.post("/api/v1/batches", json=body))
        assert r.status_code == 202, r.get_json()
        assert r.get_json()["batch"]["total"] == n
        with engine.connect() as conn:
            seeded = conn.execute(text("SELECT count(*) FROM batch_items WHERE batch_id = :b"),
                                  {"b": r.get_json()["batch"]["id"]}).scalar_one()
        assert seeded == REQUEST_PAGE  # a first page in the request; the sweep seeds the rest
    assert costs[4000] == costs[20], costs

    with engine.connect() as conn:
        before = conn.execute(text("SELECT count(*) FROM batches")).scalar_one()
    missing = [str(uuid.uuid4()) for _ in range(3000)]
    r, cost = _statements(engine, lambda: client.post("/api/v1/batches", json={"image_ids": missing}))
    assert (r.status_code, r.get_json()["error"]) == (404, "not_found")
    assert cost < 10, cost
    too_many = [str(uuid.uuid4()) for _ in range(MAX_IMAGE_IDS + 1)]
    r = client.post("/api/v1/batches", json={"image_ids": too_many})
    assert (r.status_code, r.get_json()["error"]) == (422, "validation_error")
    assert str(MAX_IMAGE_IDS) in r.get_json()["message"]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM batches")).scalar_one() == before
