"""Leaf task execution (SPEC §4.4, §4.5): claim, heartbeat, complete, fail — all fenced."""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection, RowMapping
from sqlalchemy.exc import DataError, DBAPIError, OperationalError

from app import metrics
from app.db.enums import AttemptState, ContextStatus, JobStatus, Lane, StageStatus, TaskStatus
from app.orchestrator import fingerprints as fp
from app.orchestrator import grants, lanes, stages
from app.orchestrator.advance import advance_jobs_txn
from app.orchestrator.errors import UnstorableResult
from app.orchestrator.hints import Hint
from app.orchestrator.lanes import lane_batch_budget
from app.orchestrator.retry import decide_retry
from app.orchestrator.store import attempts, counters, images, jobs, tasks
from app.orchestrator.store._sql import InvariantBroken
from app.orchestrator.types import AgentArtifact, BatchClaim, Claim, TextArtifact, VisualArtifact
from app.stages.errors import OutcomeUnknownError, StageError

if TYPE_CHECKING:
    from app.orchestrator.service import Orchestrator

log = logging.getLogger(__name__)


def retry_on_disconnect(fn):
    """Run a worker-side transaction again once if the connection was found broken (e.g. after
    a PostgreSQL restart). Safe: a claim is conditional and every later write is fenced, so a
    transaction that did commit before the connection broke is rejected, not applied twice. Where
    that rejection would lose work, the function recognises its own commit: agent claims through
    ``_resumable_claim``, completions through ``tasks.finished_as_txn`` (docs/architecture.md)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
            log.warning("database connection lost; retrying once", extra={"code": fn.__name__})
            return fn(*args, **kwargs)

    return wrapper


#: Characters no text or jsonb column stores: NUL and UTF-16 surrogates (unpaired in a str).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
#: A stored error's message and code, at most (it is written on the task, stage, job and attempt).
ERROR_MESSAGE_MAX, ERROR_CODE_MAX = 1000, 100


def stored_error(code: Any, message: Any) -> dict[str, str]:
    """``{code, message}`` as a failure stores it: a provider's StageError carries its own text (a
    model's or library's words), so NUL and unpaired surrogates become U+FFFD and the text is cut
    to a bound — else the failure's own write was refused and raised out of the worker, leaving
    the task running to fail the same way at every lease recovery."""
    def clean(value: Any, limit: int) -> str:
        text = str(value)
        return _UNSTORABLE.sub("\ufffd", text[:limit] + ("…" if len(text) > limit else ""))
    return {"code": clean(code, ERROR_CODE_MAX), "message": clean(message, ERROR_MESSAGE_MAX)}


#: SQLSTATE class 54, program_limit_exceeded: a value past one of PostgreSQL's size limits ("string
#: is too long for tsvector", a jsonb over 255 MB, an index row too big). psycopg2 raises it as an
#: OperationalError, the class of a lost connection too, so it is told apart by its code.
PROGRAM_LIMIT_EXCEEDED = "54"


def refused_values_are_unstorable(fn):
    """Raise :class:`UnstorableResult` when the transaction failed on a value of the results that
    PostgreSQL refuses (DataError: a NUL in text, a malformed vector; a program limit: a lexical
    document past the tsvector limit) or that cannot be encoded for it (a lone surrogate); the
    transaction rolled back, so nothing of it was written."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (DataError, UnicodeEncodeError) as exc:
            raise UnstorableResult(f"a result could not be stored: {type(exc).__name__}") from exc
        except OperationalError as exc:
            code = getattr(exc.orig, "pgcode", None) or getattr(exc.orig, "sqlstate", None) or ""
            if exc.connection_invalidated or not str(code).startswith(PROGRAM_LIMIT_EXCEEDED):
                raise
            raise UnstorableResult("a result could not be stored: it passes a database limit") from exc

    return wrapper


def _claim_from_row(row: RowMapping, owner: str, attempt_id: str | None = None, recovering: bool = False,
                    recall_safe: bool = False) -> Claim:
    return Claim(
        task_id=row["id"], scope_id=row["scope_id"], job_id=row["job_id"], image_id=row["image_id"],
        image_sha256=row["image_sha256"], stage=row["stage"], lane=row["lane"], owner=owner,
        generation=row["claim_generation"], attempt_count=row["attempt_count"], max_attempts=row["max_attempts"],
        payload=row["payload"], storage_key=row["storage_key"], attempt_id=attempt_id, recovering=recovering,
        grant_id=row.get("grant_id"), recall_safe=recall_safe,
    )


class _Refused(Exception):
    """Raised inside a claim transaction when admission (lane fairness, slots) refuses the claimed
    row: leaving the ``with`` block rolls the claim back; ``_refused`` then records it."""

    def __init__(self, lane: str, resource_key: str):
        super().__init__(lane)
        self.lane, self.resource_key = lane, resource_key


def _admit_txn(orch: Orchestrator, conn: Connection, row: RowMapping) -> bool:
    """Admit a just-claimed row (lane fairness and slots), or raise ``_Refused`` (the caller's
    transaction must then roll back: it never commits a refused claim). True: a due task of the
    lane waited unhinted as it was admitted — the caller tops up (``lanes.top_up_txn``) once its
    own claims took their slots."""
    admission = lanes.acquire_slot_txn(orch, conn, row)
    if not admission.admitted:
        raise _Refused(row["lane"], row["resource_key"])
    return admission.unhinted


def _refused(orch: Orchestrator, hinted: uuid.UUID, refused: _Refused) -> list[Hint]:
    """After a refused claim rolled back: mark the hint spent, in a transaction of its own (the
    task and its group wait unhinted), then hint what a free slot would admit now
    (``lanes.hints_after_refusal``). Returns the hints to publish (all committed)."""
    with orch.engine.begin() as conn:
        lanes.refused_txn(orch, conn, hinted)
    metrics.EMPTY_CLAIMS.labels(refused.lane).inc()
    return _hints_after_refusal(orch, refused.lane, refused.resource_key)


def _hints_after_refusal(orch: Orchestrator, lane: str, resource_key: str) -> list[Hint]:
    """``lanes.hints_after_refusal``, best effort: it runs after a commit (a refusal's cleared hint,
    or a claim whose group ran out of slots, whose attempts must now run), so a database error
    here is logged and the hints are left to the sweep (SPEC §2.7) — never raised into the claim."""
    try:
        return lanes.hints_after_refusal(orch, lane, resource_key)
    except DBAPIError:
        log.warning("hints after a refusal not given; the sweep re-hints", exc_info=True, extra={"code": lane})
        return []


def _resumable_claim(orch: Orchestrator, owner: str, n: int, claim: Callable[[list[str]], list[Claim]]) -> list[Claim]:
    """Run ``claim(attempt_ids)`` — a claim transaction that starts any agent attempt under the next
    of ``attempt_ids`` — and once more if the connection was found broken, as
    ``retry_on_disconnect``; but first recognise a claim that did commit, its reply lost between
    COMMIT and the worker: the attempts started under those ids, still external_started, on tasks
    ``owner`` holds at that generation with a live lease. Those claims are returned to run: their
    paid call was never made — the attempt row says started by this owner, who holds the lease —
    so making it now keeps SPEC §4.5. A blind retry would find the tasks running, claim nothing,
    and leave them to a recovery that can prove nothing (``unknown_execution``).

    A claim that started no attempt (another lane, or an agent task recovering an interrupted
    attempt) is not recognised: its tasks wait for their lease to expire and are claimed again."""
    ids = attempts.new_attempt_ids(n)
    try:
        return claim(ids)
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        log.warning("database connection lost; looking for this claim's attempts, then retrying once",
                    extra={"code": "claim"})
    with orch.engine.begin() as conn:
        resumed = attempts.resume_started_txn(conn, ids, owner, orch.now(), orch.settings.lease_s)
        found = {r["attempt_id"]: r for r in (resumed.rows if resumed.matched else ())}
    if not found:  # not matched: nothing of the first try committed (or it started no attempt): claim again
        return claim(attempts.new_attempt_ids(n))
    log.info("claim committed before the connection broke; running it", extra={"code": "claim"})
    metrics.CLAIMS.labels(Lane.AGENT.value).inc(len(found))
    return [_claim_from_row(found[a], owner, a, recall_safe=found[a]["recall_safe"]) for a in ids if a in found]


def claim_task(orch: Orchestrator, task_id: uuid.UUID, owner: str, lane: str | None = None,
               hints_out: list[Hint] | None = None, *, recall_safe: bool = False, shared: bool = False
               ) -> Claim | None:
    """One conditional UPDATE; None means the hint was stale, a duplicate, or (with ``lane``) sent
    to the wrong lane's queue — a worker only ever runs its own lane's stage (ack and drop).
    Retried once on a broken connection (``_resumable_claim``). ``hints_out`` receives the hints
    to publish now that the claim (or its refusal) committed: the agent lane's free slots for
    tasks waiting unhinted (``lanes.top_up_txn``, ``lanes.hints_after_refusal``). ``recall_safe``:
    the claiming worker's agent may run an interrupted attempt again (recorded on the attempt it
    starts); ``shared``: as ``tasks.claim_txn``."""
    hints: list[Hint] = []
    claims = _resumable_claim(orch, owner, 1, lambda ids: _claim_task(orch, task_id, owner, lane, ids, hints,
                                                                      recall_safe, shared))
    if hints_out is not None:
        hints_out.extend(hints)
    return claims[0] if claims else None


def _claim_task(orch: Orchestrator, task_id: uuid.UUID, owner: str, lane: str | None, attempt_ids: list[str],
                hints_out: list[Hint], recall_safe: bool = False, shared: bool = False) -> list[Claim]:
    """``claim_task``'s transaction; an agent task's attempt starts under ``attempt_ids[0]``."""
    try:
        with orch.engine.begin() as conn:
            claimed = tasks.claim_txn(conn, task_id, owner, orch.now(), orch.settings.lease_s, lane, shared)
            if not claimed.matched:  # stale, duplicate or wrong-lane hint: nothing to do
                metrics.EMPTY_CLAIMS.labels("unknown").inc()
                return []
            row = claimed.row
            unhinted = _admit_txn(orch, conn, row)
            claim = (_agent_attempts_txn(orch, conn, [row], owner, attempt_ids, recall_safe)[0]
                     if row["lane"] == Lane.AGENT else _claim_from_row(row, owner))
            hints = lanes.top_up_txn(orch, conn, row["lane"], row["resource_key"]) if unhinted else []
    except _Refused as refused:
        hints_out[:] = _refused(orch, task_id, refused)
        return []
    hints_out[:] = hints  # committed: a retry after a lost connection replaces an earlier try's
    metrics.CLAIMS.labels(claim.lane).inc()
    return [claim]


@retry_on_disconnect
def claim_batch(orch: Orchestrator, lane: str, n: int, owner: str) -> list[Claim]:
    """Claim up to ``n`` due tasks of a batched lane within its batch budget (at least one); each
    keeps its own fencing token."""
    if lane == Lane.AGENT:
        raise ValueError("the agent lane is claimed one task at a time (attempt protocol, lane slots)")
    with orch.engine.begin() as conn:
        tasks.generic_plans_txn(conn)
        rows = tasks.claim_batch_txn(conn, lane, n, owner, orch.now(), orch.settings.lease_s,
                                     budget=lane_batch_budget(orch.settings, lane)).rows  # none due: empty
    if rows:
        metrics.CLAIMS.labels(lane).inc(len(rows))
    return [_claim_from_row(r, owner) for r in rows]


@retry_on_disconnect
def claim_with_batch(orch: Orchestrator, task_id: uuid.UUID, lane: str, n: int, owner: str,
                     shared: bool = False) -> BatchClaim:
    """Claim the hinted task and its wake-up group, then up to ``n`` in all with other due tasks of
    its batched lane, in one transaction — as far as the lane's batch budget allows (decoded
    pixels, document characters: ``lanes.lane_batch_budget``), and at least the hinted task.

    Only a live hint drains a batch: a stale, duplicate, wrong-lane or unknown id whose group has
    nothing queued claims nothing (the message is acked and changes nothing); every queued task
    is named by a hint of its own or its group's — group members left out for lack of budget by a
    new hint naming the group, returned to publish right away. The hinted task is locked first
    (waiting for a task joining its group to commit), so the group claim sees every member that
    joined. A hinted task whose lease lapsed (its worker died) is claimed alone, its group left
    to a new hint: whatever killed the worker (a poisoned input) kills no other task's run again,
    and a task is charged only for a death in a run of its own (SPEC §10; store/tasks.py).

    ``shared``: the claimer's process runs claims side by side (a threads pool), so none of these
    is a run alone; a dead task (``BatchClaim.died``) is then marked alone by ``run_alone`` once its
    process holds every other thread off.
    """
    if lane == Lane.AGENT:
        raise ValueError("the agent lane claims through claim_agent_batch (attempts, lane slots)")
    budget = lane_batch_budget(orch.settings, lane)
    try:
        return _claim_with_batch(orch, task_id, lane, n, owner, budget, shared)
    except OperationalError as exc:
        if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
            raise
        # the hinted task's holder (a writer joining its group, seeding a batch page on a loaded
        # box) outlasted lock_timeout: this transaction claimed nothing and rolled back — wake the
        # lane again for the same task instead of failing the hint (the sweep would also recover it)
        metrics.CLAIM_LOCK_TIMEOUTS.labels(lane).inc()
        log.warning("hinted task still locked after lock_timeout; hinting it again",
                    extra={"task_id": str(task_id), "lane": lane})
        return BatchClaim([], [Hint(lane, task_id)])


LOCK_NOT_AVAILABLE = "55P03"  # SQLSTATE lock_not_available: lock_timeout expired


def _claim_with_batch(orch: Orchestrator, task_id: uuid.UUID, lane: str, n: int, owner: str, budget: int,
                      shared: bool) -> BatchClaim:
    """``claim_with_batch``'s one transaction (its docstring)."""
    with orch.engine.begin() as conn:
        tasks.generic_plans_txn(conn)
        # not matched (the hinted task is running, finished or unknown): its queued members may
        # still be due — the group claim below decides
        tasks.lock_hinted_txn(conn, task_id, lane)
        now = orch.now()  # after the wait: a member that joined meanwhile is due by now
        group, left_out = tasks.claim_group_txn(conn, task_id, lane, owner, now, orch.settings.lease_s, budget=budget,
                                                shared=shared)
        rows = list(group.rows)
        # a task whose run died is claimed alone (no fill): the death may be its own (SPEC §10)
        died = any(r["died"] for r in rows)
        if group.matched:  # fill fairly; the group's scope counts as served even when nothing is left to fill
            used = sum(r["batch_cost"] for r in rows)
            room = n - len(rows) if not left_out and not died and used < budget else 0
            rows += tasks.claim_batch_txn(conn, lane, max(0, room), owner, now, orch.settings.lease_s,
                                          budget=max(0, budget - used), at_least_one=False,
                                          served=sorted({r["scope_id"] for r in rows}),
                                          with_ids=[r["id"] for r in rows], shared=shared).rows  # none: batch of the group
        # not matched: a stale, duplicate, wrong-lane or unknown hint — it claims nothing
    if rows:
        metrics.CLAIMS.labels(lane).inc(len(rows))
    else:
        metrics.EMPTY_CLAIMS.labels(lane).inc()
    return BatchClaim([_claim_from_row(r, owner) for r in rows], [Hint(lane, task_id)] if left_out else [], died)


@retry_on_disconnect
def run_alone(orch: Orchestrator, claim: Claim) -> bool:
    """Mark ``claim``'s execution as running alone in its process (``tasks.run_alone_txn``): from now
    on a death of its process is charged to it. False: fenced out (counted) — do not run it."""
    with orch.engine.begin() as conn:
        if tasks.run_alone_txn(conn, claim.task_id, claim.owner, claim.generation, orch.now()).matched:
            return True
        rejected_txn(orch, conn, claim, "run_alone")  # lease lost and re-claimed, or finished
    return False


def claim_agent_batch(orch: Orchestrator, task_id: uuid.UUID, n: int, owner: str,
                      hints_out: list[Hint] | None = None, *, recall_safe: bool = False, shared: bool = False
                      ) -> list[Claim]:
    """The agent lane's claim for a hint: the hinted task — or, when it is no longer claimable, one
    due member of its wake-up group — through the full admission (fairness, slots; refused →
    nothing, as ``claim_task``), then up to ``n - 1`` more of the group while free slots last.
    A hinted task whose previous run died (an attempt still external_started) is claimed alone.
    Each claim commits its external_started attempt in this transaction, recording ``recall_safe``
    (the claiming worker's agent: ``app.stages.base.is_recall_safe``). ``shared``: the calls run
    beside others in one process (``tasks.claim_txn``). Retried once on a broken connection,
    recognising its own committed claims (``_resumable_claim``). ``hints_out`` receives the hints
    to publish now that the claim (or its refusal) committed: free slots for tasks waiting
    unhinted (``lanes.top_up_txn``, ``lanes.hints_after_refusal``)."""
    hints: list[Hint] = []
    claims = _resumable_claim(orch, owner, n, lambda ids: _claim_agent_batch(orch, task_id, n, owner, ids, hints,
                                                                            recall_safe, shared))
    if hints_out is not None:
        hints_out.extend(hints)
    return claims


def _claim_agent_batch(orch: Orchestrator, task_id: uuid.UUID, n: int, owner: str, attempt_ids: list[str],
                       hints_out: list[Hint], recall_safe: bool = False, shared: bool = False) -> list[Claim]:
    """``claim_agent_batch``'s transaction; the attempts start under ``attempt_ids``."""
    now, lease_s = orch.now(), orch.settings.lease_s
    left = False
    try:
        with orch.engine.begin() as conn:
            # the group claims' generic plans (tasks.generic_plans_txn) only where one runs: a hint
            # whose task is claimable (a local agent's batch of 1) pays no SET for them
            claimed = tasks.claim_txn(conn, task_id, owner, now, lease_s, Lane.AGENT, shared)
            # not matched: the hinted task was taken — one due member of its group instead, if any
            generic = not claimed.matched
            if generic:
                tasks.generic_plans_txn(conn)
            row = claimed.row if claimed.matched else (
                tasks.claim_group_members_txn(conn, task_id, Lane.AGENT, 1, owner, now, lease_s, shared).row
            )
            if row is None:  # neither matched — stale or duplicate hint, group drained: nothing to do
                metrics.EMPTY_CLAIMS.labels("unknown").inc()
                return []
            unhinted = _admit_txn(orch, conn, row)
            group = task_id if row["id"] == task_id else row["hint_group"]
            # a run that died (its attempt still open) is recovered alone: if it runs again, a death
            # then is its own (SPEC §10) — its group's members wait for a hint of their own
            alone = n == 1 or _open_attempt_txn(conn, row) is not None
            if not alone and not generic:
                tasks.generic_plans_txn(conn)
            members, left = (([], False) if alone
                             else lanes.claim_group_txn(orch, conn, group, row, n - 1, owner, shared))
            rows = [row] + members
            claims = _agent_attempts_txn(orch, conn, rows, owner, attempt_ids, recall_safe)
            # after this claim's slots were taken: the free ones left go to tasks waiting unhinted
            hints = lanes.top_up_txn(orch, conn, Lane.AGENT, row["resource_key"]) if unhinted and not left else []
    except _Refused as refused:
        hints_out[:] = _refused(orch, task_id, refused)
        return []
    if left:  # members left unhinted for want of a slot: as after a refusal, settle a release in flight
        hints += _hints_after_refusal(orch, Lane.AGENT, row["resource_key"])
    hints_out[:] = hints  # committed: a retry after a lost connection replaces an earlier try's
    metrics.CLAIMS.labels(Lane.AGENT.value).inc(len(claims))
    return claims


def _open_attempt_txn(conn: Connection, row: RowMapping) -> RowMapping | None:
    """The claimed task's attempt still external_started, if an earlier run died in it. A first
    execution (generation 1) cannot have one: the happy path skips the lookup. (Not the attempt
    count: a run that died beside others is re-claimed without charge, ``tasks.CLAIM``.)"""
    return attempts.open_attempt_txn(conn, row["id"]) if row["claim_generation"] > 1 else None


def _agent_attempts_txn(
    orch: Orchestrator, conn: Connection, rows: list[RowMapping], owner: str, attempt_ids: list[str],
    recall_safe: bool = False,
) -> list[Claim]:
    """Commit an external_started attempt with each claim (one statement for all), under the next
    of ``attempt_ids`` — or surface an interrupted one to recover (with its own ``recall_safe``:
    the provider that started it decides, whatever this worker's is)."""
    recovering: dict[uuid.UUID, Claim] = {}
    for row in rows:
        open_attempt = _open_attempt_txn(conn, row)
        if open_attempt is not None:
            recovering[row["id"]] = _claim_from_row(row, owner, open_attempt["attempt_id"], recovering=True,
                                                    recall_safe=open_attempt["recall_safe"])
    fresh = [r for r in rows if r["id"] not in recovering]
    started = attempts.start_attempts_txn(conn, [
        {"scope_id": r["scope_id"], "task_id": r["id"], "generation": r["claim_generation"],
         "input_digest": r["input_fingerprint"], "target_sha256": r["image_sha256"], "recall_safe": recall_safe}
        for r in fresh
    ], attempt_ids, orch.now())
    new = {r["id"]: _claim_from_row(r, owner, a, recall_safe=recall_safe) for r, a in zip(fresh, started, strict=True)}
    return [recovering.get(r["id"]) or new[r["id"]] for r in rows]


def restart_attempt(orch: Orchestrator, claim: Claim, recall_safe: bool) -> Claim | None:
    """A recovering claim whose interrupted attempt is recall-safe and whose lookup found no result:
    in one fenced transaction, mark the execution as running alone (``tasks.run_alone_txn``: a death
    from now on is charged to this task), end the interrupted attempt ``failed`` with
    ``worker_died`` (its provider repeats no external effect, so nothing is left unprovable) and
    start a fresh external_started attempt (``recall_safe``: this worker's agent) — the claim to
    run now, under the same task, generation and grant (SPEC §4.6: a retry reuses the grant).
    None: fenced out (counted) — the task is no longer this claim's; nothing was written.

    Not retried on a broken connection: a lost COMMIT reply would start a second attempt; instead
    the error ends the hint and the lease recovery finds the attempt this one committed, if any."""
    assert claim.recovering and claim.attempt_id and claim.recall_safe
    now = orch.now()
    err = {"code": "worker_died",
           "message": "the worker died during this local call; it had no external effect and runs again"}
    with orch.engine.begin() as conn:
        if not tasks.run_alone_txn(conn, claim.task_id, claim.owner, claim.generation, now).matched:
            rejected_txn(orch, conn, claim, "restart_attempt")  # lease lost and re-claimed, or finished
            return None
        interrupted = attempts.open_attempt_txn(conn, claim.task_id)
        if interrupted is None or interrupted["attempt_id"] != claim.attempt_id:
            # the claim read it open, and only this task's execution (fenced above) closes it
            raise InvariantBroken(f"attempt {claim.attempt_id} of a recovering claim is no longer open")
        # the watchdog's stage_timeout, when it ended the worker, says more than "died"
        attempts.finish_attempt_txn(conn, claim.attempt_id, claim.task_id, AttemptState.FAILED, now,
                                    error=interrupted["error"] or err).expect(
            "the attempt was read external_started, row locked")
        [attempt_id] = attempts.start_attempts_txn(conn, [
            {"scope_id": claim.scope_id, "task_id": claim.task_id, "generation": claim.generation,
             "input_digest": interrupted["input_digest"], "target_sha256": interrupted["target_sha256"],
             "recall_safe": recall_safe},
        ], attempts.new_attempt_ids(1), now)
    log.info("interrupted recall-safe attempt runs again", extra={
        "task_id": claim.task_id, "job_id": claim.job_id, "scope_id": claim.scope_id, "stage": claim.stage,
        "generation": claim.generation, "code": claim.attempt_id})
    return dataclasses.replace(claim, attempt_id=attempt_id, recovering=False, recall_safe=recall_safe)


def note_overrun(orch: Orchestrator, claims: list[Claim], error: dict) -> None:
    """The watchdog's note, before it ends the worker, that ``claims``' provider call ran past its
    maximum: ``error`` on each task (still running: its lease lapses, the recovery takes it) and on
    its open agent attempt — in one transaction, fenced; a claim fenced out is counted, not noted."""
    now = orch.now()
    with orch.engine.begin() as conn:
        for claim in claims:
            if not tasks.note_overrun_txn(conn, claim.task_id, claim.owner, claim.generation, now, error).matched:
                rejected_txn(orch, conn, claim, "note_overrun")
                continue
            # the task's open attempt, not the claim's: a recovery may have started a fresh one since
            # (``restart_attempt``), and the task's fence above makes whichever is open this execution's
            open_attempt = attempts.open_attempt_txn(conn, claim.task_id) if claim.lane == Lane.AGENT else None
            if open_attempt is not None:
                attempts.note_attempt_error_txn(conn, open_attempt["attempt_id"], claim.task_id, now, error)


@retry_on_disconnect
def heartbeat(orch: Orchestrator, claim: Claim) -> bool:
    """Extend the lease. False = stop: fenced out, or cancellation requested."""
    with orch.engine.begin() as conn:
        beat = tasks.heartbeat_txn(conn, claim.task_id, claim.owner, claim.generation, orch.now(),
                                   orch.settings.lease_s)
        if not beat.matched:  # fenced out: lease lost, re-claimed or finished
            rejected_txn(orch, conn, claim, "heartbeat")
            return False
        lanes.extend_slot_txn(orch, conn, claim)
    return not beat.row["cancel_requested"]


def rejected_txn(orch: Orchestrator, conn: Connection, claim: Claim, operation: str) -> None:
    """Count a fencing rejection of ``claim`` (metric, counter, log) in the caller's transaction."""
    metrics.FENCING_REJECTIONS.labels(operation).inc()
    counters.bump_txn(conn, "fencing_rejection", claim.scope_id, orch.now())
    log.warning(
        "fencing rejection",
        extra={"task_id": claim.task_id, "job_id": claim.job_id, "scope_id": claim.scope_id, "stage": claim.stage,
               "generation": claim.generation, "owner": claim.owner, "code": operation},
    )


@retry_on_disconnect
@refused_values_are_unstorable
def complete_tasks(orch: Orchestrator, results: list[tuple[Claim, Any]], landed_out: list[Claim] | None = None) -> list[Hint]:
    """Fenced completion of several claims of one lane in one transaction, set-based. ``landed_out``
    receives, once the transaction committed, the claims whose completion landed (not fenced out).

    Each claim is fenced on its own: a rejected one (lease lost, re-claimed) writes nothing but its
    rejection count, and the others still land. Images are locked in id order, once, before any
    job — the lock order every writer follows. One statement finishes every task with the stages
    waiting on it, one writes the embeddings, and the jobs advance together (``advance_jobs_txn``).
    A value PostgreSQL refuses rolls the whole transaction back: :class:`UnstorableResult` (the
    worker then completes the claims one by one, ``app.worker.run.complete_isolated``).
    """
    if not results:
        return []
    lane = results[0][0].lane
    assert all(c.lane == lane for c, _ in results), "a completion batch is one lane"
    ordered = sorted(results, key=lambda r: r[0].image_id)
    now = orch.now()
    with orch.engine.begin() as conn:
        # every statement below reaches its rows by id (tests/db/test_batch_plans.py checks their
        # generic plans on a big history): planning the job facts read, the image lock and the
        # context write per call cost ≈ 1.1 ms of PostgreSQL CPU per completion (performance-log.md §36)
        tasks.generic_plans_txn(conn)
        locked = images.lock_images_txn(
            conn, sorted({c.image_id for c, _ in results}), share=lane != Lane.AGENT
        )
        stale: dict[uuid.UUID, str | None] = {}
        rows = []
        for claim, artifact in ordered:
            image = locked.get(claim.image_id)
            if image is not None and image["scope_id"] != claim.scope_id:
                image = None
            reason = stale[claim.task_id] = _stale_reason(claim, image, artifact)
            rows.append({
                "id": claim.task_id, "owner": claim.owner, "gen": claim.generation,
                "st": TaskStatus.CANCELLED.value if reason else TaskStatus.SUCCEEDED.value,
                "sst": StageStatus.QUEUED.value if reason else StageStatus.SUCCEEDED.value,
                "err": {"code": reason, "message": "the target changed while the task ran"} if reason else None,
                "res": None if reason else _result_summary(artifact),
            })
        finished = dict(tasks.finish_many_txn(conn, rows, now).rows)  # a claim missing from it: fenced out…
        # …unless this completion already landed: its COMMIT's reply was lost and retry_on_disconnect
        # runs it again (only then can a claim's own execution be finished exactly so)
        missed = [r for r in rows if r["id"] not in finished]
        already = dict(tasks.finished_as_txn(conn, missed)) if missed else {}
        landed, relanded, fenced = [], [], []
        for claim, artifact in ordered:
            if claim.task_id in finished:
                landed.append((claim, artifact))
            elif claim.task_id in already:
                relanded.append(claim)
            else:
                fenced.append(claim)
        # counted per scope (one ops_counters row each): rows taken in scope order, never in the
        # claims' image order — two completions mixing the same scopes would deadlock on them
        for claim in sorted(fenced, key=lambda c: c.scope_id):
            rejected_txn(orch, conn, claim, "complete")
        stages.write_artifacts_txn(conn, [(c, a) for c, a in landed if not stale[c.task_id]])
        paid = [(c, a) for c, a in landed if isinstance(a, AgentArtifact)]
        locked.update(_write_agent_results_txn(orch, conn, [
            (c, a) for c, a in paid if not stale[c.task_id] and not _human_edit_kept(c, locked, finished)
        ], locked))
        # every call that answered closes its attempt and commits its grant, a stale one too: it ran
        # (and is billed) though its answer describes bytes the image no longer has
        _close_paid_txn(orch, conn, paid, [c for c, _ in landed])
        hints = advance_jobs_txn(orch, conn, [
            (job_id, locked.get(claim.image_id)) for claim, _ in landed for job_id in finished[claim.task_id]
        ])
        hints += lanes.next_fair_hints_txn(orch, conn, results[0][0], len(landed))
        hints += _rehint_relanded_txn(orch, conn, [j for c in relanded for j in already[c.task_id]])
    for claim in [c for c, _ in landed] + relanded:
        metrics.COMPLETIONS.labels(claim.lane, "stale" if stale[claim.task_id] else "succeeded").inc()
    if landed_out is not None:
        landed_out.extend([c for c, _ in landed] + relanded)
    return hints


def _rehint_relanded_txn(orch: Orchestrator, conn: Connection, job_ids: list[uuid.UUID]) -> list[Hint]:
    """The hints a completion whose reply was lost would have returned, as far as they can be
    derived: the due queued tasks its jobs' open stages wait on (one per wake-up group whose
    leader is among them). Hints of the lane's fairness for the slots it freed cannot be told
    apart: the sweep re-hints those once their grace passes."""
    rows = tasks.hint_queued_of_jobs_txn(conn, job_ids, orch.now())
    ids = {r["id"] for r in rows}
    return [Hint(r["lane"], r["id"]) for r in rows if r["hint_group"] not in ids]


def _stale_reason(claim: Claim, image: RowMapping | None, artifact: Any) -> str | None:
    if image is None or image["sha256"] != claim.image_sha256:
        return "target_changed"
    if isinstance(artifact, TextArtifact) and image["metadata_hash"] != artifact.metadata_hash:
        return "context_changed"
    return None


def _human_edit_kept(claim: Claim, locked: dict, finished: dict) -> bool:
    """Whether an agent answer must not be written because a human edited the context after its
    job ended: no open stage waited on the task (its job was cancelled or superseded while the
    call ran, so ``PATCH`` was allowed) and the context is ``edited``. While an agent stage is in
    progress a PATCH is refused (409), so an edit seen with a stage still waiting predates the
    task (a forced rerun), whose answer replaces it as asked."""
    image = locked.get(claim.image_id)
    return (not finished.get(claim.task_id) and image is not None
            and image["context_status"] == ContextStatus.EDITED)


def _result_summary(artifact: Any) -> dict:
    if isinstance(artifact, (VisualArtifact, TextArtifact)):
        return {"model": artifact.model, "dims": artifact.dims}
    if isinstance(artifact, AgentArtifact):
        return {"model": artifact.model, "attempt_id": artifact.attempt_id}
    return {}


def _write_agent_results_txn(
    orch: Orchestrator, conn: Connection, results: list[tuple[Claim, AgentArtifact]], locked: dict
) -> dict[uuid.UUID, RowMapping]:
    """Write the agents' contexts onto their images, close the attempts and commit the grants —
    one statement each for the whole batch; returns the image rows as they are now."""
    if not results:
        return {}
    now = orch.now()
    contexts = []
    for claim, artifact in results:
        provenance = {
            "task_id": str(claim.task_id), "attempt_id": artifact.attempt_id, "model": artifact.model,
            "agent_config_hash": claim.payload["agent_config_hash"],
            "reverse_image_policy": claim.payload["reverse_image_policy"], "image_sha256": claim.image_sha256,
            "request_id": artifact.request_id,
        }
        contexts.append({
            "id": claim.image_id, "sha": claim.image_sha256, "context": artifact.context, "provenance": provenance,
            "metadata_hash": fp.metadata_hash(locked[claim.image_id]["display_name"], artifact.context),
            "display_name": locked[claim.image_id]["display_name"],
        })
    # an image missing from the written rows changed its bytes under the lock: impossible, since
    # the caller locked them FOR UPDATE and checked the sha (stale claims are not passed here)
    return {r["id"]: r for r in images.write_agent_contexts_txn(conn, contexts, now).rows}


def _close_paid_txn(orch: Orchestrator, conn: Connection, results: list[tuple[Claim, AgentArtifact]],
                    landed: list[Claim]) -> None:
    """Close the attempts of ``results`` (the agents' answers, stale ones too), commit their grants and free
    the slots of every ``landed`` claim: one statement with the built-in policies
    (``attempts.close_paid_many_txn``), a custom policy's own ``commit`` per grant otherwise."""
    if not results:
        lanes.release_slots_txn(orch, conn, landed)
        return
    now = orch.now()
    # not matched cannot be: each attempt is external_started until this fenced completion closes it
    closing = [{"attempt_id": a.attempt_id, "task_id": c.task_id, "result": {"context": a.context, "model": a.model},
                "request_id": a.request_id} for c, a in results]
    if not grants.builtin_commit(orch):
        attempts.complete_many_txn(conn, closing, now)
        grants.commit_grants_txn(orch, conn, [c for c, _ in results])
        lanes.release_slots_txn(orch, conn, landed)
        return
    attempts.close_paid_many_txn(conn, closing, grants.grant_ids_txn(conn, [c for c, _ in results]),
                                 lanes.slot_holders(landed), now)


#: How long after a retried task's ``available_at`` its delayed hint is delivered: a hint delivered
#: a hair early (an eta's float rounding in the broker's timer) would find its task not yet due and
#: be spent, leaving the task to the sweep.
DELAYED_HINT_SLACK = timedelta(milliseconds=10)


def _delayed_hint_at(orch: Orchestrator, available_at: datetime | None, now: datetime) -> datetime | None:
    """When a retry due at ``available_at`` is hinted: at that moment if it comes within
    ``Settings.delayed_hint_max_s``; None beyond (or turned off): the sweep hints it once due."""
    limit = orch.settings.delayed_hint_max_s
    if available_at is None or limit <= 0 or available_at - now > timedelta(seconds=limit):
        return None
    return available_at


@retry_on_disconnect
def fail_task(orch: Orchestrator, claim: Claim, error: StageError, *, lease_expired: bool = False) -> list[Hint]:
    """Retryable → queued again after backoff; permanent, exhausted or unknown → failed with its code.

    A retry returns, besides the freed slot's hints, a *delayed hint* for the task itself, due when
    its backoff ends (``Hint.eta``; the task is marked hinted as of then): it runs when it becomes
    due, not at the next sweep. A backoff longer than ``Settings.delayed_hint_max_s`` gets none
    and is left unhinted for the sweep.

    ``lease_expired``: the sweep ends the execution for a worker it believes dead — only while its
    lease is still expired (``tasks.lock_expired_lease_txn``); a worker that renewed it meanwhile
    keeps its execution."""
    now = orch.now()
    decision = decide_retry(
        error, attempt=claim.attempt_count, max_attempts=claim.max_attempts, now=now,
        base_s=orch.settings.backoff_base_s, max_s=orch.settings.backoff_max_s, rand=orch.rand,
        # a recall-safe agent's call repeats no external effect: its errors retry like any stage's
        paid_call=claim.attempt_id is not None and not claim.recall_safe,
    )
    err = stored_error(decision.code or error.code, error.message)
    hint_at = _delayed_hint_at(orch, decision.available_at, now) if decision.retry else None
    with orch.engine.begin() as conn:
        if lease_expired and not tasks.lock_expired_lease_txn(
            conn, claim.task_id, claim.owner, claim.generation, now,
        ).matched:  # renewed by its (live) worker, finished, or claimed again since the sweep read it
            log.info("lease no longer expired; not ended",
                     extra={"task_id": claim.task_id, "generation": claim.generation})
            return []
        # a retry of a task whose job ended while it ran (cancel requested, no job waits on it): it
        # ends cancelled, as abandon_task records a stop — requeued, no claim could ever take it
        cancelled = decision.retry and tasks.end_cancel_requested_txn(
            conn, claim.task_id, claim.owner, claim.generation, now,
            stored_error("cancelled", f"cancelled while it ran; not retried after: {err['message']}"),
        ).matched  # not matched: fenced out (seen below), not cancelled, or a job waits on it — requeue
        if not cancelled:
            if decision.retry:
                done = tasks.requeue_fenced_txn(conn, claim.task_id, claim.owner, claim.generation, now,
                                                decision.available_at, err, hinted_at=hint_at)
            else:
                done = tasks.finish_fenced_txn(conn, claim.task_id, claim.owner, claim.generation, now,
                                               status=TaskStatus.FAILED, error=err)
            if not done.matched:  # fenced out: nothing was written; count the rejection
                rejected_txn(orch, conn, claim, "fail")
                return []
        if claim.attempt_id:
            state = AttemptState.UNKNOWN_EXECUTION if decision.unknown else AttemptState.FAILED
            if not attempts.finish_attempt_txn(conn, claim.attempt_id, claim.task_id, state, now, error=err).matched:
                log.warning("attempt already closed", extra={"task_id": claim.task_id, "code": claim.attempt_id})
        lanes.release_slot_txn(orch, conn, claim)
        hints: list[Hint] = []
        if cancelled:
            grants.release_if_unattempted_txn(orch, conn, claim.task_id)
            hints = lanes.next_fair_hints_txn(orch, conn, claim)
        elif decision.retry:
            # not matched: no stage waits on the task any more (its job ended meanwhile) — nothing to do
            jobs.requeue_stages_of_task_txn(conn, claim.task_id, err, decision.available_at, claim.attempt_count, now)
            # its slot is free now: the fairest waiting task takes it (the requeued task itself is
            # not due before its backoff ends, so it is not among them)
            hints = lanes.next_fair_hints_txn(orch, conn, claim)
            if hint_at is not None:  # the requeued task's own wake-up, when its backoff ends
                hints.append(Hint(claim.lane, claim.task_id, eta=hint_at + DELAYED_HINT_SLACK))
        else:
            stage_status = StageStatus.UNKNOWN_EXECUTION if decision.unknown else StageStatus.FAILED
            job_status = JobStatus.UNKNOWN_EXECUTION if decision.unknown else JobStatus.FAILED
            if decision.unknown:
                grants.mark_grant_unknown_txn(orch, conn, claim)
            ended = jobs.end_stages_of_task_txn(conn, claim.task_id, stage_status, err, claim.attempt_count, now)
            for job_id in ended.rows:  # not matched: no stage waited on it (its job ended) — no job to end
                if not jobs.end_job_txn(conn, job_id, job_status, err, now).matched:
                    log.info("job already ended", extra={"job_id": job_id, "task_id": claim.task_id})
            hints = lanes.next_fair_hints_txn(orch, conn, claim)
    metrics.COMPLETIONS.labels(
        claim.lane, "abandoned" if cancelled else "retry" if decision.retry else decision.code or "failed").inc()
    log.info("task failed", extra={"task_id": claim.task_id, "job_id": claim.job_id, "scope_id": claim.scope_id,
                                   "stage": claim.stage, "generation": claim.generation, "code": err["code"]})
    return hints


def mark_unknown_execution(orch: Orchestrator, claim: Claim) -> list[Hint]:
    """Recovery could not prove what an interrupted paid call did: end honestly, never re-call.
    (A recall-safe attempt is not ended so: it runs again, ``restart_attempt``.)"""
    return fail_task(
        orch, claim,
        OutcomeUnknownError(f"attempt {claim.attempt_id} was interrupted and its outcome cannot be proven",
                            code="unknown_execution"),
    )


def end_abandoned_txn(orch: Orchestrator, conn: Connection, claim: Claim) -> list[Hint]:
    """The sweep, in a transaction of its own after its pick committed: end a cancel-requested task
    whose lease expired and that no open stage waited on — no claim can ever take it, so its dead
    worker's execution would stay ``running`` (and active for dedupe) forever. Fenced on the
    execution the pick saw, still cancel-requested and expired: a job that took the task meanwhile
    withdrew the request, and then nothing is ended.

    Recorded as ``abandon_task`` records a worker's stop, but honestly for a death: an agent
    attempt still open had its paid call in flight with an outcome no one can prove, so it ends
    ``unknown_execution`` and its grant stays counted (``unknown``), never released nor called
    again (SPEC §4.5); a recall-safe attempt (no external effect) ends ``failed`` exactly as
    ``abandon_task`` ends one; a task that never attempted gives its grant back. The freed slot goes to
    the fairest waiting task. ``claim`` carries the execution the sweep saw (owner, generation)
    and its open attempt, if any. Returns the hints to publish after commit."""
    now = orch.now()
    if not tasks.end_abandoned_txn(conn, claim.task_id, claim.owner, claim.generation, now).matched:
        # not matched: that execution is no longer the task's, or a job took it meanwhile (request
        # withdrawn) — nothing of it to end
        log.info("abandoned task not ended", extra={"task_id": claim.task_id, "generation": claim.generation})
        return []
    if claim.attempt_id and claim.recall_safe:  # nothing external happened: recorded as abandon_task records a stop
        err = {"code": "worker_died", "message": "the worker died during a local call of a cancelled task"}
        if not attempts.finish_attempt_txn(conn, claim.attempt_id, claim.task_id, AttemptState.FAILED,
                                           now, error=err).matched:
            log.warning("attempt already closed", extra={"task_id": claim.task_id, "code": claim.attempt_id})
        grants.release_if_unattempted_txn(orch, conn, claim.task_id)
    elif claim.attempt_id:
        err = {"code": "unknown_execution", "message": "the worker died during a paid call of a cancelled task"}
        if not attempts.finish_attempt_txn(conn, claim.attempt_id, claim.task_id, AttemptState.UNKNOWN_EXECUTION,
                                           now, error=err).matched:
            log.warning("attempt already closed", extra={"task_id": claim.task_id, "code": claim.attempt_id})
        grants.mark_grant_unknown_txn(orch, conn, claim)
    else:
        grants.release_if_unattempted_txn(orch, conn, claim.task_id)
    lanes.release_slot_txn(orch, conn, claim)
    metrics.COMPLETIONS.labels(claim.lane, "abandoned").inc()
    log.info("cancelled task of a dead worker ended",
             extra={"task_id": claim.task_id, "job_id": claim.job_id, "scope_id": claim.scope_id,
                    "stage": claim.stage, "generation": claim.generation, "code": "cancelled"})
    return lanes.next_fair_hints_txn(orch, conn, claim)


@retry_on_disconnect
def abandon_task(orch: Orchestrator, claim: Claim, reason: str = "cancelled") -> list[Hint]:
    """The worker stopped on a cancel request: record it (fenced) and free the slot, handed to the
    fairest waiting task as every slot release is. Returns the hints to publish after commit."""
    with orch.engine.begin() as conn:
        done = tasks.finish_fenced_txn(conn, claim.task_id, claim.owner, claim.generation, orch.now(),
                                       status=TaskStatus.CANCELLED, error={"code": reason, "message": reason})
        if not done.matched:  # fenced out: someone else owns the task now, and it holds no slot of ours
            return []
        if claim.attempt_id:
            closed = attempts.finish_attempt_txn(conn, claim.attempt_id, claim.task_id, AttemptState.FAILED,
                                                 orch.now(), error={"code": reason, "message": reason})
            if not closed.matched:
                log.warning("attempt already closed", extra={"task_id": claim.task_id, "code": claim.attempt_id})
        lanes.release_slot_txn(orch, conn, claim)
        grants.release_if_unattempted_txn(orch, conn, claim.task_id)
        return lanes.next_fair_hints_txn(orch, conn, claim)
