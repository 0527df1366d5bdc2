"""The Celery strategy of memeflow's tasks: Celery's own, minus messages that ask to run too late.

A memeflow message is a wake-up for now (a hint, a sweep, a seeding) — or a retry's delayed hint,
whose ``eta`` is its task's ``available_at``, at most ``DELAYED_HINT_MAX_BOUND_S`` ahead
(docs/architecture.md, "Delayed hints"). Celery keeps a message with an eta in the worker's memory,
unacked, until its time — and raises the worker's prefetch by one for each — so anyone who can
write to Redis could park any number of messages in a worker (eta in a hundred years), growing its
memory with no bound, and have them redelivered to another worker at each restart. A message whose
eta does not parse, or lies further ahead than any delayed hint may (with a minute's slack for
clocks), is logged, counted (``memeflow_broker_messages_dropped_total{reason="eta"}``) and acked
instead: a hint it carried is re-sent by the sweep if its task still waits.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from celery.worker.strategy import default

from app import metrics
from app.config import DELAYED_HINT_MAX_BOUND_S

log = logging.getLogger(__name__)

#: ``Strategy=`` of every memeflow task (celery resolves the name when the worker starts).
HINT_STRATEGY = "app.worker.strategy:without_eta"
#: The furthest ahead a message's eta may lie: the longest delayed hint, plus slack for clocks.
MAX_ETA_AHEAD = timedelta(seconds=DELAYED_HINT_MAX_BOUND_S + 60)


def _eta(message, body) -> object:
    """The eta a message asks for, whatever its protocol (2: a header; 1 and hybrid: the body)."""
    headers = message.headers or {}
    if headers.get("eta"):
        return headers["eta"]
    for payload in (body, message.payload):
        if isinstance(payload, dict) and payload.get("eta"):
            return payload["eta"]
    return None


def eta_refused(eta: object, now: datetime | None = None) -> bool:
    """Whether a message's eta is none a delayed hint could carry: unparsable, naive, or further
    ahead than ``MAX_ETA_AHEAD``."""
    try:
        when = datetime.fromisoformat(str(eta))
    except ValueError:
        return True
    if when.tzinfo is None:
        return True
    return when - (now or datetime.now(UTC)) > MAX_ETA_AHEAD


def without_eta(task, app, consumer, **kwargs):
    """Celery's default strategy for ``task``, with a message whose eta no delayed hint could
    carry acked and dropped."""
    handle = default(task, app, consumer, **kwargs)
    connection_errors = consumer.connection_errors

    def task_message_handler(message, body, ack, reject, callbacks, **kw):
        eta = _eta(message, body)
        if eta is not None and eta_refused(eta):
            log.warning("message with an eta no delayed hint carries dropped",
                        extra={"lane": task.name, "code": "eta"})
            metrics.BROKER_MESSAGES_DROPPED.labels(reason="eta").inc()
            ack(log, connection_errors)  # Message.ack_log_error, as Celery's Request acks
            return None
        return handle(message, body, ack, reject, callbacks, **kw)

    return task_message_handler
