"""An external PostgreSQL whose memeflow role is not a superuser (a managed database, a DBA's
role per application): pgvector's `vector` extension is not a trusted one, so only a superuser
may create it. `memeflow db upgrade` says exactly what to ask the DBA for, and once the DBA has
created it the same role migrates."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg2
from sqlalchemy.engine import make_url

from tests.conftest import admin_connect

ROOT = Path(__file__).resolve().parents[2]


def _upgrade(url: str, redis_url: str, var_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MEMEFLOW_DATABASE_URL": url, "MEMEFLOW_BROKER_URL": redis_url,
           "MEMEFLOW_VAR_DIR": str(var_dir),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, "-m", "app.cli", "db", "upgrade"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_non_superuser_role_is_told_which_extension_to_ask_for_then_migrates(fresh_db, services, tmp_path):
    admin_url = make_url(fresh_db(None))
    role = f"mf_app_{uuid.uuid4().hex[:8]}"
    admin = admin_connect(services)
    with admin.cursor() as cur:
        cur.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
        cur.execute(f"ALTER DATABASE {admin_url.database} OWNER TO {role}")
    admin.close()
    url = admin_url.set(username=role).render_as_string(hide_password=False)

    first = _upgrade(url, services.redis_url(), tmp_path / "var")
    assert first.returncode == 1, first.stderr[-2000:]
    assert "Traceback" not in first.stderr, first.stderr[-2000:]
    assert "CREATE EXTENSION IF NOT EXISTS vector" in first.stderr, first.stderr
    assert admin_url.database in first.stderr and "superuser" in first.stderr

    # the DBA does what it said; the same role then migrates (IF NOT EXISTS needs no privilege)
    dba = psycopg2.connect(admin_url.set(drivername="postgresql").render_as_string(hide_password=False))
    dba.autocommit = True
    with dba.cursor() as cur:
        cur.execute("CREATE EXTENSION IF NOT EXISTS vector")
    dba.close()
    second = _upgrade(url, services.redis_url(), tmp_path / "var")
    assert second.returncode == 0, second.stderr[-2000:]
    assert "database at head" in second.stdout


def test_an_older_pgvector_is_refused_at_upgrade_saying_what_to_update(fresh_db, template_db, services, tmp_path):
    """Searches set ``hnsw.iterative_scan`` (pgvector 0.8); a server with an older pgvector (a
    distribution's package, a managed PostgreSQL) would fail every semantic search. Only 0.8.x ships
    with the test's embedded server, so the installed version is rewritten in the catalog."""
    url = make_url(fresh_db(template_db))
    dba = psycopg2.connect(url.set(drivername="postgresql").render_as_string(hide_password=False))
    dba.autocommit = True
    with dba.cursor() as cur:
        cur.execute("UPDATE pg_extension SET extversion = '0.7.4' WHERE extname = 'vector'")
    dba.close()
    proc = _upgrade(url.render_as_string(hide_password=False), services.redis_url(), tmp_path / "var")
    assert proc.returncode == 1, (proc.stdout, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    assert "pgvector 0.7.4" in proc.stderr and "ALTER EXTENSION vector UPDATE" in proc.stderr, proc.stderr
