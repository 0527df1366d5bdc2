"""A PostgreSQL restart under the API: the connections pooled before it are dead, and no request
after it may see that — no 5xx, no lost or doubled upload (``make_engine``'s pre-ping, which
tells a dead pooled connection locally, without a round trip: docs/performance-log.md §33)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from sqlalchemy import text

from app.api import create_app
from app.auth import LocalScopeResolver
from app.config import Settings
from app.db.engine import make_engine, upgrade_to_head
from app.embedded import EmbeddedServices
from app.orchestrator import Orchestrator, RecordingPublisher
from app.storage import FileStore
from tests.api.conftest import png_bytes, upload


@pytest.fixture()
def restartable(tmp_path):
    """PostgreSQL of this test alone (restarting the session's would disturb every other test)."""
    # not pytest's tmp_path: its parents are 0700 and the unprivileged postgres user must reach the dir
    root = Path(tempfile.mkdtemp(prefix="memeflow-restart-"))
    svc = EmbeddedServices(root / "var", fast_unsafe=True)
    urls = svc.start()
    try:
        upgrade_to_head(urls.database_url)
        yield svc, urls.database_url
    finally:
        svc.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_uploads_right_after_a_postgres_restart_all_succeed_once(restartable, tmp_path):
    svc, url = restartable
    settings = Settings(database_url=url, var_dir=tmp_path / "var", log_json=False,
                        visual_provider="deterministic", agent_provider="deterministic",
                        text_provider="deterministic")
    engine = make_engine(url, pool_size=4, max_overflow=0)
    try:
        store = FileStore(settings.storage_path)
        app = create_app(scope_resolver=LocalScopeResolver(), settings=settings,
                         orchestrator=Orchestrator(engine, settings), engine=engine,
                         publisher=RecordingPublisher(), store=store, cursor_secret_key="test-secret")
        client = app.test_client()
        before = [png_bytes((i, 10, 10)) for i in range(3)]
        for data in before:
            assert upload(client, data).status_code == 201
        held = [engine.connect() for _ in range(4)]  # fill the pool: every connection predates the restart
        pids = {c.execute(text("SELECT pg_backend_pid()")).scalar_one() for c in held}
        for c in held:
            c.close()

        svc.restart_postgres()

        after = [png_bytes((i, 200, 10)) for i in range(6)]
        for data in after:
            r = upload(client, data)
            assert r.status_code == 201, r.get_data(as_text=True)
        again = upload(client, before[0])  # identical bytes: the existing image, not a second one
        assert again.status_code == 200 and again.get_json()["created"] is False
        listed = client.get("/api/v1/images?limit=100")
        assert listed.status_code == 200
        assert len(listed.get_json()["items"]) == len(before) + len(after)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() not in pids
            keys = conn.execute(text("SELECT storage_key FROM images")).scalars().all()
            assert conn.execute(text("SELECT count(*) FROM processing_jobs")).scalar_one() == len(keys)
        assert len(keys) == len(set(keys)) == len(before) + len(after)
        assert all(store.exists(k) for k in keys)
    finally:
        engine.dispose()
