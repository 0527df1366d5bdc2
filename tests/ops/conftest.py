"""Fixtures for the /ops tests: a database with rows in many states (inserted directly with SQL,
as a fixture — the orchestrator is not under test here) and a Flask app with /ops mounted."""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import text
from werkzeug.serving import make_server

from app.ops import register_ops

SCOPE, OTHER = "local", "other-tenant"
STAGES = ("visual", "agent", "text_embedding")
LANE = {"visual": "visual", "agent": "agent", "text_embedding": "embedding"}


@dataclass
class Seeded:
    jobs: dict[str, list[uuid.UUID]] = field(default_factory=dict)
    images: dict[str, uuid.UUID] = field(default_factory=dict)
    batch_id: uuid.UUID | None = None


def _sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


class Seeder:
    def __init__(self, conn) -> None:
        self.conn = conn
        self.n = 0

    def scope(self, scope_id: str) -> None:
        self.conn.execute(text("INSERT INTO scopes (id, storage_namespace) VALUES (:s, :n)"),
                          {"s": scope_id, "n": uuid.uuid4()})

    def image(self, scope_id: str, name: str) -> uuid.UUID:
        self.n += 1
        image_id, sha = uuid.uuid4(), _sha(f"{scope_id}/{name}/{self.n}")
        self.conn.execute(text("""
            INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height,
                                storage_key, display_name, context, context_status)
            VALUES (:id, :s, :sha, '.png', 'image/png', 1234, 480, 360, :key, :name, CAST(:ctx AS jsonb), :cs)"""),
            {"id": image_id, "s": scope_id, "sha": sha, "key": f"ns/{sha}.png", "name": name,
             "ctx": json.dumps({"title": name, "ocr_text": name.upper(), "tags": ["meme"]}), "cs": "ready"})
        return image_id

    def job(self, scope_id: str, image_id: uuid.UUID, status: str, stages: tuple[str, str, str], *,
            revision: int = 1, error: dict | None = None, batch_id: uuid.UUID | None = None) -> uuid.UUID:
        job_id = uuid.uuid4()
        current = next((st for st, ss in zip(STAGES, stages, strict=True) if ss not in ("succeeded", "reused")), None)
        self.conn.execute(text("""
            INSERT INTO processing_jobs (id, scope_id, image_id, revision, image_sha256, config, config_hash,
                                         reverse_image_policy, mode, status, current_stage, error, batch_id,
                                         retry_at)
            VALUES (:id, :s, :img, :rev, (SELECT sha256 FROM images WHERE id = :img), '{}', :h, 'forbid', 'auto',
                    :st, :cur, CAST(:err AS jsonb), :b,
                    CASE WHEN CAST(:st AS varchar) = 'blocked' THEN now() + interval '1 hour' END)"""),
            {"id": job_id, "s": scope_id, "img": image_id, "rev": revision, "h": _sha("cfg"), "st": status,
             "cur": current, "err": json.dumps(error) if error else None, "b": batch_id})
        for pos, (stage, sstatus) in enumerate(zip(STAGES, stages, strict=True)):
            self.conn.execute(text("""
                INSERT INTO job_stages (job_id, stage, scope_id, position, status, started_at, completed_at)
                VALUES (:j, :st, :s, :p, :ss,
                        CASE WHEN CAST(:ss AS varchar) IN ('running', 'succeeded', 'failed') THEN now() - interval '3 seconds' END,
                        CASE WHEN CAST(:ss AS varchar) IN ('succeeded', 'failed') THEN now() - interval '1 second' END)"""),
                {"j": job_id, "st": stage, "s": scope_id, "p": pos, "ss": sstatus})
            if sstatus in ("queued", "running", "succeeded"):
                self.task(scope_id, job_id, image_id, stage, "succeeded" if sstatus == "succeeded" else sstatus)
        return job_id

    def task(self, scope_id: str, job_id: uuid.UUID, image_id: uuid.UUID, stage: str, status: str,
             *, waited_s: int = 0) -> uuid.UUID:
        task_id = uuid.uuid4()
        self.conn.execute(text("""
            INSERT INTO tasks (id, scope_id, job_id, stage, lane, payload, input_fingerprint, dedupe_key, image_id,
                               image_sha256, status, max_attempts, available_at, lease_owner, lease_expires_at,
                               claim_generation, started_at, completed_at)
            VALUES (:id, :s, :j, :st, :lane, '{}', :fp, :dk, :img, (SELECT sha256 FROM images WHERE id = :img),
                    :status, 5, now() - make_interval(secs => :w),
                    CASE WHEN CAST(:status AS varchar) = 'running' THEN 'worker-1' END,
                    CASE WHEN CAST(:status AS varchar) = 'running' THEN now() + interval '60 seconds' END,
                    CASE WHEN CAST(:status AS varchar) = 'queued' THEN 0 ELSE 1 END,
                    CASE WHEN CAST(:status AS varchar) <> 'queued' THEN now() - interval '3 seconds' END,
                    CASE WHEN CAST(:status AS varchar) = 'succeeded' THEN now() - interval '1 second' END)"""),
            {"id": task_id, "s": scope_id, "j": job_id, "st": stage, "lane": LANE[stage], "fp": _sha(str(task_id)),
             "dk": _sha(f"dk{task_id}"), "img": image_id, "status": status, "w": waited_s})
        if status == "running" and stage == "agent":
            self.conn.execute(text("""
                INSERT INTO lane_slots (lane, resource_key, slot_no, task_id, claim_generation, lease_expires_at)
                VALUES ('agent', '', (SELECT coalesce(max(slot_no), 0) + 1 FROM lane_slots WHERE lane = 'agent'),
                        :t, 1, now() + interval '60 seconds')"""), {"t": task_id})
        return task_id


def seed_states(engine) -> Seeded:
    """Several jobs per status in scope ``local``, plus noise in another scope that must never show."""
    out = Seeded()
    with engine.begin() as conn:
        s = Seeder(conn)
        s.scope(SCOPE)
        s.scope(OTHER)
        batch_id = uuid.uuid4()
        conn.execute(text("INSERT INTO batches (id, scope_id, status, select_all, reverse_image_policy, total) "
                          "VALUES (:b, :s, 'running', true, 'forbid', 4)"), {"b": batch_id, "s": SCOPE})
        out.batch_id = batch_id
        plan = [
            ("succeeded", ("succeeded", "succeeded", "succeeded"), None, 3),
            ("queued", ("queued", "pending", "pending"), None, 2),
            ("running", ("succeeded", "running", "pending"), None, 2),
            ("running", ("succeeded", "succeeded", "queued"), None, 1),
            ("failed", ("succeeded", "failed", "pending"), {"code": "invalid_image", "message": "cannot decode"}, 1),
            ("blocked", ("succeeded", "blocked", "pending"),
             {"code": "operation_limit_exceeded", "message": "daily agent quota reached"}, 1),
            ("unknown_execution", ("succeeded", "unknown_execution", "pending"),
             {"code": "unknown_execution", "message": "worker died during the agent call"}, 2),
        ]
        k = 0
        for status, stages, error, count in plan:
            for _ in range(count):
                k += 1
                name = f"{status}-{k}"
                image_id = s.image(SCOPE, name)
                in_batch = k <= 4
                job_id = s.job(SCOPE, image_id, status, stages, error=error, batch_id=batch_id if in_batch else None)
                if in_batch:
                    conn.execute(text("INSERT INTO batch_items (batch_id, image_id, scope_id, job_id) "
                                      "VALUES (:b, :i, :s, :j)"), {"b": batch_id, "i": image_id, "s": SCOPE,
                                                                   "j": job_id})
                out.jobs.setdefault(status, []).append(job_id)
                out.images[name] = image_id
        # a failed job superseded by a newer revision: no longer awaits a human
        image_id = s.image(SCOPE, "retried-later")
        s.job(SCOPE, image_id, "failed", ("succeeded", "failed", "pending"),
              error={"code": "agent_timeout", "message": "x"})
        s.job(SCOPE, image_id, "succeeded", ("reused", "succeeded", "succeeded"), revision=2)
        out.images["retried-later"] = image_id
        # an old queued visual task that has waited 90 s
        queued_job = out.jobs["queued"][0]
        conn.execute(text("UPDATE tasks SET available_at = now() - interval '90 seconds' "
                          "WHERE job_id = :j AND stage = 'visual'"), {"j": queued_job})
        # the other tenant: lots of rows that must not be counted
        for i in range(5):
            other_image = s.image(OTHER, f"other-{i}")
            s.job(OTHER, other_image, "unknown_execution", ("succeeded", "unknown_execution", "pending"),
                  error={"code": "unknown_execution", "message": "other"})
        other_image = s.image(OTHER, "other-running")
        s.job(OTHER, other_image, "running", ("succeeded", "running", "pending"))
        # ops counters: inside and outside the last hour; the other tenant's and unattributed
        # ones (from before counters had a scope) are not this scope's to see
        conn.execute(text("""
            INSERT INTO ops_counters (bucket, name, scope_id, count) VALUES
              (date_trunc('minute', now()), 'fencing_rejection', :s, 2),
              (date_trunc('minute', now()) - interval '10 minutes', 'fencing_rejection', :s, 1),
              (date_trunc('minute', now()) - interval '3 hours', 'fencing_rejection', :s, 50),
              (date_trunc('minute', now()) - interval '5 minutes', 'rehint', :s, 7),
              (date_trunc('minute', now()) - interval '2 hours', 'rehint', :s, 100),
              (date_trunc('minute', now()), 'fencing_rejection', :o, 40),
              (date_trunc('minute', now()) - interval '5 minutes', 'rehint', :o, 400),
              (date_trunc('minute', now()), 'rehint', '', 4000)"""), {"s": SCOPE, "o": OTHER})
    return out


class RecordingRetry:
    def __init__(self) -> None:
        self.calls: list[tuple[str, uuid.UUID]] = []

    def __call__(self, scope_id: str, job_id: uuid.UUID) -> Any:
        self.calls.append((scope_id, job_id))

        @dataclass
        class Result:
            job: dict
            created: bool = True
            hints: tuple = ()

        return Result(job={"id": "new-job-id"})


@pytest.fixture()
def seeded(engine) -> Seeded:
    return seed_states(engine)


@pytest.fixture()
def retry_recorder() -> RecordingRetry:
    return RecordingRetry()


@pytest.fixture()
def ops_app(engine, retry_recorder) -> Flask:
    app = Flask("ops-test")
    register_ops(app, engine=engine, scope_for_request=lambda: SCOPE, retry_job=retry_recorder,
                 slot_limits={"agent": 4})
    return app


@pytest.fixture()
def live_ops(ops_app) -> Iterator[str]:
    server = make_server("127.0.0.1", 0, ops_app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()
