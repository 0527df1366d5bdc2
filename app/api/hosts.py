"""The API's Host-header allow-list (DNS-rebinding defence; see :mod:`app.netguard`)."""

from __future__ import annotations

from typing import Any

from flask import Flask, request

from app.api.errors import error_response
from app.netguard import allowed_hosts, host_allowed


def install_host_check(app: Flask, settings: Any) -> None:
    """Answer 400 ``invalid_host`` to any request whose Host is not allowed, before anything runs."""
    allowed = allowed_hosts(settings)
    if allowed is None:
        return

    @app.before_request
    def _check_host():
        if not host_allowed(request.host, allowed):
            return error_response(
                400, "invalid_host",
                "this server does not answer to that Host name; add it to MEMEFLOW_ALLOWED_HOSTS",
            )
        return None
