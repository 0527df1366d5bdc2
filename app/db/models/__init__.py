"""SQLAlchemy 2.0 models: the whole schema of SPEC §3. No behaviour beyond declaration.

Tenant rows carry ``scope_id`` and point at each other through composite ``(scope_id, …)``
foreign keys, so a row can never reference another scope's data. Every status column has a
CHECK constraint generated from :mod:`app.db.enums`; the invariants the orchestrator relies on
(one active job per image, one active task per dedupe key) are partial unique indexes.

One module per entity group; importing this package registers every table on ``Base.metadata``
(Alembic's ``env.py`` and the schema test), and ``from app.db.models import X`` works for each.
"""

from app.db.models.artifacts import TextEmbedding, VisualEmbedding
from app.db.models.base import NAMING, SCOPE_ID_PATTERN, Base, status_check
from app.db.models.events import (
    EVENTS_ID_SEQ,
    Event,
    EventPending,
    EventPruneMark,
    EventStreamSlot,
    WebhookFailure,
    WebhookSubscription,
)
from app.db.models.images import Image
from app.db.models.jobs import Batch, BatchItem, JobStage, ProcessingJob
from app.db.models.ops import OpsCounter, RetentionWalk, SweepState, WorkerRegistration
from app.db.models.search import SearchServing, SearchServingEvent
from app.db.models.tasks import LANE_DISPATCH_SEQ, LaneFairness, LaneSlot, OperationGrant, Task, TaskAttempt
from app.db.models.tenancy import ApiToken, AppSecret, BrowserSession, RateWindow, Scope, ScopeLimit, ScopeUsage

__all__ = [
    "NAMING",
    "SCOPE_ID_PATTERN",
    "Base",
    "status_check",
    "Scope",
    "ScopeLimit",
    "ScopeUsage",
    "RateWindow",
    "ApiToken",
    "BrowserSession",
    "AppSecret",
    "Image",
    "Batch",
    "ProcessingJob",
    "JobStage",
    "BatchItem",
    "Task",
    "TaskAttempt",
    "LaneSlot",
    "LANE_DISPATCH_SEQ",
    "LaneFairness",
    "OperationGrant",
    "VisualEmbedding",
    "TextEmbedding",
    "OpsCounter",
    "WorkerRegistration",
    "SweepState",
    "RetentionWalk",
    "EVENTS_ID_SEQ",
    "Event",
    "EventPending",
    "EventPruneMark",
    "EventStreamSlot",
    "WebhookSubscription",
    "WebhookFailure",
    "SearchServing",
    "SearchServingEvent",
]
