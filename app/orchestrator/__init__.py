"""The DB-authoritative orchestrator: the only place that decides job and task state."""

from app.orchestrator.errors import (
    ContextGenerationInProgress,
    GenerationPolicyConflict,
    InvalidRequest,
    JobNotActive,
    JobNotRetryable,
    NotFound,
    OrchestratorError,
)
from app.orchestrator.hints import Hint, HintPublisher, NullPublisher, RecordingPublisher
from app.orchestrator.service import Orchestrator
from app.orchestrator.types import (
    AgentArtifact,
    Claim,
    ImageJobResult,
    IngestResult,
    JobResult,
    StageConfigs,
    SweepReport,
    TextArtifact,
    VisualArtifact,
)

__all__ = [
    "AgentArtifact", "Claim", "ContextGenerationInProgress", "GenerationPolicyConflict", "Hint",
    "HintPublisher", "ImageJobResult", "IngestResult", "InvalidRequest", "JobNotActive", "JobNotRetryable",
    "JobResult", "NotFound", "NullPublisher", "Orchestrator", "OrchestratorError", "RecordingPublisher",
    "StageConfigs", "SweepReport", "TextArtifact", "VisualArtifact",
]
