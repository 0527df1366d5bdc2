"""A model change rolled out one process at a time (docs/operations.md: "rolling is fine"): a job
planned under the old configuration and claimed by a worker on the new one (or the other way
round) is replanned under the claiming worker's configuration — never failed, never a paid call
repeated — and an image cannot flap between two configurations forever
(app/orchestrator/replan.py)."""

from __future__ import annotations

from sqlalchemy import text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.orchestrator.types import StageConfigs
from app.stages.providers import Providers
from app.worker.run import handle_hint
from tests.support.agents import CountingAgent, CountingPolicy, providers_with, rows
from tests.support.clock import FakeClock
from tests.support.pipeline import png_bytes, store_and_ingest


def _drive(orch, pub, providers, clock, rounds=30, owner="new-worker"):
    """Workers of one configuration handle every hint; sweeps of that configuration between rounds."""
    for _ in range(rounds):
        for _ in range(50):
            hints = pub.drain()
            if not hints:
                break
            for h in hints:
                handle_hint(orch, h.lane, h.task_id, owner, providers, pub)
        clock.advance(orch.settings.sweep_interval_s + orch.settings.rehint_grace_s
                      + orch.settings.search_cutover_check_s)
        pub.publish(orch.sweep().hints)


def test_an_upload_planned_before_a_rolling_visual_model_change_is_processed_under_the_new_model(
    engine, settings
):
    clock = FakeClock()
    old = settings.replace(visual_provider="deterministic")
    new = settings.replace(visual_provider="perceptual-v1")
    orch_old, orch_new = Orchestrator(engine, old, clock=clock), Orchestrator(engine, new, clock=clock)
    pub = RecordingPublisher()
    done = store_and_ingest(orch_old, "local", png_bytes(1))  # processed before the change
    pub.publish(done.hints)
    _drive(orch_old, pub, Providers(old), clock, rounds=3)
    assert orch_old.get_job("local", done.job["id"])["status"] == "succeeded"
    # the rolling restart: an upload is planned by a process still on the old model ...
    inflight = store_and_ingest(orch_old, "local", png_bytes(2))
    pub.publish(inflight.hints)
    # ... and from now on only restarted processes (new model) run workers and beat
    _drive(orch_new, pub, Providers(new), clock)
    img = orch_new.get_image("local", inflight.image["id"])
    assert img["context_status"] != "pending", img["latest_job"]
    first = orch_new.get_job("local", inflight.job["id"])
    assert first["status"] == "superseded" and first["error"]["code"] == "provider_config_mismatch"
    assert img["latest_job"]["status"] == "succeeded"
    new_model = orch_new.stage_configs.visual["model"]
    assert rows(engine, "SELECT count(*) FROM visual_embeddings WHERE image_id = :i AND model = :m",
                i=inflight.image["id"], m=new_model)[0][0] == 1
    assert rows(engine, "SELECT count(*) FROM processing_jobs WHERE status = 'failed'")[0][0] == 0


def _agent_configs(settings, version: str) -> tuple[StageConfigs, dict]:
    base = StageConfigs.from_settings(settings)
    agent = {**base.agent, "model": f"deterministic-{version}", "version": f"deterministic-{version}"}
    return StageConfigs(visual=base.visual, agent=agent, text=base.text), agent


class VersionedAgent(CountingAgent):
    """The deterministic agent under another model name (an agent model change)."""

    def __init__(self, *, results_dir: str, cfg: dict):
        super().__init__(results_dir=results_dir)
        self.cfg = cfg

    def config(self):
        return dict(self.cfg)


def test_an_agent_task_planned_under_the_old_agent_model_is_replanned_without_a_paid_call(engine, settings):
    """The mismatch is found before the call: the old attempt never called out (failed, its grant
    returned), and the replanned job's agent runs once, under the new model; visual is reused."""
    clock = FakeClock()
    old_cfg, old_agent = _agent_configs(settings, "v1")
    new_cfg, new_agent = _agent_configs(settings, "v2")
    policy = CountingPolicy()
    orch_old = Orchestrator(engine, settings, clock=clock, stage_configs=old_cfg, policy=policy)
    orch_new = Orchestrator(engine, settings, clock=clock, stage_configs=new_cfg, policy=policy)
    agent = VersionedAgent(results_dir=str(settings.agent_results_path), cfg=new_agent)
    pub = RecordingPublisher()
    res = store_and_ingest(orch_old, "local", png_bytes(3))
    pub.publish(res.hints)
    _drive(orch_new, pub, providers_with(settings, agent), clock, rounds=10)
    assert agent.calls["describe"] == 1 and agent.calls["lookup"] == 0
    img = orch_new.get_image("local", res.image["id"])
    assert img["latest_job"]["status"] == "succeeded"
    assert img["context"]["title"] and old_agent != new_agent
    jobs = rows(engine, "SELECT status, error->>'code' FROM processing_jobs ORDER BY revision")
    assert [tuple(j) for j in jobs] == [("superseded", "provider_config_mismatch"), ("succeeded", None)]
    # the old job's agent attempt: closed as failed (never called out); one grant committed, one released
    assert sorted(r[0] for r in rows(engine, "SELECT state FROM task_attempts")) == ["completed", "failed"]
    assert len(policy.acquired) == 2 and sum(policy.committed.values()) == 1
    assert sorted(r[0] for r in rows(engine, "SELECT state FROM operation_grants")) == ["committed", "released"]
    # visual ran once: the replanned job reused it
    assert rows(engine, "SELECT count(*) FROM tasks WHERE lane = 'visual' AND status = 'succeeded'")[0][0] == 1


def test_workers_on_two_configurations_cannot_make_an_image_flap_forever(engine, settings):
    """An old worker left running and a new one take turns: each replans the job to its own
    configuration, up to MAX_CONFIG_REPLANS times in a row; the next mismatch fails the job
    (provider_config_mismatch, as documented). A human retry starts the count again."""
    from app.orchestrator.replan import MAX_CONFIG_REPLANS

    clock = FakeClock()
    old = settings.replace(visual_provider="deterministic")
    new = settings.replace(visual_provider="perceptual-v1")
    sides = [(Orchestrator(engine, new, clock=clock), Providers(new)),
             (Orchestrator(engine, old, clock=clock), Providers(old))]
    pub = RecordingPublisher()
    res = store_and_ingest(sides[1][0], "local", png_bytes(4))
    pub.publish(res.hints)
    turn = 0
    for _ in range(MAX_CONFIG_REPLANS + 1):
        [hint] = pub.drain()
        orch, providers = sides[turn % 2]
        handle_hint(orch, hint.lane, hint.task_id, f"worker-{turn % 2}", providers, pub)
        turn += 1
    assert pub.drain() == []
    jobs = [tuple(j) for j in rows(engine, "SELECT status, error->>'code' FROM processing_jobs ORDER BY revision")]
    assert jobs == [("superseded", "provider_config_mismatch")] * MAX_CONFIG_REPLANS + [
        ("failed", "provider_config_mismatch")]
    assert rows(engine, "SELECT count(*) FROM visual_embeddings")[0][0] == 0  # nothing ran
    # the operator stops the stale worker and retries: the new configuration's worker processes it
    orch_new, prov_new = sides[0]
    failed_id = rows(engine, "SELECT id FROM processing_jobs WHERE status = 'failed'")[0][0]
    pub.publish(orch_new.retry_job("local", failed_id).hints)
    _drive(orch_new, pub, prov_new, clock, rounds=3)
    assert orch_new.get_image("local", res.image["id"])["latest_job"]["status"] == "succeeded"


def test_a_model_changes_fill_processes_an_image_an_older_version_failed_for_a_config_mismatch(engine, settings):
    """Rows left by versions that failed such jobs: the image has no context, its latest job
    failed with provider_config_mismatch. The fill batch of the next model change seeds it."""
    clock = FakeClock()
    old = settings.replace(visual_provider="deterministic")
    new = settings.replace(visual_provider="perceptual-v1")
    orch_old, orch_new = Orchestrator(engine, old, clock=clock), Orchestrator(engine, new, clock=clock)
    pub = RecordingPublisher()
    done = store_and_ingest(orch_old, "local", png_bytes(5))
    pub.publish(done.hints)
    _drive(orch_old, pub, Providers(old), clock, rounds=3)  # the scope's serving state: the old model
    lost = store_and_ingest(orch_old, "local", png_bytes(6))
    pub.drain()
    with engine.begin() as conn:  # as the failure path before replanning left it
        conn.execute(text("UPDATE tasks SET status = 'failed', error = CAST(:e AS jsonb) WHERE job_id = :j"),
                     {"j": lost.job["id"], "e": '{"code": "provider_config_mismatch", "message": "m"}'})
        conn.execute(text("UPDATE job_stages SET status = CASE WHEN stage = 'visual' THEN 'failed' ELSE 'cancelled'"
                          " END WHERE job_id = :j"), {"j": lost.job["id"]})
        conn.execute(text("UPDATE processing_jobs SET status = 'failed', completed_at = now(),"
                          " error = CAST(:e AS jsonb) WHERE id = :j"),
                     {"j": lost.job["id"], "e": '{"code": "provider_config_mismatch", "message": "m"}'})
    _drive(orch_new, pub, Providers(new), clock)
    img = orch_new.get_image("local", lost.image["id"])
    assert img["context_status"] != "pending" and img["latest_job"]["status"] == "succeeded"
