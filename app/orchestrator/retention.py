"""Retention, a step of the reconcile sweep (River's job cleaner, Oban's pruner): history older
than its configured age (``MEMEFLOW_RETENTION_*_S``; 0 = kept forever) is deleted in small
batches — each step of a kind's walk reads about ``retention_scan_rows`` rows (the heap pages
that hold that many, in physical order) and deletes at most
``retention_batch_size`` of them in its own short transaction, at most ``retention_max_batches``
steps per kind per sweep — so a sweep's cost is bounded whatever the history, and a large backlog
drains over successive sweeps.

Operation grants go after ``MEMEFLOW_RETENTION_GRANTS_S`` (at least a day, the quota's window);
ended batches, their items first, after ``MEMEFLOW_RETENTION_JOBS_S``, as their jobs do.

What is never deleted, and each statement, is in app/orchestrator/store/retention.py. Embeddings
of models no longer configured are kept unless ``MEMEFLOW_RETENTION_OLD_MODELS_S`` is set: only
the configured text model and visual model/preprocess version count as current, and so does every
model a scope's search serving state names (serving, target, previous within
``MEMEFLOW_SEARCH_ROLLBACK_WINDOW_S`` or while pinned — app/orchestrator/serving.py).
"""

from __future__ import annotations

import logging
import math
import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import DBAPIError

from app.orchestrator.store import retention as q

if TYPE_CHECKING:
    from app.orchestrator.service import Orchestrator

log = logging.getLogger(__name__)

OPS_COUNTERS = "ops_counters"
GRANTS_MIN_AGE_S = 86400.0  # an operation grant counts toward its UTC day's quota (QuotaPolicy)


def prune(orch: Orchestrator) -> dict[str, int]:
    """One bounded retention pass; rows deleted per kind (``pruned_<kind>``), the time each kind
    took (``retention_ms_<kind>``), kinds left for the next sweep because ``retention_budget_ms`` was
    spent (``retention_deferred``; the least recently walked kind goes first, and at least one kind
    runs every sweep) and steps that failed (``retention_errors``; a lock timeout or deadlock with
    live work — the next sweep retries). A kind that failed had its turn too (the others go first
    next time); an error that is not the database's is raised once every kind had its turn."""
    s = orch.settings
    now = orch.now()

    def cutoff(age: float) -> datetime | None:
        return now - timedelta(seconds=age) if age > 0 else None

    cfg = orch.stage_configs
    stale, models = cutoff(s.retention_embeddings_s), cutoff(s.retention_old_models_s)
    keep_after = now - timedelta(seconds=s.search_rollback_window_s)  # a replaced model stays for a rollback
    walks: dict[str, dict[str, Any] | None] = {
        "jobs": {"cutoff": cutoff(s.retention_jobs_s)},
        "tasks": {"cutoff": cutoff(s.retention_tasks_s)},
        "attempts": {"cutoff": cutoff(s.retention_attempts_s)},
        # at least a day: QuotaPolicy counts the grants of the current UTC day
        "grants": {"cutoff": cutoff(max(s.retention_grants_s, GRANTS_MIN_AGE_S) if s.retention_grants_s > 0 else 0)},
        # a batch ends with the age of its jobs (the jobs walk keeps a batch's jobs as long)
        "batch_items": {"cutoff": cutoff(s.retention_jobs_s)},
        "batches": {"cutoff": cutoff(s.retention_jobs_s)},
        "text_embeddings": {"stale_cutoff": stale, "model_cutoff": models, "keep": [str(cfg.text["model"])],
                            "keep_after": keep_after},
        "visual_embeddings": {"stale_cutoff": stale, "model_cutoff": models,
                              "keep": [f"{cfg.visual['model']}|{cfg.visual['preprocess_version']}"],
                              "keep_after": keep_after},
    }
    counts: dict[str, int] = {"retention_errors": 0, "retention_deferred": 0}
    ops_age = max(s.retention_ops_counters_s, 3600.0) if s.retention_ops_counters_s > 0 else 0.0  # /ops: last hour
    due = [k for k, p in walks.items()
           if p is not None and any(p.get(c) is not None for c in ("cutoff", "stale_cutoff", "model_cutoff"))]
    due += [OPS_COUNTERS] if ops_age else []
    for kind in (*walks, OPS_COUNTERS):
        counts[f"pruned_{kind}"] = 0
    if not due:
        return counts
    deadline = time.monotonic() + s.retention_budget_ms / 1000 if s.retention_budget_ms > 0 else math.inf
    with orch.engine.begin() as conn:
        order = q.walk_order_txn(conn, due)
    failed: Exception | None = None
    for n, kind in enumerate(order):
        if n and time.monotonic() >= deadline:  # spent (the first kind always runs): first next sweep
            counts["retention_deferred"] += 1
            continue
        started = time.monotonic()
        try:
            if kind == OPS_COUNTERS:
                counts[f"pruned_{kind}"] = _prune_ops_counters(orch, now - timedelta(seconds=ops_age), deadline)
            else:
                counts[f"pruned_{kind}"] = _walk(orch, kind, walks[kind], deadline)
        except Exception as exc:  # noqa: BLE001 - isolate the kind; the next sweep retries it
            if isinstance(exc, DBAPIError):
                log.warning("retention step failed", extra={"kind": kind}, exc_info=True)
            else:  # a bug, not a clash with live work: told as the step's failure once the others ran
                log.exception("retention step failed", extra={"kind": kind})
                failed = failed or exc
            counts["retention_errors"] += 1
            # its turn is recorded though it failed: a kind that fails at every sweep (a lock or
            # statement timeout longer than the budget) stayed the least recently walked, ran first
            # at every sweep and left every other kind deferred for good
            with orch.engine.begin() as conn:
                q.touch_walk_txn(conn, kind)
        counts[f"retention_ms_{kind}"] = round((time.monotonic() - started) * 1000)
    if failed is not None:
        raise failed
    return counts


def _prune_ops_counters(orch: Orchestrator, before: datetime, deadline: float) -> int:
    """Up to ``retention_max_batches`` deletes of per-minute buckets older than ``before``."""
    s = orch.settings
    deleted = 0
    with orch.engine.begin() as conn:
        q.touch_walk_txn(conn, OPS_COUNTERS)
    for _ in range(s.retention_max_batches):
        with orch.engine.begin() as conn:
            pruned = q.prune_ops_counters_txn(conn, before, s.retention_batch_size)
        n = pruned.affected if pruned.matched else 0  # not matched: nothing older than the age
        deleted += n
        if n < s.retention_batch_size or time.monotonic() >= deadline:
            break
    return deleted


def _walk(orch: Orchestrator, kind: str, params: dict[str, Any], deadline: float) -> int:
    """Up to ``retention_max_batches`` steps of ``kind``'s walk (none started past ``deadline``),
    resuming at the heap page where the last sweep stopped and starting over past the table's end;
    rows deleted."""
    s = orch.settings
    deleted = 0
    with orch.engine.begin() as conn:
        page = q.walk_position_txn(conn, kind)
        end, density = q.table_pages_txn(conn, kind)
    # about retention_scan_rows rows a step (ANALYZE's rows per page; 64 before the first ANALYZE)
    pages = max(1, math.ceil(s.retention_scan_rows / (density or 64.0)))
    if page >= end:
        page = 0
    for _ in range(s.retention_max_batches):
        with orch.engine.begin() as conn:
            step = q.walk_step_txn(conn, kind, page, pages, s.retention_batch_size, **params)
            n = step.affected if step.matched else 0  # not matched: nothing prunable in this window
            wrapped = False
            if n < s.retention_batch_size:  # else the window may hold more: read it again
                page += pages
                if page >= end:  # past the end: the next sweep starts over
                    page, wrapped = 0, True
            q.set_walk_position_txn(conn, kind, page)
        deleted += n
        if wrapped or time.monotonic() >= deadline:
            break
    return deleted
