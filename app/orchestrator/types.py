"""Value objects exchanged between the orchestrator, the workers and the API."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from app.orchestrator.fingerprints import config_hash
from app.orchestrator.hints import Hint


class StageConfigs(Mapping[str, dict[str, Any]]):
    """Provider configs frozen into each new job (their hashes are part of the fingerprints): one
    per stage of the registry (app/orchestrator/stages.py), keyed by stage name — a new stage needs
    no edit here.

    Read by stage (``configs[Stage.VISUAL]``, ``configs["text_embedding"]``) or by a stage's short
    ``config_key`` (``configs.text``). Built from a job's ``config`` column, from the settings, or
    by config_key (``StageConfigs(visual=…, agent=…, text=…)``: every stage exactly once).
    """

    __slots__ = ("_by_stage", "__dict__")  # __dict__: the cached_property hashes below

    def __init__(self, **by_key: dict[str, Any]) -> None:
        from app.orchestrator.stages import STAGES  # which key is whose: the stage registry

        keys = [s.config_key for s in STAGES]
        if sorted(by_key) != sorted(keys):
            raise TypeError(f"StageConfigs takes one config per stage ({', '.join(keys)}), got {sorted(by_key)}")
        self._by_stage = {s.stage.value: by_key[s.config_key] for s in STAGES}

    @classmethod
    def _of(cls, by_stage: dict[str, dict[str, Any]]) -> StageConfigs:
        """From configs already keyed by every stage of the registry, in its order."""
        configs = cls.__new__(cls)
        configs._by_stage = by_stage
        return configs

    def __getitem__(self, stage: str) -> dict[str, Any]:
        return self._by_stage[stage]

    def __getattr__(self, key: str) -> dict[str, Any]:
        """A stage's config by its config_key (``configs.visual``, ``configs.text``)."""
        from app.orchestrator.stages import BY_CONFIG_KEY

        spec = BY_CONFIG_KEY.get(key)
        if spec is None or key.startswith("_"):
            raise AttributeError(key)
        return self._by_stage[spec.stage.value]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_stage)

    def __len__(self) -> int:
        return len(self._by_stage)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StageConfigs) and self._by_stage == other._by_stage

    __hash__ = None  # type: ignore[assignment]  # mutable dicts inside, as the dataclass had

    def __repr__(self) -> str:
        return f"StageConfigs({self._by_stage!r})"

    def as_dict(self) -> dict[str, Any]:
        """The configs by stage name, as a job's ``config`` column stores them."""
        return dict(self._by_stage)

    # Computed once per instance (the configs are never mutated): the planner asks for
    # agent_hash several times per job, and advance.py reuses one instance per job config hash.
    @cached_property
    def hash(self) -> str:
        return config_hash(self.as_dict())

    @cached_property
    def agent_hash(self) -> str:
        return config_hash(self._by_stage["agent"])

    @classmethod
    def from_job_config(cls, config: dict[str, Any]) -> StageConfigs:
        """The configs a job froze (its ``config`` column), by stage name."""
        from app.orchestrator.stages import STAGES

        return cls._of({s.stage.value: config[s.stage.value] for s in STAGES})

    @classmethod
    def from_settings(cls, settings) -> StageConfigs:
        """Configs of the configured providers (cheap: loads no model)."""
        from app.orchestrator.stages import STAGES
        from app.stages.providers import provider_configs

        by_kind = provider_configs(settings)
        return cls._of({s.stage.value: by_kind[s.provider_kind] for s in STAGES})


@dataclass(frozen=True)
class Claim:
    """One execution of a leaf task, fenced by (task_id, owner, generation)."""

    task_id: uuid.UUID
    scope_id: str
    job_id: uuid.UUID
    image_id: uuid.UUID
    image_sha256: str
    stage: str
    lane: str
    owner: str
    generation: int
    attempt_count: int
    max_attempts: int
    payload: dict[str, Any]
    storage_key: str
    attempt_id: str | None = None  # agent: the idempotency key of this execution's attempt
    recovering: bool = False  # agent: attempt_id belongs to an earlier, interrupted execution
    grant_id: uuid.UUID | None = None  # agent: the operation grant as of the claim (None: look it up)
    recall_safe: bool = False  # agent: attempt_id's provider may run it again (task_attempts.recall_safe)


@dataclass
class BatchClaim:
    """What a hint of a batched lane claimed, and the hints to publish now (after that claim
    committed): the members of its wake-up group left out for lack of batch budget."""

    claims: list[Claim]
    hints: list[Hint] = field(default_factory=list)
    #: the one claim is a task whose previous run died (its lease lapsed): it must run alone
    died: bool = False


@dataclass(frozen=True)
class VisualArtifact:
    vector: list[float]
    model: str
    preprocess_version: str
    dims: int
    # the same image embedded with the other models its scope's visual serving state needs
    extra: tuple[VisualArtifact, ...] = ()


@dataclass(frozen=True)
class AgentArtifact:
    context: dict[str, Any]
    model: str
    attempt_id: str
    request_id: str | None = None


@dataclass(frozen=True)
class TextArtifact:
    vector: list[float]
    model: str
    dims: int
    document: str
    document_version: str
    metadata_hash: str
    # the same document embedded with the other models its scope's search serving state needs (a
    # model change: the serving and target models), written with this one
    extra: tuple[TextArtifact, ...] = ()


@dataclass
class IngestResult:
    image: dict[str, Any]
    job: dict[str, Any] | None
    created: bool
    hints: list[Hint] = field(default_factory=list)


@dataclass
class JobResult:
    job: dict[str, Any]
    created: bool
    hints: list[Hint] = field(default_factory=list)


@dataclass
class ImageJobResult:
    image: dict[str, Any]
    job: dict[str, Any] | None
    hints: list[Hint] = field(default_factory=list)
    old_storage_key: str | None = None


@dataclass
class SweepReport:
    counts: dict[str, int] = field(default_factory=dict)
    hints: list[Hint] = field(default_factory=list)
    skipped: bool = False  # another sweep held the advisory lock
    failed_steps: list[dict[str, str]] = field(default_factory=list)  # {step, error} of steps that raised
    # time.time() just after the advisory lock was taken and just before it was released (None:
    # skipped): the interval this sweep held the lock, which no other sweep's can overlap
    held: tuple[float, float] | None = None
