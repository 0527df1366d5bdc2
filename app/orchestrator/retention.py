"""Retention, a step of the reconcile sweep (River's job cleaner, Oban's pruner): history older
than its configured age (``MEMEFLOW_RETENTION_*_S``; 0 = kept forever) is deleted in small
batches — each step of a kind's walk reads about ``retention_scan_rows`` rows (the heap pages
that hold that many, in physical order) and deletes at most
``retention_batch_size`` of them in its own short transaction, at most ``retention_max_batches``
steps per kind per sweep — so a sweep's cost is bounded whatever the history, and a large backlog
drains over successive sweeps.

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


def prune(orch: Orchestrator) -> dict[str, int]:
    """One bounded retention pass; rows deleted per kind (``pruned_<kind>``), the time each kind
    took (``retention_ms_<kind>``) and steps that failed (``retention_errors``; a lock timeout or
    deadlock with live work — the next sweep retries)."""
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
        "text_embeddings": {"stale_cutoff": stale, "model_cutoff": models, "keep": [str(cfg.text["model"])],
                            "keep_after": keep_after},
        "visual_embeddings": {"stale_cutoff": stale, "model_cutoff": models,
                              "keep": [f"{cfg.visual['model']}|{cfg.visual['preprocess_version']}"],
                              "keep_after": keep_after},
    }
    counts: dict[str, int] = {"retention_errors": 0}
    for kind, params in walks.items():
        counts[f"pruned_{kind}"] = 0
        if params is None or all(params.get(k) is None for k in ("cutoff", "stale_cutoff", "model_cutoff")):
            continue
        started = time.monotonic()
        try:
            counts[f"pruned_{kind}"] = _walk(orch, kind, params)
        except DBAPIError:
            log.warning("retention step failed", extra={"kind": kind}, exc_info=True)
            counts["retention_errors"] += 1
        counts[f"retention_ms_{kind}"] = round((time.monotonic() - started) * 1000)
    counts["pruned_ops_counters"] = 0
    ops_age = max(s.retention_ops_counters_s, 3600.0) if s.retention_ops_counters_s > 0 else 0.0  # /ops: last hour
    if ops_age:
        started = time.monotonic()
        for _ in range(s.retention_max_batches):
            try:
                with orch.engine.begin() as conn:
                    n = q.prune_ops_counters_txn(conn, now - timedelta(seconds=ops_age), s.retention_batch_size)
            except DBAPIError:
                log.warning("retention step failed", extra={"kind": "ops_counters"}, exc_info=True)
                counts["retention_errors"] += 1
                break
            counts["pruned_ops_counters"] += n
            if n < s.retention_batch_size:
                break
        counts["retention_ms_ops_counters"] = round((time.monotonic() - started) * 1000)
    return counts


def _walk(orch: Orchestrator, kind: str, params: dict[str, Any]) -> int:
    """Up to ``retention_max_batches`` steps of ``kind``'s walk, resuming at the heap page where the
    last sweep stopped and starting over past the table's end; rows deleted."""
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
            _scanned, n = q.walk_step_txn(conn, kind, page, pages, s.retention_batch_size, **params)
            wrapped = False
            if n < s.retention_batch_size:  # else the window may hold more: read it again
                page += pages
                if page >= end:  # past the end: the next sweep starts over
                    page, wrapped = 0, True
            q.set_walk_position_txn(conn, kind, page)
        deleted += n
        if wrapped:
            break
    return deleted
