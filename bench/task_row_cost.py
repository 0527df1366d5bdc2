"""PostgreSQL's cost of a task's life (queued → running → succeeded): the ``tasks`` table as it is,
against the same life in a narrow row of its own for the hot state (issue 21, item 3's lever).

Every claim and finish of a task changes ``status``, which the partial indexes' predicates read, so
no task update is HOT: each writes the whole ≈ 800-byte row again and an entry into every full index
(``pk_tasks``, ``uq_tasks_scope_id_id``, ``ix_tasks_image``, ``ix_tasks_job``) and the partial ones
it enters (docs/performance-log.md §52). The alternative measured here, without changing the
schema: a ``bench_task_static`` table with the columns written once (payload, fingerprints, ids;
the full indexes) and a ``bench_task_hot`` row per task with what claims and finishes change (status,
lease, generation, timestamps, result; the partial indexes and the dedupe index), both in the real
database next to the real tables.

Each variant runs the same statements the drain's batched store runs for its tasks, ``--batch``
tasks per statement and one commit per statement (insert; claim; finish), for ``--tasks`` tasks,
and reads the backend's CPU time (``/proc/<pid>/stat``) and the WAL written. Variants alternate,
``--rounds`` times. Only the tasks' own statements are measured: the stages, jobs, attempts and
embeddings around them are the same in both designs.

    python bench/task_row_cost.py [--tasks 6000] [--batch 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg  # noqa: E402

from bench.common import bench_servers  # noqa: E402

FILL = """
INSERT INTO scopes (id, storage_namespace) VALUES ('bench', gen_random_uuid());
INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height, storage_key)
  SELECT gen_random_uuid(), 'bench', md5(g::text) || md5((g + 1)::text), '.png', 'image/png', 1, 1, 1, 'k'
  FROM generate_series(1, :n) g;
INSERT INTO processing_jobs (id, scope_id, image_id, revision, image_sha256, config, config_hash,
    reverse_image_policy, mode, status, current_stage)
  SELECT gen_random_uuid(), scope_id, id, 1, sha256, '{}', 'h', 'forbid', 'auto', 'running', 'visual'
  FROM images;
"""

# The narrow design: written once (static) and changed by claims and finishes (hot).
NARROW_DDL = """
CREATE TABLE bench_task_static (
  id uuid PRIMARY KEY, scope_id varchar(128) NOT NULL, job_id uuid NOT NULL, stage varchar(24) NOT NULL,
  payload jsonb NOT NULL, input_fingerprint varchar(64) NOT NULL, image_id uuid NOT NULL,
  image_sha256 varchar(64) NOT NULL, max_attempts int NOT NULL, grant_id uuid,
  created_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (scope_id, id),
  FOREIGN KEY (scope_id, image_id) REFERENCES images (scope_id, id) ON DELETE CASCADE,
  FOREIGN KEY (scope_id, job_id) REFERENCES processing_jobs (scope_id, id) ON DELETE CASCADE
);
CREATE INDEX bench_ts_image ON bench_task_static (scope_id, image_id);
CREATE INDEX bench_ts_job ON bench_task_static (job_id);
CREATE TABLE bench_task_hot (
  id uuid PRIMARY KEY REFERENCES bench_task_static (id) ON DELETE CASCADE,
  scope_id varchar(128) NOT NULL, lane varchar(16) NOT NULL, resource_key text NOT NULL DEFAULT '',
  dedupe_key varchar(64) NOT NULL, status varchar(16) NOT NULL, priority smallint NOT NULL DEFAULT 0,
  available_at timestamptz NOT NULL, lease_owner text, lease_expires_at timestamptz,
  claim_generation bigint NOT NULL DEFAULT 0, attempt_count int NOT NULL DEFAULT 0,
  last_hint_at timestamptz, cancel_requested boolean NOT NULL DEFAULT false, hint_group uuid,
  hint_members int NOT NULL DEFAULT 0, error jsonb, result jsonb,
  created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, started_at timestamptz,
  completed_at timestamptz
);
CREATE INDEX bench_th_claimable ON bench_task_hot (lane, resource_key, scope_id, priority DESC, created_at)
  WHERE status = 'queued';
CREATE INDEX bench_th_lease ON bench_task_hot (lease_expires_at) WHERE status = 'running';
CREATE INDEX bench_th_rehint ON bench_task_hot (last_hint_at NULLS FIRST) WHERE status = 'queued';
CREATE UNIQUE INDEX bench_th_dedupe ON bench_task_hot (scope_id, dedupe_key) WHERE status IN ('queued', 'running');
CREATE INDEX bench_th_finished ON bench_task_hot (completed_at) WHERE status IN ('succeeded', 'failed', 'cancelled');
CREATE INDEX bench_th_queued_due ON bench_task_hot (lane, priority DESC, available_at) WHERE status = 'queued';
CREATE INDEX bench_th_hint_group ON bench_task_hot (hint_group) WHERE status = 'queued' AND hint_group IS NOT NULL;
CREATE INDEX bench_th_open_group ON bench_task_hot (scope_id, lane, resource_key, priority, created_at)
  WHERE status = 'queued' AND hint_group IS NULL;
CREATE INDEX bench_th_lane_scope_due ON bench_task_hot (lane, scope_id, priority DESC, available_at)
  WHERE status = 'queued';
"""

ROWS = ("r(id uuid, scope_id text, job_id uuid, stage text, lane text, payload jsonb, input_fingerprint text,"
        " dedupe_key text, image_id uuid, image_sha256 text, hint_group uuid)")

INSERT_WIDE = f"""
INSERT INTO tasks (id, scope_id, job_id, stage, lane, resource_key, payload, input_fingerprint, dedupe_key,
                   image_id, image_sha256, status, priority, available_at, max_attempts, last_hint_at,
                   grant_id, hint_group, hint_members, created_at, updated_at)
SELECT id, scope_id, job_id, stage, lane, '', payload, input_fingerprint, dedupe_key, image_id, image_sha256,
       'queued', 0, now(), 3, now(), NULL, hint_group, 0, now(), now()
FROM jsonb_to_recordset(%(rows)s::jsonb) AS {ROWS}
"""
CLAIM_WIDE = """
UPDATE tasks SET status = 'running', lease_owner = %(owner)s, lease_expires_at = now() + interval '60 s',
       claim_generation = claim_generation + 1, attempt_count = attempt_count + 1, started_at = now(),
       updated_at = now(), hint_group = NULL
WHERE id = ANY(%(ids)s) AND status = 'queued'
"""
FINISH_WIDE = """
UPDATE tasks SET status = 'succeeded', result = %(res)s::jsonb, completed_at = now(), updated_at = now(),
       lease_expires_at = NULL
WHERE id = ANY(%(ids)s) AND status = 'running' AND lease_owner = %(owner)s
"""

INSERT_NARROW = f"""
WITH r AS (SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) AS {ROWS}),
s AS (
  INSERT INTO bench_task_static (id, scope_id, job_id, stage, payload, input_fingerprint, image_id,
                                 image_sha256, max_attempts, grant_id, created_at)
  SELECT id, scope_id, job_id, stage, payload, input_fingerprint, image_id, image_sha256, 3, NULL, now() FROM r
  RETURNING id
)
INSERT INTO bench_task_hot (id, scope_id, lane, resource_key, dedupe_key, status, priority, available_at,
                            last_hint_at, hint_group, hint_members, created_at, updated_at)
SELECT r.id, r.scope_id, r.lane, '', r.dedupe_key, 'queued', 0, now(), now(), r.hint_group, 0, now(), now()
FROM r JOIN s ON s.id = r.id
"""
CLAIM_NARROW = CLAIM_WIDE.replace("UPDATE tasks", "UPDATE bench_task_hot")
FINISH_NARROW = FINISH_WIDE.replace("UPDATE tasks", "UPDATE bench_task_hot")

# name: (insert, claim, finish, reset, the table whose rows say each task's status)
VARIANTS = {
    "tasks (as it is)": (INSERT_WIDE, CLAIM_WIDE, FINISH_WIDE, "TRUNCATE tasks CASCADE", "tasks"),
    "narrow hot row": (INSERT_NARROW, CLAIM_NARROW, FINISH_NARROW, "TRUNCATE bench_task_static CASCADE",
                       "bench_task_hot"),
}


def backend_cpu_s(pid: int) -> float:
    """utime + stime of a local backend, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def task_rows(jobs: list[tuple], k: int) -> list[dict]:
    """One task per job (stage ``k``), with a payload the size of the drain's."""
    stage = ("visual", "agent", "text_embedding")[k]
    lane = ("visual", "agent", "embedding")[k]
    out = []
    for job_id, scope_id, image_id, sha in jobs:
        payload = {"image_id": str(image_id), "image_sha256": sha, "stage": stage,
                   "stage_config_hash": uuid.uuid4().hex * 2,
                   "config": {"provider": "deterministic", "model": "deterministic-v1",
                              "version": "deterministic-v1", "dims": 64, "preprocess_version": "v1",
                              "document_version": "6", "reverse_image_policy": "forbid"}}
        out.append({"id": str(uuid.uuid4()), "scope_id": scope_id, "job_id": str(job_id), "stage": stage,
                    "lane": lane, "payload": payload, "input_fingerprint": uuid.uuid4().hex * 2,
                    "dedupe_key": uuid.uuid4().hex * 2, "image_id": str(image_id), "image_sha256": sha,
                    "hint_group": None})
    return out


def libpq_url(db_url: str) -> str:
    """The SQLAlchemy URL (``postgresql+driver://…``) as libpq takes it."""
    return "postgresql://" + db_url.split("://", 1)[1]


def prepare(conn, n_jobs: int) -> list[tuple]:
    """Images and running jobs for ``n_jobs`` tasks' lives, and the narrow design's tables."""
    with conn.cursor() as cur:
        cur.execute(FILL.replace(":n", str(int(n_jobs))))
        cur.execute(NARROW_DDL)
        cur.execute("SELECT id, scope_id, image_id, image_sha256 FROM processing_jobs")
        jobs = cur.fetchall()
    conn.commit()
    return jobs


def run_variant(conn, name: str, jobs: list[tuple], batch: int) -> dict:
    """One design's run over ``jobs`` (three tasks each); raises unless every task succeeded."""
    insert, claim, finish, reset, status_table = VARIANTS[name]
    with conn.cursor() as cur:
        cur.execute(reset)
        cur.execute("CHECKPOINT")
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
        conn.commit()
        res = json.dumps({"embedding": {"model": "deterministic-v1", "dims": 64}, "rows": 1})
        batches = []
        for k in range(3):  # a job's three tasks, stage after stage
            rows = task_rows(jobs, k)
            batches += [rows[i:i + batch] for i in range(0, len(rows), batch)]
        cpu0, t0 = backend_cpu_s(pid), time.perf_counter()
        cur.execute("SELECT pg_current_wal_insert_lsn()")
        lsn0 = cur.fetchone()[0]
        conn.commit()
        for chunk in batches:
            ids = [uuid.UUID(r["id"]) for r in chunk]
            cur.execute(insert, {"rows": json.dumps(chunk)})
            conn.commit()
            cur.execute(claim, {"ids": ids, "owner": "w1"})
            conn.commit()
            cur.execute(finish, {"ids": ids, "owner": "w1", "res": res})
            conn.commit()
        wall = time.perf_counter() - t0
        cpu = backend_cpu_s(pid) - cpu0
        cur.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", (lsn0,))
        wal = float(cur.fetchone()[0])
        cur.execute(f"SELECT status, count(*) FROM {status_table} GROUP BY status")
        statuses = dict(cur.fetchall())
        conn.commit()
    n = sum(len(b) for b in batches)
    if statuses != {"succeeded": n}:
        raise RuntimeError(f"{name}: expected {n} succeeded tasks, found {statuses}")
    return {"cpu_us": 1e6 * cpu / n, "wall_us": 1e6 * wall / n, "wal_b": wal / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=6000, help="tasks per variant and round (3 per job)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with bench_servers("memeflow-taskrow-") as (_tmp, db_url, _broker):
        with psycopg.connect(libpq_url(db_url)) as conn:
            jobs = prepare(conn, args.tasks // 3)
            results: dict[str, list[dict]] = {name: [] for name in VARIANTS}
            for rnd in range(args.rounds):
                order = list(VARIANTS) if rnd % 2 == 0 else list(reversed(VARIANTS))
                for name in order:
                    r = run_variant(conn, name, jobs, args.batch)
                    results[name].append(r)
                    print(f"round {rnd + 1} {name}: backend CPU {r['cpu_us']:.1f} µs/task,"
                          f" wall {r['wall_us']:.1f} µs/task, WAL {r['wal_b']:.0f} B/task", flush=True)
    print(f"\n| design | backend CPU µs per task (median of {args.rounds}) | WAL bytes per task | wall µs per task |")
    print("|---|---|---|---|")
    for name, rs in results.items():
        print(f"| {name} | {statistics.median(r['cpu_us'] for r in rs):.1f} |"
              f" {statistics.median(r['wal_b'] for r in rs):.0f} | {statistics.median(r['wall_us'] for r in rs):.1f} |")


if __name__ == "__main__":
    main()
