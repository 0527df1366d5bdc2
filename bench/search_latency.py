"""Latency of ``GET /api/v1/search/text`` with N images in one scope: hybrid vs semantic vs lexical.

Fills a fresh embedded PostgreSQL (fsync on) with N images of scope ``local`` by SQL in bulk:
each image gets a caption of random words (English and Chinese, from a fixed vocabulary), its
lexical terms (``images.search_tsv``, made by app/search/lexical.py exactly as the store writes
them) and a current text embedding of the configured text provider's model and dims (random unit
vectors: the HNSW scan's cost does not depend on what the vectors mean). Then it serves the real
Flask app (in process, the configured text provider embedding each query) and times every mode
over the same queries, interleaved, after a warm-up.

    python bench/search_latency.py [--images 10000] [--queries 200]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from sqlalchemy import text  # noqa: E402

from app.config import Settings  # noqa: E402
from app.db.engine import ensure_vector_index, make_engine  # noqa: E402
from app.search.lexical import image_terms  # noqa: E402
from bench.common import bench_servers  # noqa: E402

EN = ("monday coffee build deploy friday cat dog pizza meeting boss weekend sleep code bug test server "
      "cloud rain sun money salary rent school exam homework teacher mom dad game phone battery wifi "
      "diet gym run train bus late early happy sad angry tired hungry party birthday holiday").split()
ZH = list("今天明天老板工资加班摸鱼红包快乐周末睡觉吃饭学习考试作业手机电池网络减肥跑步火车迟到开心难过生气累饿")
QUERIES_EN = ["monday coffee", "deploy on friday", "my boss is angry", "tired after the gym", "pizza party",
              "the wifi is down again", "exam tomorrow", "happy weekend", "cat sleeping", "late for the bus"]
QUERIES_ZH = ["加班", "摸鱼", "抢红包", "周末睡觉", "考试", "手机没电", "老板生气", "减肥跑步", "今天开心", "工资"]


def caption(rng: random.Random) -> str:
    if rng.random() < 0.6:
        return " ".join(rng.choice(EN) for _ in range(rng.randint(3, 9))).upper()
    return "".join(rng.choice(ZH) for _ in range(rng.randint(4, 12)))


def fill(engine, n: int, model: str, dims: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    nprng = np.random.default_rng(seed)
    page = 2000
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO scopes (id, storage_namespace) VALUES ('local', gen_random_uuid())"
                          " ON CONFLICT DO NOTHING"))
    for start in range(0, n, page):
        rows = []
        vecs = nprng.normal(size=(min(page, n - start), dims))
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        for k in range(min(page, n - start)):
            cap = caption(rng)
            ctx = {"title": "", "description": "", "ocr_text": cap, "tags": []}
            rows.append({"n": start + k, "ctx": json.dumps(ctx, ensure_ascii=False),
                         "terms": image_terms(f"meme-{start + k}.png", ctx), "v": json.dumps(vecs[k].tolist())})
        with engine.begin() as conn:
            conn.execute(text(
                "WITH r AS (SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(n int, ctx text, terms text,"
                "  v text)), i AS (INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width,"
                "  height, storage_key, display_name, context, context_status, metadata_hash, search_tsv)"
                "  SELECT gen_random_uuid(), 'local', md5(r.n::text) || md5((r.n + 1)::text), '.png', 'image/png', 1,"
                "  1, 1, 'k' || r.n, 'meme-' || r.n || '.png', CAST(r.ctx AS jsonb), 'ready', 'h',"
                "  to_tsvector('simple', r.terms) FROM r RETURNING id, sha256, display_name)"
                " INSERT INTO text_embeddings (scope_id, image_id, image_sha256, metadata_hash, model, dims,"
                "  document_version, document, embedding, status)"
                " SELECT 'local', i.id, i.sha256, 'h', :m, :d, '2', '', CAST(r.v AS vector), 'ready'"
                " FROM i JOIN r ON i.display_name = 'meme-' || r.n || '.png'"),
                {"rows": json.dumps(rows, ensure_ascii=False), "m": model, "d": dims})
    with engine.begin() as conn:
        ensure_vector_index(conn, "text_embeddings", model, dims)
        conn.execute(text("ANALYZE images"))
        conn.execute(text("ANALYZE text_embeddings"))


def instrument_steps() -> dict[str, float]:
    """Wrap the search service's steps with timers; returns the dict each request's times land in
    (step name -> ms, summed over the step's calls in the request)."""
    from app.search import queries as Q
    from app.search import service

    steps: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                steps[name] = steps.get(name, 0.0) + (time.perf_counter() - t) * 1000
        return wrapper

    service.embed_query = timed("embed query", service.embed_query)
    service._query_bank = timed("query bank", service._query_bank)
    for name, label in (("candidates", "candidates SQL"), ("term_frequencies", "term df SQL"),
                        ("text_coverage", "text coverage"), ("lexical_coverage", "lexical coverage")):
        setattr(Q, name, timed(label, getattr(Q, name)))
    return steps


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--breakdown", action="store_true",
                    help="also print the median time per request in each step of the search (embedding the "
                         "query, the candidates' SQL, document frequencies, query bank, coverage counts)")
    args = ap.parse_args()
    with bench_servers("memeflow-search-latency-") as (tmp, db_url, broker_url):
        settings = Settings(database_url=db_url, broker_url=broker_url, var_dir=tmp / "var", log_json=False)
        from app.api import create_app
        from app.auth import LocalScopeResolver
        from app.orchestrator import Orchestrator, RecordingPublisher
        from app.stages.providers import Providers
        from app.storage import FileStore

        engine = make_engine(db_url)
        cfg = Providers(settings).text.config()
        t0 = time.monotonic()
        fill(engine, args.images, str(cfg["model"]), int(cfg["dims"]))
        print(f"filled {args.images} images ({cfg['model']}, {cfg['dims']} dims) in {time.monotonic() - t0:.0f}s")
        app = create_app(scope_resolver=LocalScopeResolver(), settings=settings,
                         orchestrator=Orchestrator(engine, settings), engine=engine,
                         publisher=RecordingPublisher(), store=FileStore(settings.storage_path),
                         cursor_secret_key="bench")
        client = app.test_client()
        queries = [(QUERIES_EN + QUERIES_ZH)[i % 20] for i in range(args.queries)]
        modes = ("hybrid", "semantic", "lexical")
        for q in queries[:20]:  # warm-up: model load, caches
            for mode in modes:
                client.get("/api/v1/search/text", query_string={"q": q, "mode": mode, "limit": 10})
        times: dict[str, list[float]] = {m: [] for m in modes}
        steps = instrument_steps() if args.breakdown else None
        per_step: dict[str, dict[str, list[float]]] = {m: {} for m in modes}
        for q in queries:
            for mode in modes:
                if steps is not None:
                    steps.clear()
                t = time.perf_counter()
                r = client.get("/api/v1/search/text", query_string={"q": q, "mode": mode, "limit": 10})
                times[mode].append((time.perf_counter() - t) * 1000)
                assert r.status_code == 200, r.get_json()
                if steps is not None:
                    for name, ms in steps.items():
                        per_step[mode].setdefault(name, []).append(ms)
        print(f"\n{platform.node()} · {os.cpu_count()} CPUs · {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
        print(f"command: python bench/search_latency.py --images {args.images} --queries {args.queries}\n")
        print("| mode | p50 ms | p99 ms |\n|---|---:|---:|")
        for mode in modes:
            print(f"| {mode} | {pct(times[mode], 0.5):.1f} | {pct(times[mode], 0.99):.1f} |")
        if steps is not None:
            names = sorted({n for m in modes for n in per_step[m]})
            print("\nmedian ms per request in each step (0 where a mode skips it)\n")
            print("| mode | " + " | ".join(names) + " |\n|---|" + "---:|" * len(names))
            for mode in modes:
                cells = [pct(per_step[mode][n], 0.5) if len(per_step[mode].get(n, [])) == len(times[mode]) else 0.0
                         for n in names]
                print(f"| {mode} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
        engine.dispose()


if __name__ == "__main__":
    main()
