"""Counting / failing providers for orchestration tests (deterministic underneath)."""

from __future__ import annotations

import threading
from collections import Counter

from app.stages.agent.deterministic import DeterministicAgent
from app.stages.errors import PermanentError, RetryableError
from app.stages.providers import Providers
from app.stages.text.deterministic import DeterministicTextProvider
from app.stages.visual.deterministic import DeterministicVisualProvider

_lock = threading.Lock()


class Calls:
    def __init__(self) -> None:
        self.by_stage: Counter[str] = Counter()
        self.by_image: Counter[tuple[str, str]] = Counter()

    def add(self, stage: str, key: str, n: int = 1) -> None:
        with _lock:
            self.by_stage[stage] += n
            self.by_image[(stage, key)] += 1


class CountingVisual(DeterministicVisualProvider):
    def __init__(self, calls: Calls, fail_plan: list | None = None):
        super().__init__()
        self.calls, self.fail_plan = calls, list(fail_plan or [])

    def embed(self, images):
        self.calls.add("visual", str(images[0].width * 100000 + images[0].height), len(images))
        with _lock:
            err = self.fail_plan.pop(0) if self.fail_plan else None
        if err is not None:
            raise err
        return super().embed(images)


class CountingAgent(DeterministicAgent):
    def __init__(self, calls: Calls, results_dir: str):
        super().__init__(results_dir=results_dir)
        self.calls = calls

    def describe(self, image, *, attempt_id, reverse_image_policy):
        self.calls.add("agent", attempt_id)
        return super().describe(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)


class CountingText(DeterministicTextProvider):
    def __init__(self, calls: Calls, document_version: str = "1"):
        super().__init__(document_version=document_version)
        self.calls = calls

    def embed(self, documents):
        for d in documents:
            self.calls.add("text", d)
        return super().embed(documents)


def counting_providers(settings, calls: Calls, visual_failures: list | None = None) -> Providers:
    p = Providers(settings)
    p._cache.update(
        visual=CountingVisual(calls, visual_failures),
        agent=CountingAgent(calls, str(settings.agent_results_path)),
        text=CountingText(calls, settings.text_document_version),  # the version jobs are planned with
    )
    return p


__all__ = ["Calls", "counting_providers", "PermanentError", "RetryableError"]
