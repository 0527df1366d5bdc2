-- app/orchestrator/store/tasks.py::CLAIM_GROUP, as built at import from the stage registry (app/orchestrator/stages.py).
-- Generated: PYTHONPATH=. python tests/unit/test_stage_sql.py — do not edit.
WITH cand AS MATERIALIZED (
  SELECT t.id, t.id = :id AS hinted, t.status = 'running' AS died, t.priority, t.available_at,
         CASE WHEN t.lane = 'visual' THEN i.width::bigint * i.height
              WHEN t.lane = 'embedding' THEN coalesce(length(i.display_name), 0) + coalesce(length(i.context::text), 0) END AS cost
  FROM tasks t JOIN images i ON i.id = t.image_id
  WHERE (t.id = :id OR (t.hint_group = :id AND t.status = 'queued')) AND t.lane = :lane
    AND NOT t.cancel_requested AND (t.attempt_count < t.max_attempts OR (t.status = 'running' AND NOT t.claimed_alone))
    AND ((t.status = 'queued' AND t.available_at <= :now) OR (t.status = 'running' AND t.lease_expires_at < :now))
  FOR UPDATE OF t SKIP LOCKED
), ranked AS (
  SELECT id, row_number() OVER w AS k, sum(cost) OVER w AS total FROM cand
  WINDOW w AS (ORDER BY hinted DESC, priority DESC, available_at, id)
), pick AS (
  SELECT id FROM ranked WHERE k = 1 OR (total <= :budget AND NOT EXISTS (SELECT FROM cand WHERE died))
), c AS (
  UPDATE tasks t SET status = 'running', lease_owner = :owner, lease_expires_at = :exp,
         claim_generation = claim_generation + 1,
         attempt_count = t.attempt_count + CASE WHEN t.status = 'running' AND NOT t.claimed_alone THEN 0 ELSE 1 END,
         claimed_alone = (SELECT count(*) FROM pick) = 1 AND NOT CAST(:shared AS boolean),
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
SELECT c.*, i.storage_key, cand.cost AS batch_cost, cand.died,
       (SELECT count(*) FROM cand) - (SELECT count(*) FROM pick) AS left_out
FROM c JOIN images i ON i.id = c.image_id JOIN cand ON cand.id = c.id
