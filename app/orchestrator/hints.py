"""Hints are data: (lane, task id) pairs published to the broker only after commit.

A hint with an ``eta`` is a *delayed hint*: the broker delivers it at that moment, not before (a
retry's wake-up at the end of its backoff, ``execution.fail_task``). It is still only a wake-up:
the claim decides, and a task taken or cancelled meanwhile makes it a stale hint, dropped.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hint:
    lane: str
    task_id: uuid.UUID
    eta: datetime | None = None  # deliver no earlier than this (UTC); None: now


class HintPublisher(Protocol):
    def publish(self, hints: Iterable[Hint]) -> None:
        """Publish wake-up hints. Never raises: failures are logged and counted."""


class NullPublisher:
    """Drops hints (the sweep re-hints); for tools that only write state."""

    def publish(self, hints: Iterable[Hint]) -> None:
        for _ in hints:
            pass


class RecordingPublisher:
    """In-process publisher for tests and the test worker loop: a thread-safe FIFO of hints.

    A delayed hint is recorded with its ``eta`` and handed out like any other (the test decides
    when to act on it: its clock may be a fake one)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: list[Hint] = []
        self.published: list[Hint] = []

    def publish(self, hints: Iterable[Hint]) -> None:
        hints = list(hints)
        with self._cond:
            self._items.extend(hints)
            self.published.extend(hints)
            self._cond.notify_all()

    def take(self, timeout: float = 0.05) -> Hint | None:
        with self._cond:
            if not self._items:
                self._cond.wait(timeout)
            return self._items.pop(0) if self._items else None

    def drain(self) -> list[Hint]:
        with self._cond:
            items, self._items = self._items, []
            return items

    def pending(self) -> int:
        with self._cond:
            return len(self._items)
