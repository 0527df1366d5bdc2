"""Library blueprint: ``/`` (upload, live progress, search, look-alikes) and ``/library/images/<id>``.

Server-rendered with Jinja; the page script (``static/library.js``, no build step, no CDN) calls the
public API — upload, search, visual search, context edit, jobs and the event stream — so the page
can do nothing an API client cannot. Auth is /ops's: the same scope getter (the API's resolver, or
in token mode a browser session from ``/login``); the API honours that session for this page's own
requests (:mod:`app.web.page_auth`). These views only read; they have no POST.
"""

from __future__ import annotations

import uuid
from typing import Any

from flask import Blueprint, Flask, abort, current_app, g, render_template, request, url_for

from app.library import queries
from app.ops.queries import image_detail
from app.ops.views import resolve_page_scope
from app.stages.agent.context_text import single_line
from app.thumbnails import DEFAULT_SIZE
from app.web.csrf import set_csrf_cookie
from app.web.page_auth import CSRF_HEADER

library_bp = Blueprint("library", __name__, template_folder="templates", static_folder="static",
                       static_url_path="/library/static")
library_bp.after_request(set_csrf_cookie)

RECENT = 60
CURSOR_KIND = "library"  # its own HMAC domain: an API cursor is not a library one


def register_library(app: Flask) -> None:
    """Mount the library on an app that already has /ops (its auth and sign-in) registered."""
    if "memeflow_ops" not in app.extensions:
        raise RuntimeError("register_ops first: the library uses its sign-in and scope getter")
    app.register_blueprint(library_bp)


def _ops() -> Any:
    return current_app.extensions["memeflow_ops"]


@library_bp.before_request
def _resolve_scope() -> Any:
    """The scope, exactly as /ops resolves it; a browser without credentials goes to /login."""
    if request.endpoint == "library.static":
        return None
    return resolve_page_scope()


def _thumb_url(image_id: Any, sha256: str, size: int = DEFAULT_SIZE) -> str:
    return url_for("images.ImageThumbnail", image_id=image_id, size=size, v=sha256)


def _tag_lines(tags: list[str]) -> str:
    """The edit form's tags field: one tag a line. A tag holds no line break once stored
    (app/stages/agent/context_text.py); one stored before that shows as PATCH would store it."""
    return "\n".join(single_line(tag) for tag in tags)


@library_bp.app_context_processor
def _helpers() -> dict[str, Any]:
    return {"thumb_url": _thumb_url, "csrf_header": CSRF_HEADER, "single_line": single_line,
            "tag_lines": _tag_lines}


@library_bp.get("/")
def index() -> Any:
    """Upload zone, search box and the newest images (``?older=<cursor>``: the next page back)."""
    cursors = current_app.extensions["memeflow"].cursors
    before = cursors.decode(request.args.get("older") or None, CURSOR_KIND, g.ops_scope)  # 422 invalid_cursor if forged
    images, more, total = queries.recent_images(_ops().engine(), g.ops_scope, RECENT, before)
    older = cursors.encode((images[-1]["created_at"], images[-1]["id"]), CURSOR_KIND, g.ops_scope) if more else None
    return render_template("library/index.html", images=images, total=total, older=older, paged=before is not None)


@library_bp.get("/library/images/<uuid:image_id>")
def image(image_id: uuid.UUID) -> Any:
    """One image: its context (editable through ``PATCH /api/v1/images/<id>``) and stage timeline."""
    detail = image_detail(_ops().engine(), g.ops_scope, image_id)
    if detail is None:
        abort(404)
    return render_template("library/image.html", d=detail)
