"""Status vocabularies. Each enum is mirrored by a CHECK constraint (tests compare the two)."""

from __future__ import annotations

from enum import StrEnum


class Stage(StrEnum):
    VISUAL = "visual"
    AGENT = "agent"
    TEXT_EMBEDDING = "text_embedding"


STAGE_ORDER: tuple[Stage, ...] = (Stage.VISUAL, Stage.AGENT, Stage.TEXT_EMBEDDING)


class Lane(StrEnum):
    """The Celery queues of the stages' leaf tasks; which stage runs on which: app/orchestrator/stages.py."""

    VISUAL = "visual"
    AGENT = "agent"
    EMBEDDING = "embedding"


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    BLOCKED = "blocked"
    UNKNOWN_EXECUTION = "unknown_execution"
    TARGET_CHANGED = "target_changed"
    SUPERSEDED = "superseded"
    CANCELLED = "cancelled"


ACTIVE_JOB_STATUSES = (JobStatus.QUEUED, JobStatus.RUNNING)
# Terminal outcomes that wait for a human: auto mode returns them instead of retrying.
NEEDS_HUMAN_JOB_STATUSES = (JobStatus.FAILED, JobStatus.BLOCKED, JobStatus.UNKNOWN_EXECUTION)


class StageStatus(StrEnum):
    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    REUSED = "reused"
    FAILED = "failed"
    BLOCKED = "blocked"
    UNKNOWN_EXECUTION = "unknown_execution"
    CANCELLED = "cancelled"


class TaskStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE_TASK_STATUSES = (TaskStatus.QUEUED, TaskStatus.RUNNING)


class AttemptState(StrEnum):
    PREPARED = "prepared"
    EXTERNAL_STARTED = "external_started"
    COMPLETED = "completed"
    FAILED = "failed"
    UNKNOWN_EXECUTION = "unknown_execution"


class GrantState(StrEnum):
    ACQUIRED = "acquired"
    COMMITTED = "committed"
    RELEASED = "released"
    UNKNOWN = "unknown"


class ContextStatus(StrEnum):
    PENDING = "pending"
    READY = "ready"
    EDITED = "edited"


class JobMode(StrEnum):
    AUTO = "auto"
    EXPLICIT = "explicit"
    FULL_RETRY = "full_retry"


class ReverseImagePolicy(StrEnum):
    FORBID = "forbid"
    AUTO = "auto"


class BatchStatus(StrEnum):
    SEEDING = "seeding"
    RUNNING = "running"
    COMPLETED = "completed"
    CANCELLED = "cancelled"


class TextEmbeddingStatus(StrEnum):
    READY = "ready"


class EventType(StrEnum):
    """What the transactional outbox (``events``, migration 0014) records for clients."""

    JOB_SUCCEEDED = "job.succeeded"
    JOB_FAILED = "job.failed"
    JOB_BLOCKED = "job.blocked"
    JOB_UNKNOWN_EXECUTION = "job.unknown_execution"
    JOB_CANCELLED = "job.cancelled"
    JOB_SUPERSEDED = "job.superseded"
    JOB_TARGET_CHANGED = "job.target_changed"
    IMAGE_DELETED = "image.deleted"
    BATCH_PROGRESS = "batch.progress"
    BATCH_COMPLETED = "batch.completed"
    BATCH_CANCELLED = "batch.cancelled"


#: Job statuses whose entry writes a ``job.<status>`` event (the trigger's WHEN clause, migration
#: 0028): every terminal one, so a client following a job by events sees it end however it ended.
EVENT_JOB_STATUSES: tuple[JobStatus, ...] = (
    JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.BLOCKED, JobStatus.UNKNOWN_EXECUTION,
    JobStatus.CANCELLED, JobStatus.SUPERSEDED, JobStatus.TARGET_CHANGED,
)


class ServingKind(StrEnum):
    """Which embeddings a ``search_serving`` row governs (migration 0017)."""

    TEXT = "text"
    VISUAL = "visual"


class ServingState(StrEnum):
    """A scope's search serving state: ``serving`` (one model, steady), ``backfill`` (reads from the
    serving model while the target model is filled), ``pinned`` (an operator rolled back or pinned the
    serving model: no automatic backfill until ``resume``)."""

    SERVING = "serving"
    BACKFILL = "backfill"
    PINNED = "pinned"


class ServingAction(StrEnum):
    """What a ``search_serving_events`` row records."""

    BOOTSTRAP = "bootstrap"
    BACKFILL = "backfill"
    RETARGET = "retarget"
    REFILL = "refill"
    CUTOVER = "cutover"
    EARLY_CUTOVER = "early_cutover"
    ROLLBACK = "rollback"
    ABORT = "abort"
    RESUME = "resume"
