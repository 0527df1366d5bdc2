"""The one error handler: every error is ``{"error": code, "message": …}`` JSON, never HTML.

Domain errors from the orchestrator carry their own stable ``code`` and ``status``; request
validation errors (webargs/marshmallow) become 422 with a code chosen from the offending field;
werkzeug HTTP errors keep their status with a snake_case code; anything unexpected is a logged
500 without a stack trace in the body.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from flask import Flask, jsonify
from marshmallow import ValidationError
from werkzeug.exceptions import HTTPException

from app.api.schemas import INVALID_TEXT, has_unstorable_text
from app.auth import Unauthorized
from app.orchestrator.errors import OrchestratorError, QuotaExceeded, RateLimited

log = logging.getLogger("memeflow.api")


def error_docs(codes: dict[int, str]) -> dict[str, Any]:
    """OpenAPI ``responses`` entries for a view's error statuses, each an ``Error`` body with its code."""
    return {
        str(status): {
            "description": f"error code: {code}",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
        for status, code in codes.items()
    }


# A validation error on one of these fields gets the specific stable code of SPEC §6.
FIELD_CODES = {
    "reverse_image_policy": "invalid_reverse_image_policy",
    "force_stages": "invalid_stage",
    "cursor": "invalid_cursor",
    "after": "invalid_after",
    "url": "invalid_webhook_url",
    "event_types": "invalid_event_type",
}

UNKNOWN_FIELD = "Unknown field."  # marshmallow's message for a field the schema does not have

HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    411: "length_required",
    412: "precondition_failed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "too_many_requests",
}


def _body_read_errors() -> tuple[type[BaseException], ...]:
    """Exceptions the server's input stream raises on a badly framed body (gunicorn: bad chunking,
    client gone mid-body). They surface inside a view that reads the body; they are 400, not 500."""
    try:
        from gunicorn.http.errors import NoMoreData, ParseException
    except ImportError:  # pragma: no cover - served by another WSGI server
        return ()
    return (ParseException, NoMoreData)


BODY_READ_ERRORS = _body_read_errors()


def _raised_in_json_decoder(exc: BaseException) -> bool:
    """True if the innermost Python frame of ``exc`` is the standard library's JSON decoder."""
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and last.tb_frame.f_globals.get("__name__", "").startswith("json")


class ApiError(Exception):
    """An error the API returns as-is: HTTP status, stable code, human message."""

    def __init__(self, status: int, code: str, message: str, details: Mapping[str, Any] | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = dict(details) if details else None
        self.headers = dict(headers) if headers else {}


def error_response(status: int, code: str, message: str, details: Mapping[str, Any] | None = None):
    body: dict[str, Any] = {"error": code, "message": message}
    if details:
        body["details"] = details
    resp = jsonify(body)
    resp.status_code = status
    return resp


def validation_error(messages: Any) -> ApiError:
    """Turn marshmallow messages (possibly nested by location) into a 422 ApiError."""
    flat = _flatten(messages)
    summary = "; ".join(f"{k}: {', '.join(v)}" for k, v in flat.items()) or "invalid request"
    return ApiError(422, _validation_code(flat), summary[:2000], {"fields": flat})


def _validation_code(flat: dict[str, list[str]]) -> str:
    """``invalid_text`` if any value is unstorable text, else a field's specific code, else the generic one."""
    if any(INVALID_TEXT in m for ms in flat.values() for m in ms) or any(map(has_unstorable_text, flat)):
        return "invalid_text"  # also an unknown field whose very name is unstorable
    for field, messages in flat.items():
        if all(m == UNKNOWN_FIELD for m in messages):
            continue  # not one of this endpoint's fields, whatever its name: no field-specific code
        leaf = field.split(".")
        for name, specific in FIELD_CODES.items():
            if name in leaf:
                return specific
    return "validation_error"


_LOCATIONS = {"json", "query", "querystring", "form", "files", "view_args", "json_or_form", "headers"}


def _flatten(messages: Any, prefix: str = "") -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    if isinstance(messages, Mapping):
        for key, value in messages.items():
            key = str(key)
            name = "" if (not prefix and key in _LOCATIONS) else (f"{prefix}.{key}" if prefix else key)
            out.update(_flatten(value, name))
    elif isinstance(messages, (list, tuple)):
        strings = [str(m) for m in messages if not isinstance(m, (Mapping, list, tuple))]
        if strings:
            out.setdefault(prefix or "_schema", []).extend(strings)
        for m in messages:
            if isinstance(m, (Mapping, list, tuple)):
                out.update(_flatten(m, prefix))
    else:
        out.setdefault(prefix or "_schema", []).append(str(messages))
    return out


def _snake(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "error"


def register_error_handlers(app: Flask) -> None:
    """Install the handlers (after flask-smorest's, which they replace)."""

    @app.errorhandler(ApiError)
    def _api_error(exc: ApiError):
        resp = error_response(exc.status, exc.code, exc.message, exc.details)
        resp.headers.update(exc.headers)
        return resp

    @app.errorhandler(Unauthorized)
    def _unauthorized(exc: Unauthorized):
        resp = error_response(401, "unauthorized", str(exc) or "unauthorized")
        resp.headers["WWW-Authenticate"] = 'Bearer realm="memeflow"'
        return resp

    @app.errorhandler(ValidationError)
    def _marshmallow(exc: ValidationError):
        err = validation_error(exc.messages)
        return error_response(err.status, err.code, err.message, err.details)

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException):
        status = exc.code or 500
        data = getattr(exc, "data", None)
        if status == 422 and isinstance(data, Mapping) and "messages" in data:
            err = validation_error(data["messages"])
            return error_response(err.status, err.code, err.message, err.details)
        if status == 400 and isinstance(data, Mapping) and "messages" in data:
            return error_response(400, "invalid_json", "request body is not valid JSON")
        if status == 413:
            return error_response(413, "payload_too_large", "request body exceeds the upload limit")
        code = HTTP_CODES.get(status) or _snake(exc.name or "error")
        resp = error_response(status, code, exc.description or exc.name or code)
        if status == 405 and getattr(exc, "valid_methods", None):
            resp.headers["Allow"] = ", ".join(exc.valid_methods)
        return resp

    @app.errorhandler(OrchestratorError)
    def _domain(exc: OrchestratorError):
        if isinstance(exc, RateLimited | QuotaExceeded):  # their details are the client's to act on
            resp = error_response(exc.status, exc.code, exc.message, exc.details)
            if isinstance(exc, RateLimited):
                resp.headers["Retry-After"] = str(exc.details["retry_after"])
            return resp
        return error_response(exc.status, exc.code, exc.message or exc.code)

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        if isinstance(exc, HTTPException):  # pragma: no cover - routed above
            return _http(exc)
        if isinstance(exc, RecursionError) and _raised_in_json_decoder(exc):
            # json.loads (Flask's get_json and webargs alike) only catches ValueError
            return error_response(400, "invalid_json", "the JSON body is nested too deeply")
        if isinstance(exc, ValueError) and _raised_in_json_decoder(exc):
            # an integer of more digits than int() converts (4300): json.loads raises a plain
            # ValueError, and webargs catches only its JSONDecodeError
            return error_response(400, "invalid_json", "request body is not valid JSON")
        if isinstance(exc, BODY_READ_ERRORS):  # the server could not read the body the client sent
            log.warning("unreadable request body: %s", exc)
            return error_response(400, "invalid_body", "the request body could not be read (bad framing)")
        log.exception("unhandled error in API request")
        return error_response(500, "internal_error", "internal server error")
