"""The search quality gate: the benchmark's subset through the real pipeline and the served API.

24 memes (12 English, 12 Chinese, every style) go through real Celery workers (one per lane) with
the real default providers; then every meme's ``exact`` and ``paraphrase`` query goes through
``GET /api/v1/search/text`` of the real Flask app, and r@1 per language × query type must reach
the thresholds below. The look-alike twins in the subset must find their original first.

Thresholds are provisional (the served default measured on the subset, less one query per cell);
the lead sets the final ones from the final benchmark (docs/search.md).
"""

from __future__ import annotations

import io
import uuid

import pytest
import redis as redis_lib

from app.auth import LocalScopeResolver
from app.cli.demo import stage_progress
from app.cli.ingest import image_files, ingest_files
from app.config import Settings
from bench.search_data import memes, write_dataset
from bench.search_quality import TERMINAL, evaluate, gate_failures, rank_of, summarize
from tests.conftest import admin_connect, poll_until
from tests.integration.conftest import GATE_REDIS_DB, CeleryCluster, redis_url_with_db

pytestmark = pytest.mark.slow

SCOPE = "quality-gate"
# r@1 each cell must reach on the subset (12 queries per cell), set from the benchmark: the served
# default (hybrid, multilingual-e5-small+all-MiniLM-L6-v2+multilingual-e5-small-querybank,
# local-ocr v2) measured 12, 12, 12 and 11 of 12 (`bench/search_quality.py --subset`, docs/search.md;
# 12, 12, 12 and 10 before the query bank); one query of slack per cell. The vector-only MiniLM
# search with local-ocr v1 measured 11, 10, 9 and 1.
MIN_R1: dict[str, float] = {
    "en/exact": 11 / 12,
    "en/paraphrase": 11 / 12,
    "zh/exact": 11 / 12,
    "zh/paraphrase": 10 / 12,
}
MIN_TWINS_R1 = 1.0


@pytest.fixture(scope="module")
def gate_stack(services, template_db, tmp_path_factory):
    """Its own database and Redis index, one real worker per lane with the default providers."""
    from app.db.engine import make_engine

    name = f"t_gate_{uuid.uuid4().hex[:12]}"
    conn = admin_connect(services)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name} TEMPLATE {template_db}")
    conn.close()
    broker = redis_url_with_db(services.redis_url(), GATE_REDIS_DB)
    client = redis_lib.Redis.from_url(broker)
    client.flushdb()
    client.close()
    tmp = tmp_path_factory.mktemp("quality-gate")
    settings = Settings(
        database_url=services.postgres_url(name), broker_url=broker, var_dir=tmp / "var",
        lease_s=30.0, heartbeat_s=1.0, sweep_interval_s=0.5, rehint_grace_s=1.0, backoff_base_s=0.05,
        backoff_max_s=0.5, log_json=True,  # providers: the defaults
    )
    cluster = CeleryCluster(settings, broker, tmp)
    engine = make_engine(settings.database_url)
    try:
        for lane in ("visual", "agent", "embedding"):
            cluster.worker(lane, name=f"gate-{lane}", wait=False)
        for proc in cluster.procs:
            cluster.wait_ready(proc)
        yield settings, engine, tmp
    finally:
        cluster.stop_all()
        engine.dispose()


def test_served_search_meets_the_quality_gate(gate_stack):
    from app.api import create_app

    settings, engine, tmp = gate_stack
    chosen = memes(subset=True)
    written = write_dataset(tmp / "data", chosen)
    client = create_app(scope_resolver=LocalScopeResolver(SCOPE), settings=settings).test_client()

    def upload(path, data, policy):
        resp = client.post("/api/v1/images", content_type="multipart/form-data",
                           data={"file": (io.BytesIO(data), path.name), "display_name": path.name})
        return resp.status_code, resp.get_json()

    report = ingest_files(image_files(tmp / "data" / "images"), upload)
    assert not report.failed and len(report.created) == len(chosen)
    image_ids = {m.id: report.image_ids[m.filename] for m in chosen}
    ids = list(image_ids.values())

    def all_terminal():
        _, jobs = stage_progress(engine, ids)
        return jobs if sum(n for st, n in jobs.items() if st in TERMINAL) == len(ids) else None

    jobs = poll_until(all_terminal, timeout=400, interval=0.5, what="every gate meme's job terminal")
    assert jobs == {"succeeded": len(ids)}

    def search(q: str) -> list[str]:
        resp = client.get("/api/v1/search/text", query_string={"q": q, "limit": 10})
        assert resp.status_code == 200, resp.get_json()
        return [hit["image"]["id"] for hit in resp.get_json()["items"]]

    ev = evaluate(search, chosen, image_ids)
    table = ev.table()
    failures = gate_failures(table, MIN_R1)
    assert not failures, f"{failures}; misses: {ev.misses}"

    twin_ranks = []
    for meme_id, path in written.twins.items():
        resp = client.post("/api/v1/search/visual", content_type="multipart/form-data",
                           data={"file": (io.BytesIO(path.read_bytes()), path.name)})
        assert resp.status_code == 200, resp.get_json()
        twin_ranks.append(rank_of(image_ids[meme_id], [h["image"]["id"] for h in resp.get_json()["items"]]))
    assert written.twins and summarize(twin_ranks)["r1"] >= MIN_TWINS_R1, twin_ranks
