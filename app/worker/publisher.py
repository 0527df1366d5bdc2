"""Publish orchestrator hints to Celery: the task id and nothing else, after commit, never raising.

Callers hand over the hints an orchestrator call returned, i.e. after its transaction committed
(SPEC §2.7). A broker failure is logged and counted and the rest of the batch is dropped: the
reconcile sweep re-hints every queued task whose last hint is older than the grace period, so a
lost hint only delays work. After a failure the publisher stays quiet for ``cooldown_s`` so a dead
Redis costs an upload one failed connect, not one per hint.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Protocol

from app import metrics

log = logging.getLogger(__name__)


class _HintLike(Protocol):
    lane: str
    task_id: uuid.UUID


def new_owner_id() -> str:
    """A claim owner id unique to this process and start: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def lane_task_name(lane: str) -> str | None:
    """The Celery task name that wakes a worker of ``lane`` (or of ``webhooks``; None for an unknown lane)."""
    import celeryconfig

    return celeryconfig.HINT_TASKS.get(lane)


class CeleryHintPublisher:
    """``HintPublisher`` over a Celery app: one ``send_task`` per hint on the lane's queue."""

    def __init__(self, celery_app, *, cooldown_s: float = 1.0, clock=time.monotonic):
        self._app = celery_app
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._quiet_until = 0.0

    def publish(self, hints: Iterable[_HintLike]) -> None:
        """Send each hint; on broker failure log, count, drop the rest. Never raises."""
        pending = list(hints)
        for index, hint in enumerate(pending):
            lane = str(hint.lane)
            name = lane_task_name(lane)
            if name is None:
                log.error("hint for unknown lane dropped", extra={"lane": lane, "task_id": hint.task_id})
                metrics.HINT_PUBLISH_FAILURES.labels(lane=lane).inc()
                continue
            if self._clock() < self._quiet_until:
                self._drop(pending[index:], "broker recently unreachable")
                return
            try:
                self._app.send_task(name, args=[str(hint.task_id)], queue=lane, routing_key=lane, retry=False)
            except Exception as exc:  # noqa: BLE001 - any broker error must not reach the caller
                with self._lock:
                    self._quiet_until = self._clock() + self._cooldown_s
                log.warning(
                    "hint publish failed; the sweep will re-hint: %s", exc,
                    extra={"lane": lane, "task_id": hint.task_id},
                )
                self._drop(pending[index:], "publish failed")
                return
            metrics.HINTS_PUBLISHED.labels(lane=lane).inc()

    def _drop(self, hints: list[_HintLike], why: str) -> None:
        for hint in hints:
            metrics.HINT_PUBLISH_FAILURES.labels(lane=str(hint.lane)).inc()
        if hints:
            log.debug("dropped %d hints: %s", len(hints), why)


def publisher_from_settings(settings) -> CeleryHintPublisher:
    """A publisher on ``settings.broker_url`` (the API's and CLI's default; see app.api)."""
    from app.worker.celery_app import celery_app, celery_app_for

    if settings.broker_url:
        return CeleryHintPublisher(celery_app_for(settings.broker_url, "memeflow-publisher"))
    return CeleryHintPublisher(celery_app)
