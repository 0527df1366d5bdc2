"""Publish orchestrator hints to Celery: the task id and nothing else, after commit, never raising.

Callers hand over the hints an orchestrator call returned, i.e. after its transaction committed
(SPEC §2.7). A broker failure is logged and counted and the rest of the batch is dropped: the
reconcile sweep re-hints every queued task whose last hint is older than the grace period, so a
lost hint only delays work. After a failure the publisher stays quiet for ``cooldown_s`` so a dead
Redis costs an upload one failed connect, not one per hint.

A delayed hint (one with an ``eta``: a retry's wake-up at the end of its backoff) is sent with
Celery's ``eta``: the worker that receives it holds it until then. Every other hint is sent as
before, with no option added.

Shared by the API, the CLI and the workers (below all three: it needs only the Celery config, never
the worker's tasks), so the API and CLI publish without importing ``app.worker``.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from celery import Celery

from app import metrics

log = logging.getLogger(__name__)


class _HintLike(Protocol):
    lane: str
    task_id: uuid.UUID
    # and optionally eta: datetime | None (app.orchestrator.hints.Hint)


def celery_config():
    """The top-level ``celeryconfig`` module (imported on first use: it resolves the broker URL)."""
    try:
        import celeryconfig
    except ImportError:  # running from a source checkout whose root is not on sys.path
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        import celeryconfig
    return celeryconfig


def celery_app_for(broker_url: str, name: str = "memeflow-client") -> Celery:
    """A client-side app with memeflow's config on an explicit broker (API, CLI, supervisor, tests, bench)."""
    client = Celery(name)
    client.config_from_object(celery_config())
    client.conf.broker_url = broker_url
    client.conf.broker_transport = celery_config().broker_transport_for(broker_url)
    client.conf.broker_use_ssl = celery_config().broker_ssl_for(broker_url)
    return client


def lane_task_name(lane: str) -> str | None:
    """The Celery task name that wakes a worker of ``lane`` (or of ``webhooks``; None for an unknown lane)."""
    return celery_config().HINT_TASKS.get(lane)


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
            eta = getattr(hint, "eta", None)
            try:
                if eta is None:
                    self._app.send_task(name, args=[str(hint.task_id)], queue=lane, routing_key=lane, retry=False)
                else:
                    self._app.send_task(name, args=[str(hint.task_id)], queue=lane, routing_key=lane, retry=False,
                                        eta=eta)
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
    """A publisher on ``settings.broker_url``, else on the broker ``celeryconfig`` resolved (the API's
    and CLI's default; see app.api)."""
    return CeleryHintPublisher(celery_app_for(settings.broker_url or celery_config().broker_url, "memeflow-publisher"))
