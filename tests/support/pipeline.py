"""Test-side helpers: make real images, store them, and run in-process worker threads that take
hints from a RecordingPublisher and make the same calls the Celery tasks make."""

from __future__ import annotations

import hashlib
import io
import threading
import uuid
from pathlib import Path

from PIL import Image, ImageDraw
from sqlalchemy import text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.orchestrator.hints import Hint
from app.stages.providers import Providers
from app.worker.run import handle_hint


def png_bytes(seed: int, size: tuple[int, int] = (48, 40)) -> bytes:
    img = Image.new("RGB", size, ((seed * 37) % 256, (seed * 91) % 256, (seed * 53) % 256))
    draw = ImageDraw.Draw(img)
    draw.rectangle([seed % 20, seed % 17, 20 + seed % 25, 18 + seed % 19], fill=((seed * 13) % 256, 20, 200))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def store_and_ingest(orch: Orchestrator, scope: str, data: bytes, **kwargs):
    """What the API upload does, minus HTTP: write the file atomically-enough, then ingest."""
    ns = orch.ensure_scope(scope)
    sha = hashlib.sha256(data).hexdigest()
    key = f"{ns}/{sha}.png"
    path = orch.settings.storage_path / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    with Image.open(io.BytesIO(data)) as im:
        w, h = im.size
    return orch.ingest_image(
        scope, sha256=sha, media_type="image/png", extension=".png", size_bytes=len(data), width=w, height=h,
        storage_key=key, **kwargs,
    )


def drive(orch: Orchestrator, pub: RecordingPublisher, providers: Providers, clock, rounds: int = 1) -> None:
    """``rounds`` rounds of: workers (this thread) handle every published hint, then ``clock`` passes
    a sweep interval and the re-hint grace, and a sweep runs (its hints published)."""
    for _ in range(rounds):
        for _ in range(50):
            hints = pub.drain()
            if not hints:
                break
            for h in hints:
                if h.task_id is not None:
                    handle_hint(orch, h.lane, h.task_id, "w", providers, pub)
        clock.advance(orch.settings.sweep_interval_s + orch.settings.rehint_grace_s + 1)
        pub.publish(orch.sweep().hints)


def visual_task(res) -> Hint:
    """A hint naming the visual task an ingest created. (The ingest itself may publish none: an
    upload joins the open wake-up group of the uploads just before it, whose hint wakes it.)"""
    stage = next(s for s in res.job["stages"] if s["stage"] == "visual")
    return Hint("visual", uuid.UUID(stage["task_id"]))


class Workers:
    """N threads consuming hints; each thread is one worker with its own owner id."""

    def __init__(self, orch: Orchestrator, publisher: RecordingPublisher, n: int = 4, providers: Providers | None = None,
                 worker_publisher=None):
        self.orch, self.publisher, self.n = orch, publisher, n
        self.providers = providers or Providers(orch.settings)
        self.out = worker_publisher or publisher
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def __enter__(self) -> Workers:
        for i in range(self.n):
            t = threading.Thread(target=self._loop, args=(f"test-worker-{i}-{uuid.uuid4().hex[:6]}",), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        if self.errors:
            raise self.errors[0]

    def _loop(self, owner: str) -> None:
        while not self._stop.is_set():
            hint = self.publisher.take(timeout=0.05)
            if hint is None:
                continue
            try:
                handle_hint(self.orch, hint.lane, hint.task_id, owner, self.providers, self.out)
            except BaseException as exc:  # surfaced in __exit__
                self.errors.append(exc)


def write_file(root: Path, key: str, data: bytes) -> None:
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def bulk_jobs_with_tasks(conn, n: int, *, lane: str, task_status: str) -> None:
    """``n`` finished jobs of the database's one image, each with one ``lane`` task in
    ``task_status`` (stage = lane name; hinted now), by bulk SQL — a backlog or history for plan tests."""
    conn.execute(text("""
        INSERT INTO processing_jobs (id, scope_id, image_id, revision, image_sha256, config, config_hash,
            reverse_image_policy, mode, status, created_at, updated_at)
        SELECT gen_random_uuid(), i.scope_id, i.id, 100 + g, i.sha256, '{}', 'h', 'forbid', 'auto', 'succeeded',
            now(), now()
        FROM images i, generate_series(1, :n) g"""), {"n": n})  # (one active job per image: tasks carry the state)
    conn.execute(text("""
        INSERT INTO tasks (id, scope_id, job_id, stage, lane, payload, input_fingerprint, dedupe_key, image_id,
            image_sha256, status, max_attempts, available_at, last_hint_at, created_at, updated_at)
        SELECT gen_random_uuid(), j.scope_id, j.id, :lane, :lane, '{}', 'f', md5(j.id::text), j.image_id,
            'x', :status, 3, now(), now(), now(), now()
        FROM processing_jobs j WHERE j.revision >= 100"""), {"lane": lane, "status": task_status})
    conn.execute(text("ANALYZE tasks; ANALYZE processing_jobs"))


def big_finished_history(conn) -> None:
    """60k finished agent jobs over the database's 4 images (15k each), with their three stages,
    grants and attempts, analyzed — the history the batch plan tests EXPLAIN on."""
    bulk_jobs_with_tasks(conn, 15000, lane="agent", task_status="succeeded")  # 4 images × 15k jobs
    conn.execute(text(
        "INSERT INTO job_stages (job_id, stage, scope_id, position, status, created_at, updated_at)"
        " SELECT j.id, s.stage, j.scope_id, s.pos, 'succeeded', now(), now() FROM processing_jobs j,"
        " (VALUES ('visual', 0), ('agent', 1), ('text_embedding', 2)) AS s(stage, pos) WHERE j.revision >= 100"
    ))
    conn.execute(text(
        "INSERT INTO operation_grants (id, scope_id, operation, idempotency_key, state, task_id, created_at,"
        " updated_at) SELECT gen_random_uuid(), t.scope_id, 'analysis.agent', t.id::text, 'committed', t.id,"
        " now(), now() FROM tasks t WHERE t.input_fingerprint = 'f'"
    ))
    conn.execute(text(
        "INSERT INTO task_attempts (attempt_id, scope_id, task_id, attempt_no, claim_generation, state,"
        " input_digest, target_sha256, created_at, updated_at) SELECT md5(t.id::text), t.scope_id, t.id, 1, 1,"
        " 'completed', 'f', 'x', now(), now() FROM tasks t WHERE t.input_fingerprint = 'f'"
    ))
    conn.execute(text("ANALYZE job_stages; ANALYZE operation_grants; ANALYZE task_attempts"))


def plan_nodes(plan: dict):
    """Every node of an ``EXPLAIN (FORMAT JSON)`` plan, depth first."""
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)
