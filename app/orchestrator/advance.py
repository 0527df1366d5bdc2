"""Advancing jobs (SPEC §4.3) and creating or reusing them (SPEC §4.2).

Both run inside the caller's transaction, with the image row locked before the job row (the
lock order every writer follows, so writers never deadlock on each other).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy.engine import Connection, RowMapping

from app.db.enums import (
    ACTIVE_JOB_STATUSES,
    ACTIVE_TASK_STATUSES,
    NEEDS_HUMAN_JOB_STATUSES,
    STAGE_ORDER,
    ContextStatus,
    JobMode,
    JobStatus,
    Stage,
    StageStatus,
    TaskStatus,
)
from app.ids import new_id
from app.orchestrator import fingerprints as fp
from app.orchestrator import grants
from app.orchestrator.errors import GenerationPolicyConflict
from app.orchestrator.hints import Hint
from app.orchestrator.lanes import wake_group_size
from app.orchestrator.planner import Action, ImageFacts, JobFacts, Plan, plan
from app.orchestrator.policy import Denial
from app.orchestrator.stages import BATCHED_LANES, EXISTS_STAGES, lane_of
from app.orchestrator.stages import spec as stage_spec
from app.orchestrator.store import facts, images, jobs, tasks
from app.orchestrator.types import StageConfigs

if TYPE_CHECKING:
    from app.orchestrator.service import Orchestrator

log = logging.getLogger(__name__)

DONE_STAGE = (StageStatus.SUCCEEDED, StageStatus.REUSED)


def image_facts_txn(conn: Connection, image: RowMapping, configs: StageConfigs) -> ImageFacts:
    return ImageFacts(
        sha256=image["sha256"],
        context_status=image["context_status"],
        provenance=image["context_provenance"],
        metadata_hash=image["metadata_hash"],
        exists=_exists(facts.image_artifacts_exist_txn(conn, image, configs)),
    )


def _exists(row: RowMapping) -> dict[str, bool]:
    """ImageFacts.exists from a facts row's ``<stage>_exists`` columns (store/facts.py)."""
    return {s.stage.value: row[s.exists_column] for s in EXISTS_STAGES}


def plan_for_txn(
    conn: Connection, image: RowMapping, configs: StageConfigs, policy: str, force: Iterable[str] = (),
    succeeded: Iterable[str] = (),
) -> Plan:
    image_facts = image_facts_txn(conn, image, configs)
    return plan(image_facts, JobFacts(image["sha256"], configs, policy, frozenset(force), frozenset(succeeded)))


def end_job_txn(orch: Orchestrator, conn: Connection, job: RowMapping, status: str, code: str, msg: str) -> None:
    """End an active job the caller holds locked (cancel, target changed, superseded): the job, its
    open stages and its tasks (queued → cancelled, their unattempted grants released; running →
    cancel requested)."""
    now = orch.now()
    jobs.end_job_txn(conn, job["id"], status, {"code": code, "message": msg}, now).expect(
        "the caller holds the job locked active")
    jobs.cancel_open_stages_txn(conn, job["id"], now)  # not matched: no stage was still open — fine
    for task_id in tasks.cancel_job_tasks_txn(conn, job["id"], now, status).rows:
        grants.release_if_unattempted_txn(orch, conn, task_id)
    log.info("job ended", extra={"job_id": job["id"], "scope_id": job["scope_id"], "code": code})


@dataclass
class _NewTask:
    job: RowMapping
    image: RowMapping
    configs: StageConfigs
    stage: str
    fingerprint: str
    job_fields: dict


@dataclass
class _Pending:
    """The common writes of advancing several jobs, made set-based when flushed: new leaf tasks
    (insert + link the stage + point the job, one statement) and jobs that are done (one statement)."""

    tasks: list[_NewTask] = field(default_factory=list)
    agent: list[_NewTask] = field(default_factory=list)  # new agent tasks wait for their grants
    completed: list[tuple[uuid.UUID, str | None]] = field(default_factory=list)  # job id, metadata_hash to set


def advance_job_txn(
    orch: Orchestrator, conn: Connection, job_id: uuid.UUID, image: RowMapping | None = None
) -> list[Hint]:
    """Re-plan an active job against the current facts; create the next leaf task or finish it.

    ``image`` is the job's image row when the caller already holds its lock (completion, job
    creation); otherwise it is locked here, before the job (the global lock order).
    """
    if image is None:
        ref = jobs.image_ref_txn(conn, job_id)
        if ref is None:
            return []
        image = images.lock_image_txn(conn, ref["scope_id"], ref["image_id"], share=True)
    return advance_jobs_txn(orch, conn, [(job_id, image)])


def advance_jobs_txn(
    orch: Orchestrator, conn: Connection, items: list[tuple[uuid.UUID, RowMapping | None]]
) -> list[Hint]:
    """``advance_job_txn`` for several jobs whose images the caller holds locked: one statement
    reads (and locks, in id order) all the jobs' facts, each job is planned on its own, and the
    common outcomes — a new leaf task, a finished job — are written set-based."""
    unique: dict[uuid.UUID, RowMapping | None] = {}
    for job_id, image in items:
        unique.setdefault(job_id, image)  # each job once
    items = list(unique.items())
    found = facts.job_facts_many_txn(conn, [
        (job_id, image["sha256"] if image else "", image["metadata_hash"] if image else None)
        for job_id, image in items
    ])
    pending = _Pending()
    for job_id, image in items:
        _advance_txn(orch, conn, found.get(job_id), image, pending)
    return _flush_txn(orch, conn, pending)


def _first_advance_txn(orch: Orchestrator, conn: Connection, job: RowMapping, image: RowMapping) -> list[Hint]:
    """``advance_job_txn`` of a job this transaction inserted for an image it inserted, without
    reading its facts: ``job_facts_many_txn`` would find the row as inserted (locked: no other
    transaction can see it), every stage pending without a task, and no artifact of the image —
    every stage's validity query (``StageSpec.exists_sql``) looks for a row of this image id,
    which no other transaction can know before this one commits (tests/unit/test_first_advance.py
    checks each declared query for it)."""
    found = {
        **job,
        "stage_rows": [{"stage": st.value, "status": StageStatus.PENDING.value, "task_id": None, "task_status": None}
                       for st in STAGE_ORDER],
        **{s.exists_column: False for s in EXISTS_STAGES},
    }
    pending = _Pending()
    _advance_txn(orch, conn, found, image, pending)
    return _flush_txn(orch, conn, pending)


def _advance_txn(
    orch: Orchestrator, conn: Connection, job: RowMapping | None, image: RowMapping | None, pending: _Pending
) -> None:
    if job is None or job["status"] not in ACTIVE_JOB_STATUSES:
        return
    if image is None or image["sha256"] != job["image_sha256"]:
        end_job_txn(orch, conn, job, JobStatus.TARGET_CHANGED, "target_changed", "the image content changed")
        return
    if job["metadata_hash"] is not None and image["metadata_hash"] != job["metadata_hash"]:
        end_job_txn(orch, conn, job, JobStatus.SUPERSEDED, "superseded", "the image context changed")
        return
    stages = {r["stage"]: r for r in job["stage_rows"]}
    configs = _job_configs(job)
    succeeded = [s for s, row in stages.items() if row["status"] == StageStatus.SUCCEEDED]
    image_facts = ImageFacts(
        sha256=image["sha256"], context_status=image["context_status"], provenance=image["context_provenance"],
        metadata_hash=image["metadata_hash"], exists=_exists(job),
    )
    p = plan(image_facts, JobFacts(image["sha256"], configs, job["reverse_image_policy"],
                             frozenset(job["force_stages"]), frozenset(succeeded)))
    now = orch.now()
    fields: dict = {}
    if job["metadata_hash"] is None and p.actions[Stage.AGENT] is Action.REUSE:
        fields["metadata_hash"] = image["metadata_hash"]
    for stage in STAGE_ORDER:
        action, row = p.actions[stage], stages[stage]
        if action is Action.REUSE and row["status"] not in DONE_STAGE:
            if not jobs.reuse_stage_txn(conn, job["id"], stage, p.fingerprints[stage], now).matched:
                log.warning("stage not reusable from its status", extra={"job_id": job["id"], "stage": stage,
                                                                         "code": row["status"]})
    if p.complete:
        pending.completed.append((job["id"], fields.get("metadata_hash")))
        return
    stage = p.run_stage
    assert stage is not None
    _run_stage_txn(orch, conn, job, image, configs, stage, stages[stage], p.fingerprints[stage], fields, pending)


_CONFIGS: dict[str, StageConfigs] = {}  # config_hash → the frozen configs (few per deployment)


def _job_configs(job: RowMapping) -> StageConfigs:
    """The job's frozen configs, one instance per config hash (its hashes computed once)."""
    configs = _CONFIGS.get(job["config_hash"])
    if configs is None or configs.as_dict() != job["config"]:
        configs = StageConfigs.from_job_config(job["config"])
        if len(_CONFIGS) >= 64:
            _CONFIGS.clear()
        _CONFIGS[job["config_hash"]] = configs
    return configs


_STAGE_CONFIG_HASHES: dict[tuple[str, str], str] = {}  # (configs hash, stage) → its config's hash


def _stage_config_hash(configs: StageConfigs, stage: str) -> str:
    key = (configs.hash, stage)
    found = _STAGE_CONFIG_HASHES.get(key)
    if found is None:
        if len(_STAGE_CONFIG_HASHES) >= 256:
            _STAGE_CONFIG_HASHES.clear()
        found = _STAGE_CONFIG_HASHES[key] = fp.config_hash(stage_spec(stage).config(configs))
    return found


def _run_stage_txn(
    orch: Orchestrator, conn: Connection, job: RowMapping, image: RowMapping, configs: StageConfigs,
    stage: str, row: dict, fingerprint: str | None, job_fields: dict, pending: _Pending,
) -> None:
    """Make sure the first invalid stage has an active leaf task (queue its creation — an agent
    task's after its grant — or see it already waits on a live one), and point the job at it."""
    if (row["status"] in (StageStatus.QUEUED, StageStatus.RUNNING) and row["task_id"] is not None
            and row["task_status"] in ACTIVE_TASK_STATUSES):
        _point_job_txn(orch, conn, job, stage, job_fields)
        return  # already waiting on a live task
    assert fingerprint is not None
    new = _NewTask(job, image, configs, stage, fingerprint, job_fields)
    (pending.agent if stage_spec(stage).paid else pending.tasks).append(new)


def _task_values(orch: Orchestrator, new: _NewTask, grant_id: uuid.UUID | None) -> dict:
    job, image, configs, stage = new.job, new.image, new.configs, new.stage
    s = stage_spec(stage)
    payload: dict = {
        "image_id": str(image["id"]), "image_sha256": image["sha256"], "stage": stage,
        "stage_config_hash": _stage_config_hash(configs, stage), **s.payload(job, image, configs),
    }
    return {
        "scope_id": job["scope_id"], "job_id": job["id"], "stage": stage, "lane": lane_of(stage),
        "resource_key": s.resource_key(configs), "payload": payload, "input_fingerprint": new.fingerprint,
        "dedupe_key": fp.dedupe_key(image["id"], stage, new.fingerprint), "image_id": image["id"],
        "image_sha256": image["sha256"], "priority": orch.job_priority(job),
        "max_attempts": orch.settings.max_attempts, "grant_id": grant_id,
    }


def _granted_txn(orch: Orchestrator, conn: Connection, pending: _Pending) -> list[tuple[_NewTask, dict]]:
    """The new agent tasks' grants, acquired together; a denied job is blocked (SPEC §4.6)."""
    answers = grants.agent_grants_txn(orch, conn, [(n.job, n.fingerprint) for n in pending.agent])
    now = orch.now()
    granted = []
    for new, answer in zip(pending.agent, answers, strict=True):
        if isinstance(answer, Denial):
            job, stage = new.job, new.stage
            # the job is locked active (job_facts_many_txn) and its stage is the one it must run
            jobs.block_stage_txn(conn, job["id"], stage, new.fingerprint, answer.error, answer.retry_at, now).expect(
                "the job is locked active and this stage is open")
            jobs.block_job_txn(conn, job["id"], stage, answer.error, answer.retry_at,
                               new.job_fields.get("metadata_hash"), now).expect("the job is locked active")
        else:
            granted.append((new, _task_values(orch, new, answer)))
    return granted


def _point_job_txn(orch: Orchestrator, conn: Connection, job: RowMapping, stage: str, job_fields: dict) -> None:
    if job_fields or job["current_stage"] != stage:
        jobs.point_job_txn(conn, job["id"], stage, job_fields.get("metadata_hash"), orch.now()).expect(
            "the job is locked active")


def _wake_groups(orch: Orchestrator, rows: list[dict]) -> list[list[dict]]:
    """Split new tasks into wake-up groups: one lane, scope and resource key, at most the lane's
    batch size each. The first task of a group is the one its hint names; the others carry its
    id in ``hint_group`` (a claim for the hint takes them too)."""
    by_key: dict[tuple, list[dict]] = {}
    for row in rows:
        by_key.setdefault((row["lane"], row["scope_id"], row["resource_key"]), []).append(row)
    groups = []
    for (lane, _, _), members in by_key.items():
        size = wake_group_size(orch.settings, lane)
        for i in range(0, len(members), size):
            group = members[i : i + size]
            group[0]["hint_members"] = len(group) - 1
            for member in group[1:]:
                member["hint_group"] = group[0]["id"]
            groups.append(group)
    return groups


def _join_open_groups_txn(
    orch: Orchestrator, conn: Connection, groups: list[list[dict]], now: datetime
) -> list[list[dict]]:
    """Let each small group of a batched lane (an upload's first task, most often) join the newest
    open group of its scope, lane, resource key and priority instead of publishing a hint of its
    own: a burst of single uploads then costs one message per batch, not one per image. Returns
    the groups that still need their own hint."""
    own = []
    for group in groups:
        first = group[0]
        size = wake_group_size(orch.settings, first["lane"])
        leader = None
        if first["lane"] in BATCHED_LANES and len(group) < size:
            joined = tasks.join_open_group_txn(conn, first["scope_id"], first["lane"], first["resource_key"],
                                               first["priority"], len(group), size, now)
            leader = joined.row if joined.matched else None  # not matched: no open group — hint our own
        if leader is None:
            own.append(group)
            continue
        for row in group:
            row["hint_group"], row["hint_members"] = leader, 0
    return own


def _flush_txn(orch: Orchestrator, conn: Connection, pending: _Pending) -> list[Hint]:
    """Write the queued outcomes: finished jobs, then new tasks (the common case: one statement
    creates, binds, links and points them all, and one hint per wake-up group wakes them); a
    deduplicated one is linked to the live task."""
    now = orch.now()
    jobs.complete_jobs_txn(conn, pending.completed, now)  # every job is locked active: all of them land
    new_tasks = [(n, _task_values(orch, n, None)) for n in pending.tasks] + _granted_txn(orch, conn, pending)
    rows = [{**values, "id": new_id(), "hint_group": None, "hint_members": 0,
             "mh": new.job_fields.get("metadata_hash")} for new, values in new_tasks]
    groups = _join_open_groups_txn(orch, conn, _wake_groups(orch, rows), now)
    created = dict(tasks.insert_and_link_many_txn(conn, rows, now).rows)  # missing: deduplicated, below
    hints: list[Hint] = []
    for group in groups:
        landed = [r for r in group if created.get(r["job_id"]) == r["id"]]
        if group[0] in landed:
            hints.append(Hint(group[0]["lane"], group[0]["id"]))
        else:  # the named task was deduplicated away: each member that landed gets a hint of its own
            hints += [Hint(r["lane"], r["id"]) for r in landed]
    for new, values in new_tasks:
        job, stage = new.job, new.stage
        if job["id"] not in created:  # an identical task is already active (dedupe): link this stage to it
            inserted = tasks.insert_task_txn(conn, {k: v for k, v in values.items() if k != "grant_id"}, now)
            task_id, task_status = inserted.row
            if not inserted.matched and task_status == TaskStatus.RUNNING:
                # the live execution may carry the cancel request of the job that ended before this
                # one: this job wants its result, so the request no longer holds (not matched: none)
                tasks.withdraw_cancel_txn(conn, task_id, now)
            jobs.link_stage_txn(conn, job["id"], stage, task_id, task_status, values["input_fingerprint"], now).expect(
                "the job is locked active and this stage is open")
            _point_job_txn(orch, conn, job, stage, new.job_fields)
            if inserted.matched:  # a new task (the identical one ended meanwhile): bind the grant, hint it
                grants.bind_grant_txn(orch, conn, values["grant_id"], task_id)
                hints.append(Hint(values["lane"], task_id))
            # not matched: the stage now waits on the live identical task, which keeps its own grant
    return hints


def target_matches(job: RowMapping, image: RowMapping, config_hash: str, policy: str) -> bool:
    """Is ``job`` about exactly the image version, configuration and policy asked for now?"""
    if (job["image_sha256"], job["config_hash"], job["reverse_image_policy"]) != (image["sha256"], config_hash, policy):
        return False
    if job["metadata_hash"] is None:
        return image["context_status"] != ContextStatus.EDITED
    return job["metadata_hash"] == image["metadata_hash"]


def create_or_reuse_job_txn(
    orch: Orchestrator, conn: Connection, image: RowMapping, *, mode: str, policy: str,
    force_stages: Iterable[str] = (), batch_id: uuid.UUID | None = None, new_image: bool = False,
) -> tuple[RowMapping | None, bool, list[Hint]]:
    """SPEC §4.2. The caller holds the image row lock; the active-job index is the referee.

    ``new_image``: the caller inserted the image row in this transaction, so it has no job and
    no artifact yet — nothing to reuse and nothing to read: the job is inserted and advanced from
    what is known (``_first_advance_txn``), and returned as inserted (its first advance may have
    moved it on since: read it for its current state)."""
    configs = orch.stage_configs
    chash = configs.hash
    force = sorted(set(force_stages))
    if new_image:
        job = jobs.insert_job_txn(
            conn, scope_id=image["scope_id"], image_id=image["id"], revision=1, image_sha256=image["sha256"],
            config=configs.as_dict(), config_hash=chash, reverse_image_policy=policy, mode=mode, force_stages=force,
            batch_id=batch_id, now=orch.now(),
        ).row
        return job, True, _first_advance_txn(orch, conn, job, image)
    active = jobs.active_job_txn(conn, image["id"])
    if active is not None:
        if active["reverse_image_policy"] == policy and active["config_hash"] == chash:
            return active, False, []
        raise GenerationPolicyConflict(
            "an active job for this image uses a different reverse_image_policy or configuration",
            job_id=str(active["id"]),
        )
    latest = jobs.latest_job_txn(conn, image["scope_id"], image["id"])
    p = plan_for_txn(conn, image, configs, policy, force)
    if mode == JobMode.AUTO and latest is not None and target_matches(latest, image, chash, policy):
        if latest["status"] in NEEDS_HUMAN_JOB_STATUSES:
            return latest, False, []  # never retried automatically
        if latest["status"] == JobStatus.SUCCEEDED and p.complete:
            return latest, False, []
    if mode != JobMode.AUTO and p.complete and not force and latest is not None:
        return latest, False, []
    if mode == JobMode.AUTO and p.complete and latest is not None and latest["status"] == JobStatus.SUCCEEDED:
        return latest, False, []
    job = jobs.insert_job_txn(
        conn, scope_id=image["scope_id"], image_id=image["id"], revision=(latest["revision"] + 1) if latest else 1,
        image_sha256=image["sha256"], config=configs.as_dict(), config_hash=chash, reverse_image_policy=policy,
        mode=mode, force_stages=force, batch_id=batch_id, now=orch.now(),
    ).row
    hints = advance_job_txn(orch, conn, job["id"], image)
    return jobs.lock_job_txn(conn, job["id"]), True, hints
