"""A worker started against a database that lacks this code's migrations (started before `memeflow
db upgrade`, or on a machine upgraded before the migration ran) refuses to start, saying what to
run, instead of running and failing every claim, sweep step and registry upsert with a traceback.
A database migrated beyond the code (a rolling upgrade migrated it first) is allowed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg2
import pytest

from app.db.engine import SchemaBehind, make_engine, require_schema_not_behind, schema_check

ROOT = Path(__file__).resolve().parents[2]


def _set_version(url: str, version: str) -> None:
    conn = psycopg2.connect(url.replace("postgresql+psycopg2://", "postgresql://", 1))
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("UPDATE alembic_version SET version_num = %s", (version,))
    conn.close()


def _state(url: str) -> str:
    engine = make_engine(url, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            return schema_check(conn)[0]
    finally:
        engine.dispose()


def test_the_schema_check_tells_behind_from_ahead(fresh_db, template_db):
    at_head = fresh_db(template_db)
    assert _state(at_head) == "at_head" and require_schema_not_behind(at_head) == "at_head"
    empty = fresh_db()
    assert _state(empty) == "behind"
    with pytest.raises(SchemaBehind, match="memeflow db upgrade"):
        require_schema_not_behind(empty)
    older = fresh_db(template_db)
    _set_version(older, "0001")  # a revision of the code's own history, before its head
    assert _state(older) == "behind"
    newer = fresh_db(template_db)
    _set_version(newer, "9999_from_a_newer_release")
    assert _state(newer) == "ahead" and require_schema_not_behind(newer) == "ahead"


def test_a_worker_on_an_unmigrated_database_exits_at_once_saying_what_to_run(fresh_db, services, tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        "MEMEFLOW_DATABASE_URL": fresh_db(),
        "MEMEFLOW_BROKER_URL": services.redis_url(),
        "MEMEFLOW_VAR_DIR": str(tmp_path / "var"),
        "MEMEFLOW_VISUAL_PROVIDER": "deterministic",
        "MEMEFLOW_AGENT_PROVIDER": "deterministic",
        "MEMEFLOW_TEXT_PROVIDER": "deterministic",
        "MEMEFLOW_LOG_JSON": "0",
    }
    try:
        proc = subprocess.run([sys.executable, "-m", "app.cli", "worker", "--lane", "visual"], env=env,
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:  # the old behaviour: it ran on, failing every statement
        raise AssertionError(f"the worker kept running on an unmigrated database: {exc.stderr!r}") from None
    assert proc.returncode != 0
    assert "memeflow db upgrade" in proc.stderr


# ---------------------------------------------------------------------------------- storage
def test_a_file_reading_worker_whose_storage_holds_none_of_the_databases_images_exits_at_once(
        settings, engine, services, tmp_path):
    """README's "add a machine" worker without MEMEFLOW_STORAGE_DIR (or with another mount) ran,
    and every visual and agent task failed file_missing after its retries, an error that reads
    like lost files. It now refuses to start, naming the setting."""
    from app.orchestrator import Orchestrator
    from app.worker.tasks import check_storage_at_start
    from tests.support.pipeline import png_bytes, store_and_ingest

    orch = Orchestrator(engine, settings)
    for seed in range(3):
        store_and_ingest(orch, "local", png_bytes(seed), process=False)
    check_storage_at_start(settings, ["visual", "maintenance"])  # the API's storage: passes
    elsewhere = settings.replace(storage_dir=tmp_path / "not-the-shared-storage")
    check_storage_at_start(elsewhere, ["embedding", "webhooks", "maintenance"])  # reads no image file
    with pytest.raises(SystemExit, match="MEMEFLOW_STORAGE_DIR"):
        check_storage_at_start(elsewhere, ["agent"])

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        "MEMEFLOW_DATABASE_URL": settings.database_url,
        "MEMEFLOW_BROKER_URL": services.redis_url(),
        "MEMEFLOW_VAR_DIR": str(tmp_path / "other-machine-var"),  # storage unset: <var>/storage
        "MEMEFLOW_VISUAL_PROVIDER": "deterministic",
        "MEMEFLOW_AGENT_PROVIDER": "deterministic",
        "MEMEFLOW_TEXT_PROVIDER": "deterministic",
        "MEMEFLOW_LOG_JSON": "0",
    }
    try:
        proc = subprocess.run([sys.executable, "-m", "app.cli", "worker", "--lane", "visual"], env=env,
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the worker ran on another storage: {exc.stderr!r}") from None
    assert proc.returncode != 0
    assert "MEMEFLOW_STORAGE_DIR" in proc.stderr and "not the storage the API writes" in proc.stderr


def test_an_empty_database_passes_the_storage_check(settings, tmp_path):
    from app.worker.tasks import check_storage_at_start

    check_storage_at_start(settings.replace(storage_dir=tmp_path / "new"), ["visual", "agent"])


# ---------------------------------------------------------------------------------- the API
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("cursor_secret", ["", "a-cursor-secret-of-the-operator"])
def test_the_api_on_an_unmigrated_database_exits_at_once_saying_what_to_run(fresh_db, services, tmp_path,
                                                                            cursor_secret):
    """The API started before `memeflow db upgrade` (a replica that raced the migrate job) booted
    on with a cursor secret set and answered every request 500 internal_error; without one its
    workers died of an UndefinedTable traceback. It now refuses to start, as a worker does."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        "MEMEFLOW_DATABASE_URL": fresh_db(),
        "MEMEFLOW_BROKER_URL": services.redis_url(),
        "MEMEFLOW_VAR_DIR": str(tmp_path / "var"),
        "MEMEFLOW_CURSOR_SECRET": cursor_secret,
        "MEMEFLOW_LOG_JSON": "0",
    }
    try:
        proc = subprocess.run([sys.executable, "-m", "app.cli", "api", "--port", str(_free_port()), "--workers", "1"],
                              env=env, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the API kept running on an unmigrated database: {exc.stderr!r}") from None
    assert proc.returncode != 0
    assert "memeflow db upgrade" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_the_api_started_while_its_database_is_down_serves_and_reports_not_ready(services, tmp_path):
    """The API started before its PostgreSQL accepts connections (a host reboot, a compose or k8s
    start order without health gates) stays up: /healthz 200, /readyz 503 until the database
    answers. It used to read the cursor HMAC key from the database while loading the app, and
    every gunicorn worker died of an OperationalError traceback ("Worker failed to boot")."""
    import http.client
    import time

    port = _free_port()
    dead = _free_port()  # nothing listens there
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        "MEMEFLOW_DATABASE_URL": f"postgresql://memeflow@127.0.0.1:{dead}/memeflow",
        "MEMEFLOW_BROKER_URL": services.redis_url(),
        "MEMEFLOW_VAR_DIR": str(tmp_path / "var"),
        "MEMEFLOW_CURSOR_SECRET": "",
        "MEMEFLOW_LOG_JSON": "0",
    }
    log = tmp_path / "api.log"
    with log.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "api", "--port", str(port), "--workers", "1"],
                                env=env, stdout=subprocess.DEVNULL, stderr=sink)

    def get(path: str) -> tuple[int, bytes] | None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        except OSError:
            return None
        finally:
            conn.close()

    try:
        deadline = time.monotonic() + 60
        healthz = None
        while time.monotonic() < deadline and proc.poll() is None:
            healthz = get("/healthz")
            if healthz is not None:
                break
            time.sleep(0.2)
        assert proc.poll() is None, f"the API exited (code {proc.returncode}): {log.read_text()[-2000:]}"
        assert healthz is not None and healthz[0] == 200, healthz
        readyz = get("/readyz")
        assert readyz is not None and readyz[0] == 503, readyz
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
