"""Claims and fencing (SPEC §2.1, §2.2, §4.4) with real parallel workers and an injected clock."""

from __future__ import annotations

import threading
import uuid

import pytest
from sqlalchemy import text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.errors import StageError
from app.stages.providers import Providers
from app.worker import executor
from tests.support.clock import FakeClock
from tests.support.pipeline import png_bytes, store_and_ingest, visual_task


def _scalar(engine, sql, **params):
    with engine.connect() as c:
        return c.execute(text(sql), params).scalar()


def test_16_workers_race_for_one_claim_exactly_one_wins(engine, settings):
    orch = Orchestrator(engine, settings)
    res = store_and_ingest(orch, "local", png_bytes(3))
    (hint,) = res.hints
    barrier = threading.Barrier(16)
    wins: list = []

    def racer(i: int) -> None:
        barrier.wait()
        claim = orch.claim_task(hint.task_id, f"w{i}")
        if claim is not None:
            wins.append(claim)

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert wins[0].generation == 1
    # replaying the winning hint (a duplicate broker delivery) claims nothing and changes nothing
    assert orch.claim_task(hint.task_id, "late") is None
    assert _scalar(engine, "SELECT claim_generation FROM tasks WHERE id = :t", t=hint.task_id) == 1
    assert _scalar(engine, "SELECT lease_owner FROM tasks WHERE id = :t", t=hint.task_id) == wins[0].owner


def test_unknown_or_finished_task_hint_is_dropped(engine, settings):
    orch = Orchestrator(engine, settings)
    assert orch.claim_task(uuid.uuid4(), "w") is None
    res = store_and_ingest(orch, "local", png_bytes(4))
    claim = orch.claim_task(visual_task(res).task_id, "w")
    orch.complete_task(claim, executor.execute_visual(settings, Providers(settings), claim))
    gen = _scalar(engine, "SELECT claim_generation FROM tasks WHERE id = :t", t=claim.task_id)
    assert orch.claim_task(claim.task_id, "w2") is None  # finished: a late duplicate changes nothing
    assert _scalar(engine, "SELECT claim_generation FROM tasks WHERE id = :t", t=claim.task_id) == gen


def test_expired_lease_old_generation_is_fenced_out_everywhere(engine, settings):
    clock = FakeClock()
    orch = Orchestrator(engine, settings, clock=clock)
    providers = Providers(settings)
    res = store_and_ingest(orch, "local", png_bytes(5))
    (hint,) = res.hints
    old = orch.claim_task(hint.task_id, "old-worker")
    assert old is not None
    artifact = executor.execute_visual(settings, providers, old)
    # the old worker stalls past its lease; a new claim bumps the generation
    assert orch.claim_task(hint.task_id, "new-worker") is None  # lease still valid: not claimable
    clock.advance(settings.lease_s + 1)
    new = orch.claim_task(hint.task_id, "new-worker")
    assert new is not None and new.generation == old.generation + 1
    before = _scalar(engine, "SELECT count(*) FROM ops_counters WHERE name = 'fencing_rejection'")
    assert orch.heartbeat(old) is False
    assert orch.complete_task(old, artifact) == []
    assert orch.fail_task(old, executor.PermanentError("x", code="boom")) == []
    assert _scalar(engine, "SELECT count(*) FROM visual_embeddings") == 0
    assert _scalar(engine, "SELECT status FROM job_stages WHERE task_id = :t", t=hint.task_id) == "running"
    assert _scalar(engine, "SELECT current_stage FROM processing_jobs WHERE id = :j", j=old.job_id) == "visual"
    assert _scalar(engine, "SELECT coalesce(sum(count), 0) FROM ops_counters WHERE name = 'fencing_rejection'") >= 3
    assert before == 0
    # the new owner can do all of it
    assert orch.heartbeat(new) is True
    hints = orch.complete_task(new, artifact)
    assert [h.lane for h in hints] == ["agent"]
    assert _scalar(engine, "SELECT count(*) FROM visual_embeddings") == 1
    assert _scalar(engine, "SELECT current_stage FROM processing_jobs WHERE id = :j", j=new.job_id) == "agent"


def test_content_replaced_mid_run_writes_no_artifact_and_new_version_proceeds(engine, settings):
    orch = Orchestrator(engine, settings)
    providers = Providers(settings)
    pub = RecordingPublisher()
    res = store_and_ingest(orch, "local", png_bytes(7))
    claim = orch.claim_task(visual_task(res).task_id, "w1")
    artifact = executor.execute_visual(settings, providers, claim)
    # the user replaces the content while the visual task runs
    new_bytes = png_bytes(8)
    import hashlib

    sha = hashlib.sha256(new_bytes).hexdigest()
    ns = orch.ensure_scope("local")
    (settings.storage_path / f"{ns}/{sha}.png").write_bytes(new_bytes)
    replaced = orch.replace_content(
        "local", res.image["id"], sha256=sha, media_type="image/png", extension=".png", size_bytes=len(new_bytes),
        width=48, height=40, storage_key=f"{ns}/{sha}.png",
    )
    pub.publish(replaced.hints)
    assert orch.get_job("local", res.job["id"])["status"] == "target_changed"
    assert replaced.job["id"] != res.job["id"] and replaced.job["status"] == "queued"
    # the old execution finishes: fencing passes (cancel only requested) but the target check fails
    assert orch.complete_task(claim, artifact) == []
    assert _scalar(engine, "SELECT count(*) FROM visual_embeddings") == 0
    assert _scalar(engine, "SELECT status FROM tasks WHERE id = :t", t=claim.task_id) == "cancelled"
    # the new version's job runs through
    from tests.conftest import poll_until
    from tests.support.pipeline import Workers

    with Workers(orch, pub, n=2):
        poll_until(lambda: orch.get_job("local", replaced.job["id"])["status"] == "succeeded", timeout=30)
    assert _scalar(engine, "SELECT image_sha256 FROM visual_embeddings") == sha
    assert orch.get_job("local", res.job["id"])["status"] == "target_changed"


def test_a_file_missing_while_a_replace_is_reverted_is_retried_not_failed(engine, settings):
    """A → B removes A's file while a worker holds A's visual task; B → A (a quick revert) stores
    it again and links the new job's stage to that same running task. The worker's read that
    found no file is retried under a fresh claim, which reads the file back: the job runs on."""
    import hashlib

    from app.storage import FileStore, storage_key
    from app.worker.run import run_task

    clock = FakeClock()
    orch = Orchestrator(engine, settings, clock=clock)
    files = FileStore(settings.storage_path)
    ns = orch.ensure_scope("local")

    def put(data: bytes):
        sha = hashlib.sha256(data).hexdigest()
        return orch.replace_content("local", res.image["id"], sha256=sha, media_type="image/png", extension=".png",
                                    size_bytes=len(data), width=48, height=40,
                                    storage_key=storage_key(ns, sha, ".png"), files=files, data=data)

    res = store_and_ingest(orch, "local", png_bytes(31))
    claim = orch.claim_task(visual_task(res).task_id, "w1")
    put(png_bytes(32))  # A → B: A's file goes
    with pytest.raises(StageError) as missing:
        executor.load_image(settings, claim)  # the worker reads A's file now
    reverted = put(png_bytes(31))  # B → A: A's file is back, the new job waits on the running task
    assert reverted.job["stages"][0]["task_id"] == str(claim.task_id)
    orch.fail_task(claim, missing.value)
    assert orch.get_job("local", reverted.job["id"])["status"] != "failed"
    assert _scalar(engine, "SELECT status FROM tasks WHERE id = :t", t=claim.task_id) == "queued"
    clock.advance(3600)
    assert run_task(orch, claim.task_id, "w2", Providers(settings), RecordingPublisher()) == "succeeded"
    assert orch.get_job("local", reverted.job["id"])["stages"][0]["status"] == "succeeded"

def test_text_completion_from_old_metadata_hash_writes_nothing(engine, settings):
    orch = Orchestrator(engine, settings)
    providers = Providers(settings)
    res = store_and_ingest(orch, "local", png_bytes(9))
    hints = res.hints
    for _ in range(2):  # visual, agent
        claim = orch.claim_task(hints[0].task_id, "w")
        art = (executor.execute_visual if claim.lane == "visual" else executor.execute_agent)(settings, providers, claim)
        hints = orch.complete_task(claim, art)
    text_claim = orch.claim_task(hints[0].task_id, "w")
    assert text_claim.lane == "embedding"
    [art] = executor.execute_text_batch(orch, settings, providers, [text_claim])
    edited = orch.edit_context("local", res.image["id"], context={"title": "a human title"})
    assert orch.complete_task(text_claim, art) == []
    assert _scalar(engine, "SELECT count(*) FROM text_embeddings") == 0
    assert orch.get_job("local", res.job["id"])["status"] == "superseded"
    new_job = orch.get_job("local", edited.job["id"])
    stages = {s["stage"]: s["status"] for s in new_job["stages"]}
    assert stages == {"visual": "reused", "agent": "reused", "text_embedding": "queued"}


def test_a_hint_on_the_wrong_lane_queue_claims_nothing(engine, settings):
    orch = Orchestrator(engine, settings)
    res = store_and_ingest(orch, "local", png_bytes(31))
    (hint,) = res.hints
    assert hint.lane == "visual"
    assert orch.claim_task(hint.task_id, "agent-worker", lane="agent") is None
    assert orch.claim_with_batch(hint.task_id, "embedding", 4, "embedding-worker").claims == []
    assert _scalar(engine, "SELECT claim_generation FROM tasks WHERE id = :t", t=hint.task_id) == 0
    claim = orch.claim_task(hint.task_id, "visual-worker", lane="visual")
    assert claim is not None and claim.generation == 1
