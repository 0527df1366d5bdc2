"""``/api/v1/webhooks``: the scope's webhook subscriptions (the secret is shown once, at creation)."""

from __future__ import annotations

import uuid

from flask.views import MethodView

from app.api import schemas as S
from app.api.context import Blueprint, protect, scope_id, services
from app.api.errors import error_docs

blp = protect(Blueprint("webhooks", __name__, url_prefix="/api/v1/webhooks", description="Webhooks"))


@blp.route("")
class Webhooks(MethodView):
    @blp.arguments(S.WebhookCreateSchema)
    @blp.response(201, S.WebhookCreatedSchema)
    @blp.doc(responses=error_docs({
        409: "too_many_webhooks", 415: "unsupported_media_type",
        422: "invalid_webhook_url / webhook_url_too_long / webhook_url_forbidden / webhook_url_unresolvable"
             " / invalid_event_type"}))
    def post(self, args):
        """Subscribe a URL to the scope's events from now on (all types unless ``event_types``).
        Deliveries are POSTs signed with the returned ``secret`` — shown only in this response."""
        webhook, secret = services().orchestrator.create_webhook(scope_id(), args["url"], args.get("event_types"))
        return {"webhook": webhook, "secret": secret}

    @blp.response(200, S.WebhookListSchema)
    def get(self):
        """The scope's subscriptions with their delivery state (never their secrets)."""
        return {"items": services().orchestrator.list_webhooks(scope_id())}


@blp.route("/<uuid:webhook_id>")
class WebhookById(MethodView):
    @blp.response(204)
    @blp.doc(responses=error_docs({404: "not_found", 409: "webhook_delivery_in_flight"}))
    def delete(self, webhook_id: uuid.UUID):
        """Delete a subscription: no delivery to it starts after this returns."""
        services().orchestrator.delete_webhook(scope_id(), webhook_id)
