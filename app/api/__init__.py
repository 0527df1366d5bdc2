"""The Flask REST API (SPEC §6): an app factory, one blueprint per resource, one error handler."""

from __future__ import annotations

from typing import Any

from flask import Flask, Request
from flask_smorest import Api

from app.api.context import Services
from app.api.errors import register_error_handlers
from app.api.hosts import install_request_guards
from app.api.pagination import CursorCodec, cursor_secret
from app.api.schemas import ErrorSchema

# Multipart framing (boundaries, part headers, small form fields) on top of the file itself.
MULTIPART_OVERHEAD = 64 * 1024


class UploadRequest(Request):
    """Tracks the temp files of multipart parts so that they are closed even when parsing
    aborts half-way (413 on a chunked body leaves werkzeug's partial part unreferenced)."""

    def _get_file_stream(self, total_content_length, content_type, filename=None, content_length=None):
        stream = super()._get_file_stream(total_content_length, content_type, filename, content_length)
        self.__dict__.setdefault("_memeflow_streams", []).append(stream)
        return stream

    def close_upload_streams(self) -> None:
        for stream in self.__dict__.pop("_memeflow_streams", []):
            stream.close()


class MemeflowApi(Api):
    """flask-smorest Api whose documented error body is ours: ``{error, message}``."""

    ERROR_SCHEMA = ErrorSchema


def create_app(
    *,
    scope_resolver: Any,
    settings: Any = None,
    orchestrator: Any = None,
    publisher: Any = None,
    engine: Any = None,
    store: Any = None,
    cursor_secret_key: str | bytes | None = None,
) -> Flask:
    """Build the API. ``scope_resolver`` is mandatory: without one the app refuses to start."""
    if scope_resolver is None or not callable(getattr(scope_resolver, "resolve", None)):
        raise TypeError("create_app needs a scope_resolver (fail closed: no resolver, no API)")
    if settings is None:
        from app.config import get_settings

        settings = get_settings()
    if engine is None:
        engine = getattr(orchestrator, "engine", None)
    if engine is None:
        from app.db.engine import make_engine

        if not settings.database_url:
            raise ValueError("settings.database_url is required (resolve the embedded URLs first)")
        engine = make_engine(settings.database_url)
    if orchestrator is None:
        from app.orchestrator import Orchestrator

        orchestrator = Orchestrator(engine, settings)
    if publisher is None:
        publisher = default_publisher(settings)
    if store is None:
        from app.storage import FileStore

        store = FileStore(settings.storage_path)

    from app.api import multipart

    multipart.install()  # werkzeug's multipart decoder without per-request regex compiles
    app = Flask("memeflow.api")
    app.request_class = UploadRequest
    install_request_guards(app, settings, scope_resolver)  # first: Host allow-list, local-only none mode

    @app.teardown_request
    def _close_upload_streams(exc: BaseException | None) -> None:
        from flask import request

        request.close_upload_streams()
    app.config.update(
        API_TITLE="memeflow",
        API_VERSION="v1",
        OPENAPI_VERSION="3.0.3",
        OPENAPI_URL_PREFIX="/api",
        OPENAPI_JSON_PATH="openapi.json",
        MAX_CONTENT_LENGTH=settings.max_upload_bytes + MULTIPART_OVERHEAD,
        JSON_SORT_KEYS=False,
    )
    app.extensions["memeflow"] = Services(
        settings=settings,
        orchestrator=orchestrator,
        engine=engine,
        publisher=publisher,
        store=store,
        cursors=CursorCodec(cursor_secret(settings, engine, cursor_secret_key)),
        scope_resolver=scope_resolver,
    )
    api = MemeflowApi(app, spec_kwargs={"components": {"securitySchemes": {
        "bearer": {"type": "http", "scheme": "bearer"}}}})
    api.spec.components.schema("VisualSearchJson", schema=_visual_json_schema())

    from app.api import batches, events, health, images, jobs, search, serving, webhooks

    for blp in (images.blp, jobs.blp, jobs.tasks_blp, batches.blp, search.blp, serving.blp, events.blp, webhooks.blp,
                health.blp):
        api.register_blueprint(blp)
    _mount_ops(app)
    _mount_browser_surfaces(app, settings)
    register_error_handlers(app)
    return app


def _mount_browser_surfaces(app: Flask, settings: Any) -> None:
    """/api/docs from memeflow's own Swagger UI files; security headers on every response."""
    from app.api.docs import bp as docs_bp
    from app.web.headers import install_security_headers, trust_proxies

    app.register_blueprint(docs_bp)
    install_security_headers(app)
    trust_proxies(app, getattr(settings, "trusted_proxy_hops", 0))


def _mount_ops(app: Flask) -> None:
    """Serve the operators' /ops page and the library page at / from the same app (same resolver,
    engine, orchestrator; the library uses /ops's sign-in)."""
    from app.library import register_library
    from app.ops import register_ops

    register_ops(app)
    register_library(app)


def _visual_json_schema():
    from app.api.schemas import VisualSearchJsonSchema

    return VisualSearchJsonSchema


def default_publisher(settings: Any) -> Any:
    """Hints go to the broker named by the settings; a broker outage never fails an upload."""
    from app.publisher import publisher_from_settings

    return publisher_from_settings(settings)
