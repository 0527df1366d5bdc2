"""Typed orchestrator errors with stable codes; the API maps them to {"error": code, …}."""

from __future__ import annotations


class OrchestratorError(Exception):
    """Base of all domain errors."""

    code = "orchestrator_error"
    status = 400

    def __init__(self, message: str | None = None, *, code: str | None = None, **details: object):
        self.message = message or (self.__doc__ or self.code).strip()
        if code:
            self.code = code
        self.details = details
        super().__init__(self.message)


class NotFound(OrchestratorError):
    """Not found."""

    code = "not_found"
    status = 404


class GenerationPolicyConflict(OrchestratorError):
    """An active job for this image uses a different reverse_image_policy or configuration."""

    code = "generation_policy_conflict"
    status = 409


class DuplicateImage(OrchestratorError):
    """Another image of the scope already has exactly these bytes."""

    code = "duplicate_image"
    status = 409


class ContextGenerationInProgress(OrchestratorError):
    """The agent stage is queued or running for this image; edit the context when it is done."""

    code = "context_generation_in_progress"
    status = 409


class JobNotRetryable(OrchestratorError):
    """Only failed, blocked, unknown_execution, cancelled or target_changed jobs can be retried."""

    code = "job_not_retryable"
    status = 409


class JobNotActive(OrchestratorError):
    """Only queued or running jobs can be cancelled."""

    code = "job_not_active"
    status = 409


class InvalidRequest(OrchestratorError):
    """The request is not valid."""

    code = "invalid_request"
    status = 422


class QuotaExceeded(OrchestratorError):
    """The scope's storage or image quota is reached; nothing was stored."""

    code = "quota_exceeded"
    status = 403


class StorageFull(OrchestratorError):
    """The image storage has no space left (or the quota of its filesystem is reached); nothing was stored."""

    code = "storage_full"
    status = 507


class StorageUnavailable(OrchestratorError):
    """The image storage refused the write (read-only, permissions, I/O error); nothing was stored."""

    code = "storage_unavailable"
    status = 503


class UnstorableResult(OrchestratorError):
    """A completion held a value PostgreSQL refuses to store; its transaction wrote nothing."""

    code = "unstorable_result"
    status = 500  # a worker-side condition: the worker fails the item it belongs to, never the API


class RateLimited(OrchestratorError):
    """Too many requests in this minute; ``details['retry_after']`` seconds until the window ends."""

    code = "rate_limited"
    status = 429


class TooManyStreams(OrchestratorError):
    """Too many live event streams for this scope (or this API process); retry later."""

    code = "too_many_streams"
    status = 429


class InvalidWebhook(OrchestratorError):
    """The webhook subscription is not acceptable (see the code)."""

    code = "invalid_webhook"
    status = 422


class TooManyWebhooks(OrchestratorError):
    """The scope has as many webhook subscriptions as it may have; delete one first."""

    code = "too_many_webhooks"
    status = 409


class WebhookDeliveryInFlight(OrchestratorError):
    """A delivery to this webhook is in flight; retry the delete in a few seconds."""

    code = "webhook_delivery_in_flight"
    status = 409


class ServingStateConflict(OrchestratorError):
    """The scope's search serving state does not allow this change now."""

    code = "serving_state_conflict"
    status = 409
