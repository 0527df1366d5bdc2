"""``/api/v1/jobs`` and ``/api/v1/tasks``: progress, retry, cancel, leaf task details."""

from __future__ import annotations

import uuid

from flask.views import MethodView

from app.api import schemas as S
from app.api.context import Blueprint, limit_rate, protect, publish, scope_id, services
from app.api.errors import error_docs

blp = protect(Blueprint("jobs", __name__, url_prefix="/api/v1/jobs", description="Processing jobs"))
tasks_blp = protect(Blueprint("tasks", __name__, url_prefix="/api/v1/tasks", description="Leaf tasks"))


@blp.route("")
class Jobs(MethodView):
    @blp.arguments(S.JobListArgsSchema, location="query")
    @blp.response(200, S.JobListSchema)
    @blp.doc(responses=error_docs({422: "invalid_cursor / validation_error"}))
    def get(self, args):
        """List jobs of the scope, oldest first, optionally by status and image."""
        svc = services()
        after = svc.cursors.decode(args.get("cursor"), "jobs", scope_id())
        items, next_key = svc.orchestrator.list_jobs(
            scope_id(), status=args.get("status"), image_id=args.get("image_id"), after=after, limit=args["limit"]
        )
        return {"items": items, "next_cursor": svc.cursors.encode(next_key, "jobs", scope_id())}


@blp.route("/<uuid:job_id>")
class JobById(MethodView):
    @blp.response(200, S.JobSchema)
    @blp.doc(responses=error_docs({404: "not_found"}))
    def get(self, job_id: uuid.UUID):
        """A job with its stages (visual, agent, text_embedding), progress and error."""
        return services().orchestrator.get_job(scope_id(), job_id)


@blp.route("/<uuid:job_id>/retry")
class JobRetry(MethodView):
    @blp.response(201, S.JobEnvelopeSchema)
    @blp.alt_response(200, schema=S.JobEnvelopeSchema,
                      description="nothing created: the image's newer job (active, or already valid) covers it")
    @blp.doc(responses=error_docs({404: "not_found", 409: "job_not_retryable / generation_policy_conflict",
                                   429: "rate_limited"}))
    def post(self, job_id: uuid.UUID):
        """A new revision that resumes at the first failed, blocked, unknown or stale stage."""
        limit_rate("processing")
        result = services().orchestrator.retry_job(scope_id(), job_id)
        publish(result.hints)
        return {"job": result.job}, (201 if result.created else 200)


@blp.route("/<uuid:job_id>/cancel")
class JobCancel(MethodView):
    @blp.response(200, S.JobEnvelopeSchema)
    @blp.doc(responses=error_docs({404: "not_found", 409: "job_not_active"}))
    def post(self, job_id: uuid.UUID):
        """Cancel a queued or running job (running leaf tasks are asked to stop)."""
        return {"job": services().orchestrator.cancel_job(scope_id(), job_id)}


@tasks_blp.route("/<uuid:task_id>")
class TaskById(MethodView):
    @tasks_blp.response(200, S.TaskSchema)
    @tasks_blp.doc(responses=error_docs({404: "not_found"}))
    def get(self, task_id: uuid.UUID):
        """A leaf task: status, attempts, available_at, error."""
        return services().orchestrator.get_task(scope_id(), task_id)
