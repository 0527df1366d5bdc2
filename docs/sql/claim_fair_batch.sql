-- app/orchestrator/store/tasks.py::CLAIM_FAIR_BATCH, as built at import from the stage registry (app/orchestrator/stages.py).
-- Generated: PYTHONPATH=. python tests/unit/test_stage_sql.py — do not edit.
WITH cand AS MATERIALIZED (
  WITH RECURSIVE w AS (
    (SELECT scope_id FROM tasks WHERE lane = :lane AND status = 'queued' AND available_at <= :now
       AND NOT cancel_requested AND attempt_count < max_attempts ORDER BY scope_id LIMIT 1)
    UNION ALL
    SELECT x.scope_id FROM w, LATERAL (
      SELECT scope_id FROM tasks WHERE lane = :lane AND status = 'queued' AND scope_id > w.scope_id
        AND available_at <= :now AND NOT cancel_requested AND attempt_count < max_attempts
      ORDER BY scope_id LIMIT 1) x
  ), o AS (
    SELECT w.scope_id, w.scope_id = ANY(CAST(:served AS text[])) AS served, coalesce(f.last_dispatch_seq, 0) AS seq
    FROM w LEFT JOIN lane_fairness f ON f.lane = :lane AND f.resource_key = '*' AND f.scope_id = w.scope_id
    ORDER BY served, seq, w.scope_id LIMIT :n
  ), h AS MATERIALIZED (
    SELECT x.id, o.served, o.seq, x.rk FROM o CROSS JOIN LATERAL (
      SELECT id, row_number() OVER (ORDER BY b.priority DESC, b.available_at) AS rk FROM (
        SELECT id, priority, available_at FROM tasks t WHERE t.lane = :lane
          AND t.status = 'queued' AND t.scope_id = o.scope_id AND t.available_at <= :now
          AND NOT t.cancel_requested AND t.attempt_count < t.max_attempts
        ORDER BY t.priority DESC, t.available_at LIMIT :n) b) x
  )
  SELECT t.id, false AS hinted, t.priority, t.available_at, t.scope_id, h.rk, h.served, h.seq,
         CASE WHEN t.lane = 'visual' THEN i.width::bigint * i.height
              WHEN t.lane = 'embedding' THEN coalesce(length(i.display_name), 0) + coalesce(length(i.context::text), 0) END AS cost
  FROM tasks t JOIN h ON h.id = t.id JOIN images i ON i.id = t.image_id
  WHERE t.id = ANY(ARRAY(SELECT id FROM h))
    AND t.status = 'queued' AND t.available_at <= :now AND t.lane = :lane AND NOT t.cancel_requested
    AND t.attempt_count < t.max_attempts
  ORDER BY h.rk, h.served, h.seq, t.scope_id, t.id LIMIT :n FOR UPDATE OF t SKIP LOCKED
), ranked AS (
  SELECT id, row_number() OVER w AS k, sum(cost) OVER w AS total FROM cand
  WINDOW w AS (ORDER BY rk, served, seq, scope_id, id)
), pick AS (
  SELECT id FROM ranked WHERE total <= :budget OR (CAST(:at_least_one AS boolean) AND k = 1)
), mate AS (
  UPDATE tasks t SET claimed_alone = false
  WHERE t.id = ANY(CAST(:with_ids AS uuid[])) AND t.claimed_alone AND EXISTS (SELECT FROM pick)
), fair AS (
  INSERT INTO lane_fairness (lane, resource_key, scope_id, last_dispatch_seq)
  SELECT :lane, '*', d.scope_id, nextval('lane_dispatch_seq') FROM (
    SELECT cand.scope_id FROM cand JOIN pick ON pick.id = cand.id
    UNION SELECT unnest(CAST(:served AS text[]))) d ORDER BY d.scope_id
  ON CONFLICT (lane, resource_key, scope_id) DO UPDATE SET last_dispatch_seq = excluded.last_dispatch_seq
), c AS (
  UPDATE tasks t SET status = 'running', lease_owner = :owner, lease_expires_at = :exp,
         claim_generation = claim_generation + 1, attempt_count = attempt_count + 1,
         claimed_alone = (SELECT count(*) FROM pick) + cardinality(CAST(:with_ids AS uuid[])) = 1
                         AND NOT CAST(:shared AS boolean),
         started_at = coalesce(started_at, :now), updated_at = :now
  FROM pick WHERE t.id = pick.id
  RETURNING t.id, t.scope_id, t.job_id, t.image_id, t.image_sha256, t.stage, t.lane, t.resource_key,
            t.claim_generation, t.attempt_count, t.max_attempts, t.payload, t.input_fingerprint, t.grant_id,
            t.hint_group
), s AS (
  UPDATE job_stages js SET status = 'running', attempt_count = c.attempt_count,
         started_at = coalesce(js.started_at, :now), updated_at = :now
  FROM c WHERE js.task_id = c.id AND js.status IN ('queued', 'running')
), j AS (
  UPDATE processing_jobs pj SET status = 'running', updated_at = :now
  FROM c WHERE pj.id = c.job_id AND pj.status = 'queued'
)
SELECT c.*, i.storage_key, cand.cost AS batch_cost
FROM c JOIN images i ON i.id = c.image_id JOIN cand ON cand.id = c.id
