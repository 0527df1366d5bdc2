"""The upload's ingest transaction (app/orchestrator/changes.py ``ingest_image``): the statements
it runs, and its shortcuts — the scope's namespace and limits in one read, the first advance of a
new image's job from known facts (advance.py ``_first_advance_txn``), the answer built from the
rows it wrote — giving exactly what the generic path gives."""

from __future__ import annotations

import hashlib
import uuid

import pytest
from sqlalchemy import event, text

from app.db.enums import JobMode
from app.orchestrator import Orchestrator, changes
from app.orchestrator.advance import advance_job_txn
from app.storage import FileStore
from tests.support.pipeline import png_bytes


def _ingest(orch: Orchestrator, scope: str, data: bytes, **kwargs):
    return orch.ingest_image(
        scope, sha256=hashlib.sha256(data).hexdigest(), media_type="image/png", extension="png",
        size_bytes=len(data), width=48, height=40, files=FileStore(orch.settings.storage_path), data=data, **kwargs,
    )


def _statements(engine, fn):
    """(fn's result, the statements it ran). A listener takes SQLAlchemy's ordinary path (the
    fast path steps aside), so every statement is seen."""
    seen: list[str] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        seen.append(" ".join(statement.split()))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        return fn(), seen
    finally:
        event.remove(engine, "before_cursor_execute", capture)


def _state(engine, job_id) -> dict:
    """The job, its stages and its tasks, without ids, times and what depends on the bytes."""
    with engine.connect() as conn:
        job = conn.execute(text(
            "SELECT status, current_stage, mode, revision, metadata_hash, reverse_image_policy, force_stages,"
            " config_hash, error, retry_at, batch_id, completed_at FROM processing_jobs WHERE id = :j"),
            {"j": job_id}).mappings().one()
        stages = conn.execute(text(
            "SELECT stage, position, status, task_id IS NOT NULL AS has_task, input_fingerprint IS NOT NULL AS fp,"
            " error, retry_at, attempt_count, completed_at FROM job_stages WHERE job_id = :j ORDER BY position"),
            {"j": job_id}).mappings().all()
        tasks = conn.execute(text(
            "SELECT stage, lane, status, priority, max_attempts, resource_key, hint_members, hint_group IS NULL AS own,"
            " grant_id IS NULL AS no_grant, attempt_count, claim_generation, cancel_requested, available_at IS NOT NULL,"
            " (SELECT array_agg(k ORDER BY k) FROM jsonb_object_keys(payload) k) AS payload_keys,"
            " payload->>'stage_config_hash' AS stage_config_hash FROM tasks WHERE job_id = :j ORDER BY stage"),
            {"j": job_id}).mappings().all()
    return {"job": dict(job), "stages": [dict(s) for s in stages], "tasks": [dict(t) for t in tasks]}


def _times(engine, job_id) -> list:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "SELECT 'job', updated_at FROM processing_jobs WHERE id = :j UNION ALL"
            " SELECT stage, updated_at FROM job_stages WHERE job_id = :j UNION ALL"
            " SELECT 'task', updated_at FROM tasks WHERE job_id = :j ORDER BY 1"), {"j": job_id})]


def test_an_upload_of_new_bytes_runs_seven_statements(engine, settings):
    orch = Orchestrator(engine, settings)
    _ingest(orch, "local", png_bytes(1))  # the scope exists and has an open visual group
    res, seen = _statements(engine, lambda: _ingest(orch, "local", png_bytes(2)))
    assert res.created
    expected = [
        "SELECT s.storage_namespace",  # the scope's namespace and limit overrides
        "SELECT pg_advisory_xact_lock(",  # the storage key's lock (then the file is written)
        "INSERT INTO images",
        "WITH j AS ( INSERT INTO processing_jobs",  # the job and its stages
        "UPDATE tasks SET hint_members",  # join the open visual wake-up group
        "WITH r AS (SELECT * FROM jsonb_to_recordset",  # the visual task, linked, the job pointed at it
        "SELECT j.id, j.image_id",  # the job with its stages, for the answer
    ]
    assert len(seen) == len(expected), seen
    for statement, start in zip(seen, expected, strict=True):
        assert statement.startswith(start), (statement, start)


def test_an_upload_of_known_bytes_answers_with_the_existing_image_in_seven_statements(engine, settings):
    orch = Orchestrator(engine, settings)
    first = _ingest(orch, "local", png_bytes(3))
    again, seen = _statements(engine, lambda: _ingest(orch, "local", png_bytes(3)))
    assert not again.created
    assert again.image == orch.get_image("local", first.image["id"])
    assert again.job == orch.get_job("local", first.job["id"])
    assert again.hints == []
    assert len(seen) == 7, seen  # scope, lock, insert (no row), the row locked, its active job, the two reads


def test_a_new_scope_is_created_by_its_first_upload(engine, settings):
    orch = Orchestrator(engine, settings)
    res = _ingest(orch, "fresh-scope", png_bytes(4))
    assert res.created and res.job["status"] == "queued"
    with engine.connect() as conn:
        ns = conn.execute(text("SELECT storage_namespace FROM scopes WHERE id = 'fresh-scope'")).scalar_one()
    assert orch.ensure_scope("fresh-scope") == ns
    assert (settings.storage_path / f"{ns}/{hashlib.sha256(png_bytes(4)).hexdigest()}.png").exists()


@pytest.mark.parametrize("policy", ["forbid", "auto"])
def test_the_first_advance_from_known_facts_matches_the_generic_path(engine, settings, policy):
    orch = Orchestrator(engine, settings)
    fast = _ingest(orch, "s1", png_bytes(5), reverse_image_policy=policy)
    plain = _ingest(orch, "s2", png_bytes(6), process=False)
    generic = changes.request_processing(orch, "s2", uuid.UUID(plain.image["id"]), mode=JobMode.AUTO,
                                         reverse_image_policy=policy)
    assert fast.created and generic.created
    assert _state(engine, fast.job["id"]) == _state(engine, generic.job["id"])
    assert [h.lane for h in fast.hints] == [h.lane for h in generic.hints] == ["visual"]
    # the answer built from the transaction's own rows is what a read gives afterwards
    assert fast.image == orch.get_image("s1", fast.image["id"])
    assert fast.job == orch.get_job("s1", fast.job["id"])
    assert fast.image["latest_job"] == {"id": fast.job["id"], "status": "queued"}


def test_advancing_a_fresh_upload_again_changes_nothing(engine, settings):
    """The facts the first advance assumed are the ones the generic advance reads."""
    orch = Orchestrator(engine, settings)
    res = _ingest(orch, "local", png_bytes(7))
    before, times = _state(engine, res.job["id"]), _times(engine, res.job["id"])
    with engine.begin() as conn:
        assert advance_job_txn(orch, conn, uuid.UUID(res.job["id"])) == []
    assert _state(engine, res.job["id"]) == before
    assert _times(engine, res.job["id"]) == times


def test_an_upload_without_processing_answers_without_a_job(engine, settings):
    orch = Orchestrator(engine, settings)
    res = _ingest(orch, "local", png_bytes(8), process=False)
    assert res.created and res.job is None and res.hints == []
    assert res.image == orch.get_image("local", res.image["id"])
    assert res.image["latest_job"] is None
