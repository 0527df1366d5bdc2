"""Fixtures for the browser surfaces: the whole API app (as ``create_app`` builds it) in either auth
mode, served by a real HTTP server for headless Chromium, with a real orchestrator and PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from flask import Flask
from werkzeug.serving import make_server

from app.api import create_app
from app.auth import LocalScopeResolver, TokenScopeResolver, create_scope, create_token
from app.orchestrator import Orchestrator, RecordingPublisher
from app.storage import FileStore


@contextmanager
def serving(app: Flask, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve ``app`` on a free loopback port; yields its base URL."""
    server = make_server(host, 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()


@pytest.fixture()
def make_app(settings, engine) -> Callable[..., Flask]:
    """``make_app("none" | "token", **settings)``: the full app, wired as the WSGI entry point wires it."""

    def make(auth: str, **overrides: object) -> Flask:
        resolver = TokenScopeResolver(engine) if auth == "token" else LocalScopeResolver()
        app_settings = settings.replace(auth=auth, **overrides)
        return create_app(scope_resolver=resolver, settings=app_settings,
                          orchestrator=Orchestrator(engine, app_settings), engine=engine,
                          publisher=RecordingPublisher(), store=FileStore(settings.storage_path),
                          cursor_secret_key="test-secret")

    return make


@pytest.fixture()
def token_for(engine) -> Callable[[str], tuple[str, str]]:
    """``token_for(scope)`` → (token name, token): the scope is created if missing."""
    made: list[int] = []

    def make(scope: str) -> tuple[str, str]:
        create_scope(engine, scope)
        made.append(1)
        name = f"{scope}-browser-{len(made)}"
        return name, create_token(engine, scope, name)[1]

    return make
