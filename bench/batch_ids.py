"""``POST /api/v1/batches`` with a long ``image_ids`` list, through the real Flask app.

Fills a fresh database with ``--n`` images per run (by SQL in bulk, scope ``local``), then for
each run posts all of that run's ids (plus ``--dupes`` repeated ids, which the API drops) and
times the request end to end: JSON parsing, schema validation, the one-statement existence check,
the batch row with its snapshot of ids, and the first seeded page (``batch_page_size`` jobs and
their first tasks). A second figure times the orchestrator's ``create_batch`` alone. Prints a
markdown table. Uses the embedded PostgreSQL under a temp dir (fsync on) unless --database-url.

    python bench/batch_ids.py [--n 10000] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import text  # noqa: E402

from bench.common import bench_servers  # noqa: E402

FILL = """
INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height, storage_key)
  SELECT gen_random_uuid(), 'local', md5(:salt || g::text) || md5(:salt || (g + 1)::text), '.png', 'image/png',
    1, 1, 1, 'k/' || g
  FROM generate_series(1, :n) g
RETURNING id
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000, help="image ids per request (default 10000, the limit)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dupes", type=int, default=0, help="repeated ids appended to each request")
    ap.add_argument("--database-url")
    args = ap.parse_args()

    from app.api import create_app
    from app.auth import LocalScopeResolver
    from app.config import Settings
    from app.db.engine import make_engine
    from app.orchestrator import Orchestrator, RecordingPublisher
    from app.orchestrator.batches import REQUEST_PAGE

    with bench_servers("mf-bench-batch-", args.database_url, "redis://unused") as (tmp, db_url, _):
        settings = Settings(database_url=db_url, broker_url="redis://unused", var_dir=tmp / "run",
                            visual_provider="deterministic", agent_provider="deterministic",
                            text_provider="deterministic", log_json=False)
        engine = make_engine(db_url)
        orch = Orchestrator(engine, settings)
        orch.ensure_scope("local")
        app = create_app(scope_resolver=LocalScopeResolver(), settings=settings, orchestrator=orch, engine=engine,
                         publisher=RecordingPublisher(), cursor_secret_key="bench")
        client = app.test_client()

        def fill(salt: str) -> list[str]:
            with engine.begin() as conn:
                ids = [str(i) for i in conn.execute(text(FILL), {"n": args.n, "salt": salt}).scalars()]
                conn.execute(text("ANALYZE images"))
            return ids

        api_s, orch_s = [], []
        for run in range(args.runs):
            ids = fill(f"api{run}-")
            body = {"image_ids": ids + ids[: args.dupes]}
            t0 = time.perf_counter()
            r = client.post("/api/v1/batches", json=body)
            api_s.append(time.perf_counter() - t0)
            assert r.status_code == 202, r.get_json()
            assert r.get_json()["batch"]["total"] == args.n

            ids = [uuid.UUID(i) for i in fill(f"orch{run}-")]
            t0 = time.perf_counter()
            batch, _ = orch.create_batch("local", image_ids=ids, first_page_size=REQUEST_PAGE)
            orch_s.append(time.perf_counter() - t0)
            assert batch["total"] == args.n

        missing = [str(uuid.uuid4()) for _ in range(args.n)]
        t0 = time.perf_counter()
        r = client.post("/api/v1/batches", json={"image_ids": missing})
        missing_s = time.perf_counter() - t0
        assert r.status_code == 404, r.get_json()
        r = client.post("/api/v1/batches", json={"image_ids": missing + [str(uuid.uuid4())]})
        assert r.status_code == 422, r.get_json()
        engine.dispose()

    def row(name: str, values: list[float]) -> str:
        return (f"| {name} | {len(values)} | {statistics.median(values) * 1000:.0f} | {min(values) * 1000:.0f} |"
                f" {max(values) * 1000:.0f} |")

    print(f"{args.n} ids per request (+{args.dupes} duplicates); {REQUEST_PAGE} jobs seeded in the request")
    print("| what | runs | median ms | min ms | max ms |")
    print("|---|---|---|---|---|")
    print(row("POST /api/v1/batches (202, test client)", api_s))
    print(row("Orchestrator.create_batch", orch_s))
    print(row(f"POST /api/v1/batches, {args.n} unknown ids (404)", [missing_s]))


if __name__ == "__main__":
    main()
