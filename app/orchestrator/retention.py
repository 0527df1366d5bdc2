"""Retention, a step of the reconcile sweep (River's job cleaner, Oban's pruner): history older
than its configured age (``MEMEFLOW_RETENTION_*_S``; 0 = kept forever) is deleted in small
batches — ``retention_batch_size`` rows a statement, its own short transaction, at most
``retention_max_batches`` statements per kind per sweep — so a sweep's cost is bounded whatever
the backlog, and a large backlog drains over successive sweeps.

What is never deleted, and each statement, is in app/orchestrator/store/retention.py. Embeddings
of models no longer configured are kept unless ``MEMEFLOW_RETENTION_OLD_MODELS_S`` is set: only
the configured text model and visual model/preprocess version count as current.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING

from sqlalchemy.exc import DBAPIError

from app.orchestrator.store import retention as q

if TYPE_CHECKING:
    from app.orchestrator.service import Orchestrator

log = logging.getLogger(__name__)

# the order matters only for what a single sweep reaches first: jobs (their tasks and attempts
# cascade) before the loose tasks and attempts
KINDS = ("jobs", "tasks", "attempts", "ops_counters")


def prune(orch: Orchestrator) -> dict[str, int]:
    """One bounded retention pass; rows deleted per kind (``pruned_<kind>``) and statements that
    failed (``retention_errors``; the next sweep retries them)."""
    s = orch.settings
    now = orch.now()
    ages = {"jobs": s.retention_jobs_s, "tasks": s.retention_tasks_s, "attempts": s.retention_attempts_s,
            "ops_counters": max(s.retention_ops_counters_s, 3600.0) if s.retention_ops_counters_s else 0.0}
    counts: dict[str, int] = {"retention_errors": 0}
    for kind in KINDS:
        counts[f"pruned_{kind}"] = 0
        if ages[kind] <= 0:
            continue
        cutoff = now - timedelta(seconds=ages[kind])
        for _ in range(s.retention_max_batches):
            try:
                with orch.engine.begin() as conn:
                    n = q.prune_txn(conn, kind, cutoff, s.retention_batch_size)
            except DBAPIError:  # a lock timeout or deadlock with live work: leave it to the next sweep
                log.warning("retention statement failed", extra={"kind": kind}, exc_info=True)
                counts["retention_errors"] += 1
                break
            counts[f"pruned_{kind}"] += n
            if n < s.retention_batch_size:
                break
    stale = now - timedelta(seconds=s.retention_embeddings_s) if s.retention_embeddings_s > 0 else None
    models = now - timedelta(seconds=s.retention_old_models_s) if s.retention_old_models_s > 0 else None
    cfg = orch.stage_configs
    keep = {"text_embeddings": [str(cfg.text["model"])],
            "visual_embeddings": [f"{cfg.visual['model']}|{cfg.visual['preprocess_version']}"]}
    for table in q.WALKS:
        counts[f"pruned_{table}"] = 0
        if stale is None and models is None:
            continue
        try:
            counts[f"pruned_{table}"] = _walk(orch, table, stale, models, keep[table])
        except DBAPIError:
            log.warning("retention walk failed", extra={"table": table}, exc_info=True)
            counts["retention_errors"] += 1
    return counts


def _walk(orch: Orchestrator, table: str, stale, models, keep: list[str]) -> int:
    """Up to ``retention_max_batches`` windows of ``retention_scan_rows`` rows of the table's walk,
    resuming where the last sweep stopped and starting over past the end."""
    s = orch.settings
    deleted = 0
    with orch.engine.begin() as conn:
        after = q.walk_position_txn(conn, table)
    for _ in range(s.retention_max_batches):
        with orch.engine.begin() as conn:
            last, scanned, n = q.walk_embeddings_txn(
                conn, table, after, s.retention_scan_rows, s.retention_batch_size, stale_cutoff=stale,
                model_cutoff=models, keep=keep,
            )
            if n < s.retention_batch_size:  # else the window may hold more: walk it again
                after = last if last is not None and scanned == s.retention_scan_rows else 0
            q.set_walk_position_txn(conn, table, after)
        deleted += n
        if after == 0:
            break
    return deleted
