"""The workers' Celery consumer (``celeryconfig.worker_consumer``): Celery's, with task events sent
in fewer, larger messages.

Task events (received, started, succeeded: Flower's task views) are buffered by Celery's event
dispatcher and published by the consumer's event loop. Celery flushes the buffer on the loop's
next turn after each event, so a worker sends about one Redis message per event — two or three
per task, each a kombu publish (≈ 0.2 ms of CPU). Here the first event buffered after a flush
schedules the next flush ``EVENTS_FLUSH_S`` later, and that flush sends every event buffered by
then as one message (Celery's ``task.multi``, which Flower reads like single events): the same
events in the same order, at most ``EVENTS_FLUSH_S`` later. Celery's own limit still flushes a
buffer of 24 at once, and a warm shutdown flushes what is left.
"""

from __future__ import annotations

import time

from celery.worker.consumer import Consumer as CeleryConsumer
from vine import promise

#: How long a buffered task event may wait for the events buffered after it (seconds).
EVENTS_FLUSH_S = 0.5


class Consumer(CeleryConsumer):
    """Celery's consumer; buffered task events are flushed once per ``EVENTS_FLUSH_S``."""

    #: time.monotonic() at which the scheduled flush runs; 0.0: none scheduled
    _events_flush_due = 0.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._schedule_flush_promise = promise(self._schedule_events_flush)

    def on_send_event_buffered(self) -> None:
        # called by the event dispatcher (any thread: the pool's too) for each buffered event
        if not self.hub:
            return
        now = time.monotonic()
        due = self._events_flush_due
        # a flush is scheduled (one whose time passed a window ago was lost with its timer, e.g.
        # by a connection restart: schedule another)
        if due and now < due + EVENTS_FLUSH_S:
            return
        self._events_flush_due = now + EVENTS_FLUSH_S
        self.hub.call_soon(self._schedule_flush_promise)  # to the loop thread: its timers are not thread-safe

    def _schedule_events_flush(self) -> None:
        delay = max(0.0, self._events_flush_due - time.monotonic())
        self.hub.call_later(delay, self._flush_due_events)

    def _flush_due_events(self) -> None:
        # cleared first: an event buffered during the flush schedules the next one
        self._events_flush_due = 0.0
        self._flush_events()

    def shutdown(self) -> None:
        try:
            self._flush_events()  # what the window holds (Celery's shutdown does not flush the buffer)
        except Exception:  # noqa: BLE001 - best effort, as Celery's own event sends
            pass
        super().shutdown()
