"""A counting provider loaded through the registry's ``module:Class`` form."""

from __future__ import annotations

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
