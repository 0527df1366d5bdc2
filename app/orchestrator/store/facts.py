"""The planner's facts about an image version: does each stage's current artifact exist?

Both statements have one column per stage that declares a validity query (``StageSpec.exists_sql``
in app/orchestrator/stages.py), so a new stage adds its column by its declaration alone. Each is
built once, at import, and is then a constant like every other statement; what it renders to is
checked in as docs/sql/job_facts_many.sql and docs/sql/image_artifacts_exist.sql
(tests/unit/test_stage_sql.py fails when they drift, and says how to render them again). The only
other statements built from the registry are the batched claims (their cost CASE, store/tasks.py).
"""

from __future__ import annotations

import uuid

from sqlalchemy.engine import Connection, RowMapping

from app.db.jsoncodec import dumps
from app.orchestrator.fingerprints import canonical_json
from app.orchestrator.stages import EXISTS_STAGES, STAGES, StageSpec, exists_columns
from app.orchestrator.store._sql import sql
from app.orchestrator.types import StageConfigs


def job_facts_many_sql(specs: tuple[StageSpec, ...]) -> str:
    """JOB_FACTS_MANY for the pipeline ``specs``."""
    columns = exists_columns(specs, scope="j.scope_id", image="j.image_id", sha="r.sha", mh="r.mh",
                             config="j.config->'{stage}'")
    return f"""
SELECT j.*,
       (SELECT json_agg(json_build_object('stage', s.stage, 'status', s.status, 'task_id', s.task_id,
                                          'task_status', t.status))
        FROM job_stages s LEFT JOIN tasks t ON t.id = s.task_id WHERE s.job_id = j.id) AS stage_rows,
       {columns}
FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(id uuid, sha text, mh text)
JOIN processing_jobs j ON j.id = r.id
WHERE j.id = ANY(:ids)
ORDER BY j.id
FOR UPDATE OF j
"""


def image_artifacts_exist_sql(specs: tuple[StageSpec, ...]) -> str:
    """IMAGE_ARTIFACTS_EXIST for the pipeline ``specs``."""
    columns = exists_columns(specs, scope=":s", image=":i", sha=":sha", mh=":mh",
                             config="CAST(:config_{stage} AS jsonb)")
    return f"\nSELECT {columns}\n"


#: Lock jobs (in id order) and read each one's stages (with their tasks' status) and, per stage,
#: whether the artifact its frozen config needs exists for the given image version (r.sha, r.mh).
JOB_FACTS_MANY = sql(job_facts_many_sql(STAGES))

#: The same validity queries for one image version and one set of configs (a job being created).
IMAGE_ARTIFACTS_EXIST = sql(image_artifacts_exist_sql(STAGES))


def job_facts_many_txn(
    conn: Connection, items: list[tuple[uuid.UUID, str, str | None]]
) -> dict[uuid.UUID, RowMapping]:
    """Lock jobs (in id order) and read, in one statement, each one's stages (with their tasks'
    status) and whether the artifacts its frozen config needs exist for the given image version
    (``<stage>_exists`` columns, StageSpec.exists_column).

    ``items``: (job id, image sha256, image metadata_hash) — the image version to check against.
    """
    if not items:
        return {}
    doc = dumps([{"id": str(j), "sha": sha, "mh": mh} for j, sha, mh in items])
    rows = conn.execute(JOB_FACTS_MANY, {"rows": doc, "ids": [j for j, _, _ in items]}).mappings().all()
    return {r["id"]: r for r in rows}


def image_artifacts_exist_txn(conn: Connection, image: RowMapping, configs: StageConfigs) -> RowMapping:
    """Whether each stage's artifact for ``configs`` exists for the image row's current version
    (``<stage>_exists`` columns), in one statement."""
    return conn.execute(IMAGE_ARTIFACTS_EXIST, {
        "s": image["scope_id"], "i": image["id"], "sha": image["sha256"], "mh": image["metadata_hash"],
        **{f"config_{s.stage.value}": canonical_json(s.config(configs)) for s in EXISTS_STAGES},
    }).mappings().one()
