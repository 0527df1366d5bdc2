"""Thin Celery tasks. A message body is one ID; PostgreSQL decides whether there is work.

Each task calls one orchestrator entry point and publishes the hints it returns (the orchestrator
has committed by then). No business logic here: a stale, duplicate, foreign or unknown id simply
finds nothing to claim and the message is acked.
"""

from __future__ import annotations

import gc
import logging
import os
import time

from celery import signals

import celeryconfig
from app.config import get_settings
from app.ids import parse_uuid
from app.worker.celery_app import celery_app
from app.worker.runtime import get_runtime, preload, reset_runtime
from app.worker.strategy import HINT_STRATEGY

log = logging.getLogger(__name__)

#: Comma-separated lanes whose providers a worker loads at start (set by ``memeflow worker``).
PRELOAD_ENV = "MEMEFLOW_WORKER_LANES"
#: ``0`` = this worker does not also consume the ``maintenance`` queue (``memeflow worker
#: --no-maintenance``, for deployments that run a dedicated ``--lane maintenance`` worker).
MAINTENANCE_ENV = "MEMEFLOW_WORKER_MAINTENANCE"
#: ``0`` = leave the worker's start-up objects to the garbage collector (see :func:`freeze_startup_objects`).
GC_FREEZE_ENV = "MEMEFLOW_WORKER_GC_FREEZE"


def _turned_off(name: str) -> bool:
    """An on-by-default worker switch set to ``0``/``false``/``no``/``off``."""
    return os.environ.get(name, "1").strip().lower() in ("0", "false", "no", "off")


def _run_leaf(lane: str, raw_task_id: object) -> None:
    task_id = parse_uuid(raw_task_id)
    if task_id is None:
        log.warning("malformed hint dropped", extra={"lane": lane})
        return
    from app.worker import run

    rt = get_runtime()
    limit = rt.settings.worker_local_hints
    # a worker of this lane alone may wait for its batch to fill (run._linger): it holds up no other lane
    lingers = _LOCAL_LANES == {lane}
    if limit > 0 and _LOCAL_LANES:  # continue the chain here (run.LocalHints)
        run.handle_hint_locally(rt.orch, lane, task_id, rt.owner, rt.providers, rt.publisher, _LOCAL_LANES, limit,
                                busy=_stop_continuing, lingers=lingers)
    else:
        run.handle_hint(rt.orch, lane, task_id, rt.owner, rt.providers, rt.publisher, lingers=lingers)


#: The stage lanes this worker consumes (its ``-Q``, set at start by ``_serve_maintenance``; a
#: prefork child inherits it). Empty — not known — means every hint is published.
_LOCAL_LANES: frozenset[str] = frozenset()


def _stop_continuing() -> bool:
    """Should this worker stop continuing hints itself and publish its kept one? When it is shutting
    down (a warm shutdown then waits for one batch, not a chain), or has received messages it has
    not started yet (a threads pool whose threads are all busy). A solo worker with prefetch 1
    never has one waiting; a prefork child does not see its parent's state (its chain is bounded
    by the limit alone)."""
    from celery.worker import state

    for flag in (state.should_stop, state.should_terminate):  # an exit code (0 too) once a shutdown began
        if flag is not None and flag is not False:
            return True
    return len(state.reserved_requests) > len(state.active_requests)


def _lane_task(lane: str):
    """The Celery task woken by a hint on ``lane``: claims the hinted task and its wake-up group
    (a batched lane drains several due tasks per model call) and runs them."""

    def run_leaf(task_id: str) -> None:
        _run_leaf(lane, task_id)

    run_leaf.__name__ = run_leaf.__qualname__ = f"run_{lane}"
    run_leaf.__doc__ = f"Wake-up hint for a {lane} task."
    return celery_app.task(name=celeryconfig.LANE_TASKS[lane], ignore_result=True, Strategy=HINT_STRATEGY)(run_leaf)


#: One task per stage lane (celeryconfig.LANES, from app.db.enums.Lane).
LANE_TASKS = {lane: _lane_task(lane) for lane in celeryconfig.LANES}


@celery_app.task(name=celeryconfig.WEBHOOK_TASK, ignore_result=True, Strategy=HINT_STRATEGY)
def deliver_webhooks(subscription_id: str) -> None:
    """Wake-up hint for a webhook subscription: deliver its due events, in order (DB-claimed)."""
    sub = parse_uuid(subscription_id)
    if sub is None:
        log.warning("malformed hint dropped", extra={"lane": celeryconfig.WEBHOOKS})
        return
    from app.worker.webhooks import deliver_subscription

    rt = get_runtime()
    rt.publisher.publish(deliver_subscription(rt.orch, sub, rt.owner))


@celery_app.task(name=celeryconfig.SWEEP_TASK, ignore_result=True, Strategy=HINT_STRATEGY)
def reconcile_sweep() -> dict[str, int]:
    """One reconcile sweep (the orchestrator takes an advisory lock; concurrent runs skip)."""
    rt = get_runtime()
    started = time.time()
    report = rt.orch.sweep()
    finished = time.time()
    rt.publisher.publish(report.hints)
    counts = dict(report.counts)
    skipped = bool(getattr(report, "skipped", False))
    # Operators see sweep cadence and cost; the two-beats test reads these lines to prove no overlap.
    # A sweep that ran reports when it held the advisory lock: this task's own start and end also
    # cover the lock request and the connection's checkout and return, which do overlap another
    # worker's sweep (it may still be releasing the lock this one is about to take).
    started, finished = getattr(report, "held", None) or (started, finished)
    log.info("reconcile sweep %s start=%.6f end=%.6f hints=%d counts=%s", "skipped" if skipped else "ran",
             started, finished, len(report.hints), counts, extra={"owner": rt.owner})
    return counts


@celery_app.task(name=celeryconfig.SEED_BATCH_TASK, ignore_result=True, Strategy=HINT_STRATEGY)
def seed_batch(batch_id: str) -> None:
    """Wake-up for batch seeding: seed the next pages of batches with work left.

    The id only says "a batch changed"; which pages to seed (and back-pressure) is decided by the
    orchestrator from PostgreSQL, the same step the sweep runs.
    """
    if parse_uuid(batch_id) is None:
        log.warning("malformed batch hint dropped")
        return
    rt = get_runtime()
    _seeded, hints = rt.orch.continue_batches()
    rt.publisher.publish(hints)


@celery_app.task(name=celeryconfig.SEARCH_INDEXES_TASK, ignore_result=True, Strategy=HINT_STRATEGY)
def search_indexes() -> bool:
    """Per-scope HNSW index maintenance (app/orchestrator/scope_indexes.py): started in a thread of
    this worker (a build takes minutes; the lanes this worker serves go on) unless one runs here;
    its advisory lock makes passes on other workers skip."""
    from app.orchestrator.scope_indexes import start_in_background

    return start_in_background(get_runtime().orch)


@signals.celeryd_after_setup.connect
def _serve_maintenance(sender=None, instance=None, **_: object) -> None:
    # Every worker also consumes `maintenance` (the sweeps beat schedules, batch seeding), so a
    # deployment of lane workers + beat alone recovers everything: no process to forget. The
    # sweep's advisory lock makes concurrent sweeps on several workers safe; prefetch 1 with late
    # acks means a busy worker reserves no sweep message, so the first free worker runs it.
    global _LOCAL_LANES
    queues = instance.app.amqp.queues
    # the lanes whose hints this worker may continue itself (run.LocalHints): its own -Q only
    _LOCAL_LANES = frozenset(q for q in (queues.consume_from or queues) if q in celeryconfig.LANE_TASKS)
    if _turned_off(MAINTENANCE_ENV):
        return
    queues.select_add(queues[celeryconfig.MAINTENANCE])


@signals.worker_ready.connect
def _register_worker(sender=None, **_: object) -> None:
    # The registry heartbeat thread lives in the worker's main process (not a pool child).
    from app.config import get_settings
    from app.worker.registry import start_registration

    app = getattr(sender, "app", celery_app)
    lanes = sorted(app.amqp.queues.consume_from or app.amqp.queues)
    start_registration(get_settings(), getattr(sender, "hostname", None) or f"worker-{os.getpid()}", lanes)
    if celeryconfig.WEBHOOKS in lanes:
        _start_webhook_poller()
    freeze_startup_objects()


def freeze_startup_objects() -> bool:
    """Move every object alive now (modules, the app, loaded providers) into the collector's
    permanent generation, once the worker is warm: a full collection then walks only what tasks
    made since, not the start-up graph again (≈ 60 ms of CPU per full collection of a no-op
    worker on the slow machine of performance-log §51). The price: a frozen object that later
    becomes cyclic garbage is not freed — start-up objects (modules, settings, engines, models)
    live as long as the process anyway. Returns whether it froze."""
    if _turned_off(GC_FREEZE_ENV):
        return False
    gc.collect()  # start-up garbage first: what is frozen is never collected
    gc.freeze()
    return True


_webhook_poller = None


def _start_webhook_poller() -> None:
    # In the worker's main process, like the registry thread: it only publishes hints.
    global _webhook_poller
    from app.worker.webhooks import HintPoller

    rt = get_runtime()
    _webhook_poller = HintPoller(rt.orch, rt.publisher).start()


@signals.worker_shutdown.connect
def _deregister_worker(**_: object) -> None:
    from app.worker.registry import stop_registration

    stop_registration()
    if _webhook_poller is not None:
        _webhook_poller.stop()


@signals.worker_shutdown.connect
@signals.worker_process_shutdown.connect
def _drain_completions(**_: object) -> None:
    # A warm shutdown (the pool has finished its tasks by now) lets the agent completions handed to
    # this process's completion thread commit first, for a bounded time (run._Completer; atexit too).
    from app.worker import run

    run.drain_completions()


@signals.worker_process_init.connect
def _fresh_runtime_in_child(**_: object) -> None:
    # A prefork child must not use the parent's pooled connections. It runs one task at a time:
    # a local agent's child warms one OCR engine, not one per core.
    reset_runtime()
    _preload_from_env(1)
    freeze_startup_objects()


@signals.worker_init.connect
def _refuse_a_database_it_cannot_serve(sender=None, **_: object) -> None:
    # Before the pool starts: a worker on a database that lacks this code's migrations would run,
    # fail every claim, sweep step and registry upsert with a traceback, and never say why. A
    # database newer than the code (a rolling upgrade migrated it first) is allowed: old workers
    # keep running until they are replaced (docs/operations.md, "Upgrading"). A worker that reads
    # image files and whose storage holds none of the database's fails every task file_missing.
    settings = get_settings()
    check_schema_at_start(settings)
    queues = getattr(getattr(getattr(sender, "app", None), "amqp", None), "queues", None)
    check_storage_at_start(settings, list((queues.consume_from or queues) if queues is not None else ()))


def check_schema_at_start(settings) -> None:
    """Exit (code 1, with what to run) when the database is behind this code's migrations; warn
    when it is ahead; an unreachable database is left to the usual retries."""
    from app.db.engine import SchemaBehind, require_schema_not_behind
    from app.worker.broker import database_url_for

    try:
        state = require_schema_not_behind(database_url_for(settings))
    except SchemaBehind as exc:
        log.critical("refusing to start: %s", exc)
        raise SystemExit(f"memeflow worker: refusing to start: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - not reachable yet: claims retry, as before this check
        log.warning("could not check the database's migrations at start: %s", exc)
        return
    if state == "ahead":
        log.warning("the database is migrated beyond this code's head: a newer release runs against it; "
                    "upgrade this worker")


#: Lanes whose stages read the image file (the embedding lane reads only the context).
FILE_LANES = frozenset({"visual", "agent"})
#: Stored images a worker looks for in its storage at start.
STORAGE_SAMPLE = 20


def _file_exists(files, key: str) -> bool:
    try:
        return files.exists(key)
    except (ValueError, OSError):  # a key the store refuses, an unreadable mount: not found
        return False


def check_storage_at_start(settings, lanes) -> None:
    """Exit (code 1) when this worker reads image files (visual, agent) and its storage directory
    holds none of a sample of the database's images: MEMEFLOW_STORAGE_DIR is not the one the API
    writes (unset on this machine, another mount). Every file of a committed image row exists in
    the right storage (written before the commit; gc removes only unreferenced files), so none
    found means the wrong directory, not bad luck; every task would fail ``file_missing`` after
    its retries, an error that reads like lost files. An empty database or an unreachable one
    passes."""
    if not FILE_LANES & set(lanes):
        return
    from app.db.engine import make_engine
    from app.orchestrator.store.workers import sample_storage_keys
    from app.storage import FileStore
    from app.worker.broker import database_url_for

    try:
        engine = make_engine(database_url_for(settings), pool_size=1, max_overflow=0)
        try:
            with engine.connect() as conn:
                keys = sample_storage_keys(conn, STORAGE_SAMPLE)
        finally:
            engine.dispose()
    except Exception as exc:  # noqa: BLE001 - not reachable yet: the tasks' own checks apply
        log.warning("could not check the storage directory at start: %s", exc)
        return
    files = FileStore(settings.storage_path)
    if keys and not any(_file_exists(files, key) for key in keys):
        message = (f"MEMEFLOW_STORAGE_DIR ({settings.storage_path}) holds none of the {len(keys)} image files "
                   "of this database that were looked for: it is not the storage the API writes. Point it at the "
                   "shared storage (docs/operations.md, 'Scaling out')")
        log.critical("refusing to start: %s", message)
        raise SystemExit(f"memeflow worker: refusing to start: {message}")


@signals.worker_init.connect
def _preload_in_solo(sender=None, **_: object) -> None:
    # solo/threads pools run tasks in this process; prefork children preload in their own init.
    pool = getattr(getattr(sender, "pool_cls", None), "__module__", "") or ""
    if pool.endswith(".thread"):  # one local OCR engine per thread, warm before the first task
        from app.worker import run

        # its task threads compute side by side: no claim of it is a run alone (run._ComputeGate)
        run.COMPUTE_THREADS = max(1, int(getattr(sender, "concurrency", None) or 1))
        _preload_from_env(getattr(sender, "concurrency", None))
    elif pool.endswith(".solo"):
        _preload_from_env()


@signals.setup_logging.connect
def _json_logs(**_: object) -> None:
    # Connecting this signal stops Celery from configuring logging; we install ours instead.
    from app.config import get_settings
    from app.logs import configure_logging

    settings = get_settings()
    configure_logging(settings.log_level, settings.log_json)


def _preload_from_env(concurrency: int | None = None) -> None:
    lanes = [lane for lane in os.environ.get(PRELOAD_ENV, "").split(",") if lane in celeryconfig.LANE_TASKS]
    if lanes:
        try:
            preload(lanes, concurrency)
        except Exception:
            log.exception("preloading providers failed", extra={"lane": ",".join(lanes)})
    elif concurrency:
        # No provider to load (a webhooks worker), but the runtime is sized here, where the pool's
        # threads are known: built later (the poller at worker_ready, the first task) it would get
        # the default pool, fewer connections than delivery threads that each hold one per POST.
        get_runtime(concurrency)
