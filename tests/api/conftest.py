"""API test fixtures: the Flask app wired to a real orchestrator on a per-test PostgreSQL."""

from __future__ import annotations

import io
from typing import Any

import pytest
from PIL import Image

from app.api import create_app
from app.auth import LocalScopeResolver, TokenScopeResolver, create_scope, create_token
from app.orchestrator import Orchestrator, RecordingPublisher
from app.storage import FileStore


def png_bytes(color: tuple[int, int, int] = (200, 30, 30), size: tuple[int, int] = (32, 24), fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format=fmt)
    return buf.getvalue()


@pytest.fixture()
def orch(engine, settings) -> Orchestrator:
    return Orchestrator(engine, settings)


@pytest.fixture()
def publisher() -> RecordingPublisher:
    return RecordingPublisher()


@pytest.fixture()
def store(settings) -> FileStore:
    return FileStore(settings.storage_path)


@pytest.fixture()
def app(settings, engine, orch, publisher, store):
    return create_app(
        scope_resolver=LocalScopeResolver(), settings=settings, orchestrator=orch, engine=engine,
        publisher=publisher, store=store, cursor_secret_key="test-secret",
    )


@pytest.fixture()
def client(app):
    return app.test_client()


@pytest.fixture()
def token_app(settings, engine, orch, publisher, store):
    return create_app(
        scope_resolver=TokenScopeResolver(engine), settings=settings, orchestrator=orch, engine=engine,
        publisher=publisher, store=store, cursor_secret_key="test-secret",
    )


@pytest.fixture()
def tokens(engine) -> dict[str, str]:
    """Two scopes, one token each: {"alpha": token, "beta": token}."""
    out = {}
    for scope in ("alpha", "beta"):
        create_scope(engine, scope)
        _, token = create_token(engine, scope, f"{scope}-key")
        out[scope] = token
    return out


def upload(client, data: bytes, *, name: str = "x.png", headers: dict | None = None, **form: Any):
    body: dict[str, Any] = {"file": (io.BytesIO(data), name)}
    body.update({k: str(v).lower() if isinstance(v, bool) else v for k, v in form.items()})
    return client.post("/api/v1/images", data=body, content_type="multipart/form-data", headers=headers or {})
