"""A fourth stage end to end, on PostgreSQL: the synthetic ``thumbnail`` StageSpec of
tests/unit/test_stage_registry_fourth.py, declared in-process, with what its migration would add
done in the test's own database (a ``thumbnails`` table, the stage / lane CHECK constraints
widened) and its worker compute registered. An upload then runs visual → thumbnail → agent →
text_embedding, the thumbnail row is written by the completion, and a reprocess reuses it — the
facts statement's ``thumbnail_exists`` column, built from the declaration, finds it."""

from __future__ import annotations

import dataclasses

from sqlalchemy import text

from app.db.enums import STAGE_ORDER
from app.orchestrator import Orchestrator, RecordingPublisher
from app.orchestrator import stages as registry
from app.orchestrator.store import facts, reads, tasks
from app.orchestrator.store._sql import sql
from app.stages.providers import Providers
from app.worker import executor
from app.worker.run import handle_hint
from tests.support.pipeline import png_bytes, store_and_ingest
from tests.unit.test_stage_registry_fourth import THUMBNAIL, ThumbnailArtifact, declare

STAGE_NAMES = ("visual", "thumbnail", "agent", "text_embedding")
LANE_NAMES = ("visual", "thumbnail", "agent", "embedding")

# what the stage's migration would do
MIGRATION = f"""
CREATE TABLE thumbnails (scope_id text NOT NULL, image_id uuid NOT NULL, image_sha256 text NOT NULL,
                         size int NOT NULL, task_id uuid, PRIMARY KEY (scope_id, image_id, image_sha256, size));
ALTER TABLE tasks DROP CONSTRAINT ck_tasks_stage_valid, DROP CONSTRAINT ck_tasks_lane_valid,
  ADD CONSTRAINT ck_tasks_stage_valid CHECK (stage IN {STAGE_NAMES}),
  ADD CONSTRAINT ck_tasks_lane_valid CHECK (lane IN {LANE_NAMES});
ALTER TABLE job_stages DROP CONSTRAINT ck_job_stages_stage_valid,
  ADD CONSTRAINT ck_job_stages_stage_valid CHECK (stage IN {STAGE_NAMES});
ALTER TABLE processing_jobs DROP CONSTRAINT ck_processing_jobs_current_stage_valid,
  ADD CONSTRAINT ck_processing_jobs_current_stage_valid CHECK (current_stage IS NULL OR current_stage IN {STAGE_NAMES});
ALTER TABLE lane_fairness DROP CONSTRAINT ck_lane_fairness_lane_valid,
  ADD CONSTRAINT ck_lane_fairness_lane_valid CHECK (lane IN {LANE_NAMES});
"""

# its artifact statement (store/artifacts.py would hold it)
INSERT_THUMBNAILS = sql("""
INSERT INTO thumbnails (scope_id, image_id, image_sha256, size, task_id)
SELECT scope_id, image_id, sha, size, task_id
FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(scope_id text, image_id uuid, sha text, size int, task_id uuid)
ON CONFLICT DO NOTHING
""")


def _insert_thumbnails_many_txn(conn, rows) -> None:
    if rows:
        import json

        conn.execute(INSERT_THUMBNAILS, {"rows": json.dumps(rows, default=str)})


def _render(orch, providers, claims):  # its worker compute (app/worker/executor.py would hold it)
    return [ThumbnailArtifact(b"png", int(c.payload["size"])) for c in claims]


def _drain(orch: Orchestrator, publisher: RecordingPublisher, providers: Providers) -> list[str]:
    """Run every published hint, one at a time, until none is left; the lanes in the order run."""
    lanes = []
    while (hint := publisher.take(timeout=0.01)) is not None:
        if handle_hint(orch, hint.lane, hint.task_id, "test-worker", providers, publisher):
            lanes.append(hint.lane)
    return lanes


def test_a_declared_fourth_stage_runs_writes_its_artifact_and_is_reused(engine, settings, monkeypatch):
    thumbnail = dataclasses.replace(THUMBNAIL, write_many_txn=_insert_thumbnails_many_txn)
    pipeline = (registry.VISUAL, thumbnail, registry.AGENT, registry.TEXT_EMBEDDING)
    order = tuple(s.stage for s in pipeline)
    built_case = registry.BATCH_COST_CASE  # what the claims were built with (re-pointed below)
    declare(monkeypatch, pipeline, order=(STAGE_ORDER, order),
            pos=(reads._STAGE_POS, {s.stage.value: n for n, s in enumerate(pipeline)}))
    # the statements built at import, as an import with the declaration would build them
    monkeypatch.setattr(facts, "JOB_FACTS_MANY", sql(facts.job_facts_many_sql(pipeline)))
    monkeypatch.setattr(facts, "IMAGE_ARTIFACTS_EXIST", sql(facts.image_artifacts_exist_sql(pipeline)))
    for name in ("CLAIM_GROUP", "CLAIM_FAIR_BATCH"):
        assert built_case in getattr(tasks, name).text
        statement = getattr(tasks, name).text.replace(built_case, registry.batch_cost_case(pipeline))
        monkeypatch.setattr(tasks, name, sql(statement))
    # its provider kind's config and its worker compute
    import app.stages.providers as providers_module

    configured = providers_module.provider_configs
    monkeypatch.setattr(providers_module, "provider_configs", lambda s: {**configured(s), "thumbnail": {"size": 96}})
    monkeypatch.setitem(executor.BATCH_COMPUTE, "thumbnail", _render)
    with engine.begin() as conn:
        conn.execute(text(MIGRATION))

    publisher = RecordingPublisher()
    orch = Orchestrator(engine, settings)
    providers = Providers(settings)
    res = store_and_ingest(orch, "local", png_bytes(5))
    assert [s["stage"] for s in res.job["stages"]] == list(STAGE_NAMES)
    publisher.publish(res.hints)
    assert _drain(orch, publisher, providers) == list(LANE_NAMES)
    job = orch.get_job("local", res.job["id"])
    assert job["status"] == "succeeded"
    assert {s["stage"]: s["status"] for s in job["stages"]} == dict.fromkeys(STAGE_NAMES, "succeeded")
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT image_id::text, size FROM thumbnails")).all()
        assert [tuple(r) for r in rows] == [(str(res.image["id"]), 96)]

    again = orch.request_processing("local", res.image["id"], force_stages=["agent"])
    publisher.publish(again.hints)
    _drain(orch, publisher, providers)
    job = orch.get_job("local", again.job["id"])
    assert job["status"] == "succeeded"
    assert {s["stage"]: s["status"] for s in job["stages"]}["thumbnail"] == "reused"
