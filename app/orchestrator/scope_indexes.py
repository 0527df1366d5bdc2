"""Per-scope partial HNSW indexes, kept by maintenance — not by the sweep, not by an operator.

A filtered scan of a model's shared HNSW index misses a mid-size scope's neighbours (recall@10
0.83–0.93 for scopes of 2–19 % of a 1M index, docs/performance-log.md §8), so every scope above the
exact-scan size (``MEMEFLOW_SEARCH_INDEX_MIN_IMAGES``, default ``EXACT_SCAN_MAX_IMAGES``) and below
half of all images gets its own index of each model its search reads (``… WHERE model = … AND
dims = … AND scope_id = …``, ``app.db.engine.scope_vector_index_name``). Search needs nothing:
it plans with the scope id's value, so the planner picks a *valid* scope index and otherwise the
shared one — also while a build runs (a CONCURRENTLY build is invalid until it is done).

:func:`maintain` is one pass, under its own advisory lock (one pass at a time across all workers,
beats and CLIs; never the sweep's lock): drop every scope index that is INVALID (a build a crash or
a lock timeout interrupted) or no longer wanted (its scope was deleted, or the model is none of the
configured model and the models the scope's search serving state names — serving, target), then
build the missing ones ``CREATE INDEX CONCURRENTLY`` (writes go on), one at a time, outside a
transaction. Idempotent: a second pass finds nothing to do. A failed build is dropped and logged;
the next pass retries it.

Who runs it: beat schedules ``memeflow.search_indexes`` every ``MEMEFLOW_SEARCH_INDEX_INTERVAL_S``
on the ``maintenance`` queue, which every worker consumes — so ``memeflow up``, docker-compose and
a plain worker + beat all run it. The task starts the pass in a background thread of the worker
(:func:`start_in_background`) and returns, so a lane worker that picks it up keeps serving its
lane while a build takes minutes. ``memeflow search-indexes`` runs one pass in the foreground.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import text

from app import metrics
from app.db.engine import scope_vector_index_name
from app.search.queries import SCOPE_INDEX_MAX_SHARE

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from app.orchestrator.service import Orchestrator

log = logging.getLogger(__name__)

LOCK_KEY = 0x6D656D69  # "memi": one scope-index pass at a time (the sweep's lock is 0x6D656D65)
TABLES = {"text": "text_embeddings", "visual": "visual_embeddings"}
#: exactly the names scope_vector_index_name makes (a shared per-model index ends with ``_<dims>``)
SCOPE_INDEX_NAME = re.compile(r"^ix_(text|visual)_embeddings_hnsw_s_[0-9a-f]{16}$")
MAX_SHARE = SCOPE_INDEX_MAX_SHARE  # a scope of at least half of all images gets none: the shared index is mostly its own
BUILD_LOCK_TIMEOUT = "5min"  # CONCURRENTLY waits for older transactions; a stuck one fails the build


@dataclass
class IndexPass:
    skipped: bool = False  # another pass held the lock
    built: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # unwanted or invalid
    failed: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Want:
    table: str
    model: str
    dims: int
    scope_id: str

    @property
    def name(self) -> str:
        return scope_vector_index_name(self.table, self.model, self.dims, self.scope_id)


def wanted(engine: Engine, configured: list[tuple[str, str, int]], min_images: int,
           max_share: float = MAX_SHARE, serving: bool = True) -> tuple[dict[str, Want], dict[str, Want]]:
    """(every index that may stay, by name; those to build, by name). May stay: each existing
    scope × the configured ``(table, model, dims)`` and the models its search serving state names
    (serving, target). To build: those of scopes above ``min_images`` and below ``max_share`` of
    all images."""
    with engine.connect() as conn:
        scopes = conn.execute(text(
            "SELECT s.id, coalesce(u.image_count, 0) AS n FROM scopes s LEFT JOIN scope_usage u ON u.scope_id = s.id"
        )).all()
        states = conn.execute(text(
            "SELECT scope_id, kind, serving_model, serving_dims, target_model, target_dims FROM search_serving"
        )).all() if serving else []
    models: dict[str, set[tuple[str, str, int]]] = {}
    for r in states:
        table = TABLES.get(r.kind)
        if table is None:
            continue
        got = models.setdefault(r.scope_id, set())
        got.add((table, r.serving_model, int(r.serving_dims)))
        if r.target_model is not None and r.target_dims is not None:
            got.add((table, r.target_model, int(r.target_dims)))
    total = sum(int(r.n) for r in scopes)
    keep: dict[str, Want] = {}
    build: dict[str, Want] = {}
    for r in scopes:
        for table, model, dims in set(configured) | models.get(r.id, set()):
            want = Want(table, model, int(dims), r.id)
            keep[want.name] = want
            if int(r.n) > min_images and int(r.n) < max_share * total:
                build[want.name] = want
    return keep, build


def existing(engine: Engine) -> dict[str, bool]:
    """Every scope index there is (name → valid)."""
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " JOIN pg_class t ON t.oid = i.indrelid"
            " WHERE t.relname IN ('text_embeddings', 'visual_embeddings') AND c.relname LIKE 'ix\\_%\\_hnsw\\_s\\_%'"
        )).all()
    return {r.relname: bool(r.indisvalid) for r in rows if SCOPE_INDEX_NAME.match(r.relname)}


def create_statement(want: Want) -> str:
    lit = want.model.replace("'", "''")
    scope = want.scope_id.replace("'", "''")
    return (f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{want.name}" ON {want.table} '
            f"USING hnsw ((embedding::vector({int(want.dims)})) vector_cosine_ops) "
            f"WHERE model = '{lit}' AND dims = {int(want.dims)} AND scope_id = '{scope}'")


def run_pass(engine: Engine, configured: list[tuple[str, str, int]], *, min_images: int,
             max_share: float = MAX_SHARE, maintenance_work_mem: str | None = None,
             only: set[str] | None = None, drop_unwanted: bool = True, wait: bool = False,
             serving: bool = True) -> IndexPass:
    """One pass (see the module doc). ``only``: restrict builds and drops to these tables;
    ``drop_unwanted=False``: drop only invalid indexes this pass rebuilds; ``wait``: wait for a
    running pass instead of skipping; ``serving=False``: only the ``configured`` models (not those the
    scopes' search serving states name)."""
    report = IndexPass()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if wait:
            conn.execute(text("SET lock_timeout = 0"))
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": LOCK_KEY})
        elif not conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY}).scalar():
            report.skipped = True
            return report
        try:
            conn.execute(text("SET statement_timeout = 0"))  # a build takes seconds to minutes
            conn.execute(text(f"SET lock_timeout = '{BUILD_LOCK_TIMEOUT}'"))
            if maintenance_work_mem:
                set_work_mem(conn, maintenance_work_mem)
            keep, build = wanted(engine, configured, min_images, max_share, serving)
            have = existing(engine)
            for name, valid in sorted(have.items()):
                table = name.split("_hnsw_s_")[0][3:]
                if only is not None and table not in only:
                    continue
                if valid and (name in keep or not drop_unwanted):
                    continue
                if not valid and not drop_unwanted and name not in build:
                    continue
                _drop(conn, name, report)
                if valid:
                    log.info("scope index dropped (scope or model gone)", extra={"code": name})
                else:
                    log.warning("invalid scope index dropped (an interrupted build)", extra={"code": name})
            for name, want in sorted(build.items(), key=lambda kv: (kv[1].scope_id, kv[1].table, kv[0])):
                if (only is not None and want.table not in only) or have.get(name):
                    continue
                try:
                    conn.execute(text(create_statement(want)))
                except Exception:  # noqa: BLE001 - one failed build (lock timeout, disk, cancel) stops no other
                    log.exception("scope index build failed", extra={"code": name, "scope_id": want.scope_id})
                    report.failed.append(name)
                    metrics.SCOPE_INDEX_BUILDS.labels("failed").inc()
                    _drop(conn, name, None)  # what it left is INVALID
                    continue
                report.built.append(name)
                metrics.SCOPE_INDEX_BUILDS.labels("built").inc()
                log.info("scope index built", extra={"code": name, "scope_id": want.scope_id})
        finally:
            try:
                conn.execute(text("RESET statement_timeout"))
                conn.execute(text("RESET lock_timeout"))
                conn.execute(text("RESET maintenance_work_mem"))
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
            except Exception:  # noqa: BLE001 - a broken connection released the lock with the session
                conn.invalidate()
                log.warning("scope index pass: connection lost at the end", exc_info=True)
    return report


class InvalidWorkMem(ValueError):
    """A ``maintenance_work_mem`` value PostgreSQL refuses (``lots``, ``1PB``)."""


def set_work_mem(conn, value: str) -> None:
    """Set this session's ``maintenance_work_mem`` for the builds; :class:`InvalidWorkMem` with the
    server's reason when it refuses the value (an operator's typo is no crash)."""
    from sqlalchemy.exc import DBAPIError

    try:
        conn.execute(text("SELECT set_config('maintenance_work_mem', :m, false)"), {"m": value})
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) != "22023":  # invalid_parameter_value
            raise
        reason = str(exc.orig).strip().splitlines()
        raise InvalidWorkMem(" ".join(line.strip() for line in reason)) from None


def _drop(conn, name: str, report: IndexPass | None) -> None:
    try:
        conn.execute(text(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"'))
    except Exception:  # noqa: BLE001 - the next pass retries
        log.exception("scope index drop failed", extra={"code": name})
        return
    if report is not None:
        report.dropped.append(name)


def configured_models(orch: Orchestrator) -> list[tuple[str, str, int]]:
    cfg = orch.stage_configs
    return [("text_embeddings", str(cfg.text["model"]), int(cfg.text["dims"])),
            ("visual_embeddings", str(cfg.visual["model"]), int(cfg.visual["dims"]))]


def min_images(orch: Orchestrator) -> int:
    from app.search.queries import EXACT_SCAN_MAX_IMAGES

    n = orch.settings.search_index_min_images
    return EXACT_SCAN_MAX_IMAGES if n is None else int(n)


def maintain(orch: Orchestrator, *, min_images_override: int | None = None,
             maintenance_work_mem: str | None = None, wait: bool = False) -> IndexPass:
    """One pass for the orchestrator's configured models and settings (``wait``: for a running pass)."""
    return run_pass(orch.engine, configured_models(orch),
                    min_images=min_images(orch) if min_images_override is None else min_images_override,
                    maintenance_work_mem=maintenance_work_mem or orch.settings.search_index_maintenance_work_mem,
                    wait=wait)


_thread: threading.Thread | None = None
_thread_lock = threading.Lock()


def start_in_background(orch: Orchestrator) -> bool:
    """Run :func:`maintain` in a daemon thread of this process unless one still runs; whether one
    was started. (A worker killed mid-build leaves an INVALID index: the next pass drops and
    rebuilds it.)"""
    global _thread
    with _thread_lock:
        if _thread is not None and _thread.is_alive():
            return False
        _thread = threading.Thread(target=_background, args=(orch,), name="scope-indexes", daemon=True)
        _thread.start()
        return True


def _background(orch: Orchestrator) -> None:
    try:
        report = maintain(orch)
    except Exception:  # noqa: BLE001 - e.g. the database is down: the next beat retries
        log.exception("scope index maintenance failed")
        return
    if report.built or report.dropped or report.failed:
        log.info("scope index maintenance: built %d, dropped %d, failed %d", len(report.built),
                 len(report.dropped), len(report.failed))


def ensure_scope_vector_indexes(engine: Engine, table: str, model: str, dims: int, *, min_images: int,
                                max_share: float = 0.5, maintenance_work_mem: str | None = None) -> list[str]:
    """Give every scope of more than ``min_images`` images (``scope_usage``) and below
    ``max_share`` of all images its own partial HNSW index of the model, built CONCURRENTLY, and
    rebuild an invalid one an interrupted build left; the names built. One pass of
    this module for this one model (waiting for a pass that runs, dropping
    nothing else) — what beat's maintenance runs for every served model."""
    if table not in ("visual_embeddings", "text_embeddings"):
        raise ValueError(f"no vector column on {table}")
    return run_pass(engine, [(table, model, int(dims))], min_images=int(min_images), max_share=float(max_share),
                    maintenance_work_mem=maintenance_work_mem, only={table}, drop_unwanted=False, wait=True,
                    serving=False).built
