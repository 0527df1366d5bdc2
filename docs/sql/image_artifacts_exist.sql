-- app/orchestrator/store/facts.py::IMAGE_ARTIFACTS_EXIST, as built at import from the stage registry (app/orchestrator/stages.py).
-- Generated: PYTHONPATH=. python tests/unit/test_stage_sql.py — do not edit.
SELECT EXISTS (SELECT 1 FROM visual_embeddings v WHERE v.scope_id = :s AND v.image_id = :i
         AND v.image_sha256 = :sha AND v.model = CAST(:config_visual AS jsonb)->>'model'
         AND v.preprocess_version = CAST(:config_visual AS jsonb)->>'preprocess_version' AND v.dims = (CAST(:config_visual AS jsonb)->>'dims')::int)
       AND NOT EXISTS (SELECT 1 FROM search_serving ss CROSS JOIN LATERAL (VALUES (ss.serving_model, ss.serving_dims, ss.serving_ref->>'preprocess_version'), (ss.target_model, ss.target_dims, ss.target_ref->>'preprocess_version')) AS w(model, dims, pv) WHERE ss.scope_id = :s AND ss.kind = 'visual' AND w.model IS NOT NULL AND NOT EXISTS (SELECT 1 FROM visual_embeddings v2 WHERE v2.scope_id = :s AND v2.image_id = :i AND v2.image_sha256 = :sha AND v2.model = w.model AND v2.preprocess_version = w.pv AND v2.dims = w.dims)) AS visual_exists,
       EXISTS (SELECT 1 FROM text_embeddings x WHERE x.scope_id = :s AND x.image_id = :i
         AND x.image_sha256 = :sha AND x.metadata_hash = :mh AND x.status = 'ready'
         AND x.model = CAST(:config_text_embedding AS jsonb)->>'model' AND x.dims = (CAST(:config_text_embedding AS jsonb)->>'dims')::int
         AND x.document_version = coalesce(CAST(:config_text_embedding AS jsonb)->>'document_version', '1'))
       AND NOT EXISTS (SELECT 1 FROM search_serving ss CROSS JOIN LATERAL (VALUES (ss.serving_model, ss.serving_dims), (ss.target_model, ss.target_dims)) AS w(model, dims) WHERE ss.scope_id = :s AND ss.kind = 'text' AND w.model IS NOT NULL AND NOT EXISTS (SELECT 1 FROM text_embeddings x2 WHERE x2.scope_id = :s AND x2.image_id = :i AND x2.image_sha256 = :sha AND x2.metadata_hash = :mh AND x2.status = 'ready' AND x2.model = w.model AND x2.dims = w.dims)) AS text_embedding_exists
