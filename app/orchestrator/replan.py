"""A job planned under another stage configuration than the worker that claimed it runs.

A model change is rolled out by restarting processes one by one (docs/operations.md, "rolling is
fine"), so for a while API replicas and workers disagree on the configuration: an upload planned
by a process still on the old model is claimed by a restarted worker (or the other way round).
The worker's provider cannot produce the artifact the job was planned for, but nothing is wrong
with the image, so the job must not end ``failed`` (an upload would then never be processed: fill
batches only seed images that have a context).

The worker detects the mismatch before any call (``app.worker.executor.check_config``), so
nothing ran — not even a paid agent call. In one transaction, fenced on the claim, the task ends
``cancelled`` (its attempt, if any, ``failed``; its grant returned), the job ends ``superseded``
with code ``provider_config_mismatch``, and a new revision is planned under *this* process's
configuration, reusing every stage still valid under it, its first task hinted after commit.

**Whose configuration wins.** The claiming process's: the processes left at the end of a rolling
restart all run the new one, so the last replans move every job to it. While old and new workers
both run, a job may be replanned back and forth; each replan only moves a job that had not run
its stage yet, and ``MAX_CONFIG_REPLANS`` replans of one image in a row end the next mismatch in
``failed`` (``provider_config_mismatch``, as before), so a worker left on an old configuration
cannot make an image flap forever. A worker whose provider differs from its own configuration
(the job was planned with exactly this process's configuration) cannot be helped by a replan:
that job fails as before.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from app import metrics
from app.db.enums import ACTIVE_JOB_STATUSES, AttemptState, JobStatus, TaskStatus
from app.orchestrator import grants, lanes
from app.orchestrator.advance import create_or_reuse_job_txn, end_job_txn
from app.orchestrator.execution import rejected_txn, retry_on_disconnect
from app.orchestrator.hints import Hint
from app.orchestrator.store import attempts, batches, images, jobs, tasks
from app.orchestrator.types import Claim
from app.stages.errors import ProviderConfigMismatch

if TYPE_CHECKING:
    from app.orchestrator.service import Orchestrator

log = logging.getLogger(__name__)

#: Replans of one image in a row (each job superseded for a configuration mismatch) after which
#: the next mismatch fails the job: enough for any rolling restart, a bound on a stale worker.
MAX_CONFIG_REPLANS = 4


@retry_on_disconnect
def replan_for_config(orch: Orchestrator, claim: Claim, error: ProviderConfigMismatch) -> list[Hint] | None:
    """Supersede the claim's job by a revision planned under this process's configuration.

    Returns the new job's hints ([] on a fencing rejection), or None when a replan cannot help —
    the job already has this process's configuration, it is no longer active, or the image was
    replanned ``MAX_CONFIG_REPLANS`` times in a row: the caller then fails the task as before."""
    configs = orch.stage_configs
    now = orch.now()
    err = {"code": error.code, "message": error.message}
    with orch.engine.begin() as conn:
        image = images.lock_image_txn(conn, claim.scope_id, claim.image_id)  # the global order: image, job
        job = jobs.lock_job_txn(conn, claim.job_id, claim.scope_id)
        if image is None or job is None or job["status"] not in ACTIVE_JOB_STATUSES:
            return None
        if job["config_hash"] == configs.hash:
            return None  # this worker's provider is not its own configuration's: a replan cannot help
        replans = jobs.config_replans_in_a_row_txn(conn, claim.scope_id, image["id"], job["id"], MAX_CONFIG_REPLANS)
        if replans >= MAX_CONFIG_REPLANS:
            log.warning("configuration replans exhausted", extra={"job_id": job["id"], "scope_id": claim.scope_id,
                                                                   "stage": claim.stage, "code": error.code})
            return None
        done = tasks.finish_fenced_txn(conn, claim.task_id, claim.owner, claim.generation, now,
                                       status=TaskStatus.CANCELLED, error=err)
        if not done.matched:  # fenced out: another claim owns the task; nothing written
            rejected_txn(orch, conn, claim, "replan")
            return []
        if claim.attempt_id:  # checked before the call: this attempt provably never called out
            if not attempts.finish_attempt_txn(conn, claim.attempt_id, claim.task_id, AttemptState.FAILED, now,
                                               error=err).matched:
                log.warning("attempt already closed", extra={"task_id": claim.task_id, "code": claim.attempt_id})
        lanes.release_slot_txn(orch, conn, claim)
        grants.release_uncalled_txn(orch, conn, claim.task_id)
        end_job_txn(orch, conn, job, JobStatus.SUPERSEDED, error.code,
                    "planned with another configuration than the worker that claimed it; replanned")
        new, _, hints = create_or_reuse_job_txn(
            orch, conn, image, mode=job["mode"], policy=job["reverse_image_policy"],
            force_stages=job["force_stages"] or (), batch_id=job["batch_id"],
        )
        if job["batch_id"] is not None and new is not None and new["id"] != job["id"]:
            batches.move_item_to_job_txn(conn, job["batch_id"], job["id"], new["id"])  # not matched: no item
        hints += lanes.next_fair_hints_txn(orch, conn, claim)
    metrics.COMPLETIONS.labels(claim.lane, "replanned").inc()
    log.info("job replanned under this worker's configuration",
             extra={"task_id": claim.task_id, "job_id": claim.job_id, "scope_id": claim.scope_id,
                    "stage": claim.stage, "generation": claim.generation, "code": error.code})
    return hints
