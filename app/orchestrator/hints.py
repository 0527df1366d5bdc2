"""Hints are data: (lane, task id) pairs published to the broker only after commit."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hint:
    lane: str
    task_id: uuid.UUID


class HintPublisher(Protocol):
    def publish(self, hints: Iterable[Hint]) -> None:
        """Publish wake-up hints. Never raises: failures are logged and counted."""


class NullPublisher:
    """Drops hints (the sweep re-hints); for tools that only write state."""

    def publish(self, hints: Iterable[Hint]) -> None:
        for _ in hints:
            pass


class RecordingPublisher:
    """In-process publisher for tests and the test worker loop: a thread-safe FIFO of hints."""

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
