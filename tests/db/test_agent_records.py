"""The local agents' per-attempt result records (issue 17): written under the scope's storage
namespace, discarded once their attempt's completion committed, kept while the attempt is in
flight (it may still be adopted), and pruned by ``memeflow gc`` when left behind."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from click.testing import CliRunner

from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.agent import records
from app.stages.base import AgentResult
from app.worker.run import handle_hint
from tests.support.agents import CountingAgent, providers_with, rows, step
from tests.support.pipeline import png_bytes, store_and_ingest


class SpyAgent(CountingAgent):
    """Notes which records exist right after each paid call (before the completion commits)."""

    def __init__(self, *, results_dir: str, **kw):
        super().__init__(results_dir=results_dir, **kw)
        self.root = Path(results_dir)
        self.seen: list[list[Path]] = []

    def describe(self, image, *, attempt_id, reverse_image_policy):
        result = super().describe(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)
        self.seen.append(sorted(p.relative_to(self.root) for p in self.root.rglob("*.json")))
        return result


def _records(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*.json")) if root.exists() else []


def _to_agent_hint(orch, providers, pub, scope: str, seed: int):
    pub.publish(store_and_ingest(orch, scope, png_bytes(seed)).hints)
    hint = step(orch, providers, pub, stop_lane="agent")
    assert hint is not None
    return hint


def test_a_record_lives_under_its_scopes_namespace_until_the_attempt_commits(engine, settings):
    orch = Orchestrator(engine, settings)
    root = settings.agent_results_path
    agent = SpyAgent(results_dir=str(root))
    providers, pub = providers_with(settings, agent), RecordingPublisher()
    namespace = str(orch.ensure_scope("tenant-r"))
    hint = _to_agent_hint(orch, providers, pub, "tenant-r", 700)
    assert handle_hint(orch, "agent", hint.task_id, "w1", providers, pub) == 1
    [attempt_id] = [r[0] for r in rows(engine, "SELECT attempt_id FROM task_attempts WHERE state = 'completed'")]
    assert agent.seen == [[Path(namespace) / f"{attempt_id}.json"]]  # written under the scope's namespace
    assert _records(root) == []  # and discarded once the completion committed


def test_a_record_of_an_attempt_in_flight_stays_and_gc_prunes_the_settled_ones(engine, settings):
    orch = Orchestrator(engine, settings)
    root = settings.agent_results_path
    agent = CountingAgent(results_dir=str(root))
    providers, pub = providers_with(settings, agent), RecordingPublisher()
    hint = _to_agent_hint(orch, providers, pub, "tenant-s", 710)
    claim = orch.claim_task(hint.task_id, "doomed-worker")  # a worker that dies after its paid call
    namespace = records.namespace_of(claim.storage_key)
    with records.in_namespace(namespace):
        agent.describe(_decoded(settings, claim), attempt_id=claim.attempt_id,
                       reverse_image_policy="forbid")
    settled = records.ResultRecords(root)
    with records.in_namespace(namespace):  # the record of an attempt long committed, never discarded
        settled.write("ab" * 16, AgentResult(context={}, model="m", request_id="r"))
    settled.write("cd" * 16, AgentResult(context={}, model="m", request_id="r"))  # an older version's, at the root
    assert len(_records(root)) == 3
    assert records.prune(root, orch.open_attempt_ids, min_age_s=3600) == []  # all too young
    from app.cli import main
    from app.config import reset_settings

    reset_settings(dataclasses.replace(settings))
    try:
        result = CliRunner().invoke(main, ["gc", "--min-age", "0"])
    finally:
        reset_settings(None)
    assert result.exit_code == 0, result.output
    assert "removed 2 agent result records" in result.output
    assert _records(root) == [Path(namespace) / f"{claim.attempt_id}.json"]  # in flight: still adoptable


def _decoded(settings, claim):
    from app.worker.executor import load_image

    return load_image(settings, claim)


def test_a_batch_whose_worker_died_after_its_grouped_records_is_adopted_whole(engine, settings):
    """An agent batch's concurrent calls share one record file (group commit); the worker dies
    before the completion commits; after the lease, every attempt is adopted from its record by
    lookup — one paid call per task in all — and the records are discarded once committed."""
    from datetime import datetime, timezone

    from app.worker import run
    from tests.support.agents import Clock

    settings = dataclasses.replace(settings, agent_batch_size=4, agent_lane_limit=8)
    clock = Clock(datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc))
    orch = Orchestrator(engine, settings, clock=clock)
    root = settings.agent_results_path
    agent = CountingAgent(results_dir=str(root))
    providers, pub = providers_with(settings, agent), RecordingPublisher()
    for seed in range(720, 724):
        pub.publish(store_and_ingest(orch, "tenant-g", png_bytes(seed)).hints)
    hint = step(orch, providers, pub, stop_lane="agent")
    assert hint is not None
    claims = orch.claim_agent_batch(hint.task_id, 4, "doomed-worker")
    assert len(claims) == 4 and not any(c.recovering for c in claims)
    group = records.CallGroup(4, linger_s=60)  # as run_agent_batch does (a long linger: the count decides)
    results = list(run._calls().map(lambda c: run._outcome(orch, c, providers, group), claims))
    assert all(r is not None and not isinstance(r, Exception) for r in results)
    names = _records(root)
    assert len(names) == 4 and len({(root / p).stat().st_ino for p in names}) == 1  # one file, four names
    # … the worker dies here. Its leases expire; the sweep re-hints; a rescuer adopts every attempt.
    clock.advance(seconds=settings.lease_s + 1)
    pub.publish(orch.sweep().hints)
    step(orch, providers, pub, owner="rescuer")
    assert agent.calls == {"describe": 4, "lookup": 4}
    assert rows(engine, "SELECT count(*) FROM processing_jobs WHERE status = 'succeeded'")[0][0] == 4
    assert {r[0] for r in rows(engine, "SELECT state FROM task_attempts")} == {"completed"}
    assert _records(root) == []  # discarded once the adoptions committed


def test_a_fenced_out_completion_keeps_its_record_and_a_landed_one_discards_it(engine, settings):
    # the worker discards the records of the completions the transaction reported landed (no read
    # of the open attempts afterwards): a completion fenced out must leave its record in place
    from sqlalchemy import text

    from app.worker.run import execute_claim

    orch = Orchestrator(engine, settings)
    root = settings.agent_results_path
    agent = CountingAgent(results_dir=str(root))
    providers, pub = providers_with(settings, agent), RecordingPublisher()
    hint = _to_agent_hint(orch, providers, pub, "tenant-f", 720)
    claim = orch.claim_task(hint.task_id, "w1")
    with engine.begin() as conn:  # another claim took over meanwhile: this one's token is stale
        conn.execute(text("UPDATE tasks SET claim_generation = claim_generation + 1 WHERE id = :id"),
                     {"id": claim.task_id})
    assert execute_claim(orch, claim, providers, pub) == "succeeded"  # ran; its completion was rejected
    assert _records(root) == [Path(records.namespace_of(claim.storage_key)) / f"{claim.attempt_id}.json"]
    assert orch.open_attempt_ids([claim.attempt_id]) == {claim.attempt_id}
    hint2 = _to_agent_hint(orch, providers, pub, "tenant-f", 721)
    assert handle_hint(orch, "agent", hint2.task_id, "w1", providers, pub) == 1
    assert len(_records(root)) == 1  # the landed one's record is gone, the fenced-out one's stays


def test_another_machines_worker_adopts_a_dead_workers_recorded_result(engine, settings, tmp_path):
    """Two agent workers on two machines (or two ``--scale worker-agent=2`` containers) share the
    database, the broker and MEMEFLOW_STORAGE_DIR, each with its own MEMEFLOW_VAR_DIR. Machine A's
    call returns (its result recorded) and A dies before the completion commits; B recovers the
    task after the lease and must adopt A's record — not end the job ``unknown_execution``."""
    from app.stages.providers import Providers
    from app.worker import run
    from tests.support.clock import FakeClock

    storage = tmp_path / "shared-storage"
    sa = settings.replace(var_dir=tmp_path / "machine-a", storage_dir=storage)
    sb = settings.replace(var_dir=tmp_path / "machine-b", storage_dir=storage)
    clock = FakeClock()
    orch_a, orch_b = Orchestrator(engine, sa, clock=clock), Orchestrator(engine, sb, clock=clock)
    prov_a, prov_b = Providers(sa), Providers(sb)
    pub = RecordingPublisher()
    res = store_and_ingest(orch_a, "local", png_bytes(730))
    pub.publish(res.hints)
    hint = step(orch_a, prov_a, pub, stop_lane="agent")
    assert hint is not None
    [claim] = orch_a.claim_agent_batch(hint.task_id, 1, "worker-a")
    assert not isinstance(run._outcome(orch_a, claim, prov_a), Exception)  # recorded; A dies here
    for _ in range(5):
        clock.advance(sa.lease_s + sa.rehint_grace_s + 1)
        pub.publish(orch_b.sweep().hints)
        step(orch_b, prov_b, pub, owner="worker-b")
    job = orch_b.get_job("local", res.job["id"])
    assert job["status"] == "succeeded", (job["status"], job["error"])
    assert {r[0] for r in rows(engine, "SELECT state FROM task_attempts")} == {"completed"}
    assert sa.agent_results_path == sb.agent_results_path == (storage / ".agent-results").resolve()
    assert _records(sb.agent_results_path) == []  # discarded once the adoption committed


def test_a_record_an_older_version_kept_in_the_var_dir_is_adopted_and_gc_skips_the_shared_dir(
    engine, settings
):
    """Upgrading with an attempt in flight: its record sits in ``<var>/agent-results`` (the old
    location); the lookup still finds it there. The records' directory inside the storage root is
    not a namespace: gc's storage scan lists none of its files as orphans or temp files."""
    from datetime import datetime, timezone

    from app.storage import FileStore
    from tests.support.agents import Clock

    clock = Clock(datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc))
    orch = Orchestrator(engine, settings, clock=clock)
    legacy, shared = settings.legacy_agent_results_path, settings.agent_results_path
    assert legacy != shared and shared.parent == settings.storage_path
    old_version = CountingAgent(results_dir=str(legacy))  # how the worker before the upgrade wrote
    agent = CountingAgent(results_dir=str(shared))
    providers, pub = providers_with(settings, agent), RecordingPublisher()
    hint = _to_agent_hint(orch, providers, pub, "tenant-u", 740)
    claim = orch.claim_task(hint.task_id, "old-worker")
    with records.in_namespace(records.namespace_of(claim.storage_key)):
        old_version.describe(_decoded(settings, claim), attempt_id=claim.attempt_id, reverse_image_policy="forbid")
    assert len(_records(legacy)) == 1
    # the upgraded worker reads both places (its provider is built from the settings' options)
    from app.stages.providers import Providers
    real = Providers(settings).agent
    with records.in_namespace(records.namespace_of(claim.storage_key)):
        assert real.lookup(claim.attempt_id).status == "complete"
    clock.advance(seconds=settings.lease_s + 1)
    pub.publish(orch.sweep().hints)
    step(orch, Providers(settings), pub, owner="upgraded-worker")
    assert rows(engine, "SELECT status FROM processing_jobs")[0][0] == "succeeded"
    assert {r[0] for r in rows(engine, "SELECT state FROM task_attempts")} == {"completed"}
    # a record (and a temp file of a write cut short) in the shared dir: not storage files
    with records.in_namespace(records.namespace_of(claim.storage_key)):
        records.ResultRecords(shared).write("ef" * 16, AgentResult(context={}, model="m", request_id="r"))
    (shared / ".ef.tmp-x.tmp").write_bytes(b"{")
    (shared / ".tmp-crashed").write_bytes(b"")
    store = FileStore(settings.storage_path)
    assert all(not k.startswith(".") for k in store.iter_keys()) and store.stale_temp_files() == []
    from app.cli import main
    from app.config import reset_settings

    reset_settings(dataclasses.replace(settings))
    try:
        result = CliRunner().invoke(main, ["gc", "--min-age", "0"])
    finally:
        reset_settings(None)
    assert result.exit_code == 0, result.output
    assert "removed 0 unreferenced files and 0 temp files" in result.output, result.output
    assert _records(legacy) == [] and _records(shared) == []  # the adopted legacy record and the settled one
