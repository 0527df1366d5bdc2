"""The completion transaction runs on generic plans (tasks.generic_plans_txn): every statement a
visual, agent and embedding completion sends must then still reach its rows by index — on a big
history, and with text_embeddings statistics taken while the table was empty.

The plans are the ones PostgreSQL actually ran: ``auto_explain`` (loaded per connection, its
output sent to the client as notices) logs each statement's executed plan, and psycopg prepares
every statement at once (``prepare_threshold = 0``), as a worker's connection does after five
uses of a statement."""

from __future__ import annotations

import dataclasses
import json
import re

from sqlalchemy import event, text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.providers import Providers
from app.worker.run import handle_hint
from tests.support.pipeline import big_finished_history, png_bytes, store_and_ingest, visual_task

BIG = ("tasks", "processing_jobs", "job_stages", "task_attempts", "operation_grants", "text_embeddings")
#: Statements of complete_tasks (execution.py) that PostgreSQL planned per call before.
COMPLETION = {
    "job facts": "FROM jsonb_to_recordset(CAST($1 AS jsonb)) AS r(id uuid, sha text, mh text)",
    "image lock": "FROM images WHERE id = ANY($1) ORDER BY id FOR",
    "context write": "UPDATE images i SET context",
}


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _explained(engine) -> list[dict]:
    """Every plan the engine's (new) connections execute, as auto_explain's JSON documents."""
    plans: list[dict] = []
    engine.dispose()

    def on_notice(diag) -> None:
        message = diag.message_primary or ""
        start = message.find("{")
        if message.startswith("duration:") and start >= 0:
            plans.append(json.loads(message[start:]))

    @event.listens_for(engine, "connect")
    def explain_everything(dbapi_conn, _record):
        dbapi_conn.prepare_threshold = 0
        dbapi_conn.add_notice_handler(on_notice)
        with dbapi_conn.cursor() as cur:
            cur.execute("LOAD 'auto_explain'")
            for name, value in (("log_min_duration", "0"), ("log_level", "notice"), ("log_format", "json"),
                                ("log_analyze", "on"), ("log_nested_statements", "off")):
                cur.execute(f"SET auto_explain.{name} = '{value}'")
        dbapi_conn.commit()

    return plans


def test_the_completions_generic_plans_reach_their_rows_by_index(engine, settings):
    settings = dataclasses.replace(settings, agent_batch_size=4)
    orch = Orchestrator(engine, settings)
    visual = [visual_task(store_and_ingest(orch, "local", png_bytes(s))) for s in range(140, 144)]
    with engine.begin() as conn:
        conn.execute(text("ANALYZE text_embeddings"))  # while empty: the stale statistics case
        conn.execute(text(
            "INSERT INTO text_embeddings (scope_id, image_id, image_sha256, metadata_hash, model, dims,"
            " document_version, document, embedding, created_at) SELECT i.scope_id, i.id, i.sha256, md5(g::text),"
            " 'deterministic-text-v1', 64, 'v1', 'd', array_fill(0.1, ARRAY[64])::vector, now()"
            " FROM images i, generate_series(1, 3000) g"
        ))
        big_finished_history(conn)
        conn.execute(text("ANALYZE processing_jobs; ANALYZE tasks"))
    plans = _explained(engine)
    providers, pub = Providers(settings), RecordingPublisher()
    assert handle_hint(orch, "visual", visual[0].task_id, "w", providers, pub) == 4
    [agent] = [h for h in pub.drain() if h.lane == "agent"]
    assert handle_hint(orch, "agent", agent.task_id, "w", providers, pub) == 4
    [embedding] = [h for h in pub.drain() if h.lane == "embedding"]
    assert handle_hint(orch, "embedding", embedding.task_id, "w", providers, pub) == 4
    plans = list(plans)  # the three batches' statements only (the upload below is the API's)
    assert orch.get_job("local", store_and_ingest(orch, "local", png_bytes(140)).job["id"])["status"] == "succeeded"

    seen = {name: 0 for name in COMPLETION}
    for doc in plans:
        query, plan = doc["Query Text"], doc["Plan"]
        for node in _nodes(plan):
            assert not (node["Node Type"] == "Seq Scan" and node.get("Relation Name") in BIG), (query, doc)
            if node.get("Relation Name") == "text_embeddings":  # one row per job asked about
                assert node["Actual Rows"] + node.get("Rows Removed by Filter", 0) <= 1, (query, doc)
        for name, marker in COMPLETION.items():
            if marker in query:
                seen[name] += 1
                # a generic plan compares with the parameters, a custom one with their values
                assert re.search(r"\$\d", json.dumps(plan)), (name, "custom plan", doc)
    assert all(seen.values()), seen  # the visual and embedding completions' job facts and image locks,
    # the agent completion's context write: each ran, on its generic plan
