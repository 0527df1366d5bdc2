"""The Celery strategy of memeflow's tasks: Celery's own, minus messages that ask to run later.

Every memeflow message is a wake-up for now (a hint, a sweep, a seeding): nothing memeflow
publishes carries an ``eta`` or a ``countdown``. Celery keeps a message with an eta in the worker's
memory, unacked, until its time — and raises the worker's prefetch by one for each — so anyone who
can write to Redis could park any number of messages in a worker (eta in a hundred years), growing
its memory with no bound, and have them redelivered to another worker at each restart. Such a
message is logged, counted (``memeflow_broker_messages_dropped_total{reason="eta"}``) and acked
instead: a hint it carried is re-sent by the sweep if its task still waits.
"""

from __future__ import annotations

import logging

from celery.worker.strategy import default

from app import metrics

log = logging.getLogger(__name__)

#: ``Strategy=`` of every memeflow task (celery resolves the name when the worker starts).
HINT_STRATEGY = "app.worker.strategy:without_eta"


def _eta(message, body) -> object:
    """The eta a message asks for, whatever its protocol (2: a header; 1 and hybrid: the body)."""
    headers = message.headers or {}
    if headers.get("eta"):
        return headers["eta"]
    for payload in (body, message.payload):
        if isinstance(payload, dict) and payload.get("eta"):
            return payload["eta"]
    return None


def without_eta(task, app, consumer, **kwargs):
    """Celery's default strategy for ``task``, with a message that carries an eta acked and dropped."""
    handle = default(task, app, consumer, **kwargs)
    connection_errors = consumer.connection_errors

    def task_message_handler(message, body, ack, reject, callbacks, **kw):
        eta = _eta(message, body)
        if eta is not None:
            log.warning("message with an eta dropped: memeflow runs every message now",
                        extra={"lane": task.name, "code": "eta"})
            metrics.BROKER_MESSAGES_DROPPED.labels(reason="eta").inc()
            ack(log, connection_errors)  # Message.ack_log_error, as Celery's Request acks
            return None
        return handle(message, body, ack, reject, callbacks, **kw)

    return task_message_handler
