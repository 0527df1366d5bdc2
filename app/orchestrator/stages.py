"""What a stage is, declared once: the stage registry (issue 19).

Each :class:`StageSpec` says, for one stage of the pipeline, everything the orchestrator, the
workers and the supervisor otherwise had to know by name: its lane, which provider kind computes it
(and that provider's interface), where its frozen config lives, its input fingerprint and validity
rule (SPEC §3.3), the store statements that check and write its artifact, and how its lane batches.
Code that needs per-stage knowledge looks it up here (``SPECS[stage]``, ``by_lane(lane)``) instead
of comparing with ``"visual"``; :data:`STAGES` is the pipeline in order. The store statements with a
part per stage — the planner's facts (store/facts.py) and the batched claims' cost (store/tasks.py)
— are built from these declarations once, at import (``exists_columns``, ``BATCH_COST_CASE``), and
checked in rendered as docs/sql/*.sql.

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
from app.orchestrator.store import artifacts
from app.orchestrator.store.serving_fill import SERVING_TEXT_MISSING, SERVING_VISUAL_MISSING
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
    # its short name in StageConfigs(visual=…) and configs.<key> (a job's config column and
    # configs[stage] use the stage's own name)
    config_key: str
    # SPEC §3.3: the canonical hash of exactly its inputs (None: not computable yet), and whether
    # its current artifact is valid for the job — pure, from the planner's facts
    fingerprint: Callable[[ImageFacts, JobFacts], str | None]
    valid: Callable[[ImageFacts, JobFacts], bool]
    # frozen inputs its task payload carries besides the image and the stage config hash
    payload: Callable[[RowMapping, RowMapping, StageConfigs], dict[str, Any]]
    resource_key: Callable[[StageConfigs], str]  # the lane-slot pool key ('' = the lane's only pool)
    artifact: type  # what the worker hands to complete_tasks
    artifact_table: str  # where the artifact is stored
    # the validity query: does its current artifact for the job's config exist? A SQL boolean over
    # {scope} {image} {sha} {mh} (the image version) and {config} (its jsonb config); it fills
    # ImageFacts.exists[stage] (a str.format template: literal braces doubled). None: validity is
    # read from the image row itself. store/facts.py puts every stage's into one statement
    # (rendered: docs/sql/)
    exists_sql: str | None
    # the artifact writer: the rows of one landed claim, and the statement writing many of them
    # (None: the stage writes its own way — the agent's context goes onto the image row together
    # with its attempt and grant, execution._write_agent_results_txn)
    artifact_rows: Callable[[Claim, Any], list[dict[str, Any]]] | None
    write_many_txn: Callable[[Connection, list[dict[str, Any]]], None] | None
    vector_index: bool  # one HNSW index per model on artifact_table (ensure_vector_index)
    serving_kind: str | None  # its search serving state (app/orchestrator/serving.py), if any
    # batching: the Settings fields of its batch size and batch budget (None: not budgeted), and
    # what one task costs in that budget, as SQL over its image row ``i`` (the batched claims'
    # CASE, BATCH_COST_CASE)
    batch_size_setting: str
    batch_budget_setting: str | None
    batch_cost_sql: str | None
    paid: bool  # a paid external call: attempt protocol (SPEC §4.5) and operation grant (§4.6)
    slots: bool  # DB-wide lane slots and fair admission (lanes.py, SPEC §4.10)

    @property
    def exists_column(self) -> str | None:
        """The column of its validity query in the facts statements (store/facts.py)."""
        return f"{self.stage.value}_exists" if self.exists_sql is not None else None

    @property
    def batched(self) -> bool:
        """Its hint claims a wake-up group plus a fair fill within a budget (visual, embedding);
        a new task may join a queued group of its lane."""
        return self.batch_budget_setting is not None

    def config(self, configs: StageConfigs) -> dict[str, Any]:
        """Its frozen provider config in a job's configs."""
        return configs[self.stage.value]


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
    stage=Stage.VISUAL, lane=Lane.VISUAL, provider_kind="visual", protocol=VisualProvider, config_key="visual",
    fingerprint=lambda image, job: fp.visual_fingerprint(image.sha256, job.configs[Stage.VISUAL]),
    valid=lambda image, job: image.exists[Stage.VISUAL],
    payload=_no_payload, resource_key=lambda configs: "",
    artifact=VisualArtifact, artifact_table="visual_embeddings",
    # an embedding for (sha256, model, preprocess_version, dims) — and, in a model change, of the
    # scope's serving and target models too
    exists_sql=(
        "EXISTS (SELECT 1 FROM visual_embeddings v WHERE v.scope_id = {scope} AND v.image_id = {image}\n"
        "  AND v.image_sha256 = {sha} AND v.model = {config}->>'model'\n"
        "  AND v.preprocess_version = {config}->>'preprocess_version' AND v.dims = ({config}->>'dims')::int)\n"
        "AND NOT " + SERVING_VISUAL_MISSING
    ),
    artifact_rows=_visual_rows, write_many_txn=artifacts.insert_visual_many_txn,
    vector_index=True, serving_kind=ServingKind.VISUAL.value,
    batch_size_setting="visual_batch_size", batch_budget_setting="visual_batch_max_pixels",
    batch_cost_sql="i.width::bigint * i.height",  # decoded pixels
    paid=False, slots=False,
)

AGENT = StageSpec(
    stage=Stage.AGENT, lane=Lane.AGENT, provider_kind="agent", protocol=AgentProvider, config_key="agent",
    fingerprint=lambda image, job: fp.agent_fingerprint(image.sha256, job.configs.agent_hash, job.reverse_image_policy),
    valid=agent_context_valid,
    payload=lambda job, image, configs: {
        "reverse_image_policy": job["reverse_image_policy"], "agent_config_hash": configs.agent_hash,
    },
    resource_key=lambda configs: f"{configs[Stage.AGENT].get('provider', '')}:{configs[Stage.AGENT].get('model', '')}",
    artifact=AgentArtifact, artifact_table="images",  # images.context / context_provenance
    exists_sql=None,  # validity is read from the image row itself (agent_context_valid)
    artifact_rows=None, write_many_txn=None,  # images.write_agent_contexts_txn, with attempts and grants
    vector_index=False, serving_kind=None,
    batch_size_setting="agent_batch", batch_budget_setting=None, batch_cost_sql=None,
    paid=True, slots=True,
)

TEXT_EMBEDDING = StageSpec(
    stage=Stage.TEXT_EMBEDDING, lane=Lane.EMBEDDING, provider_kind="text", protocol=TextEmbeddingProvider,
    config_key="text",
    fingerprint=lambda image, job: (
        fp.text_fingerprint(image.sha256, image.metadata_hash, job.configs[Stage.TEXT_EMBEDDING])
        if image.metadata_hash else None
    ),
    valid=lambda image, job: image.metadata_hash is not None and image.exists[Stage.TEXT_EMBEDDING],
    payload=lambda job, image, configs: {"metadata_hash": image["metadata_hash"]},
    resource_key=lambda configs: "",
    artifact=TextArtifact, artifact_table="text_embeddings",
    # a ready embedding of (sha256, metadata_hash, model, dims) rendered with the config's
    # document_version (part of the fingerprint: another rendering is another artifact) — and of the
    # serving and target models (any rendering: a model is its name and dims)
    exists_sql=(
        "EXISTS (SELECT 1 FROM text_embeddings x WHERE x.scope_id = {scope} AND x.image_id = {image}\n"
        "  AND x.image_sha256 = {sha} AND x.metadata_hash = {mh} AND x.status = 'ready'\n"
        "  AND x.model = {config}->>'model' AND x.dims = ({config}->>'dims')::int\n"
        "  AND x.document_version = coalesce({config}->>'document_version', '1'))\n"
        "AND NOT " + SERVING_TEXT_MISSING
    ),
    artifact_rows=_text_rows, write_many_txn=artifacts.insert_text_many_txn,
    vector_index=True, serving_kind=ServingKind.TEXT.value,
    batch_size_setting="embedding_batch_size", batch_budget_setting="embedding_batch_max_chars",
    # the display name and the context's JSON text, at least as long as the rendered document
    batch_cost_sql="coalesce(length(i.display_name), 0) + coalesce(length(i.context::text), 0)",
    paid=False, slots=False,
)

#: The pipeline, in order: a job walks these stages (SPEC §4.3).
STAGES: tuple[StageSpec, ...] = (VISUAL, AGENT, TEXT_EMBEDDING)
SPECS: Mapping[str, StageSpec] = {s.stage.value: s for s in STAGES}
BY_CONFIG_KEY: Mapping[str, StageSpec] = {s.config_key: s for s in STAGES}
#: The stages with a validity query (ImageFacts.exists, the facts statements' columns).
EXISTS_STAGES: tuple[StageSpec, ...] = tuple(s for s in STAGES if s.exists_sql is not None)
_BY_LANE: Mapping[str, StageSpec] = {s.lane.value: s for s in STAGES}
#: Lanes with DB-wide slots and fair admission; lanes whose hints claim budgeted batches.
SLOT_LANES: tuple[str, ...] = tuple(s.lane.value for s in STAGES if s.slots)
BATCHED_LANES: frozenset[str] = frozenset(s.lane.value for s in STAGES if s.batched)


def exists_columns(specs: tuple[StageSpec, ...], *, scope: str, image: str, sha: str, mh: str, config: str,
                   indent: str = "       ") -> str:
    """The select list of every stage's validity query (``<exists_sql> AS <stage>_exists``, one per
    line group, continuation lines under ``indent``), over the given SQL for the image version and
    the stage's config (``config`` is formatted with ``stage``). store/facts.py builds its two
    statements from it, once at import."""
    return f",\n{indent}".join(
        (s.exists_sql.format(scope=scope, image=image, sha=sha, mh=mh, config=config.format(stage=s.stage.value))
         + f" AS {s.exists_column}").replace("\n", f"\n{indent}")
        for s in specs if s.exists_sql is not None
    )


def batch_cost_case(specs: tuple[StageSpec, ...]) -> str:
    """What one task of a batched lane costs in its batch budget, as SQL over its task ``t`` and
    image ``i``: one CASE branch per batched stage (the batched claims in store/tasks.py)."""
    branches = "\n              ".join(f"WHEN t.lane = '{s.lane.value}' THEN {s.batch_cost_sql}" for s in specs if s.batched)
    return f"CASE {branches} END"


#: The batched claims' cost of a task (store/tasks.py CLAIM_GROUP, CLAIM_FAIR_BATCH).
BATCH_COST_CASE = batch_cost_case(STAGES)


def spec(stage: str) -> StageSpec:
    """The declaration of ``stage`` (KeyError for an unknown stage)."""
    return SPECS[str(stage)]


def by_lane(lane: str) -> StageSpec | None:
    """The stage whose tasks run on ``lane`` (None for a lane that runs no stage: webhooks)."""
    return _BY_LANE.get(str(lane))


def lane_of(stage: str) -> str:
    """The lane of ``stage``'s leaf tasks."""
    return SPECS[str(stage)].lane.value


def earlier_lanes(lane: str) -> tuple[str, ...]:
    """The lanes of the stages before ``lane``'s in the pipeline order (those whose completions feed it)."""
    order = [s.lane.value for s in STAGES]
    return tuple(order[:order.index(str(lane))]) if str(lane) in order else ()


def write_artifacts_txn(conn: Connection, results: list[tuple[Claim, Any]]) -> None:
    """The stored artifacts of landed, non-stale claims that have a writer: one statement per stage."""
    known = tuple(s.artifact for s in STAGES)
    unknown = [a for _, a in results if not isinstance(a, known)]
    if unknown:
        raise TypeError(f"unknown artifact {type(unknown[0]).__name__}")
    for s in STAGES:
        if s.write_many_txn is not None and s.artifact_rows is not None:
            s.write_many_txn(conn, [row for c, a in results if isinstance(a, s.artifact) for row in s.artifact_rows(c, a)])
