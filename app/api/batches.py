"""``/api/v1/batches``: process the whole library (or given images) with exact progress."""

from __future__ import annotations

import uuid

from flask.views import MethodView

from app.api import schemas as S
from app.api.context import Blueprint, limit_rate, protect, publish, scope_id, services
from app.api.errors import error_docs
from app.orchestrator.batches import REQUEST_PAGE

blp = protect(Blueprint("batches", __name__, url_prefix="/api/v1/batches", description="Batches"))


def _orch_call(name: str):
    return getattr(services().orchestrator, name)


@blp.route("")
class Batches(MethodView):
    @blp.arguments(S.BatchCreateSchema)
    @blp.response(202, S.BatchEnvelopeSchema)
    @blp.doc(responses=error_docs({404: "not_found", 415: "unsupported_media_type", 422: "validation_error",
                                   429: "rate_limited"}))
    def post(self, args):
        """Snapshot the target set (all images or the given ids) and process it in explicit mode."""
        limit_rate("processing")
        batch, hints = _orch_call("create_batch")(
            scope_id(),
            all=args["all"],
            image_ids=args.get("image_ids") or [],
            reverse_image_policy=args["reverse_image_policy"],
            first_page_size=min(REQUEST_PAGE, services().settings.batch_page_size),
        )
        publish(hints)
        return {"batch": batch}


@blp.route("/<uuid:batch_id>")
class BatchById(MethodView):
    @blp.response(200, S.BatchEnvelopeSchema)
    @blp.doc(responses=error_docs({404: "not_found"}))
    def get(self, batch_id: uuid.UUID):
        """Exact progress: counts of the batch's item jobs by status."""
        return {"batch": _orch_call("get_batch")(scope_id(), batch_id)}


@blp.route("/<uuid:batch_id>/cancel")
class BatchCancel(MethodView):
    @blp.response(200, S.BatchEnvelopeSchema)
    @blp.doc(responses=error_docs({404: "not_found"}))
    def post(self, batch_id: uuid.UUID):
        """Stop seeding and cancel the batch's queued jobs (not one that another unfinished batch
        over the same image follows); a completed batch is returned unchanged.
        A cancelled one keeps its status, and cancelling it again cancels its jobs still active (a
        cancel cut short, e.g. the request killed midway, is finished this way)."""
        result = _orch_call("cancel_batch")(scope_id(), batch_id)
        if isinstance(result, tuple):
            batch, hints = result
            publish(hints)
        else:
            batch = result
        return {"batch": batch}
