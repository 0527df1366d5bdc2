"""Test harness: one embedded PostgreSQL + Redis per test session, a migrated template database
built once, and a fresh database per test copied from it (CREATE DATABASE … TEMPLATE)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import psycopg2
import pytest

from app.config import Settings
from app.db.engine import make_engine, upgrade_to_head
from app.embedded import EmbeddedServices

T = TypeVar("T")
TEMPLATE_DB = "mf_template"

# tests/openclip runs under .venv-openclip (open_clip + torchvision), started by
# tests/unit/stages/test_open_clip.py; this venv cannot import it.
collect_ignore = ["openclip"]


def _raw(url: str) -> str:
    return url.replace("postgresql+psycopg2://", "postgresql://", 1)


def admin_connect(services: EmbeddedServices):
    conn = psycopg2.connect(_raw(services.postgres_url("postgres")))
    conn.autocommit = True
    return conn


@pytest.fixture(scope="session")
def services() -> Iterator[EmbeddedServices]:
    root = Path(tempfile.mkdtemp(prefix="memeflow-test-"))
    svc = EmbeddedServices(root / "var", fast_unsafe=True)
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def template_db(services: EmbeddedServices) -> str:
    conn = admin_connect(services)
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {TEMPLATE_DB}")
        cur.execute(f"CREATE DATABASE {TEMPLATE_DB}")
    conn.close()
    url = services.postgres_url(TEMPLATE_DB)
    upgrade_to_head(url)
    return TEMPLATE_DB


@pytest.fixture()
def fresh_db(services: EmbeddedServices) -> Callable[[str | None], str]:
    """Factory: an empty (or template-copied) database, dropped at the end of the test."""
    created: list[str] = []

    def make(template: str | None = None) -> str:
        name = f"t_{uuid.uuid4().hex[:16]}"
        conn = admin_connect(services)
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
        conn.close()
        created.append(name)
        return services.postgres_url(name)

    yield make
    conn = admin_connect(services)
    with conn.cursor() as cur:
        for name in created:
            cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    conn.close()


@pytest.fixture()
def db_url(fresh_db, template_db) -> str:
    return fresh_db(template_db)


@pytest.fixture()
def engine(db_url):
    eng = make_engine(db_url, pool_size=20, max_overflow=20)
    yield eng
    eng.dispose()


@pytest.fixture()
def settings(db_url, services, tmp_path) -> Settings:
    """Fast settings for one test: its own database, var dir and storage."""
    return Settings(
        database_url=db_url,
        broker_url=services.redis_url(),
        var_dir=tmp_path / "var",
        lease_s=2.0,
        heartbeat_s=0.5,
        sweep_interval_s=0.5,
        rehint_grace_s=0.5,
        backoff_base_s=0.05,
        backoff_max_s=0.5,
        visual_batch_linger_ms=0.0,  # tests/db/test_batch_linger.py sets its own
        embedding_batch_linger_ms=0.0,
        visual_provider="deterministic",
        agent_provider="deterministic",
        text_provider="deterministic",
        # a model change acts on the first sweep, as most model-change tests expect; the tests of
        # the grace itself (tests/db/test_serving_config_grace.py) set their own
        search_config_grace_s=0.0,
        log_json=False,
    )


def poll_until(fn: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.02, what: str = "condition") -> T:
    """Poll ``fn`` until it returns a truthy value or the deadline passes (never a blind sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


os.environ.setdefault("HF_HUB_OFFLINE", "1")
