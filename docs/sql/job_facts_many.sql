-- app/orchestrator/store/facts.py::JOB_FACTS_MANY, as built at import from the stage registry (app/orchestrator/stages.py).
-- Generated: PYTHONPATH=. python tests/unit/test_stage_sql.py — do not edit.
SELECT j.*,
       (SELECT json_agg(json_build_object('stage', s.stage, 'status', s.status, 'task_id', s.task_id,
                                          'task_status', t.status))
        FROM job_stages s LEFT JOIN tasks t ON t.id = s.task_id WHERE s.job_id = j.id) AS stage_rows,
       EXISTS (SELECT 1 FROM visual_embeddings v WHERE v.scope_id = j.scope_id AND v.image_id = j.image_id
         AND v.image_sha256 = r.sha AND v.model = j.config->'visual'->>'model'
         AND v.preprocess_version = j.config->'visual'->>'preprocess_version' AND v.dims = (j.config->'visual'->>'dims')::int)
       AND NOT EXISTS (SELECT 1 FROM search_serving ss CROSS JOIN LATERAL (VALUES (ss.serving_model, ss.serving_dims, ss.serving_ref->>'preprocess_version'), (ss.target_model, ss.target_dims, ss.target_ref->>'preprocess_version')) AS w(model, dims, pv) WHERE ss.scope_id = j.scope_id AND ss.kind = 'visual' AND w.model IS NOT NULL AND NOT EXISTS (SELECT 1 FROM visual_embeddings v2 WHERE v2.scope_id = j.scope_id AND v2.image_id = j.image_id AND v2.image_sha256 = r.sha AND v2.model = w.model AND v2.preprocess_version = w.pv AND v2.dims = w.dims)) AS visual_exists,
       EXISTS (SELECT 1 FROM text_embeddings x WHERE x.scope_id = j.scope_id AND x.image_id = j.image_id
         AND x.image_sha256 = r.sha AND x.metadata_hash = r.mh AND x.status = 'ready'
         AND x.model = j.config->'text_embedding'->>'model' AND x.dims = (j.config->'text_embedding'->>'dims')::int
         AND x.document_version = coalesce(j.config->'text_embedding'->>'document_version', '1'))
       AND NOT EXISTS (SELECT 1 FROM search_serving ss CROSS JOIN LATERAL (VALUES (ss.serving_model, ss.serving_dims), (ss.target_model, ss.target_dims)) AS w(model, dims) WHERE ss.scope_id = j.scope_id AND ss.kind = 'text' AND w.model IS NOT NULL AND NOT EXISTS (SELECT 1 FROM text_embeddings x2 WHERE x2.scope_id = j.scope_id AND x2.image_id = j.image_id AND x2.image_sha256 = r.sha AND x2.metadata_hash = r.mh AND x2.status = 'ready' AND x2.model = w.model AND x2.dims = w.dims)) AS text_embedding_exists
FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(id uuid, sha text, mh text)
JOIN processing_jobs j ON j.id = r.id
WHERE j.id = ANY(:ids)
ORDER BY j.id
FOR UPDATE OF j
