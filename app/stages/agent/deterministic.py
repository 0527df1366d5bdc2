"""``deterministic`` agent: context from size and colours only. For tests and benchmarks only."""

from __future__ import annotations

from typing import Any

from app.stages.agent.facts import describe_facts, visual_facts
from app.stages.agent.records import ResultRecords, check_attempt_id
from app.stages.base import AgentResult, LookupResult, check_reverse_image_policy
from app.stages.images import DecodedImage


class DeterministicAgent:
    """Model-free and instant; reads no text. Records results like a real local agent."""

    name = "deterministic"
    recall_safe = True  # model-free local compute: safe to run again after a worker's death

    def __init__(self, *, results_dir: str, legacy_results_dir: str | None = None, **_: Any) -> None:
        if not results_dir:
            raise ValueError(
                "deterministic agent needs results_dir (where attempt results are kept)"
            )
        self.records = ResultRecords(results_dir, legacy_dir=legacy_results_dir)

    def config(self) -> dict[str, Any]:
        """Identity of this fake agent."""
        return {"provider": self.name, "model": "deterministic-v1", "version": "deterministic-v1"}

    def describe(
        self, image: DecodedImage, *, attempt_id: str, reverse_image_policy: str
    ) -> AgentResult:
        """A context built from the image's facts; recorded before it is returned."""
        check_attempt_id(attempt_id)
        check_reverse_image_policy(reverse_image_policy)
        facts = visual_facts(image)
        kind = "animated" if image.animated else "still"
        context = {
            "title": f"{image.width}x{image.height} {kind} image",
            "description": describe_facts(facts),
            "ocr_text": "",
            "tags": [kind, *(colour.lstrip("#") for colour in facts["dominant_colors"])],
            "facts": facts,
        }
        result = AgentResult(context=context, model="deterministic-v1", request_id=attempt_id)
        self.records.write(attempt_id, result)
        return result

    def lookup(self, attempt_id: str, *, image: DecodedImage | None = None) -> LookupResult:
        """``complete`` with the recorded result, or ``not_received``."""
        result = self.records.read(attempt_id)
        if result is None:
            return LookupResult(status="not_received")
        return LookupResult(status="complete", result=result)
