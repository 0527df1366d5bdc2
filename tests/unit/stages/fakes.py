"""Providers loaded through the registry's ``module:Class`` form (counting, slow to build)."""

from __future__ import annotations

import threading
from typing import Any

INSTANCES: list[CountingVisualProvider] = []


class CountingVisualProvider:
    """Counts constructions and calls so the tests can see the per-process cache at work."""

    name = "counting"

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.calls = 0
        INSTANCES.append(self)

    def config(self) -> dict[str, Any]:
        return {
            "provider": "counting",
            "model": "counting-v1",
            "preprocess_version": "1",
            "dims": 2,
        }

    def embed(self, images: list) -> list[list[float]]:
        self.calls += 1
        return [[1.0, 0.0] for _ in images]


class SlowToBuildTextProvider:
    """A text provider whose constructor blocks until ``release`` is set (a model loading its
    weights); ``entered`` is set once a build has begun."""

    entered = threading.Event()
    release = threading.Event()

    def __init__(self, **options):
        type(self).entered.set()
        type(self).release.wait(60)
