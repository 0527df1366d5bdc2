"""A fourth stage is one declaration: a synthetic ``thumbnail`` StageSpec, declared here in-process
(between visual and agent), is picked up by everything derived from the stage registry — configs,
the planner's facts and order, the facts statements, payloads and task values, batching, the
batched claims' cost, the artifact write and the worker's dispatch — with no other edit
(docs/architecture.md "Adding a stage"). No table exists for it, so its SQL is checked as text;
tests/db/test_stage_registry_fourth.py runs it end to end with its table created in the test's
database. Queue and Celery task names follow ``app.db.enums.Lane`` (the migration's vocabulary,
which test_stage_registry.py checks against the registry), so they are not re-derived here."""

from __future__ import annotations

import dataclasses
import sys
import uuid
from enum import StrEnum
from types import SimpleNamespace
from typing import Any

import pytest

from app.config import Settings
from app.orchestrator import advance, lanes, stages
from app.orchestrator import fingerprints as fp
from app.orchestrator.planner import Action, ImageFacts, JobFacts, plan
from app.orchestrator.store import facts as store_facts
from app.orchestrator.types import Claim, StageConfigs
from app.worker import executor, run


class Synthetic(StrEnum):  # stands for Stage.THUMBNAIL / Lane.THUMBNAIL, which its migration would add
    THUMBNAIL = "thumbnail"


@dataclasses.dataclass(frozen=True)
class ThumbnailArtifact:
    png: bytes
    size: int


WRITTEN: list[list[dict[str, Any]]] = []

THUMBNAIL = stages.StageSpec(
    stage=Synthetic.THUMBNAIL, lane=Synthetic.THUMBNAIL, provider_kind="thumbnail", protocol=object,
    config_key="thumbnail",
    fingerprint=lambda image, job: fp.sha256_hex({"stage": "thumbnail", "image_sha256": image.sha256,
                                                  **job.configs["thumbnail"]}),
    valid=lambda image, job: image.exists["thumbnail"],
    payload=lambda job, image, configs: {"size": configs["thumbnail"]["size"]},
    resource_key=lambda configs: "",
    artifact=ThumbnailArtifact, artifact_table="thumbnails",
    exists_sql=("EXISTS (SELECT 1 FROM thumbnails th WHERE th.scope_id = {scope} AND th.image_id = {image}"
                " AND th.image_sha256 = {sha} AND th.size = ({config}->>'size')::int)"),
    artifact_rows=lambda c, a: [{"scope_id": c.scope_id, "image_id": c.image_id, "sha": c.image_sha256,
                                 "size": a.size, "task_id": c.task_id}],
    write_many_txn=lambda conn, rows: WRITTEN.append(rows),
    vector_index=False, serving_kind=None,
    batch_size_setting="visual_batch_size", batch_budget_setting="visual_batch_max_pixels",
    batch_cost_sql="i.width::bigint * i.height",
    paid=False, slots=False,
)
PIPELINE = (stages.VISUAL, THUMBNAIL, stages.AGENT, stages.TEXT_EMBEDDING)


def _derived(pipeline: tuple[stages.StageSpec, ...]) -> dict[str, Any]:
    """What app/orchestrator/stages.py derives from STAGES at import, for ``pipeline``."""
    return {
        "STAGES": pipeline,
        "SPECS": {s.stage.value: s for s in pipeline},
        "_BY_LANE": {s.lane.value: s for s in pipeline},
        "BY_CONFIG_KEY": {s.config_key: s for s in pipeline},
        "EXISTS_STAGES": tuple(s for s in pipeline if s.exists_sql is not None),
        "SLOT_LANES": tuple(s.lane.value for s in pipeline if s.slots),
        "BATCHED_LANES": frozenset(s.lane.value for s in pipeline if s.batched),
        "BATCH_COST_CASE": stages.batch_cost_case(pipeline),
    }


def declare(monkeypatch, pipeline: tuple[stages.StageSpec, ...], **more: tuple[Any, Any]) -> None:
    """The registry as if ``pipeline`` were declared in stages.py: its derived names, and every
    module-level name in app/ bound to one of them (``from app.orchestrator.stages import STAGES``
    …), re-pointed; ``more``: other (old, new) objects to re-point the same way."""
    assert _derived(stages.STAGES).keys() <= vars(stages).keys()
    new = _derived(pipeline)
    swaps = [(getattr(stages, name), new[name]) for name in new] + list(more.values())
    for module in [m for name, m in sys.modules.items() if name == "app" or name.startswith("app.")]:
        for attr, value in list(vars(module).items()):
            for before, after in swaps:
                if value is before:
                    monkeypatch.setattr(module, attr, after)


@pytest.fixture
def four_stages(monkeypatch):
    declare(monkeypatch, PIPELINE)
    WRITTEN.clear()


CONFIGS = dict(visual={"model": "v", "preprocess_version": "p1", "dims": 8}, thumbnail={"size": 128},
               agent={"provider": "a", "model": "m"}, text={"model": "t", "dims": 4, "document_version": "1"})
SHA = "a" * 64


def _facts(**exists: bool) -> ImageFacts:
    return ImageFacts(sha256=SHA, context_status="pending", provenance=None, metadata_hash=None,
                      exists={"visual": False, "thumbnail": False, "text_embedding": False, **exists})


def test_the_registry_lookups_follow_the_declaration(four_stages):
    assert [s.stage.value for s in stages.STAGES] == ["visual", "thumbnail", "agent", "text_embedding"]
    assert stages.spec("thumbnail") is THUMBNAIL and stages.by_lane("thumbnail") is THUMBNAIL
    assert stages.lane_of("thumbnail") == "thumbnail"
    assert advance.BATCHED_LANES == frozenset({"visual", "thumbnail", "embedding"})
    assert lanes.LIMITED_LANES == ("agent",)
    assert THUMBNAIL.exists_column == "thumbnail_exists"


def test_configs_carry_one_config_per_declared_stage(four_stages, monkeypatch):
    configs = StageConfigs(**CONFIGS)
    assert configs["thumbnail"] == configs.thumbnail == {"size": 128}
    assert list(configs.as_dict()) == ["visual", "thumbnail", "agent", "text_embedding"]
    assert StageConfigs.from_job_config(configs.as_dict()) == configs
    assert THUMBNAIL.config(configs) == {"size": 128}
    with pytest.raises(TypeError):  # a job's configs lack no stage
        StageConfigs(**{k: v for k, v in CONFIGS.items() if k != "thumbnail"})
    # the configured providers' configs, by kind (its provider registered as kind "thumbnail")
    import app.stages.providers as providers_module

    by_kind = {"visual": CONFIGS["visual"], "agent": CONFIGS["agent"], "text": CONFIGS["text"],
               "thumbnail": {"size": 64}}
    monkeypatch.setattr(providers_module, "provider_configs", lambda settings: by_kind)
    assert StageConfigs.from_settings(None)["thumbnail"] == {"size": 64}


def test_the_planner_walks_the_declared_order(four_stages):
    job = JobFacts(SHA, StageConfigs(**CONFIGS), "forbid")
    p = plan(_facts(visual=True), job)
    assert list(p.actions) == ["visual", "thumbnail", "agent", "text_embedding"]
    assert p.run_stage == "thumbnail" and p.actions["agent"] is Action.WAIT
    assert p.fingerprints["thumbnail"] == THUMBNAIL.fingerprint(_facts(), job)
    assert plan(_facts(visual=True, thumbnail=True), job).run_stage == "agent"
    forced = JobFacts(SHA, StageConfigs(**CONFIGS), "forbid", force_stages=frozenset({"thumbnail"}))
    assert plan(_facts(visual=True, thumbnail=True), forced).run_stage == "thumbnail"


def test_the_facts_statements_get_its_column(four_stages):
    many = store_facts.job_facts_many_sql(PIPELINE)
    assert ("EXISTS (SELECT 1 FROM thumbnails th WHERE th.scope_id = j.scope_id AND th.image_id = j.image_id"
            " AND th.image_sha256 = r.sha AND th.size = (j.config->'thumbnail'->>'size')::int) AS thumbnail_exists"
            ) in many
    one = store_facts.image_artifacts_exist_sql(PIPELINE)
    assert "th.size = (CAST(:config_thumbnail AS jsonb)->>'size')::int) AS thumbnail_exists" in one
    # and the planner's facts are read from that column
    row = {"visual_exists": True, "thumbnail_exists": False, "text_embedding_exists": False}
    assert advance._exists(row) == {"visual": True, "thumbnail": False, "text_embedding": False}


def test_task_values_and_payload_follow_the_declaration(four_stages):
    configs = StageConfigs(**CONFIGS)
    job = {"id": uuid.uuid4(), "scope_id": "s", "reverse_image_policy": "forbid"}
    image = {"id": uuid.uuid4(), "sha256": SHA, "metadata_hash": None}
    orch = SimpleNamespace(settings=SimpleNamespace(max_attempts=3), job_priority=lambda job: 0)
    values = advance._task_values(orch, advance._NewTask(job, image, configs, "thumbnail", "f" * 64, {}), None)
    assert values["lane"] == "thumbnail" and values["stage"] == "thumbnail" and values["resource_key"] == ""
    assert values["payload"]["stage_config_hash"] == fp.config_hash({"size": 128})
    assert values["payload"]["size"] == 128
    assert values["dedupe_key"] == fp.dedupe_key(image["id"], "thumbnail", "f" * 64)


def test_batching_follows_the_declaration(four_stages, tmp_path):
    settings = Settings(storage_dir=str(tmp_path), visual_batch_size=16)
    assert lanes.lane_batch_size(settings, "thumbnail") == 16
    assert lanes.lane_batch_budget(settings, "thumbnail") == settings.visual_batch_max_pixels
    assert lanes.wake_group_size(settings, "thumbnail") == 14  # the fair fill's reserve, as any batched lane
    case = stages.batch_cost_case(PIPELINE)
    assert "WHEN t.lane = 'thumbnail' THEN i.width::bigint * i.height" in case
    assert case.startswith("CASE WHEN t.lane = 'visual'") and case.endswith(" END")


def test_completion_writes_its_artifact_rows(four_stages):
    claim = Claim(uuid.uuid4(), "s", uuid.uuid4(), uuid.uuid4(), SHA, "thumbnail", "thumbnail", "w", 1, 1, 3,
                  {}, "k")
    stages.write_artifacts_txn(None, [(claim, ThumbnailArtifact(b"png", 128))])
    thumbs = [rows for rows in WRITTEN if rows]
    assert thumbs == [[{"scope_id": "s", "image_id": claim.image_id, "sha": SHA, "size": 128,
                        "task_id": claim.task_id}]]


def test_the_worker_dispatches_its_lane_by_provider_kind(four_stages, monkeypatch):
    computed = []
    monkeypatch.setitem(executor.BATCH_COMPUTE, "thumbnail",
                        lambda orch, providers, claims: computed.extend(claims) or ["artifact"] * len(claims))
    assert run._compute_batch(None, "thumbnail", ["c1"], None) == ["artifact"] and computed == ["c1"]
    with pytest.raises(ValueError):
        run._compute_batch(None, "agent", ["c1"], None)
