"""Fairness between scopes in the batched lanes and in batch seeding (issue 17, item 3): one
scope's backlog of thousands delays another scope's single task by a bounded number of claims
(counted, not timed), the fair claim stays index-driven, and batch back-pressure and seeding are
per scope."""

from __future__ import annotations

import dataclasses
import re
import uuid

from psycopg import sql as psql
from sqlalchemy import event, text

from app.orchestrator import Orchestrator
from app.orchestrator.lanes import lane_batch_size, wake_group_size
from tests.support.pipeline import bulk_jobs_with_tasks, plan_nodes, png_bytes, store_and_ingest, visual_task

BACKLOG = 3000


def _holding(settings, **changes):
    """The test's settings with leases that outlive the test: its claims are never completed, and
    a claim whose 2 s lease expired on a busy machine would be claimed again and counted twice."""
    return dataclasses.replace(settings, lease_s=600.0, heartbeat_s=1.0, **changes)


def _backlog(engine, orch: Orchestrator, scope: str, lane: str, n: int, seed: int) -> list[uuid.UUID]:
    """``n`` queued ``lane`` tasks of one image of ``scope``, older than anything created later,
    in wake-up groups of the lane's group size, as a batched completion creates them. Returns the
    groups' named tasks in creation order: the hints the broker holds, first in first out."""
    image_id = store_and_ingest(orch, scope, png_bytes(seed), process=False).image["id"]
    size = wake_group_size(orch.settings, lane)
    with engine.begin() as conn:
        conn.execute(text("""
            INSERT INTO processing_jobs (id, scope_id, image_id, revision, image_sha256, config, config_hash,
                reverse_image_policy, mode, status, created_at, updated_at)
            SELECT gen_random_uuid(), i.scope_id, i.id, 100 + g, i.sha256, '{}', 'h', 'forbid', 'auto', 'succeeded',
                now(), now() FROM images i, generate_series(0, :n - 1) g WHERE i.id = :img"""),
                     {"n": n, "img": image_id})
        conn.execute(text("""
            WITH t AS (SELECT j.id AS job_id, j.scope_id, j.image_id, row_number() OVER (ORDER BY j.revision) - 1 AS k
                       FROM processing_jobs j WHERE j.image_id = :img AND j.revision >= 100)
            INSERT INTO tasks (id, scope_id, job_id, stage, lane, payload, input_fingerprint, dedupe_key, image_id,
                image_sha256, status, max_attempts, available_at, last_hint_at, created_at, updated_at)
            SELECT gen_random_uuid(), t.scope_id, t.job_id, :stage, :lane, '{}', 'f', md5(t.job_id::text),
                t.image_id, 'x', 'queued', 3, now() - interval '1 hour' + k * interval '1 ms', now(),
                now() - interval '1 hour' + k * interval '1 ms', now() FROM t"""),
                     {"img": image_id, "lane": lane, "stage": "visual" if lane == "visual" else "text_embedding"})
        # every size-th task names a group; the others follow it (hint_group)
        conn.execute(text("""
            WITH o AS (SELECT id, (row_number() OVER (ORDER BY created_at) - 1) / :size AS grp FROM tasks
                       WHERE image_id = :img AND status = 'queued'),
                 l AS (SELECT DISTINCT ON (grp) grp, id FROM o ORDER BY grp, id)
            UPDATE tasks t SET hint_group = CASE WHEN t.id = l.id THEN NULL ELSE l.id END,
                hint_members = CASE WHEN t.id = l.id THEN (SELECT count(*) - 1 FROM o o2 WHERE o2.grp = o.grp) ELSE 0 END
            FROM o JOIN l USING (grp) WHERE t.id = o.id"""), {"img": image_id, "size": size})
        leaders = conn.execute(text(
            "SELECT id FROM tasks WHERE image_id = :img AND status = 'queued' AND hint_group IS NULL ORDER BY created_at"
        ), {"img": image_id}).scalars().all()
        conn.execute(text("ANALYZE tasks"))
    return list(leaders)


def _claims_until(orch: Orchestrator, hints: list[uuid.UUID], lane: str, target: uuid.UUID) -> tuple[int, int]:
    """Serve the hints in broker order, one batch each; returns (batches until ``target`` was
    claimed, tasks claimed in all)."""
    n, found, total = lane_batch_size(orch.settings, lane), None, 0
    for i, hint in enumerate(hints, start=1):
        claimed = orch.claim_with_batch(hint, lane, n, f"w{i}").claims
        total += len(claimed)
        if found is None and any(c.task_id == target for c in claimed):
            found = i
    assert found is not None, "the target was never claimed"
    return found, total


def _queued(engine, lane: str) -> int:
    with engine.connect() as c:
        return c.execute(text("SELECT count(*) FROM tasks WHERE lane = :l AND status = 'queued'"), {"l": lane}).scalar()


def test_a_single_visual_upload_is_claimed_within_one_batch_behind_another_scopes_backlog(engine, settings):
    orch = Orchestrator(engine, _holding(settings))
    hints = _backlog(engine, orch, "tenant-a", "visual", BACKLOG, 500)
    upload = store_and_ingest(orch, "tenant-b", png_bytes(501))  # the real upload path: its own hint
    b_task = visual_task(upload).task_id
    assert [h.task_id for h in upload.hints] == [b_task]
    with engine.begin() as conn:  # A's backlog: uploads too, as urgent as B's (no priority to lean on)
        conn.execute(text("UPDATE tasks SET priority = (SELECT priority FROM tasks WHERE id = :b)"
                          " WHERE scope_id = 'tenant-a'"), {"b": b_task})
    captured: list[tuple[str, dict]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if "lane_fairness" in statement and "SKIP LOCKED" in statement:
            captured.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        # A's ~107 hints are ahead of B's in the broker; B's task rides in the first batch's fair fill
        batches, total = _claims_until(orch, hints + [b_task], "visual", b_task)
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    assert batches == 1
    assert total == BACKLOG + 1 and _queued(engine, "visual") == 0  # A's hints still drain A: nothing stranded
    statement, parameters = captured[0]
    with engine.connect() as conn:
        plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, parameters))
    assert not re.search(r"Seq Scan on tasks", plan), plan


def test_a_single_embedding_task_is_claimed_within_one_batch_behind_another_scopes_backlog(engine, settings):
    orch = Orchestrator(engine, _holding(settings, embedding_batch_size=16))
    hints = _backlog(engine, orch, "tenant-a", "embedding", BACKLOG, 510)
    [b_task] = _backlog(engine, orch, "tenant-b", "embedding", 1, 511)
    batches, total = _claims_until(orch, hints + [b_task], "embedding", b_task)
    assert batches == 1
    assert total == BACKLOG + 1 and _queued(engine, "embedding") == 0


def test_the_fair_fill_round_robins_over_the_least_recently_served_scopes(engine, settings):
    """More waiting scopes than one claim's fill: every scope is served within
    ceil(scopes / reserve) batches of A's hints, in least-recently-served order."""
    orch = Orchestrator(engine, _holding(settings, visual_batch_size=8))  # groups of 7, fill of 1
    hints = _backlog(engine, orch, "tenant-a", "visual", 200, 520)
    others = {f"tenant-{i}": _backlog(engine, orch, f"tenant-{i}", "visual", 1, 530 + i)[0] for i in range(4)}
    n, served_at = lane_batch_size(orch.settings, "visual"), {}
    for i, hint in enumerate(hints, start=1):
        for claim in orch.claim_with_batch(hint, "visual", n, f"w{i}").claims:
            if claim.task_id in others.values():
                served_at[claim.task_id] = i
    assert sorted(served_at.values()) == [1, 2, 3, 4]


def test_back_pressure_and_seeding_are_per_scope(engine, settings):
    """Scope A's backlog pauses A's batches only; B's batch seeds at once, and the sweep seeds C's
    batch although A has more paused batches than one sweep looks at."""
    orch = Orchestrator(engine, dataclasses.replace(settings, batch_page_size=1, batch_backlog_threshold=0))
    for s in (600, 601):
        store_and_ingest(orch, "tenant-a", png_bytes(s))  # two queued visual tasks: A is over its threshold
    paused = [orch.create_batch("tenant-a", all=True)[0] for _ in range(21)]  # > SWEEP_BATCHES
    assert {b["status"] for b in paused} == {"seeding"} and all(b["total"] == 2 for b in paused)
    assert all(sum(b["counts"].values()) == 0 for b in paused)
    store_and_ingest(orch, "tenant-b", png_bytes(602), process=False)
    b_batch, _ = orch.create_batch("tenant-b", all=True)
    assert sum(b_batch["counts"].values()) == 1  # its first page seeded despite A's backlog

    c_busy = store_and_ingest(orch, "tenant-c", png_bytes(603))
    store_and_ingest(orch, "tenant-c", png_bytes(604), process=False)
    c_batch, _ = orch.create_batch("tenant-c", all=True)
    assert c_batch["status"] == "seeding" and sum(c_batch["counts"].values()) == 0  # C's own backlog
    orch.cancel_job("tenant-c", c_busy.job["id"])  # C's backlog gone; A's is still there
    orch.continue_batches()
    c_batch = orch.get_batch("tenant-c", c_batch["id"])
    assert sum(c_batch["counts"].values()) == 1  # one page, then C's own new backlog pauses it
    assert all(orch.get_batch("tenant-a", b["id"])["status"] == "seeding" for b in paused)


def test_the_batched_claims_run_on_generic_plans_in_their_transaction_only(engine, settings):
    """CLAIM_FAIR_BATCH and CLAIM_GROUP were planned on every call (custom plans, ≈ 1 ms each:
    docs/performance-log.md §26): their transactions set plan_cache_mode for themselves, so once
    psycopg prepares them PostgreSQL never builds a custom plan — and the setting ends with the
    transaction."""
    orch = Orchestrator(engine, _holding(settings, visual_batch_size=4))
    hints = _backlog(engine, orch, "tenant-a", "visual", 120, 540)
    _backlog(engine, orch, "tenant-b", "visual", 40, 541)
    n = lane_batch_size(orch.settings, "visual")
    for i, hint in enumerate(hints[:12], start=1):  # the group claim and its fair fill, on one pooled connection
        assert orch.claim_with_batch(hint, "visual", n, f"w{i}").claims
    for i in range(12):  # the fair claim alone
        assert orch.claim_batch("visual", 2, f"b{i}")
    with engine.connect() as conn:  # the pool's one connection: the claims' prepared statements
        plans = dict(conn.execute(text(
            "SELECT CASE WHEN statement LIKE '%WITH RECURSIVE w AS%' THEN 'fair' ELSE 'group' END,"
            " array[generic_plans, custom_plans] FROM pg_prepared_statements"
            " WHERE statement LIKE '%WITH cand AS MATERIALIZED%'")).all())
        assert conn.execute(text("SHOW plan_cache_mode")).scalar() == "auto"
    assert set(plans) == {"fair", "group"}, plans
    for name, (generic, custom) in plans.items():
        assert generic >= 5 and custom == 0, (name, generic, custom)


def _generic_plan(engine, statement: str, parameters: dict) -> dict:
    """EXPLAIN (ANALYZE) of ``statement``'s generic plan — the one its transaction runs once psycopg
    prepared it — with ``parameters``; rolled back."""
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", statement)))
    for i, name in enumerate(names, 1):
        statement = statement.replace(f"%({name})s", f"${i}")
    raw = engine.raw_connection()
    try:
        conn = raw.driver_connection
        values = ", ".join(psql.Literal(parameters[name]).as_string(conn) for name in names)
        conn.execute("PREPARE generic_claim AS " + statement)
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        [(plan,)] = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE generic_claim({values})").fetchall()
        conn.rollback()
        conn.execute("DEALLOCATE generic_claim")
        return plan[0]["Plan"]
    finally:
        raw.close()


def test_the_fair_claims_generic_plan_reads_its_candidates_only_behind_a_big_backlog(engine, settings):
    """CLAIM_FAIR_BATCH runs on its generic plan (above), where ``LIMIT :n`` is unknown: the planner
    estimated the scopes' candidates (``h``) at thousands of rows and hash-joined them with every
    queued task of the lane — 21 ms per claim at 100k queued against 2 ms on the custom plan
    (docs/performance-log.md §46). The candidates reach their tasks by primary key now, so the
    claim reads about its candidates whatever the backlog."""
    orch = Orchestrator(engine, _holding(settings))
    store_and_ingest(orch, "local", png_bytes(77))
    backlog = 20000
    with engine.begin() as conn:
        bulk_jobs_with_tasks(conn, backlog, lane="visual", task_status="queued")
        conn.execute(text("ANALYZE tasks"))
    captured: list[tuple[str, dict]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if "WITH RECURSIVE w AS" in statement:
            captured.append((statement, dict(parameters)))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        assert len(orch.claim_batch("visual", 16, "w")) == 16
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    (statement, parameters), = captured
    plan = _generic_plan(engine, statement, parameters)
    read = {(node["Node Type"], node.get("Index Name")): node["Actual Rows"] * node["Actual Loops"]
            for node in plan_nodes(plan) if node.get("Relation Name") == "tasks"}
    assert read and max(read.values()) <= 16 * 16, read  # at most n candidates per scope, n scopes
