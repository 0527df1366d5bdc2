"""What a stage is, declared once: the stage registry (issue 19).

Each :class:`StageSpec` says, for one stage of the pipeline, everything the orchestrator, the
workers and the supervisor otherwise had to know by name: its lane, which provider kind computes it
(and that provider's interface), where its frozen config lives, its input fingerprint and validity
rule (SPEC §3.3), the store statements that check and write its artifact, and how its lane batches.
Code that needs per-stage knowledge looks it up here (``SPECS[stage]``, ``by_lane(lane)``) instead
of comparing with ``"visual"``; :data:`STAGES` is the pipeline in order.

Why here and not in ``app/stages``: a declaration includes the fingerprint, the validity rule and
the artifact's SQL, which are the orchestrator's decisions — ``app/stages`` holds pure providers
below the orchestrator and must not import it (tests/unit/test_layering.py). The provider side of a
stage (interface, settings → options, name table) stays there, in ``app/stages/providers.py``, and
a spec names it by ``provider_kind``. Adding a stage: docs/architecture.md "Adding a stage".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection, RowMapping

from app.db.enums import ContextStatus, Lane, ServingKind, Stage
from app.orchestrator import fingerprints as fp
from app.orchestrator.store import artifacts, tasks
from app.orchestrator.types import AgentArtifact, Claim, StageConfigs, TextArtifact, VisualArtifact
from app.stages.base import AgentProvider, TextEmbeddingProvider, VisualProvider

if TYPE_CHECKING:
    from app.orchestrator.planner import ImageFacts, JobFacts


@dataclass(frozen=True)
class StageSpec:
    """One stage of the pipeline, as every layer above the providers sees it."""

    stage: Stage
    lane: Lane  # the Celery queue and ``tasks.lane`` of its leaf tasks
    provider_kind: str  # app.stages.providers.KINDS: which configured provider computes it
    protocol: type  # that provider's interface (app.stages.base)
    config_field: str  # the StageConfigs field holding its frozen provider config
    # SPEC §3.3: the canonical hash of exactly its inputs (None: not computable yet), and whether
    # its current artifact is valid for the job — pure, from the planner's facts
    fingerprint: Callable[[ImageFacts, JobFacts], str | None]
    valid: Callable[[ImageFacts, JobFacts], bool]
    # frozen inputs its task payload carries besides the image and the stage config hash
    payload: Callable[[RowMapping, RowMapping, StageConfigs], dict[str, Any]]
    resource_key: Callable[[StageConfigs], str]  # the lane-slot pool key ('' = the lane's only pool)
    artifact: type  # what the worker hands to complete_tasks
    artifact_table: str  # where the artifact is stored
    # the validity query (ImageFacts field it fills, and the statement: conn, image row, configs);
    # store/jobs.py::job_facts_many_txn computes the same facts for locked jobs in one statement
    exists_field: str | None
    exists_txn: Callable[[Connection, RowMapping, StageConfigs], bool] | None
    # the artifact writer: the rows of one landed claim, and the statement writing many of them
    # (None: the stage writes its own way — the agent's context goes onto the image row together
    # with its attempt and grant, execution._write_agent_results_txn)
    artifact_rows: Callable[[Claim, Any], list[dict[str, Any]]] | None
    write_many_txn: Callable[[Connection, list[dict[str, Any]]], None] | None
    vector_index: bool  # one HNSW index per model on artifact_table (ensure_vector_index)
    serving_kind: str | None  # its search serving state (app/orchestrator/serving.py), if any
    # batching: the Settings fields of its batch size and batch budget (None: not budgeted), the
    # SQL cost of one task in that budget (store/tasks.py::BATCH_COST[lane])
    batch_size_setting: str
    batch_budget_setting: str | None
    paid: bool  # a paid external call: attempt protocol (SPEC §4.5) and operation grant (§4.6)
    slots: bool  # DB-wide lane slots and fair admission (lanes.py, SPEC §4.10)

    @property
    def batched(self) -> bool:
        """Its hint claims a wake-up group plus a fair fill within a budget (visual, embedding);
        a new task may join a queued group of its lane."""
        return self.batch_budget_setting is not None

    @property
    def batch_cost_sql(self) -> str | None:
        """What one task costs in the batch budget, as SQL over its image row ``i``."""
        return tasks.BATCH_COST.get(self.lane.value) if self.batched else None

    def config(self, configs: StageConfigs) -> dict[str, Any]:
        """Its frozen provider config in a job's configs."""
        return getattr(configs, self.config_field)


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


def _visual_rows(c: Claim, v: VisualArtifact) -> list[dict[str, Any]]:
    return [
        {"scope_id": c.scope_id, "image_id": c.image_id, "sha": c.image_sha256, "model": a.model,
         "preprocess_version": a.preprocess_version, "dims": a.dims, "vector": a.vector, "task_id": c.task_id}
        for a in (v, *v.extra)
    ]


def _text_rows(c: Claim, t: TextArtifact) -> list[dict[str, Any]]:
    return [
        {"scope_id": c.scope_id, "image_id": c.image_id, "sha": c.image_sha256, "metadata_hash": a.metadata_hash,
         "model": a.model, "dims": a.dims, "document_version": a.document_version, "document": a.document,
         "vector": a.vector, "task_id": c.task_id}
        for a in (t, *t.extra)
    ]


def _no_payload(job: RowMapping, image: RowMapping, configs: StageConfigs) -> dict[str, Any]:
    return {}


VISUAL = StageSpec(
    stage=Stage.VISUAL, lane=Lane.VISUAL, provider_kind="visual", protocol=VisualProvider, config_field="visual",
    fingerprint=lambda image, job: fp.visual_fingerprint(image.sha256, job.configs.visual),
    valid=lambda image, job: image.visual_exists,
    payload=_no_payload, resource_key=lambda configs: "",
    artifact=VisualArtifact, artifact_table="visual_embeddings",
    exists_field="visual_exists",
    exists_txn=lambda conn, image, configs: artifacts.visual_exists_txn(
        conn, image["scope_id"], image["id"], image["sha256"], configs.visual),
    artifact_rows=_visual_rows, write_many_txn=artifacts.insert_visual_many_txn,
    vector_index=True, serving_kind=ServingKind.VISUAL.value,
    batch_size_setting="visual_batch_size", batch_budget_setting="visual_batch_max_pixels",
    paid=False, slots=False,
)

AGENT = StageSpec(
    stage=Stage.AGENT, lane=Lane.AGENT, provider_kind="agent", protocol=AgentProvider, config_field="agent",
    fingerprint=lambda image, job: fp.agent_fingerprint(image.sha256, job.configs.agent_hash, job.reverse_image_policy),
    valid=agent_context_valid,
    payload=lambda job, image, configs: {
        "reverse_image_policy": job["reverse_image_policy"], "agent_config_hash": configs.agent_hash,
    },
    resource_key=lambda configs: f"{configs.agent.get('provider', '')}:{configs.agent.get('model', '')}",
    artifact=AgentArtifact, artifact_table="images",  # images.context / context_provenance
    exists_field=None, exists_txn=None,  # validity is read from the image row itself
    artifact_rows=None, write_many_txn=None,  # images.write_agent_contexts_txn, with attempts and grants
    vector_index=False, serving_kind=None,
    batch_size_setting="agent_batch", batch_budget_setting=None,
    paid=True, slots=True,
)

TEXT_EMBEDDING = StageSpec(
    stage=Stage.TEXT_EMBEDDING, lane=Lane.EMBEDDING, provider_kind="text", protocol=TextEmbeddingProvider,
    config_field="text",
    fingerprint=lambda image, job: (
        fp.text_fingerprint(image.sha256, image.metadata_hash, job.configs.text) if image.metadata_hash else None
    ),
    valid=lambda image, job: image.metadata_hash is not None and image.text_exists,
    payload=lambda job, image, configs: {"metadata_hash": image["metadata_hash"]},
    resource_key=lambda configs: "",
    artifact=TextArtifact, artifact_table="text_embeddings",
    exists_field="text_exists",
    exists_txn=lambda conn, image, configs: artifacts.text_exists_txn(
        conn, image["scope_id"], image["id"], image["sha256"], image["metadata_hash"], configs.text),
    artifact_rows=_text_rows, write_many_txn=artifacts.insert_text_many_txn,
    vector_index=True, serving_kind=ServingKind.TEXT.value,
    batch_size_setting="embedding_batch_size", batch_budget_setting="embedding_batch_max_chars",
    paid=False, slots=False,
)

#: The pipeline, in order: a job walks these stages (SPEC §4.3).
STAGES: tuple[StageSpec, ...] = (VISUAL, AGENT, TEXT_EMBEDDING)
SPECS: Mapping[str, StageSpec] = {s.stage.value: s for s in STAGES}
_BY_LANE: Mapping[str, StageSpec] = {s.lane.value: s for s in STAGES}
#: Lanes with DB-wide slots and fair admission; lanes whose hints claim budgeted batches.
SLOT_LANES: tuple[str, ...] = tuple(s.lane.value for s in STAGES if s.slots)
BATCHED_LANES: frozenset[str] = frozenset(s.lane.value for s in STAGES if s.batched)


def spec(stage: str) -> StageSpec:
    """The declaration of ``stage`` (KeyError for an unknown stage)."""
    return SPECS[str(stage)]


def by_lane(lane: str) -> StageSpec | None:
    """The stage whose tasks run on ``lane`` (None for a lane that runs no stage: webhooks)."""
    return _BY_LANE.get(str(lane))


def lane_of(stage: str) -> str:
    """The lane of ``stage``'s leaf tasks."""
    return SPECS[str(stage)].lane.value


def write_artifacts_txn(conn: Connection, results: list[tuple[Claim, Any]]) -> None:
    """The stored artifacts of landed, non-stale claims that have a writer: one statement per stage."""
    known = tuple(s.artifact for s in STAGES)
    unknown = [a for _, a in results if not isinstance(a, known)]
    if unknown:
        raise TypeError(f"unknown artifact {type(unknown[0]).__name__}")
    for s in STAGES:
        if s.write_many_txn is not None and s.artifact_rows is not None:
            s.write_many_txn(conn, [row for c, a in results if isinstance(a, s.artifact) for row in s.artifact_rows(c, a)])
