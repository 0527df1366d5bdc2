"""Batches — "process the whole library" (SPEC §4.8).

A batch snapshots its target set (all images of the scope created up to the batch, or a list of
ids) and seeds it page by page: each page is one transaction that creates or reuses every image's
job in ``explicit`` mode and records a ``batch_items`` row. Seeding pauses while the scope's
queued backlog is above ``batch_backlog_threshold`` (so at most threshold + one page per scope is
ever queued) and the sweep continues it, round-robin over scopes. Progress is exact: terminal item jobs / total.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy.engine import Connection, RowMapping
from sqlalchemy.exc import DBAPIError

from app.db.enums import ACTIVE_JOB_STATUSES, BatchStatus, JobMode, JobStatus, ReverseImagePolicy
from app.ids import parse_uuid
from app.orchestrator.advance import create_or_reuse_job_txn, end_job_txn
from app.orchestrator.errors import GenerationPolicyConflict, InvalidRequest, NotFound
from app.orchestrator.events import emit_batch_progress
from app.orchestrator.hints import Hint
from app.orchestrator.store import batches as store
from app.orchestrator.store import images, jobs
from app.orchestrator.store import serving_fill as serving_q

if TYPE_CHECKING:
    from app.orchestrator.service import Orchestrator

log = logging.getLogger(__name__)

SEEDING, RUNNING, COMPLETED, CANCELLED = BatchStatus.SEEDING, BatchStatus.RUNNING, BatchStatus.COMPLETED, BatchStatus.CANCELLED
FINISHED = (COMPLETED, CANCELLED)
CANCEL_PAGE = 500
SWEEP_BATCHES = 20
MAX_BATCH_IDS = 10_000  # image_ids per POST /batches; all=true has no limit
MISSING_SHOWN = 5
# Jobs POST /batches seeds inside the request (work starts at once and the request stays fast:
# each job costs its own statements); the sweep seeds the rest in pages of ``batch_page_size``.
REQUEST_PAGE = 16


def _uuid_list(values: Iterable) -> list[uuid.UUID]:
    """The ids as UUIDs, duplicates dropped, first-seen order kept (linear: a dict is the set)."""
    try:
        parsed = [parse_uuid(v) for v in values]
    except (TypeError, AttributeError):  # not a list at all
        parsed = [None]
    if None in parsed:
        raise InvalidRequest("image_ids must be a list of image ids", code="invalid_image_ids")
    out = list(dict.fromkeys(parsed))
    if len(out) > MAX_BATCH_IDS:
        raise InvalidRequest(f"at most {MAX_BATCH_IDS} image ids per batch (use all=true for the whole library)",
                             code="too_many_image_ids")
    return out


def create_batch(
    orch: Orchestrator, scope_id: str, *, all: bool = False, image_ids: list | None = None,
    reverse_image_policy: str = "forbid", first_page_size: int | None = None,
    fill_models: list[dict] | None = None,
) -> tuple[dict, list[Hint]]:
    """Create a batch and seed a first page (``first_page_size``, default ``batch_page_size``; the
    API asks for ``REQUEST_PAGE`` to answer fast); the sweep seeds the rest.

    The snapshot is set-based whatever the list's length: ids deduplicated in one pass, their
    existence checked by one statement, the list stored once on the batch row. Returns (batch, hints).

    ``fill_models`` (with ``all``; a model backfill, app/orchestrator/serving.py): only images
    lacking a current embedding of one of these models (``store.serving_fill``'s fill scans) are
    seeded, each with the reverse_image_policy its context was made with (so its valid agent stage
    is reused)."""
    with orch.engine.begin() as conn:
        batch = create_batch_txn(orch, conn, scope_id, all=all, image_ids=image_ids,
                                 reverse_image_policy=reverse_image_policy, fill_models=fill_models)
    _, hints = seed_batch(orch, batch["id"], max_pages=1, page_size=first_page_size or orch.settings.batch_page_size)
    return get_batch(orch, scope_id, batch["id"]), hints


def create_batch_txn(
    orch: Orchestrator, conn: Connection, scope_id: str, *, all: bool = False, image_ids: list | None = None,
    reverse_image_policy: str = "forbid", fill_models: list[dict] | None = None,
) -> RowMapping:
    """Insert a batch in ``seeding`` inside the caller's transaction, nothing seeded yet: it commits
    with the caller's state change, and from then on the sweep seeds it (``continue_batches``) even
    if the caller dies before seeding a first page itself (:func:`seed_batch`)."""
    if reverse_image_policy not in tuple(ReverseImagePolicy):
        raise InvalidRequest("reverse_image_policy must be 'forbid' or 'auto'", code="invalid_reverse_image_policy")
    if bool(all) == bool(image_ids):
        raise InvalidRequest("give either all=true or a non-empty image_ids list", code="invalid_batch_target")
    ids = None if all else _uuid_list(image_ids or [])
    now = orch.now()
    images.ensure_scope_txn(conn, scope_id)
    if ids is not None:
        missing = store.missing_ids_txn(conn, scope_id, ids, MISSING_SHOWN)
        if missing:  # another scope's id behaves exactly like a missing one
            raise NotFound(f"image not found: {', '.join(map(str, missing))}")
        cursor: dict = {"offset": 0}
        total = len(ids)
    elif fill_models:
        cursor = {"until": now.isoformat(), "after": None}
        total = serving_q.count_needing_fill_txn(conn, scope_id, fill_models, now)
    else:
        cursor = {"until": now.isoformat(), "after": None}
        total = store.count_images_until_txn(conn, scope_id, now)
    return store.insert_batch_txn(conn, scope_id, select_all=bool(all), requested_ids=ids,
                                  policy=reverse_image_policy, cursor=cursor, total=total, now=now,
                                  fill_models=fill_models).row


def seed_batch(
    orch: Orchestrator, batch_id: uuid.UUID | str, max_pages: int | None = None, page_size: int | None = None,
) -> tuple[int, list[Hint]]:
    """Seed pages (of ``page_size``, default ``batch_page_size``) until done, paused by back-pressure,
    cancelled, or ``max_pages``. Returns (items, hints)."""
    batch_id = batch_id if isinstance(batch_id, uuid.UUID) else uuid.UUID(str(batch_id))
    seeded, hints, pages = 0, [], 0
    while max_pages is None or pages < max_pages:
        n, page_hints, more, _ = _seed_page(orch, batch_id, page_size or orch.settings.batch_page_size)
        seeded, pages = seeded + n, pages + 1
        hints += page_hints
        if not more:
            break
    return seeded, hints


def _seed_page(orch: Orchestrator, batch_id: uuid.UUID, page_size: int) -> tuple[int, list[Hint], bool, bool]:
    """One page in one transaction: (items, hints, ``more`` = another page may be seeded right away,
    ``paged`` = a page was read; not when paused by back-pressure or no longer seeding)."""
    threshold = orch.settings.batch_backlog_threshold
    with orch.engine.begin() as conn:
        batch = store.batch_txn(conn, batch_id, lock=True)  # one seeder per batch at a time
        if batch is None or batch["status"] != SEEDING:
            return 0, [], False, False
        if store.queued_backlog_txn(conn, batch["scope_id"], threshold + 1) > threshold:
            # back-pressure: the sweep continues later — touched, so other scopes' heads go first
            store.touch_batch_txn(conn, batch_id, orch.now()).expect("the batch is locked in seeding")
            return 0, [], False, False
        now = orch.now()
        cursor = dict(batch["seed_cursor"] or {})
        policies: dict[uuid.UUID, str] = {}
        if batch["fill_models"]:
            after = cursor.get("after")
            after_key = (datetime.fromisoformat(after[0]), uuid.UUID(after[1])) if after else None
            rows, reached = serving_q.fill_page_txn(conn, batch["scope_id"], batch["fill_models"],
                                                    datetime.fromisoformat(cursor["until"]), after_key, page_size)
            page_ids = [r["id"] for r in rows]
            policies = {r["id"]: r["policy"] for r in rows}
            if reached:
                cursor["after"] = [reached[0].isoformat(), str(reached[1])]
            done = reached is None
        elif batch["select_all"]:
            after = cursor.get("after")
            after_key = (datetime.fromisoformat(after[0]), uuid.UUID(after[1])) if after else None
            rows = store.image_page_txn(conn, batch["scope_id"], datetime.fromisoformat(cursor["until"]), after_key,
                                        page_size)
            page_ids = [r["id"] for r in rows]
            if rows:
                cursor["after"] = [rows[-1]["created_at"].isoformat(), str(rows[-1]["id"])]
            done = len(rows) < page_size
        else:
            offset = int(cursor.get("offset", 0))
            requested = list(batch["requested_ids"] or [])
            page_ids = requested[offset:offset + page_size]
            cursor["offset"] = offset + len(page_ids)
            done = cursor["offset"] >= len(requested)
        items, hints, gone = [], [], 0
        for image_id in page_ids:
            image = images.lock_image_txn(conn, batch["scope_id"], image_id)
            if image is None:
                gone += 1  # deleted since the snapshot: no longer part of the target set
                continue
            if batch["fill_models"]:
                # its active job locked first (image, then job: the lock order), so the job cannot end
                # between this look and create_or_reuse_job_txn: a fill never turns an image whose
                # agent failed meanwhile into a job of its own that runs that agent again
                jobs.active_job_txn(conn, image_id)
                if not serving_q.needs_fill_txn(conn, batch["scope_id"], image_id, batch["fill_models"]):
                    gone += 1  # its job ended or embedded it since the page scan: not filled
                    continue
            try:
                policy = policies.get(image_id, batch["reverse_image_policy"])
                job, _, job_hints = create_or_reuse_job_txn(
                    orch, conn, image, mode=JobMode.EXPLICIT, policy=policy, batch_id=batch_id
                )
                job_id = job["id"] if job else None
                hints += job_hints
            except GenerationPolicyConflict as exc:
                # An active job with another policy owns the image; the item follows that job.
                job_id = uuid.UUID(str(exc.details["job_id"]))
            items.append({"batch_id": batch_id, "image_id": image_id, "scope_id": batch["scope_id"],
                          "job_id": job_id, "now": now})
        store.insert_items_txn(conn, items)
        # the batch is locked in seeding since the start of this transaction: "not matched" cannot be.
        # Once seeded, the total is the items (finish_seeding_txn): the snapshot's count also held
        # images deleted before their page and, for a fill, images that got the model meanwhile.
        if done:
            landed = store.finish_seeding_txn(conn, batch_id, cursor, now)
        else:
            landed = store.record_seeded_page_txn(conn, batch_id, cursor, batch["total"] - gone, now)
        landed.expect("the batch is locked in seeding")
    return len(items), hints, not done, True


def get_batch(orch: Orchestrator, scope_id: str, batch_id: uuid.UUID | str) -> dict:
    """SPEC §6 Batch: {id, status, total, counts, progress, created_at, completed_at}."""
    bid = _batch_uuid(batch_id)
    with orch.engine.connect() as conn:
        batch = store.batch_txn(conn, bid, scope_id)
        if batch is None:
            raise NotFound("batch not found")
        counts = store.item_counts_txn(conn, bid)
    total = batch["total"]
    terminal = sum(n for status, n in counts.items() if status not in ACTIVE_JOB_STATUSES)
    if batch["status"] == COMPLETED:  # every item ended; an image deleted since took its item along
        progress = 1.0
    else:
        progress = min(1.0, round(terminal / total, 6)) if total else 0.0
    return {
        "id": str(batch["id"]), "status": batch["status"], "total": total, "counts": counts, "progress": progress,
        "reverse_image_policy": batch["reverse_image_policy"],
        "created_at": batch["created_at"].isoformat(),
        "completed_at": batch["completed_at"].isoformat() if batch["completed_at"] else None,
    }


def cancel_batch(orch: Orchestrator, scope_id: str, batch_id: uuid.UUID | str) -> dict:
    """Stop seeding and cancel the batch's active jobs; a finished batch is returned unchanged.
    A job an item of another unfinished batch follows (that batch adopted it) is left to it.

    The batch is marked first (its progress open), its jobs are cancelled after, one transaction
    each: a cancel interrupted in between (the request killed) is finished by cancelling again — a
    cancelled batch still has its remaining active jobs cancelled (none: one query) — or by the
    next sweep, which finishes the cancel of every batch whose progress is open."""
    bid = _batch_uuid(batch_id)
    with orch.engine.begin() as conn:
        batch = store.batch_txn(conn, bid, scope_id, lock=True)
        if batch is None:
            raise NotFound("batch not found")
        if batch["status"] == COMPLETED:
            return get_batch(orch, scope_id, bid)
        if batch["status"] != CANCELLED:  # locked and not finished: seeding or running, so the cancel lands
            store.cancel_batch_txn(conn, bid, orch.now()).expect("the batch is locked unfinished")
    _cancel_active_jobs(orch, bid)
    emit_batch_progress(orch, bid, cancelled=True)  # the counts the cancel left, if not batch.cancelled's
    return get_batch(orch, scope_id, bid)


def _cancel_active_jobs(orch: Orchestrator, bid: uuid.UUID) -> None:
    """A cancelled batch's active jobs cancelled, page by page, one job per transaction; a job an
    item of another unfinished batch follows is left to it."""
    while True:  # page by page, through the same path as POST /jobs/{id}/cancel
        with orch.engine.connect() as conn:
            job_ids = store.active_batch_jobs_txn(conn, bid, CANCEL_PAGE)
        for job_id in job_ids:
            # one job per transaction, its image locked before it (the lock order of every writer): a
            # page of jobs locked together deadlocked with completions of the same jobs' tasks
            with orch.engine.begin() as conn:
                ref = jobs.image_ref_txn(conn, job_id)
                if ref is None or images.lock_image_txn(conn, ref["scope_id"], ref["image_id"]) is None:
                    continue
                # its open tasks before the job (image → tasks → job), as a claim and a failure
                # lock a task and then its job: the other order deadlocked with them (a 500)
                images.lock_open_tasks_of_image_txn(conn, ref["scope_id"], ref["image_id"])
                job = jobs.lock_job_txn(conn, job_id)
                # (checked again under the image lock: a batch seeding the image adopts its job under it)
                if job is not None and job["status"] in ACTIVE_JOB_STATUSES \
                        and not store.followed_by_other_batch_txn(conn, job_id, bid):
                    end_job_txn(orch, conn, job, JobStatus.CANCELLED, "cancelled", "the batch was cancelled")
        if len(job_ids) < CANCEL_PAGE:
            break


def continue_batches(orch: Orchestrator, errors: list[BaseException] | None = None) -> tuple[int, list[Hint]]:
    """Sweep step: seed batches still seeding, round-robin over scopes (one page of each scope's
    head batch per round, until every head is done or paused by its scope's back-pressure, or
    ``batch_sweep_pages`` pages were read); then complete running batches whose item jobs are all
    terminal.

    The page budget bounds the step where back-pressure cannot: a batch whose jobs queue nothing
    (a library already processed, a fill scan past covered images) is never paused, and seeding
    all of it in one run held the sweep — and every scope's re-hints, published after it — for as
    long as the whole library took. Heads the budget left out keep their place (least recently
    touched first) and go first next run. The heads looked at get their ``batch.progress`` turn
    (a seeding batch's items run long before its last page is in), as do the running batches.

    Bounded (``SWEEP_BATCHES`` of each kind per run), yet no batch waits on others: a paused head
    and a running batch left unfinished are touched, so the windows rotate; and the batches that
    may complete now are looked for among all running ones (``completable_batches_txn``), so a
    finished batch completes at the next sweep however many long batches run.

    Each batch's work (a page, a completion, a cancel's finishing, a progress event) runs isolated:
    one that raises is logged and appended to ``errors`` and the others go on — a head whose page
    raised at every sweep (a custom policy raising for its tenant) otherwise ended the step first,
    and no batch of any tenant was seeded behind it or completed again."""
    errors = [] if errors is None else errors

    def isolated(what: str, batch_id: uuid.UUID, fn, *args):
        try:
            return fn(*args)
        except DBAPIError as exc:
            if exc.connection_invalidated:  # the database is gone for every batch: end the step
                raise
            log.exception("batch step failed", extra={"batch_id": batch_id, "code": what})
            errors.append(exc)
            return None
        except Exception as exc:  # noqa: BLE001 - isolate the batch; the next run tries it again
            log.exception("batch step failed", extra={"batch_id": batch_id, "code": what})
            errors.append(exc)
            return None

    with orch.engine.connect() as conn:
        heads = [b["id"] for b in store.seeding_heads_txn(conn, SWEEP_BATCHES)]
    looked_at = list(heads)
    seeded, hints, budget = 0, [], orch.settings.batch_sweep_pages
    while heads and budget > 0:
        still = []
        for batch_id in heads:
            if budget <= 0:
                break
            page = isolated("seed", batch_id, _seed_page, orch, batch_id, orch.settings.batch_page_size)
            if page is None:  # raised: counted as a page read, and not seeded again this run
                budget -= 1
                continue
            n, page_hints, more, paged = page
            seeded, hints, budget = seeded + n, hints + page_hints, budget - int(paged)
            if more:
                still.append(batch_id)
        heads = still
    # a library larger than the backlog threshold stays seeding for most of its run (each page
    # waits for the backlog to drain): its items' jobs end meanwhile, so its progress is told too
    for batch_id in looked_at:
        isolated("progress", batch_id, emit_batch_progress, orch, batch_id)
    with orch.engine.connect() as conn:
        candidates = store.completable_batches_txn(conn, SWEEP_BATCHES)
        running = [b["id"] for b in store.running_batches_txn(conn, SWEEP_BATCHES)]
    for batch_id in dict.fromkeys(candidates + running):
        isolated("complete", batch_id, _complete_or_touch, orch, batch_id)
    # cancelled batches whose items follow jobs their cancel left running: told until final
    with orch.engine.connect() as conn:
        still_open = store.open_cancelled_batches_txn(conn, SWEEP_BATCHES)
    for batch_id in still_open:
        isolated("cancel", batch_id, _finish_cancel, orch, batch_id)
    return seeded, hints


def _complete_or_touch(orch: Orchestrator, batch_id: uuid.UUID) -> None:
    """A running batch whose item jobs all ended → completed (its batch.completed event: a trigger);
    otherwise touched (to the back of the sweep's window) and its progress told."""
    with orch.engine.begin() as conn:
        batch = store.batch_txn(conn, batch_id, lock=True)
        if batch is None or batch["status"] != RUNNING:
            return
        now = orch.now()
        if not store.has_active_item_jobs_txn(conn, batch_id):
            store.complete_batch_txn(conn, batch_id, now).expect("the batch is locked running")
            return
        store.touch_batch_txn(conn, batch_id, now).expect("the batch is locked running")
    emit_batch_progress(orch, batch_id)


def _finish_cancel(orch: Orchestrator, batch_id: uuid.UUID) -> None:
    """A cancelled batch still open: its active jobs cancelled (a cancel whose request died after the
    mark is finished here) and its progress told."""
    _cancel_active_jobs(orch, batch_id)
    emit_batch_progress(orch, batch_id, cancelled=True)


def _batch_uuid(value: uuid.UUID | str) -> uuid.UUID:
    parsed = parse_uuid(value)
    if parsed is None:
        raise NotFound("batch not found")
    return parsed
