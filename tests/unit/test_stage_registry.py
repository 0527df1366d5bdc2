"""The stage registry (app/orchestrator/stages.py) is complete and agrees with the vocabularies
the schema mirrors, the providers, the settings and the queues."""

from __future__ import annotations

import dataclasses

import celeryconfig
from app.config import Settings
from app.db.enums import STAGE_ORDER, Lane, Stage
from app.orchestrator import stages
from app.orchestrator.types import StageConfigs
from app.stages.providers import KINDS, Providers


def _settings(tmp_path) -> Settings:
    return Settings(visual_provider="deterministic", agent_provider="deterministic", text_provider="deterministic",
                    storage_dir=str(tmp_path))


def test_the_registry_is_the_pipeline_in_the_schema_order():
    assert tuple(s.stage for s in stages.STAGES) == STAGE_ORDER
    assert set(stages.SPECS) == {s.value for s in Stage}
    assert {s.lane for s in stages.STAGES} == set(Lane)  # one stage per lane, every lane used


def test_every_stage_names_settings_and_queues_that_exist(tmp_path):
    fields = {f.name for f in dataclasses.fields(Settings)}
    settings = _settings(tmp_path)
    for spec in stages.STAGES:
        assert spec.provider_kind in KINDS
        assert hasattr(settings, spec.batch_size_setting)
        assert spec.batch_budget_setting is None or spec.batch_budget_setting in fields
        assert spec.lane.value in celeryconfig.LANE_TASKS and spec.lane.value in celeryconfig.QUEUES
        assert (spec.batch_cost_sql is not None) == spec.batched
        assert (spec.write_many_txn is None) == (spec.artifact_rows is None)
        # a stage with its own artifact rows has a validity query over them
        assert (spec.exists_sql is None) == (spec.write_many_txn is None)
    # StageConfigs(...) takes one keyword per stage, its config_key
    assert len({s.config_key for s in stages.STAGES}) == len(stages.STAGES)


def test_each_stage_provider_implements_its_protocol(tmp_path):
    providers = Providers(_settings(tmp_path))
    configs = StageConfigs.from_settings(_settings(tmp_path))
    for spec in stages.STAGES:
        assert isinstance(providers.get(spec.provider_kind), spec.protocol)
        assert spec.config(configs) == providers.get(spec.provider_kind).config()


def test_lookups_by_stage_and_lane():
    assert stages.lane_of("text_embedding") == "embedding"
    assert stages.by_lane("agent") is stages.AGENT and stages.by_lane("webhooks") is None
    assert stages.SLOT_LANES == ("agent",)
    assert stages.BATCHED_LANES == frozenset({"visual", "embedding"})
    assert [s.stage.value for s in stages.STAGES if s.paid] == ["agent"]


def test_every_unpaid_stage_has_a_worker_compute_and_the_paid_one_the_attempt_path():
    from app.worker.executor import BATCH_COMPUTE

    assert {s.provider_kind for s in stages.STAGES if not s.paid} == set(BATCH_COMPUTE)
