"""The statements the store builds from the stage registry at import (store/facts.py's two facts
statements, the batched claims in store/tasks.py) are checked in, rendered, as docs/sql/*.sql, so
the SQL that runs is written down whole: this test fails when a declaration changes what they
render to and the files were not rendered again (docs/architecture.md "Adding a stage").

Render them again with: PYTHONPATH=. python tests/unit/test_stage_sql.py
"""

from __future__ import annotations

from pathlib import Path

from app.orchestrator.stages import EXISTS_STAGES, STAGES
from app.orchestrator.store import facts, tasks

DOCS = Path(__file__).resolve().parents[2] / "docs" / "sql"
#: file → (statement, where it is built)
RENDERED = {
    "job_facts_many.sql": (facts.JOB_FACTS_MANY, "app/orchestrator/store/facts.py::JOB_FACTS_MANY"),
    "image_artifacts_exist.sql": (facts.IMAGE_ARTIFACTS_EXIST, "app/orchestrator/store/facts.py::IMAGE_ARTIFACTS_EXIST"),
    "claim_group.sql": (tasks.CLAIM_GROUP, "app/orchestrator/store/tasks.py::CLAIM_GROUP"),
    "claim_fair_batch.sql": (tasks.CLAIM_FAIR_BATCH, "app/orchestrator/store/tasks.py::CLAIM_FAIR_BATCH"),
}


def _rendered(name: str) -> str:
    statement, source = RENDERED[name]
    return (f"-- {source}, as built at import from the stage registry (app/orchestrator/stages.py).\n"
            f"-- Generated: PYTHONPATH=. python tests/unit/test_stage_sql.py — do not edit.\n"
            f"{statement.text.strip()}\n")


def test_the_rendered_statements_are_checked_in():
    stale = [name for name in RENDERED if not (DOCS / name).is_file() or (DOCS / name).read_text() != _rendered(name)]
    assert stale == [], f"docs/sql/ is stale for {stale}: PYTHONPATH=. python tests/unit/test_stage_sql.py"
    assert sorted(p.name for p in DOCS.glob("*.sql")) == sorted(RENDERED)


def test_every_declared_validity_query_and_batch_cost_is_in_its_statements():
    assert EXISTS_STAGES, "no stage declares a validity query"
    for s in EXISTS_STAGES:
        for statement in (facts.JOB_FACTS_MANY, facts.IMAGE_ARTIFACTS_EXIST):
            assert f" AS {s.exists_column}" in statement.text
    for s in STAGES:
        for statement in (tasks.CLAIM_GROUP, tasks.CLAIM_FAIR_BATCH):
            assert (f"WHEN t.lane = '{s.lane.value}' THEN" in statement.text) == s.batched


if __name__ == "__main__":
    for name in RENDERED:
        (DOCS / name).write_text(_rendered(name))
        print(f"wrote docs/sql/{name}")
