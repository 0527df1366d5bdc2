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

from app.db.enums import STAGE_ORDER, ContextStatus, Stage
from app.orchestrator import fingerprints as fp
from app.orchestrator.types import StageConfigs


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
    visual_exists: bool  # a visual embedding for (sha256, model, preprocess_version, dims)
    text_exists: bool  # a ready text embedding for (sha256, metadata_hash, model)


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


def agent_context_valid(image: ImageFacts, job: JobFacts) -> bool:
    """A context counts for this job if it describes the current bytes and, unless a human edited
    it, was produced with the job's agent config and reverse_image_policy."""
    if image.context_status not in (ContextStatus.READY, ContextStatus.EDITED):
        return False
    prov = image.provenance or {}
    if prov.get("image_sha256") != image.sha256:
        return False
    if image.context_status == ContextStatus.EDITED:
        return True
    return (
        prov.get("agent_config_hash") == job.configs.agent_hash
        and prov.get("reverse_image_policy") == job.reverse_image_policy
    )


def plan(image: ImageFacts, job: JobFacts) -> Plan:
    """Walk the stages in order: valid prefix → REUSE, first invalid → RUN, the rest → WAIT."""
    sha = image.sha256
    fps: dict[str, str | None] = {
        Stage.VISUAL: fp.visual_fingerprint(sha, job.configs.visual),
        Stage.AGENT: fp.agent_fingerprint(sha, job.configs.agent_hash, job.reverse_image_policy),
        Stage.TEXT_EMBEDDING: (
            fp.text_fingerprint(sha, image.metadata_hash, job.configs.text) if image.metadata_hash else None
        ),
    }
    valid = {
        Stage.VISUAL: image.visual_exists,
        Stage.AGENT: agent_context_valid(image, job),
        Stage.TEXT_EMBEDDING: image.metadata_hash is not None and image.text_exists,
    }
    actions: dict[str, Action] = {}
    blocked = False
    for stage in STAGE_ORDER:
        forced = stage in job.force_stages and stage not in job.succeeded_in_job
        if blocked:
            actions[stage] = Action.WAIT
        elif valid[stage] and not forced:
            actions[stage] = Action.REUSE
        else:
            actions[stage] = Action.RUN
            blocked = True
    return Plan(actions=actions, fingerprints=fps)
