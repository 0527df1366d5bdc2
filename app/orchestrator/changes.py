"""Requests that change an image or its jobs (SPEC §4.1, §4.2, §4.7): one transaction each."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from app.db.enums import ACTIVE_JOB_STATUSES, STAGE_ORDER, ContextStatus, JobMode, JobStatus
from app.orchestrator import fingerprints as fp
from app.orchestrator import grants, lanes, limits
from app.orchestrator.advance import create_or_reuse_job_txn, end_job_txn
from app.orchestrator.errors import (
    ContextGenerationInProgress,
    InvalidRequest,
    JobNotActive,
    JobNotRetryable,
    NotFound,
)
from app.orchestrator.files import release_file, store_file_txn
from app.orchestrator.hints import Hint
from app.orchestrator.store import images, jobs, reads, slots, tasks
from app.orchestrator.types import ImageJobResult, IngestResult, JobResult
from app.storage import FileStore
from app.storage import storage_key as content_key

if TYPE_CHECKING:
    from app.orchestrator.service import Orchestrator

UNSET: Any = object()
RETRYABLE_JOB_STATUSES = (
    JobStatus.FAILED, JobStatus.BLOCKED, JobStatus.UNKNOWN_EXECUTION, JobStatus.CANCELLED, JobStatus.TARGET_CHANGED,
    JobStatus.SUPERSEDED,
)
POLICIES = ("forbid", "auto")


def _check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise InvalidRequest("reverse_image_policy must be 'forbid' or 'auto'", code="invalid_reverse_image_policy")


def _check_stages(force_stages: Iterable[str]) -> list[str]:
    stages = list(force_stages)
    unknown = [s for s in stages if s not in {st.value for st in STAGE_ORDER}]
    if unknown:
        raise InvalidRequest(f"unknown stage(s): {', '.join(map(str, unknown))}", code="invalid_stage")
    return stages


def ingest_image(
    orch: Orchestrator, scope_id: str, *, sha256: str, media_type: str, extension: str, size_bytes: int,
    width: int, height: int, storage_key: str | None = None, display_name: str | None = None,
    reverse_image_policy: str = "forbid", process: bool = True, files: FileStore | None = None,
    data: bytes | None = None,
) -> IngestResult:
    """Insert the image (or find identical bytes) and create/reuse its auto job — one transaction.

    ``storage_key`` None: the content-addressed key under the scope's namespace
    (``app.storage.storage_key``), resolved in this transaction — the API's upload then needs no
    transaction of its own to learn the namespace.

    With ``files``, ``data`` is stored under ``storage_key`` in that transaction, under the key's
    lock (``files.store_file_txn``), so no removal can take the file from under the row; if the
    transaction fails, the file goes again unless another row uses it.
    """
    _check_policy(reverse_image_policy)
    values = {"sha256": sha256, "extension": extension, "media_type": media_type, "size_bytes": size_bytes,
              "width": width, "height": height, "storage_key": storage_key, "display_name": display_name,
              "metadata_hash": None}
    stored = storage_key  # the key released if the transaction fails (None: not resolved yet)
    try:
        with orch.engine.begin() as conn:
            scope = images.scope_facts_txn(conn, scope_id)
            if storage_key is None:
                storage_key = stored = values["storage_key"] = content_key(scope["storage_namespace"], sha256,
                                                                           extension)
            store_file_txn(conn, files, storage_key, data)
            scope_limits = limits.effective_limits(orch, scope if scope["has_limits"] else None)
            image, created = _insert_or_lock_image_txn(orch, conn, scope_id, sha256, values, scope_limits)
            job, hints = None, []
            if process:
                job, _, hints = create_or_reuse_job_txn(orch, conn, image, mode=JobMode.AUTO,
                                                        policy=reverse_image_policy, new_image=created)
            elif not created:
                job = jobs.latest_job_txn(conn, scope_id, image["id"])
            # read in the transaction: a delete committing right after this one cannot turn the
            # upload's answer into a 404
            job_doc = reads.get_job_txn(conn, scope_id, job["id"]) if job else None
            if created:  # the row as inserted (nothing since changed it); its only job, if any, is job_doc
                image_doc = reads.image_doc(image, job_doc)
            else:
                image_doc = reads.get_image_txn(conn, scope_id, image["id"])
    except BaseException:
        if stored is not None:
            release_file(orch, files, stored)
        raise
    return IngestResult(image=image_doc, job=job_doc, created=created, hints=hints)


def _insert_or_lock_image_txn(orch: Orchestrator, conn, scope_id: str, sha256: str, values: dict,
                              scope_limits: limits.Limits):
    """The new image row, or the scope's existing one with these bytes, locked: (row, created).
    An existing row deleted between the two statements is simply inserted on the next round."""
    while True:
        inserted = images.insert_image_txn(conn, scope_id, values, orch.now())
        if inserted.matched:
            limits.check_quota_txn(orch, conn, scope_id, scope_limits)  # over: the caller's transaction rolls back
            return inserted.row, True
        # not matched: the scope has these bytes already — that row, locked
        existing = images.image_by_sha_txn(conn, scope_id, sha256)
        if existing is not None:
            return existing, False


def request_processing(
    orch: Orchestrator, scope_id: str, image_id: uuid.UUID, *, mode: str = JobMode.EXPLICIT,
    reverse_image_policy: str = "forbid", force_stages: Iterable[str] = (), batch_id: uuid.UUID | None = None,
) -> JobResult:
    _check_policy(reverse_image_policy)
    force = _check_stages(force_stages)
    if force and mode == JobMode.EXPLICIT:
        mode = JobMode.FULL_RETRY
    with orch.engine.begin() as conn:
        image = images.lock_image_txn(conn, scope_id, image_id)
        if image is None:
            raise NotFound("image not found")
        job, created, hints = create_or_reuse_job_txn(
            orch, conn, image, mode=mode, policy=reverse_image_policy, force_stages=force, batch_id=batch_id
        )
        job_id = job["id"]
    return JobResult(job=orch.get_job(scope_id, job_id), created=created, hints=hints)


def retry_job(orch: Orchestrator, scope_id: str, job_id: uuid.UUID) -> JobResult:
    """A new revision in explicit mode, resuming at the first failed/blocked/unknown/stale stage."""
    with orch.engine.begin() as conn:
        job = jobs.lock_job_txn(conn, job_id, scope_id)
        if job is None:
            raise NotFound("job not found")
        if job["status"] not in RETRYABLE_JOB_STATUSES:
            raise JobNotRetryable(f"job is {job['status']}")
        policy, force = job["reverse_image_policy"], job["force_stages"]
    result = request_processing(orch, scope_id, job["image_id"], mode=JobMode.EXPLICIT, reverse_image_policy=policy,
                                force_stages=[s for s in force])
    if not result.created and result.job["id"] == str(job_id):
        raise JobNotRetryable("nothing to retry: every stage is already valid")
    return result


def cancel_job(orch: Orchestrator, scope_id: str, job_id: uuid.UUID) -> dict:
    with orch.engine.begin() as conn:
        ref = jobs.image_ref_txn(conn, job_id)
        if ref is not None and ref["scope_id"] == scope_id:  # its image's tasks before the job (lock order)
            images.lock_open_tasks_of_image_txn(conn, scope_id, ref["image_id"])
        job = jobs.lock_job_txn(conn, job_id, scope_id)
        if job is None:
            raise NotFound("job not found")
        if job["status"] not in ACTIVE_JOB_STATUSES:
            raise JobNotActive(f"job is {job['status']}")
        end_job_txn(orch, conn, job, JobStatus.CANCELLED, "cancelled", "cancelled by request")
    return orch.get_job(scope_id, job_id)


def edit_context(
    orch: Orchestrator, scope_id: str, image_id: uuid.UUID, *, display_name: Any = UNSET, context: Any = UNSET,
) -> ImageJobResult:
    """A human edit: new metadata_hash → an auto revision that reuses visual and agent."""
    with orch.engine.begin() as conn:
        image = images.lock_image_txn(conn, scope_id, image_id)
        if image is None:
            raise NotFound("image not found")
        if jobs.agent_stage_in_progress_txn(conn, image_id):
            raise ContextGenerationInProgress()
        name = image["display_name"] if display_name is UNSET else display_name
        if context is UNSET:
            ctx, status, prov = image["context"], image["context_status"], image["context_provenance"]
        else:
            ctx = {**fp.whitelisted_context(image["context"] or {}), **(image["context"] or {}), **context}
            status = ContextStatus.EDITED
            prov = {"edited": True, "image_sha256": image["sha256"],
                    "previous": (image["context_provenance"] or {}).get("attempt_id")}
        mhash = fp.metadata_hash(name, ctx) if ctx is not None else None
        if name == image["display_name"] and ctx == image["context"]:
            job = jobs.active_job_txn(conn, image_id) or jobs.latest_job_txn(conn, scope_id, image_id)
            return ImageJobResult(image=orch.get_image(scope_id, image_id),
                                  job=orch.get_job(scope_id, job["id"]) if job else None)
        image = images.edit_context_txn(conn, image_id, display_name=name, context=ctx, context_status=status,
                                        provenance=prov, metadata_hash=mhash, now=orch.now()).expect(
            "the image row is locked (lock_image_txn above)").row
        hints: list = []
        images.lock_open_tasks_of_image_txn(conn, scope_id, image_id)  # tasks before the job (lock order)
        active = jobs.active_job_txn(conn, image_id)
        policy = _edit_policy_txn(conn, scope_id, image, active)
        if active is not None:
            end_job_txn(orch, conn, active, JobStatus.SUPERSEDED, "superseded", "the image context was edited")
        job = None
        if ctx is not None or active is not None:
            job, _, hints = create_or_reuse_job_txn(orch, conn, image, mode=JobMode.AUTO, policy=policy)
        job_id = job["id"] if job else None
    return ImageJobResult(image=orch.get_image(scope_id, image_id),
                          job=orch.get_job(scope_id, job_id) if job_id else None, hints=hints)


def _edit_policy_txn(conn, scope_id: str, image, active) -> str:
    """The reverse_image_policy of a context edit's job: the active job's; else the one the agent
    context was produced with, so that its agent stage is reused (SPEC §4.7) — planned with the
    default ``forbid``, an ``auto`` context counted as invalid and the edit re-ran the paid agent
    call; else the latest job's; else the default."""
    if active is not None:
        return active["reverse_image_policy"]
    produced = (image["context_provenance"] or {}).get("reverse_image_policy")
    if image["context_status"] == ContextStatus.READY and produced in POLICIES:
        return produced
    latest = jobs.latest_job_txn(conn, scope_id, image["id"])
    return latest["reverse_image_policy"] if latest is not None else "forbid"


def replace_content(
    orch: Orchestrator, scope_id: str, image_id: uuid.UUID, *, sha256: str, media_type: str, extension: str,
    size_bytes: int, width: int, height: int, storage_key: str, files: FileStore | None = None,
    data: bytes | None = None,
) -> ImageJobResult:
    """New bytes: the active job ends target_changed and a new auto job starts for the new sha.

    With ``files``, the new bytes are stored in the transaction under their key's lock (as on
    upload), and after the commit the old file is removed under its key's lock unless a row
    (e.g. a re-upload of those bytes) references it.
    """
    try:
        with orch.engine.begin() as conn:
            store_file_txn(conn, files, storage_key, data)
            image = images.lock_image_txn(conn, scope_id, image_id)
            if image is None:
                raise NotFound("image not found")
            old_key, old_size = image["storage_key"], image["size_bytes"]
            if image["sha256"] == sha256:
                job = jobs.active_job_txn(conn, image_id) or jobs.latest_job_txn(conn, scope_id, image_id)
                return ImageJobResult(image=orch.get_image(scope_id, image_id),
                                      job=orch.get_job(scope_id, job["id"]) if job else None)
            images.lock_open_tasks_of_image_txn(conn, scope_id, image_id)  # tasks before the job (lock order)
            active = jobs.active_job_txn(conn, image_id)
            policy = active["reverse_image_policy"] if active else "forbid"
            if active is not None:
                end_job_txn(orch, conn, active, JobStatus.TARGET_CHANGED, "target_changed",
                             "the image content changed")
            image = images.replace_content_txn(
                conn, image_id, {"sha256": sha256, "media_type": media_type, "extension": extension,
                                 "size_bytes": size_bytes, "width": width, "height": height,
                                 "storage_key": storage_key},
                orch.now(),
            ).expect("the image row is locked (lock_image_txn above)").row
            if size_bytes > old_size:  # bigger bytes may cross the storage quota; the same or fewer
                limits.check_quota_txn(orch, conn, scope_id)  # never do (nor the image count)
            job, _, hints = create_or_reuse_job_txn(orch, conn, image, mode=JobMode.AUTO, policy=policy)
            job_id = job["id"]
    except BaseException:
        release_file(orch, files, storage_key)
        raise
    if old_key != storage_key:
        release_file(orch, files, old_key)
    return ImageJobResult(image=orch.get_image(scope_id, image_id), job=orch.get_job(scope_id, job_id), hints=hints,
                          old_storage_key=old_key)


def delete_image(orch: Orchestrator, scope_id: str, image_id: uuid.UUID, *,
                 files: FileStore | None = None) -> list[Hint]:
    """Delete the image (cascade). With ``files``, its file is then removed under the key's lock
    unless a row (e.g. a re-upload of the same bytes) references it. Returns the hints to publish:
    a lane slot its running task held is free now, and goes to the fairest waiting task (as when a
    task ends) rather than idle until the sweep."""
    with orch.engine.begin() as conn:
        image = images.lock_image_txn(conn, scope_id, image_id)
        if image is None:
            raise NotFound("image not found")
        images.lock_open_tasks_of_image_txn(conn, scope_id, image_id)  # tasks before the job (lock order)
        active = jobs.active_job_txn(conn, image_id)
        if active is not None:  # release what its cancelled tasks held before the rows cascade away
            for task_id in tasks.cancel_job_tasks_txn(conn, active["id"], orch.now(), "image_deleted").rows:
                grants.release_if_unattempted_txn(orch, conn, task_id)
        held = slots.held_by_image_txn(conn, scope_id, image_id, orch.now())
        key = images.delete_image_txn(conn, scope_id, image_id).expect(
            "the image row is locked (lock_image_txn above)").row
        hints = [h for lane, n in held for h in lanes.next_fair_hints_of_lane_txn(orch, conn, lane, n)]
    if key:
        release_file(orch, files, key)
    return hints
