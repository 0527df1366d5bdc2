"""Reconcile sweep (SPEC §4.9): bounded, index-driven steps under a Postgres advisory lock.

It never executes a stage: it re-hints, makes expired leases claimable, ends tasks whose
executions died too often, advances stuck jobs, prunes dead workers' registrations and records its
completion with the lane gauges (``sweep_state``), deletes old history in bounded batches
(retention) and ANALYZEs hot tables that outgrew their statistics. Safe with two beats.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy.engine import RowMapping
from sqlalchemy.exc import DBAPIError, OperationalError

from app import metrics
from app.db.enums import Lane
from app.orchestrator import retention
from app.orchestrator.advance import advance_job_txn
from app.orchestrator.events import prune_events
from app.orchestrator.execution import end_abandoned_txn, fail_task
from app.orchestrator.hints import Hint
from app.orchestrator.liveness import worker_ttl_s
from app.orchestrator.store import attempts, counters
from app.orchestrator.store import sweep as q
from app.orchestrator.store import workers as workers_q
from app.orchestrator.types import Claim, SweepReport
from app.orchestrator.webhooks import skip_unmatched_events
from app.stages.errors import OutcomeUnknownError, PermanentError

if TYPE_CHECKING:
    from app.orchestrator.service import Orchestrator

log = logging.getLogger(__name__)


def sweep(orch: Orchestrator) -> SweepReport:
    started = time.monotonic()
    report = SweepReport()
    with orch.engine.connect() as lock_conn:
        if not q.try_lock(lock_conn):
            lock_conn.rollback()
            report.skipped = True
            return report
        locked_at = time.time()
        lock_conn.commit()
        try:
            _run_steps(orch, report, started)
        finally:
            report.held = (locked_at, time.time())
            q.unlock(lock_conn)
            lock_conn.commit()
    metrics.SWEEP_DURATION.observe(time.monotonic() - started)
    return report


def step_error(exc: BaseException) -> str:
    """What the sweep's record (``sweep_state``, shown by the unauthenticated ``/readyz``) says of a
    failed step: the exception's class and, for a database error, its SQLSTATE — never its text,
    which may name a tenant's data (a DETAIL's clashing key, a statement's parameters); the text
    is in the log line of the failure."""
    orig = getattr(exc, "orig", None)
    sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return f"{type(exc).__name__} ({sqlstate})" if isinstance(sqlstate, str) and sqlstate else type(exc).__name__


def _run_steps(orch: Orchestrator, report: SweepReport, started: float) -> None:
    """Every step in order, each isolated: one that raises is logged, counted
    (``memeflow_sweep_step_failures_total{step}``, ``report.failed_steps``) and the next runs —
    a bug or a lock timeout in one repair must not stop the others (re-hints, webhooks, gauges).
    The sweep's record (``sweep_state``) is written last, with the steps that failed."""
    for name, step in STEPS:
        try:
            step(orch, report)
        except Exception as exc:  # noqa: BLE001 - isolate the step; the next sweep retries it
            log.exception("sweep step failed", extra={"code": name})
            _tell(report, name, exc)  # once: an item of it may have told it already (_item)
    report.counts["steps_failed"] = len(report.failed_steps)
    # DB-truth gauges, kept with the time of this completed sweep (what /metrics and /readyz read).
    # If even this fails the hints above still go out; the missing record shows as a stale sweep.
    try:
        with orch.engine.begin() as conn:
            gauges = {lane.value: {"queued": 0, "running": 0, "oldest_age": 0.0} for lane in Lane}
            for g in q.lane_gauges_txn(conn, orch.now()):
                gauges[g["lane"]] = {"queued": int(g["queued"]), "running": int(g["running"]),
                                     "oldest_age": float(g["oldest_age"] or 0)}
            q.record_sweep_txn(conn, None, time.monotonic() - started, gauges, report.failed_steps)
    except Exception as exc:  # noqa: BLE001
        log.exception("sweep step failed", extra={"code": "record"})
        metrics.SWEEP_STEP_FAILURES.labels("record").inc()
        report.failed_steps.append({"step": "record", "error": step_error(exc)})
        return
    metrics.set_lane_gauges(gauges)


def _item(report: SweepReport, step: str, repair: Callable[[], list[Hint]]) -> bool:
    """Run one item's repair within a step (its own transaction), isolated like the steps: one
    that raises is logged and told as the step's failure (once per sweep: the metric and
    ``report.failed_steps``), and the step goes on with its next item — an item nothing can repair
    (a custom policy raising for one tenant) must not leave every item behind it unrepaired at
    every sweep. False: it raised (the next sweep tries it again, where the step finds it again)."""
    try:
        report.hints += repair()
    except DBAPIError as exc:
        if exc.connection_invalidated:  # the database is gone for every item: end the step, as before
            raise
        log.exception("sweep item failed", extra={"code": step})
        _tell(report, step, exc)
        return False
    except Exception as exc:  # noqa: BLE001 - isolate the item; the next sweep retries it
        log.exception("sweep item failed", extra={"code": step})
        _tell(report, step, exc)
        return False
    return True


def _tell(report: SweepReport, step: str, exc: BaseException) -> None:
    """Record that ``step`` failed in this sweep (once: the metric and ``report.failed_steps``)."""
    if not any(f["step"] == step for f in report.failed_steps):
        metrics.SWEEP_STEP_FAILURES.labels(step).inc()
        report.failed_steps.append({"step": step, "error": step_error(exc)})


def _rehint(orch: Orchestrator, report: SweepReport) -> None:
    """1. queued and due, but the last hint is old (lost publish, broker outage, backoff over)"""
    s = orch.settings
    with orch.engine.begin() as conn:
        rehinted = q.due_for_rehint_txn(conn, orch.now(), s.rehint_grace_s, s.sweep_batch_limit)
        rows = rehinted.rows if rehinted.matched else ()  # not matched: every due task's hint is live
        counters.bump_each_txn(conn, "rehint", [r["scope_id"] for r in rows], orch.now())
    report.hints += [Hint(r["lane"], r["id"]) for r in rows]
    report.counts["rehinted"] = len(rows)
    metrics.REHINTS.labels("stale_hint").inc(len(rows))


def _expired_leases(orch: Orchestrator, report: SweepReport) -> None:
    """2. running with an expired lease: claimable again; re-hint, or end it if attempts are spent.

    A cancel-requested one nobody waits on any more is ended (``end_abandoned_txn``): no claim
    could ever take it, and left running it would stay active for dedupe (a later job of its image
    would wait on it for ever) and come back here at every grace, filling this step's LIMIT ahead of
    genuinely dead workers' tasks. Each is ended in a transaction of its own after this step's
    commit, fenced on the execution seen here (like the exhausted ones): freeing its slot and
    hinting the fairest waiter takes other rows' locks, which must not be taken while this step
    holds up to ``sweep_batch_limit`` task rows (a claim takes a task, then slots, then tasks)."""
    s = orch.settings
    with orch.engine.begin() as conn:
        expired = q.lease_expired_txn(conn, orch.now(), s.rehint_grace_s, s.sweep_batch_limit)
        rows = expired.rows if expired.matched else ()  # not matched: no expired lease to re-hint
        abandoned = [r for r in rows if r["abandon"]]
        rows = [r for r in rows if not r["abandon"]]
        counters.bump_each_txn(conn, "rehint", [r["scope_id"] for r in rows], orch.now())
        ending = []
        for r in abandoned:
            open_attempt = attempts.open_attempt_txn(conn, r["id"]) if r["lane"] == Lane.AGENT else None
            ending.append(_claim_of(r, open_attempt))
        exhausted, live = [], []
        for r in rows:
            open_attempt = (attempts.open_attempt_txn(conn, r["id"])
                            if r["lane"] == Lane.AGENT and _spent(r) else None)
            if _spent(r) and not _lookup_due(r, open_attempt):
                exhausted.append((_claim_of(r, open_attempt), r["noted_code"]))
            else:
                live.append(r)
    for claim in ending:  # not matched inside: a job took the task meanwhile (its request withdrawn)
        _item(report, "expired_leases", functools.partial(_end_abandoned, orch, claim))
    report.counts["cancelled_abandoned"] = len(abandoned)
    report.hints += [Hint(r["lane"], r["id"]) for r in live]
    report.counts["lease_expired"] = len(live)
    metrics.REHINTS.labels("lease_expired").inc(len(live))
    report.counts["exhausted"] = 0
    for claim, noted in exhausted:
        # a paid call in flight may have happened; a recall-safe one (local compute) repeated
        # nothing external, so like any stage it has spent its attempts (a poison input). The last
        # error noted on the task (the watchdog's stage_timeout, or an earlier run's retry) is kept
        # in the message: an operator sees why runs died, not only that they did.
        why = f" (last error noted: {noted})" if noted else ""
        err = (
            OutcomeUnknownError(f"the worker died during a paid call{why}", code="unknown_execution")
            if claim.attempt_id and not claim.recall_safe
            else PermanentError(f"every attempt's worker died before finishing{why}", code="max_attempts_exceeded")
        )
        if _item(report, "expired_leases", functools.partial(fail_task, orch, claim, err, lease_expired=True)):
            report.counts["exhausted"] += 1


def _end_abandoned(orch: Orchestrator, claim: Claim) -> list[Hint]:
    with orch.engine.begin() as conn:
        return end_abandoned_txn(orch, conn, claim)


def _claim_of(r: RowMapping, open_attempt: RowMapping | None) -> Claim:
    """The execution an expired-lease row (``q.lease_expired_txn``) last belonged to, as a Claim:
    what the fenced writes that end it are conditioned on."""
    return Claim(
        task_id=r["id"], scope_id=r["scope_id"], job_id=r["job_id"], image_id=r["image_id"],
        image_sha256=r["image_sha256"], stage=r["stage"], lane=r["lane"], owner=r["lease_owner"],
        generation=r["claim_generation"], attempt_count=r["attempt_count"], max_attempts=r["max_attempts"],
        payload=r["payload"], storage_key="", attempt_id=open_attempt["attempt_id"] if open_attempt else None,
        recall_safe=bool(open_attempt and open_attempt["recall_safe"]),
    )


def _spent(r: RowMapping) -> bool:
    """The task's attempts are spent by deaths of its own: the run that died held it alone. A run
    that died in a batch of several is not charged to any of them (SPEC §10): its claim is refunded
    when the task is claimed again, alone (store/tasks.py), so it is re-hinted even at max_attempts."""
    return r["attempt_count"] >= r["max_attempts"] and r["claimed_alone"]


def _lookup_due(r: RowMapping, open_attempt: RowMapping | None) -> bool:
    """The agent task's last attempt died alone with its call's outcome unread: it is re-hinted, not
    ended — one recovery claim past ``max_attempts`` (``tasks.CLAIM``, the same condition) looks the
    attempt up first (SPEC §4.5), adopting a result its provider recorded before the death. Once
    that claim was taken the count is past ``max_attempts`` and a further death ends the task here."""
    return r["lane"] == Lane.AGENT and r["attempt_count"] == r["max_attempts"] and open_attempt is not None


def _orphan_slots(orch: Orchestrator, report: SweepReport) -> None:
    """3. lane slots whose holder is gone"""
    with orch.engine.begin() as conn:
        report.counts["slots_released"] = orch.release_orphan_slots_txn(conn)


#: Rounds of ``sweep_batch_limit`` stuck jobs one sweep takes at most.
STUCK_JOB_ROUNDS = 20


def _stuck_jobs(orch: Orchestrator, report: SweepReport) -> None:
    """4. active jobs whose current stage's task finished without advancing them

    In rounds of ``sweep_batch_limit`` until one finds fewer: the next sweep's window reaches back
    only from this sweep (``stuck_jobs_txn``), so after a long beat outage every job the window
    holds now must be found now — one batch, and the rest were never seen again. A job a round
    found is not asked for again (an advance that could not move it must not fill the next)."""
    s = orch.settings
    found: list = []
    advanced = 0
    for _ in range(STUCK_JOB_ROUNDS):
        with orch.engine.begin() as conn:
            stuck = q.stuck_jobs_txn(conn, orch.now(), s.rehint_grace_s, s.sweep_batch_limit, s.sweep_lookback_s,
                                     skip=found)
        for job_id in stuck:  # one that raises is still among ``found``: not asked for again this sweep
            advanced += _item(report, "stuck_jobs", functools.partial(_advance, orch, job_id))
        found += stuck
        if len(stuck) < s.sweep_batch_limit:
            break
    report.counts["jobs_advanced"] = advanced


def _advance(orch: Orchestrator, job_id) -> list[Hint]:
    with orch.engine.begin() as conn:
        return advance_job_txn(orch, conn, job_id)


def _batches(orch: Orchestrator, report: SweepReport) -> None:
    """5. batches still seeding"""
    errors: list[BaseException] = []  # batches whose work raised: logged there, the others went on
    seeded, hints = orch.continue_batches(errors)
    report.counts["batches_seeded"] = seeded
    report.hints += hints
    if errors:
        _tell(report, "batches", errors[0])


def _serving(orch: Orchestrator, report: SweepReport) -> None:
    """5b. search serving: new scopes, model changes (backfills), cutovers (app/orchestrator/serving.py)"""
    errors: list[BaseException] = []  # scopes whose reconcile raised: logged there, the others went on
    counts, hints = orch.reconcile_serving(errors)
    report.counts.update(counts)
    report.hints += hints
    if errors:
        _tell(report, "serving", errors[0])


def _dead_workers(orch: Orchestrator, report: SweepReport) -> None:
    """6. worker registrations whose process died without a clean shutdown"""
    with orch.engine.begin() as conn:
        pruned = workers_q.prune_workers_txn(conn, worker_ttl_s(orch.settings))
        report.counts["workers_pruned"] = pruned.affected if pruned.matched else 0  # not matched: none died


def _webhooks(orch: Orchestrator, report: SweepReport) -> None:
    """8. webhook subscriptions with an event due and no live hint (filtered ones skip what they
    do not take first)"""
    skip_unmatched_events(orch)
    webhook_hints = orch.webhook_hints()
    report.hints += webhook_hints
    report.counts["webhooks_hinted"] = len(webhook_hints)


def _events(orch: Orchestrator, report: SweepReport) -> None:
    """7. events past their retention"""
    report.counts["events_pruned"] = prune_events(orch)


def _retention(orch: Orchestrator, report: SweepReport) -> None:
    """9. retention: old history, in small batches (app/orchestrator/retention.py)"""
    report.counts.update(retention.prune(orch))


#: A hot table is analyzed once the rows changed since its last analysis reach this many times
#: the rows it held then (and ``Settings.sweep_analyze_min_changes``): its size has about doubled.
ANALYZE_GROWTH = 1.0
#: How long an ANALYZE waits for autovacuum to let go of the table before the next sweep retries.
ANALYZE_LOCK_TIMEOUT_MS = 200


def _statistics(orch: Orchestrator, report: SweepReport) -> None:
    """10. planner statistics of the hot tables that grew past their last analysis.

    Prepared statements settle on generic plans, and PostgreSQL keeps a generic plan until the
    tables' statistics change. A burst into an empty database would run every upload's statements
    on plans made while the tables were tiny (whole-table scans, growing with every queued job)
    until autovacuum's first ANALYZE, up to its naptime later (docs/performance-log.md §45). This
    step analyzes such a table at the next sweep instead; autovacuum (10 % of the rows) keeps doing
    the steady-state work. A table autovacuum is busy with is left to the next sweep."""
    s = orch.settings
    analyzed = 0
    deferred: list[str] = []
    if s.sweep_analyze_min_changes > 0:
        with orch.engine.begin() as conn:
            grown = q.grown_tables_txn(conn, s.sweep_analyze_min_changes, ANALYZE_GROWTH)
        for table in grown:  # each isolated: one whose ANALYZE fails (a timeout) is told, the rest go on
            if _item(report, "statistics", functools.partial(_analyze, orch, table, deferred)):
                analyzed += table not in deferred
    report.counts["tables_analyzed"] = analyzed
    report.counts["tables_analyze_deferred"] = len(deferred)


def _analyze(orch: Orchestrator, table: str, deferred: list[str]) -> list[Hint]:
    """ANALYZE ``table``; appended to ``deferred`` if autovacuum holds it (the next sweep retries)."""
    try:
        with orch.engine.begin() as conn:
            q.analyze_table_txn(conn, table, ANALYZE_LOCK_TIMEOUT_MS)
    except OperationalError as exc:
        if getattr(getattr(exc, "orig", None), "sqlstate", None) != "55P03":  # lock_not_available
            raise
        deferred.append(table)
    return []


#: The sweep's steps in order (name → function); the cheap repairs first, the deletes last.
STEPS: list[tuple[str, Callable[[Orchestrator, SweepReport], None]]] = [
    ("rehint", _rehint),
    ("expired_leases", _expired_leases),
    ("orphan_slots", _orphan_slots),
    ("stuck_jobs", _stuck_jobs),
    ("batches", _batches),
    ("serving", _serving),
    ("dead_workers", _dead_workers),
    ("events", _events),
    ("webhooks", _webhooks),
    ("retention", _retention),
    ("statistics", _statistics),
]
