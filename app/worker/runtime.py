"""Per-process worker state: settings, engine, orchestrator, publisher, owner id, providers.

Created lazily once per worker process (and reset in a forked pool child, which must not reuse
its parent's database connections). Providers are loaded per lane on first use, so a process that
only serves the ``visual`` queue never loads the text model.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from typing import Any

from app.config import Settings, get_settings

log = logging.getLogger(__name__)
#: Optional ``module:callable(celery_app) -> HintPublisher``; chaos tests inject faulty publishers.
PUBLISHER_ENV = "MEMEFLOW_WORKER_PUBLISHER"


class WorkerRuntime:
    """Everything a task needs, built once per process."""

    def __init__(self, settings: Settings, celery_app, concurrency: int | None = None) -> None:
        from app.db.engine import make_engine
        from app.orchestrator import Orchestrator
        from app.publisher import CeleryHintPublisher
        from app.stages.providers import Providers
        from app.worker.broker import database_url_for

        self.settings = settings
        # each of a threads pool's ``concurrency`` task threads and the heartbeat thread hold one
        # connection at a time (a claim, a completion; a webhook delivery across its POST, its
        # fenced write after the POST released it), so a big box's pool never makes them queue;
        # the spare one serves a webhooks worker's hint poller (its LISTEN connection is its own);
        # the agent's completion thread (settings.agent_completes_async, app/worker/run.py) one
        # more, so it never waits for (or makes wait) a call thread's claim
        overflow = max(4, (concurrency or 1) + 2) + (1 if settings.agent_completes_async else 0)
        self.engine = make_engine(database_url_for(settings), pool_size=2, max_overflow=overflow, pre_ping=False)
        self.orch = Orchestrator(self.engine, settings)
        self.publisher = _publisher_factory()(celery_app) if os.environ.get(PUBLISHER_ENV) else CeleryHintPublisher(
            celery_app
        )
        self.owner = new_owner_id()
        self.pid = os.getpid()
        # Lazy handles: a lane's tasks touch only their own stage's provider.
        self.providers = Providers(settings)
        if settings.metrics_port:
            from app import metrics

            port = metrics.serve(settings.metrics_port, settings.metrics_host, settings.metrics_token)
            log.info("metrics served on port %s", port, extra={"owner": self.owner})

    def load_lane(self, lane: str, concurrency: int | None = None) -> Any:
        """Create ``lane``'s provider now (and warm its model if it can), not on the first task.
        ``concurrency``: the calls this process runs at once (a threads pool's size); the local
        agent warms one OCR engine per call."""
        from app.orchestrator.stages import by_lane

        provider = self.providers.get(by_lane(lane).provider_kind)
        warm = getattr(provider, "warm", None) or getattr(provider, "load", None)
        if callable(warm):
            if lane == "agent" and concurrency and getattr(provider, "name", "") == "local-ocr":
                warm(concurrency)
            else:
                warm()
        log.info("providers loaded", extra={"lane": lane, "owner": self.owner})
        return provider

    def close(self) -> None:
        self.engine.dispose()


def new_owner_id() -> str:
    """A claim owner id unique to this process and start: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _publisher_factory():
    """``MEMEFLOW_WORKER_PUBLISHER=module:callable`` wraps the publisher (fault-injection tests)."""
    import importlib

    module, _, attr = os.environ[PUBLISHER_ENV].partition(":")
    return getattr(importlib.import_module(module), attr)


_runtime: WorkerRuntime | None = None
_runtime_lock = threading.Lock()


def get_runtime(concurrency: int | None = None) -> WorkerRuntime:
    """This process's runtime; rebuilt after a fork (a new pid never inherits connections).
    ``concurrency``: the task threads it serves, when the first call knows it (``preload``)."""
    global _runtime
    with _runtime_lock:
        if _runtime is None or _runtime.pid != os.getpid():
            from app.worker.celery_app import celery_app

            _runtime = WorkerRuntime(get_settings(), celery_app, concurrency)
        return _runtime


def reset_runtime() -> None:
    """Forget this process's runtime (after fork, or on shutdown)."""
    global _runtime
    with _runtime_lock:
        if _runtime is not None and _runtime.pid == os.getpid():
            _runtime.close()
        _runtime = None


def preload(lanes: list[str], concurrency: int | None = None) -> None:
    """Build the runtime and load the providers of ``lanes`` now, not on the first task."""
    runtime = get_runtime(concurrency)
    for lane in lanes:
        runtime.load_lane(lane, concurrency)
