"""``/api/v1/search/serving?kind=text|visual``: the scope's search serving model during a model
change, and the operator's switches (cut over early, roll back, resume) — scope from the bearer
token, like /ops."""

from __future__ import annotations

from flask.views import MethodView

from app.api import schemas as S
from app.api.context import Blueprint, protect, publish, scope_id, services
from app.api.errors import error_docs

blp = protect(Blueprint("search_serving", __name__, url_prefix="/api/v1/search/serving",
                        description="Search serving model (model changes)"))


@blp.route("")
class Serving(MethodView):
    @blp.arguments(S.ServingArgsSchema, location="query")
    @blp.response(200, S.ServingStateSchema)
    def get(self, args):
        """Serving model, target being filled and both coverages, epoch, recent switches."""
        return services().orchestrator.search_serving_status(scope_id(), args["kind"])


@blp.route("/cutover")
class ServingCutover(MethodView):
    @blp.arguments(S.ServingArgsSchema, location="query")
    @blp.response(200, S.ServingStateSchema)
    @blp.doc(responses=error_docs({409: "serving_state_conflict"}))
    def post(self, args):
        """Serve the target model now, before it covers every image (those it lacks are found by words only)."""
        return services().orchestrator.search_cutover(scope_id(), args["kind"])


@blp.route("/rollback")
class ServingRollback(MethodView):
    @blp.arguments(S.ServingArgsSchema, location="query")
    @blp.response(200, S.ServingStateSchema)
    @blp.doc(responses=error_docs({409: "serving_state_conflict"}))
    def post(self, args):
        """Abort a backfill, or serve the previous model again after a cutover; the scope stays pinned."""
        doc, hints = services().orchestrator.search_rollback(scope_id(), args["kind"])
        publish(hints)
        return doc


@blp.route("/resume")
class ServingResume(MethodView):
    @blp.arguments(S.ServingArgsSchema, location="query")
    @blp.response(200, S.ServingStateSchema)
    @blp.doc(responses=error_docs({409: "serving_state_conflict"}))
    def post(self, args):
        """Unpin: the sweep starts a backfill towards the configured model if it differs."""
        return services().orchestrator.search_resume(scope_id(), args["kind"])
