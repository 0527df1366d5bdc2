"""The operator CLI as a shell user runs it: subprocesses against a live stack (real workers and
providers, MEMEFLOW_DATABASE_URL/BROKER_URL set), checking exit codes, messages and the effects."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid

import pytest
from sqlalchemy import text

from app.samples import generate_samples
from tests.conftest import poll_until
from tests.integration.conftest import PYTHON, ROOT, ingest

pytestmark = pytest.mark.slow

SCOPE = "cli"


def _latest_jobs(engine, scope: str) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT DISTINCT ON (image_id) id, status FROM processing_jobs WHERE scope_id = :s "
                                 "ORDER BY image_id, revision DESC"), {"s": scope}).all()
    return {str(r.id): r.status for r in rows}


def _all_succeeded(engine, scope: str, n: int):
    jobs = _latest_jobs(engine, scope)
    assert not set(jobs.values()) - {"queued", "running", "succeeded"}, jobs
    return jobs if len(jobs) == n and set(jobs.values()) == {"succeeded"} else None


def _pipeline_state(live_stack, scope: str) -> str:
    """What a stalled job's tasks, the lane slots and the workers' last log lines say (for a failure)."""
    with live_stack.engine.connect() as conn:
        tasks = conn.execute(text(
            "SELECT t.stage, t.status, t.attempt_count, t.claim_generation, t.available_at, t.last_hint_at,"
            " t.lease_expires_at, t.error->>'code' FROM tasks t WHERE t.scope_id = :s ORDER BY t.created_at"),
            {"s": scope}).all()
        slots = conn.execute(text("SELECT * FROM lane_slots WHERE task_id IS NOT NULL")).mappings().all()
    logs = "\n".join(f"--- {p.log_path.name}\n" + p.log()[-3000:] for p in live_stack.cluster.procs)
    return f"tasks: {[tuple(t) for t in tasks]}\nheld slots: {[dict(r) for r in slots]}\n{logs}"


def test_ingest_status_search_sweep_process_all_gc(live_stack, tmp_path):
    cli, engine, settings = live_stack.cli, live_stack.engine, live_stack.settings
    samples, inbox = tmp_path / "samples", tmp_path / "inbox"
    generate_samples(samples, limit=6)
    inbox.mkdir()
    for name in ("very-dog.png", "works-on-my-machine.png"):
        shutil.copy(samples / name, inbox / name)
    (inbox / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"truncated, not an image")

    # ingest: the corrupt file is reported and skipped, the rest processed, exit code 1
    r = cli("ingest", inbox, "--scope", SCOPE)
    assert r.returncode == 1, r.stderr
    assert "created 2, already present 0, failed 1" in r.stdout
    assert "broken.png" in r.stderr and "invalid_image" in r.stderr
    jobs = poll_until(lambda: _all_succeeded(engine, SCOPE, 2), timeout=120, interval=0.3, what="2 jobs succeeded")
    # resumable: a re-run uploads nothing new
    r = cli("ingest", inbox, "--scope", SCOPE)
    assert r.returncode == 1 and "created 0, already present 2, failed 1" in r.stdout

    # status: counts that match the database; one job's stages; an unknown job is exit 1
    r = cli("status", "--scope", SCOPE, "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["jobs"]["succeeded"] == 2 and sum(data["jobs"].values()) == 2
    assert {lane: v["queued"] + v["running"] for lane, v in data["lanes"].items()} == {
        "visual": 0, "agent": 0, "embedding": 0}
    r = cli("status", "--scope", SCOPE)
    assert r.returncode == 0 and "succeeded" in r.stdout and "embedding" in r.stdout
    job_id = next(iter(jobs))
    r = cli("status", job_id, "--scope", SCOPE)
    assert r.returncode == 0, r.stderr
    for stage in ("visual", "agent", "text_embedding"):
        assert stage in r.stdout
    r = cli("status", str(uuid.uuid4()), "--scope", SCOPE)
    assert r.returncode == 1 and "not_found" in r.stderr
    r = cli("status", "not-a-uuid")
    assert r.returncode == 2 and "not a job id" in r.stderr

    # search: the API's query code and the configured text model; no hit is exit 1
    r = cli("search", "very dog", "--scope", SCOPE, "--json")
    assert r.returncode == 0, r.stderr
    hits = json.loads(r.stdout)["items"]
    assert hits[0]["image"]["display_name"] == "very-dog.png"
    assert "DOG" in hits[0]["image"]["context"]["ocr_text"].upper()
    r = cli("search", "very dog", "--scope", SCOPE)
    assert r.returncode == 0 and "very-dog.png" in r.stdout
    r = cli("search", "anything", "--scope", "nobody-here")
    assert r.returncode == 1

    # sweep: a task whose hint was lost is re-hinted by `memeflow sweep` and then processed
    from app.orchestrator import Orchestrator

    lost = ingest(Orchestrator(engine, settings), settings, 4242, scope=SCOPE)  # hints dropped on purpose
    assert lost.hints

    def rehinted():
        out = cli("sweep")
        assert out.returncode == 0, out.stderr
        return out.stdout if "rehinted 1" in out.stdout else None

    out = poll_until(rehinted, timeout=30, interval=0.2, what="the sweep re-hints the lost task")
    assert "hints published 1" in out
    try:
        poll_until(lambda: _all_succeeded(engine, SCOPE, 3), timeout=60, interval=0.3, what="the re-hinted job")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_pipeline_state(live_stack, SCOPE)}") from None

    # process-all: a batch over the scope's images, waited for; every stage is still valid, so reused
    r = cli("process-all", "--scope", SCOPE, "--wait", "--timeout", "120")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 images" in r.stdout and "succeeded 3" in r.stdout

    # gc: old unreferenced files and stale temp files go; referenced and young files stay
    storage = settings.storage_path
    with engine.connect() as conn:
        referenced = [storage / k for (k,) in conn.execute(text("SELECT storage_key FROM images"))]
    assert referenced and all(p.is_file() for p in referenced)
    ns = referenced[0].parent
    orphan, young = ns / f"{'a' * 64}.png", ns / f"{'b' * 64}.png"
    temp = ns / ".tmp-crashed-write"
    for path in (orphan, young, temp):
        path.write_bytes(b"x" * 100)
    old = time.time() - 7200
    os.utime(orphan, (old, old))
    os.utime(temp, (old, old))
    r = cli("gc", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "would remove 1 unreferenced files and 1 temp files (200 bytes)" in r.stdout
    assert orphan.exists() and temp.exists()
    r = cli("gc")
    assert r.returncode == 0 and "removed 1 unreferenced files and 1 temp files (200 bytes); kept 1" in r.stdout
    assert not orphan.exists() and not temp.exists() and young.exists()
    assert all(p.is_file() for p in referenced)
    r = cli("gc", "--min-age", "0")
    assert r.returncode == 0 and "removed 1 unreferenced" in r.stdout and not young.exists()
    assert all(p.is_file() for p in referenced)


def test_without_urls_the_embedded_services_must_already_run(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMEFLOW_")}
    env.update(MEMEFLOW_VAR_DIR=str(tmp_path / "var"), PYTHONPATH=str(ROOT))
    for args in (["status"], ["sweep"], ["gc"], ["search", "cat"], ["process-all"]):
        r = subprocess.run([PYTHON, "-m", "app.cli", *args], check=False, env=env, cwd=ROOT, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert "embedded services" in r.stderr and "not running" in r.stderr
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "var" / "postgres").exists()  # nothing was started
