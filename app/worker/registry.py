"""A worker process's registration in the database (``worker_registry``), kept fresh by a thread.

The thread runs in the worker's main process (for the solo pool, the process that also runs the
tasks), independent of Celery's event loop, so a worker busy with a long OCR batch still reports
itself alive. It upserts every ``MEMEFLOW_WORKER_REGISTRY_INTERVAL_S``; a clean shutdown removes the
row, a kill leaves it to expire (``liveness.TTL_FACTOR`` intervals) and the sweep prunes it.
"""

from __future__ import annotations

import logging
import os
import threading
from datetime import UTC, datetime

from app.config import Settings
from app.orchestrator.liveness import WorkerIdentity, deregister_worker, register_worker

log = logging.getLogger(__name__)


class WorkerRegistration:
    """Registers ``identity`` now and every ``settings.worker_registry_interval_s`` until stopped."""

    def __init__(self, settings: Settings, identity: WorkerIdentity) -> None:
        self.settings = settings
        self.identity = identity
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-registry", daemon=True)
        self._engine = None

    def _engine_now(self):
        if self._engine is None:
            from app.db.engine import make_engine
            from app.worker.broker import database_url_for

            self._engine = make_engine(database_url_for(self.settings), pool_size=1, max_overflow=1)
        return self._engine

    def beat(self) -> bool:
        """One registry heartbeat; False (logged) when the database is unreachable."""
        try:
            register_worker(self._engine_now(), self.identity)
            return True
        except Exception as exc:  # noqa: BLE001 - the row expires; the next beat retries
            log.warning("worker registry heartbeat failed: %s", exc, extra={"owner": self.identity.node})
            return False

    def _run(self) -> None:
        self.beat()
        while not self._stop.wait(self.settings.worker_registry_interval_s):
            self.beat()

    def start(self) -> WorkerRegistration:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the heartbeats and remove the registration (best effort)."""
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            deregister_worker(self._engine_now(), self.identity)
        except Exception as exc:  # noqa: BLE001 - the row expires instead
            log.warning("worker deregistration failed: %s", exc, extra={"owner": self.identity.node})
        if self._engine is not None:
            self._engine.dispose()

    def forget_after_fork(self) -> None:
        """In a forked pool child: never touch the parent's pooled connection."""
        if self._engine is not None:
            self._engine.dispose(close=False)
            self._engine = None


_current: WorkerRegistration | None = None


def start_registration(settings: Settings, node: str, lanes: list[str]) -> WorkerRegistration:
    """Start this process's registration (idempotent per process)."""
    global _current
    if _current is None or _current.identity.pid != os.getpid():
        identity = WorkerIdentity.of(settings, node, lanes, datetime.now(UTC))
        _current = WorkerRegistration(settings, identity).start()
    return _current


def stop_registration() -> None:
    global _current
    if _current is not None and _current.identity.pid == os.getpid():
        _current.stop()
    _current = None


def _after_fork_in_child() -> None:
    global _current
    if _current is not None:
        _current.forget_after_fork()
        _current = None  # a pool child is not a worker node; its parent keeps the registration


os.register_at_fork(after_in_child=_after_fork_in_child)
