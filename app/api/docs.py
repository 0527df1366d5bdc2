"""``/api/docs``: Swagger UI served by memeflow itself, never from a CDN (works with no internet).

The assets come from the pinned ``flask-swagger-ui`` package (its ``dist/`` folder is the Swagger UI
release of the same version number); only its files are used, not its blueprint, whose page
carries an inline script. Ours loads everything from this origin, so the page keeps the strict
self-only CSP of :mod:`app.web.headers`.
"""

from __future__ import annotations

from importlib.metadata import version
from importlib.resources import files
from pathlib import Path

from flask import Blueprint, abort, render_template, send_from_directory, url_for

SWAGGER_UI_DIST = Path(str(files("flask_swagger_ui") / "dist"))
SWAGGER_UI_VERSION = version("flask-swagger-ui")
# The files the page needs; nothing else of the package's folder is reachable.
SWAGGER_UI_ASSETS = frozenset({"swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png", "favicon-16x16.png"})
ASSET_MAX_AGE_S = 3600

bp = Blueprint("api_docs", __name__, url_prefix="/api/docs", template_folder="templates", static_folder="static")


@bp.get("")
def swagger_ui():
    """The OpenAPI UI for ``/api/openapi.json``."""
    return render_template("api_docs/swagger_ui.html", spec_url=url_for("api-docs.openapi_json"),
                           swagger_ui_version=SWAGGER_UI_VERSION)


@bp.get("/swagger-ui/<name>")
def swagger_ui_asset(name: str):
    """One file of the pinned Swagger UI release."""
    if name not in SWAGGER_UI_ASSETS:
        abort(404)
    return send_from_directory(SWAGGER_UI_DIST, name, max_age=ASSET_MAX_AGE_S)
