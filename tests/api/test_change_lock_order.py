"""A delete, a content replace, a context edit or a job cancel racing a worker that holds the image's task.

A worker's claim and its failure lock the task row, then the job row. A change that ends the
image's active job (delete, replace, edit, cancel) must not lock the job and then wait for the task —
PostgreSQL would break the cycle by aborting one side (a 500 to the user, or a lost failure).
Each test stops one side at the point where it holds its first lock, starts the other, waits
(polling ``pg_stat_activity``) until that one is blocked on a lock, then lets both finish: both
must succeed.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable

import pytest
from sqlalchemy import text

from app.orchestrator.store import jobs as store_jobs
from app.orchestrator.store import tasks as store_tasks
from app.stages.errors import PermanentError
from tests.api.conftest import png_bytes, upload
from tests.conftest import poll_until


def _run(action: Callable[[], object]) -> tuple[threading.Thread, list]:
    out: list = []

    def body() -> None:
        try:
            out.append(action())
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            out.append(exc)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, out


def _lock_waiters(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")).scalar_one()


def _pause(monkeypatch, module, name: str) -> tuple[threading.Event, threading.Event]:
    """Make ``module.name`` wait for ``go`` (after setting ``reached``) before it runs, once."""
    reached, go = threading.Event(), threading.Event()
    original = getattr(module, name)

    def paused(*args, **kwargs):
        if not reached.is_set():
            reached.set()
            assert go.wait(30), "never released"
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, paused)
    return reached, go


def _new_image(client) -> tuple[str, str]:
    r = upload(client, png_bytes((11, 22, 33)))
    assert r.status_code == 201, r.get_json()
    body = r.get_json()
    return body["image"]["id"], body["job"]["stages"][0]["task_id"]


def _replace(client, image_id: str):
    return client.put(f"/api/v1/images/{image_id}/content",
                      data={"file": (io.BytesIO(png_bytes((1, 2, 3))), "n.png")}, content_type="multipart/form-data")


def _cancel(client, image_id: str):
    job_id = client.get(f"/api/v1/images/{image_id}").get_json()["latest_job"]["id"]
    return client.post(f"/api/v1/jobs/{job_id}/cancel")


CHANGES = {
    "delete": (lambda client, i: client.delete(f"/api/v1/images/{i}"), 204),
    "replace": (_replace, 200),
    "edit": (lambda client, i: client.patch(f"/api/v1/images/{i}", json={"display_name": "renamed"}), 200),
    "cancel": (_cancel, None),  # None: 200, or 409 job_not_active when the failure ended the job first
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_racing_a_failing_task_of_the_image_both_succeed(app, orch, engine, monkeypatch, change):
    client = app.test_client()
    image_id, task_id = _new_image(client)
    claim = orch.claim_task(task_id, "worker-1")
    assert claim is not None
    # the worker's failure has finished its task row and now waits before the stages and the job
    reached, go = _pause(monkeypatch, store_jobs, "end_stages_of_task_txn")
    failing, failed = _run(lambda: orch.fail_task(claim, PermanentError("bad", code="invalid_image")))
    assert reached.wait(30)
    act, status = CHANGES[change]
    changing, changed = _run(lambda: act(app.test_client(), image_id))
    poll_until(lambda: _lock_waiters(engine) >= 1 or not changing.is_alive(), what="the change waits for the task")
    go.set()
    failing.join(60)
    changing.join(60)
    assert not failing.is_alive() and not changing.is_alive()
    assert not isinstance(failed[0], BaseException), failed[0]
    assert not isinstance(changed[0], BaseException), changed[0]
    assert changed[0].status_code == status or (status is None and changed[0].status_code in (200, 409)), \
        changed[0].get_json()


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_racing_the_claim_of_a_task_of_the_image_both_succeed(app, orch, engine, monkeypatch, change):
    client = app.test_client()
    image_id, task_id = _new_image(client)
    # the change holds the image (and, before the fix, its queued job) and waits before cancelling tasks
    reached, go = _pause(monkeypatch, store_tasks, "cancel_job_tasks_txn")
    act, status = CHANGES[change]
    changing, changed = _run(lambda: act(app.test_client(), image_id))
    poll_until(lambda: reached.is_set() or _lock_waiters(engine) >= 1 or not changing.is_alive(),
               what="the change holds the image")
    claiming, claimed = _run(lambda: orch.claim_task(task_id, "worker-1"))
    poll_until(lambda: _lock_waiters(engine) >= 1 or not claiming.is_alive(), what="the claim waits or is done")
    go.set()
    claiming.join(60)
    changing.join(60)
    assert not claiming.is_alive() and not changing.is_alive()
    assert not isinstance(claimed[0], BaseException), claimed[0]
    assert not isinstance(changed[0], BaseException), changed[0]
    assert changed[0].status_code == status or (status is None and changed[0].status_code in (200, 409)), \
        changed[0].get_json()


def test_a_batch_cancel_racing_a_failing_task_of_its_image_both_succeed(app, orch, engine, monkeypatch):
    """``POST /batches/{id}/cancel`` locks the image, then (now) its open tasks, then the job: the
    worker's failure locks the task and then the job. Job before task deadlocked (a 500)."""

    client = app.test_client()
    image_id = upload(client, png_bytes((9, 9, 9)), process=False).get_json()["image"]["id"]
    made = client.post("/api/v1/batches", json={"image_ids": [image_id]})
    assert made.status_code == 202, made.get_json()
    batch_id = made.get_json()["batch"]["id"]

    def task_id():
        job = client.get(f"/api/v1/images/{image_id}").get_json()["latest_job"]
        return job and client.get(f"/api/v1/jobs/{job['id']}").get_json()["stages"][0]["task_id"]

    claim = orch.claim_task(poll_until(task_id, timeout=30, what="the batch's job"), "w")
    assert claim is not None
    reached, go = _pause(monkeypatch, store_jobs, "end_stages_of_task_txn")
    failing, failed = _run(lambda: orch.fail_task(claim, PermanentError("bad", code="invalid_image")))
    assert reached.wait(30)
    cancelling, cancelled = _run(lambda: app.test_client().post(f"/api/v1/batches/{batch_id}/cancel"))
    poll_until(lambda: _lock_waiters(engine) >= 1 or not cancelling.is_alive(), timeout=30,
               what="the cancel to wait for a lock")
    go.set()
    failing.join(60)
    cancelling.join(60)
    assert not isinstance(failed[0], BaseException), failed[0]
    assert cancelled[0].status_code == 200, cancelled[0].get_json()
