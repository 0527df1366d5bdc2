"""An external PostgreSQL whose database (or role, or server) has another default TimeZone than
UTC: every timestamp the API renders is still UTC (SPEC §3), whichever server default applies."""

from __future__ import annotations

import psycopg2
from sqlalchemy.engine import make_url

from app.api import create_app
from app.auth import LocalScopeResolver
from app.db.engine import make_engine
from app.orchestrator import Orchestrator, RecordingPublisher
from app.storage import FileStore
from tests.api.conftest import png_bytes, upload


def _set_database_timezone(url: str, tz: str) -> None:
    dbname = make_url(url).database
    conn = psycopg2.connect(url.replace("postgresql+psycopg2://", "postgresql://", 1))
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"ALTER DATABASE {dbname} SET timezone = %s", (tz,))
    conn.close()


def test_timestamps_are_utc_on_a_database_with_another_default_timezone(db_url, settings):
    _set_database_timezone(db_url, "Asia/Kathmandu")  # +05:45: no chance of looking like UTC
    engine = make_engine(db_url)
    try:
        app = create_app(scope_resolver=LocalScopeResolver(), settings=settings, engine=engine,
                         orchestrator=Orchestrator(engine, settings), publisher=RecordingPublisher(),
                         store=FileStore(settings.storage_path), cursor_secret_key="test-secret")
        client = app.test_client()
        r = upload(client, png_bytes())
        assert r.status_code == 201, r.get_json()
        body = r.get_json()
        job = client.get(f"/api/v1/jobs/{body['job']['id']}").get_json()
        batch = client.post("/api/v1/batches", json={"all": True}).get_json()["batch"]
        stamps = {
            "image.created_at": body["image"]["created_at"],
            "job.created_at": job["created_at"],
            "job.updated_at": job["updated_at"],
            "batch.created_at": batch["created_at"],
        }
        not_utc = {k: v for k, v in stamps.items() if not (v.endswith("+00:00") or v.endswith("Z"))}
        assert not_utc == {}
    finally:
        engine.dispose()
