"""Pure stage planner: from the image's current facts and the job's frozen configuration, decide
for each stage whether its artifact is reusable, whether it must run now, or wait (SPEC §3.3, §4.3).

Validity over history: only the current artifacts and their input fingerprints count, never
"some task once succeeded".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from app.orchestrator.stages import STAGES, agent_context_valid
from app.orchestrator.types import StageConfigs

__all__ = ["Action", "ImageFacts", "JobFacts", "Plan", "agent_context_valid", "plan"]


class Action(StrEnum):
    REUSE = "reuse"
    RUN = "run"
    WAIT = "wait"


@dataclass(frozen=True)
class ImageFacts:
    sha256: str
    context_status: str
    provenance: Mapping[str, Any] | None
    metadata_hash: str | None
    # stage → does its current artifact for the job's config exist (its StageSpec.exists_sql), for
    # every stage that declares a validity query
    exists: Mapping[str, bool]


@dataclass(frozen=True)
class JobFacts:
    image_sha256: str
    configs: StageConfigs
    reverse_image_policy: str
    force_stages: frozenset[str] = frozenset()
    succeeded_in_job: frozenset[str] = frozenset()  # stages this job itself ran to success


@dataclass(frozen=True)
class Plan:
    actions: dict[str, Action]
    fingerprints: dict[str, str | None] = field(default_factory=dict)

    @property
    def run_stage(self) -> str | None:
        return next((s for s, a in self.actions.items() if a is Action.RUN), None)

    @property
    def complete(self) -> bool:
        return all(a is Action.REUSE for a in self.actions.values())


def plan(image: ImageFacts, job: JobFacts) -> Plan:
    """Walk the stages in order: valid prefix → REUSE, first invalid → RUN, the rest → WAIT."""
    fps: dict[str, str | None] = {s.stage: s.fingerprint(image, job) for s in STAGES}
    actions: dict[str, Action] = {}
    blocked = False
    for s in STAGES:
        stage = s.stage
        forced = stage in job.force_stages and stage not in job.succeeded_in_job
        if blocked:
            actions[stage] = Action.WAIT
        elif s.valid(image, job) and not forced:
            actions[stage] = Action.REUSE
        else:
            actions[stage] = Action.RUN
            blocked = True
    return Plan(actions=actions, fingerprints=fps)
