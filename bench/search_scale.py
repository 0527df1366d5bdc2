"""Recall@10 and latency of search for small, medium and large scopes sharing one big index.

Bulk-loads (SQL, generate_series, like bench/claim_latency.py) N images across S scopes with a
skewed size distribution — one scope holds half, nine share most of the rest geometrically, the
others hold 100–600 each — each image with a current text embedding (``--text-dims``) and a
current visual embedding (``--visual-dims``). Vectors are clustered random unit vectors:
normalize(centroid + three noise vectors), the centroid one of 1,000 and each noise vector one of
4,096 of its pool, so no two rows are alike but neighbours are meaningful. Each image's lexical
terms are 6 words of a 2,000-word vocabulary. Then the per-model HNSW indexes are built (timed).

For the measured scopes (the largest, two medium, three small) it runs, through the real search
functions (``app.search.service.search_text`` — hybrid and semantic — and
``app.api.search_queries.search_visual``, the ones the API calls; the query vector is given, so
no model runs), queries drawn like the data, and reports p50/p99 latency and recall@10 against
an exact scan (the scope's rows ranked by SQL without an index; for hybrid: the same fusion over
exact semantic candidates). Recall@10 of semantic and visual search is also checked on a few
queries for every scope.

    python bench/search_scale.py [--images 1000000] [--scopes 100] [--queries 100] [--keep DIR]

``--keep DIR`` keeps the embedded PostgreSQL under DIR and reuses a loaded database on the next
run (loading 1M rows and building the indexes takes most of the time).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# MEMEFLOW_BENCH_CODE=<tree>: measure another tree's search code (e.g. main before issue 18) on the same data
sys.path.insert(0, os.environ.get("MEMEFLOW_BENCH_CODE") or str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import psycopg2  # noqa: E402
from sqlalchemy import text  # noqa: E402

from app.api import search_queries as VQ  # noqa: E402
from app.db.engine import ensure_vector_index, make_engine, upgrade_to_head, vector_index_name  # noqa: E402
from app.embedded import EmbeddedServices  # noqa: E402
from app.orchestrator.scope_indexes import ensure_scope_vector_indexes  # noqa: E402
from app.search import queries as Q  # noqa: E402
from app.search import service  # noqa: E402
from app.search.queries import vector_literal  # noqa: E402

EXACT_MAX = getattr(Q, "EXACT_SCAN_MAX_IMAGES", -1)  # -1: a tree without the exact path
EF_SEARCH = getattr(Q, "HNSW_EF_SEARCH", 40)

TEXT_MODEL, VISUAL_MODEL, PREPROCESS = "bench-text", "bench-visual", "p1"
CENTROIDS, POOL, VOCAB = 1000, 4096, 2000
NOISE = 0.45  # norm of each of the three noise vectors (the centroid's is 1)


def scope_sizes(total: int, scopes: int, seed: int = 3) -> list[int]:
    """One scope with half the images, nine sharing most of the rest (ratio 0.6 each), the others
    100–600 each."""
    if scopes == 1:
        return [total]
    rng = random.Random(seed)
    small = [rng.randint(100, 600) for _ in range(max(0, scopes - 10))]
    rest = total - total // 2 - sum(small)
    weights = [0.6 ** i for i in range(min(9, scopes - 1))]
    medium = [int(rest * w / sum(weights)) for w in weights]
    sizes = [total // 2] + medium + small
    sizes[1] += total - sum(sizes)
    return sizes


def unit(rng: np.random.Generator, n: int, dims: int, norm: float = 1.0) -> np.ndarray:
    v = rng.normal(size=(n, dims))
    return v / np.linalg.norm(v, axis=1, keepdims=True) * norm


def _copy(cur: Any, table: str, rows: np.ndarray) -> None:
    import io

    buf = io.StringIO("".join(f"{i}\t{vector_literal(r)}\n" for i, r in enumerate(rows)))
    cur.copy_expert(f"COPY {table} (k, v) FROM STDIN", buf)


def load(raw_url: str, sizes: list[int], text_dims: int, visual_dims: int, seed: int = 11) -> dict[str, float]:
    """Fill the database; returns the seconds each phase took."""
    rng = np.random.default_rng(seed)
    timings: dict[str, float] = {}
    conn = psycopg2.connect(raw_url)
    conn.autocommit = True
    cur = conn.cursor()
    t0 = time.perf_counter()
    cur.execute("SET session_replication_role = replica")  # bulk load: no FK checks, no usage trigger
    for name, dims in (("t", text_dims), ("v", visual_dims)):
        for pool, n, norm in (("c", CENTROIDS, 1.0), ("n1", POOL, NOISE), ("n2", POOL, NOISE), ("n3", POOL, NOISE)):
            table = f"bench_{name}{pool}"
            cur.execute(f"CREATE UNLOGGED TABLE {table} (k int PRIMARY KEY, v vector({dims}))")
            _copy(cur, table, unit(rng, n, dims, norm))
    cur.execute("CREATE UNLOGGED TABLE bench_scopes (n int PRIMARY KEY, id text, lo bigint, hi bigint)")
    lo = 0
    for n, size in enumerate(sizes):
        cur.execute("INSERT INTO bench_scopes VALUES (%s, %s, %s, %s)", (n, f"s{n:03d}", lo, lo + size))
        lo += size
    cur.execute("INSERT INTO scopes (id, storage_namespace) SELECT id, gen_random_uuid() FROM bench_scopes")
    h = "abs(hashint8(g * 8 + {0})::bigint)"  # a stable pseudo-random number per (row, purpose)
    words = " || ' ' || ".join(f"'w' || {h.format(j)} % {VOCAB}" for j in range(6))
    cur.execute(
        "INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height, storage_key,"
        " display_name, context, context_status, metadata_hash, search_tsv)"
        " SELECT md5('img' || g)::uuid, s.id, md5(g::text) || md5((g + 1)::text), '.png', 'image/png', 1, 1, 1, 'k',"
        " 'meme-' || g || '.png', '{}', 'ready', 'h', to_tsvector('simple', " + words + ")"
        f" FROM generate_series(0, {sum(sizes) - 1}) g JOIN bench_scopes s ON g >= s.lo AND g < s.hi"
    )
    timings["images"] = time.perf_counter() - t0
    for kind, table, extra_cols, extra_vals in (
        ("t", "text_embeddings", "metadata_hash, model, dims, document_version, document, status",
         f"'h', '{TEXT_MODEL}', {text_dims}, '2', '', 'ready'"),
        ("v", "visual_embeddings", "model, preprocess_version, dims", f"'{VISUAL_MODEL}', '{PREPROCESS}', {visual_dims}"),
    ):
        t = time.perf_counter()
        off = 4 if kind == "t" else 5
        cur.execute(
            f"INSERT INTO {table} (scope_id, image_id, image_sha256, {extra_cols}, embedding)"
            f" SELECT s.id, md5('img' || g)::uuid, md5(g::text) || md5((g + 1)::text), {extra_vals},"
            f" l2_normalize(c.v + a.v + b.v + d.v)"
            f" FROM generate_series(0, {sum(sizes) - 1}) g JOIN bench_scopes s ON g >= s.lo AND g < s.hi"
            f" JOIN bench_{kind}c c ON c.k = {h.format(off)} % {CENTROIDS}"
            f" JOIN bench_{kind}n1 a ON a.k = {h.format(off + 1)} % {POOL}"
            f" JOIN bench_{kind}n2 b ON b.k = {h.format(off + 2)} % {POOL}"
            f" JOIN bench_{kind}n3 d ON d.k = {h.format(off + 3)} % {POOL}"
        )
        timings[table] = time.perf_counter() - t
    cur.execute("INSERT INTO scope_usage (scope_id, image_count, stored_bytes)"
                " SELECT scope_id, count(*), sum(size_bytes) FROM images GROUP BY scope_id"
                " ON CONFLICT (scope_id) DO UPDATE SET image_count = EXCLUDED.image_count")
    cur.execute("RESET session_replication_role")
    cur.execute("VACUUM ANALYZE images")
    cur.execute("VACUUM ANALYZE text_embeddings")
    cur.execute("VACUUM ANALYZE visual_embeddings")
    conn.close()
    return timings


def build_indexes(url: str, text_dims: int, visual_dims: int, mem: str) -> dict[str, float]:
    engine = make_engine(url)
    timings = {}
    for table, model, dims in (("text_embeddings", TEXT_MODEL, text_dims), ("visual_embeddings", VISUAL_MODEL,
                                                                          visual_dims)):
        t = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(text(f"SET LOCAL maintenance_work_mem = '{mem}'"))
            conn.execute(text("SET LOCAL max_parallel_maintenance_workers = 2"))
            conn.execute(text("SET LOCAL statement_timeout = 0"))
            ensure_vector_index(conn, table, model, dims)
        timings[f"hnsw {table}"] = time.perf_counter() - t
        print(f"  {vector_index_name(table, model, dims)} built in {timings[f'hnsw {table}']:.0f}s", flush=True)
    engine.dispose()
    return timings


class GivenVector:
    """A text provider whose query vector is set by the benchmark (no model runs)."""

    def __init__(self, dims: int):
        self.dims, self.vector = dims, [0.0] * dims

    def config(self) -> dict[str, Any]:
        return {"model": TEXT_MODEL, "dims": self.dims}

    def embed_query(self, texts: list[str]) -> list[list[float]]:
        return [self.vector for _ in texts]


def query_vectors(raw_url: str, kind: str, n: int, seed: int) -> list[list[float]]:
    """Vectors drawn like the data (a centroid plus fresh noise of the same size), normalized."""
    rng = np.random.default_rng(seed)
    conn = psycopg2.connect(raw_url)
    cur = conn.cursor()
    cur.execute(f"SELECT v::text FROM bench_{kind}c ORDER BY k")
    cents = np.array([[float(x) for x in r[0].strip("[]").split(",")] for r in cur.fetchall()])
    conn.close()
    picks = cents[rng.integers(0, len(cents), n)]
    noise = sum(unit(rng, n, cents.shape[1], NOISE) for _ in range(3))
    v = picks + noise
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).tolist()


def exact_ids(engine, table: str, scope: str, vec: list[float], dims: int, k: int = 10) -> list[str]:
    """The scope's ``k`` nearest current rows, ranked by SQL without any index (the reference)."""
    join = ("i.metadata_hash = e.metadata_hash AND e.model = :m" if table == "text_embeddings"
            else "e.model = :m AND e.preprocess_version = :p")
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL enable_indexscan = off"))
        conn.execute(text("SET LOCAL enable_bitmapscan = on"))
        rows = conn.execute(text(
            f"WITH d AS MATERIALIZED (SELECT e.image_id, e.embedding::vector({dims}) <=> CAST(:q AS vector({dims}))"
            f" AS dist FROM {table} e JOIN images i ON i.scope_id = e.scope_id AND i.id = e.image_id"
            f" AND i.sha256 = e.image_sha256 AND {join} WHERE e.scope_id = :s)"
            " SELECT image_id FROM d ORDER BY dist, image_id LIMIT :k"),
            {"q": vector_literal(vec), "s": scope, "m": TEXT_MODEL if table == "text_embeddings" else VISUAL_MODEL,
             "p": PREPROCESS, "k": k}).scalars()
    return [str(r) for r in rows]


@contextlib.contextmanager
def exact_everywhere():
    saved = Q.EXACT_SCAN_MAX_IMAGES
    Q.EXACT_SCAN_MAX_IMAGES = 1 << 62
    try:
        yield
    finally:
        Q.EXACT_SCAN_MAX_IMAGES = saved


def recall(got: list[str], want: list[str]) -> float:
    return len(set(got) & set(want)) / max(1, len(want))


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def part_query(vectors: list[list[float]], keep: int) -> list[list[float]]:
    """Each vector with all but its first ``keep`` dims zeroed, renormalized: a query that weighs one
    part of a concatenated vector only (a CJK query: e5 alone, app/stages/text/composite.py)."""
    v = np.asarray(vectors)
    v[:, keep:] = 0.0
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).tolist()


QUERY_KEEP_DIMS = 0  # --query-keep-dims: 0 = whole vectors


def measure(engine, raw_url: str, scope: str, n_queries: int, text_dims: int, visual_dims: int,
            timed: bool, seed: int, recall_queries: int = 20) -> dict[str, Any]:
    """Recall@10 (and, ``timed``, latency) of hybrid, semantic and visual search in one scope."""
    provider = GivenVector(text_dims)
    tq = query_vectors(raw_url, "t", n_queries, seed)
    if QUERY_KEEP_DIMS:
        tq = part_query(tq, QUERY_KEEP_DIMS)
    vq = query_vectors(raw_url, "v", n_queries, seed + 1)
    rng = random.Random(seed)
    words = [" ".join(f"w{rng.randrange(VOCAB)}" for _ in range(2)) for _ in range(n_queries)]
    out: dict[str, Any] = {m: {"ms": [], "recall": []} for m in ("hybrid", "semantic", "visual")}

    def text_ids(mode: str, i: int) -> tuple[list[str], float]:
        provider.vector = tq[i]
        t = time.perf_counter()
        r = service.search_text(engine, provider, scope, words[i], limit=10, mode=mode)
        return [str(h["image"]["id"]) for h in r["items"]], (time.perf_counter() - t) * 1000

    def visual_ids(i: int) -> tuple[list[str], float]:
        t = time.perf_counter()
        items = VQ.search_visual(engine, scope, model=VISUAL_MODEL, preprocess_version=PREPROCESS, dims=visual_dims,
                                 vector=vq[i], limit=10)
        VQ.visual_coverage(engine, scope, model=VISUAL_MODEL, preprocess_version=PREPROCESS)  # as the API does
        return [str(h["image"]["id"]) for h in items], (time.perf_counter() - t) * 1000

    for i in range(min(5, n_queries) if timed else 0):  # warm-up
        text_ids("hybrid", i)
        visual_ids(i)
    got: dict[str, list[list[str]]] = {m: [] for m in out}
    for i in range(n_queries):  # timed first, interleaved; the exact references after (they read the scope)
        for mode in ("hybrid", "semantic"):
            ids, ms = text_ids(mode, i)
            out[mode]["ms"].append(ms)
            got[mode].append(ids)
        ids, ms = visual_ids(i)
        out["visual"]["ms"].append(ms)
        got["visual"].append(ids)
    for i in range(min(n_queries, recall_queries)):
        out["semantic"]["recall"].append(recall(got["semantic"][i],
                                                exact_ids(engine, "text_embeddings", scope, tq[i], text_dims)))
        if hasattr(Q, "exact_scan"):  # a tree without the exact path has no exact hybrid reference
            with exact_everywhere():
                out["hybrid"]["recall"].append(recall(got["hybrid"][i], text_ids("hybrid", i)[0]))
        out["visual"]["recall"].append(recall(got["visual"][i],
                                              exact_ids(engine, "visual_embeddings", scope, vq[i], visual_dims)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=1_000_000)
    ap.add_argument("--scopes", type=int, default=100)
    ap.add_argument("--text-dims", type=int, default=384)
    ap.add_argument("--visual-dims", type=int, default=254)
    ap.add_argument("--queries", type=int, default=100, help="timed queries per measured scope")
    ap.add_argument("--recall-queries", type=int, default=5, help="recall queries per other scope")
    ap.add_argument("--maintenance-work-mem", default="3GB")
    ap.add_argument("--keep", type=Path, help="keep (and reuse) the embedded PostgreSQL under this directory")
    ap.add_argument("--load-only", action="store_true")
    ap.add_argument("--exact-max", type=int, default=EXACT_MAX,
                    help="override EXACT_SCAN_MAX_IMAGES (-1: never exact, the code before issue 18)")
    ap.add_argument("--ef-search", type=int, default=EF_SEARCH, help="override HNSW_EF_SEARCH")
    ap.add_argument("--only-measured", action="store_true", help="skip the recall check of every other scope")
    ap.add_argument("--query-keep-dims", type=int, default=0,
                    help="text queries keep only their first N dims (e.g. 384 of 768: one model of a concatenated vector)")
    ap.add_argument("--no-scope-indexes", action="store_true",
                    help="don't build the per-scope HNSW indexes of scopes above the exact-scan size (and drop none)")
    ap.add_argument("--measure", help="comma-separated scope ids to time (default: the largest, two medium, three small)")
    args = ap.parse_args()
    Q.EXACT_SCAN_MAX_IMAGES, Q.HNSW_EF_SEARCH = args.exact_max, args.ef_search
    global QUERY_KEEP_DIMS
    QUERY_KEEP_DIMS = args.query_keep_dims
    root = args.keep or Path(tempfile.mkdtemp(prefix="memeflow-search-scale-", dir="/tmp"))
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    svc = EmbeddedServices(root / "var")
    svc.start()
    name = f"scale_{args.images}_{args.scopes}_{args.text_dims}_{args.visual_dims}"
    sizes = scope_sizes(args.images, args.scopes)
    try:
        admin = psycopg2.connect(svc.postgres_url("postgres").replace("+psycopg2", ""))
        admin.autocommit = True
        acur = admin.cursor()
        acur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
        exists = acur.fetchone() is not None
        url = svc.postgres_url(name)
        raw = url.replace("+psycopg2", "")
        engine = None
        if exists:
            engine = make_engine(url)
            with engine.connect() as conn:
                exists = conn.execute(text("SELECT to_regclass(:n) IS NOT NULL"),
                                      {"n": vector_index_name("visual_embeddings", VISUAL_MODEL, args.visual_dims)}
                                      ).scalar()
            engine.dispose()
        timings: dict[str, float] = {}
        if not exists:
            acur.execute(f"DROP DATABASE IF EXISTS {name}")
            acur.execute(f"CREATE DATABASE {name}")
            upgrade_to_head(url)
            print(f"loading {args.images:,} images in {len(sizes)} scopes (largest {sizes[:4]}, smallest "
                  f"{min(sizes)})", flush=True)
            timings.update(load(raw, sizes, args.text_dims, args.visual_dims))
            print("  " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()), flush=True)
            timings.update(build_indexes(url, args.text_dims, args.visual_dims, args.maintenance_work_mem))
        else:
            print(f"reusing loaded database {name}", flush=True)
        admin.close()
        engine = make_engine(url)
        if not args.no_scope_indexes and hasattr(Q, "EXACT_SCAN_MAX_IMAGES") and args.exact_max >= 0:
            for table, model, dims in (("text_embeddings", TEXT_MODEL, args.text_dims),
                                       ("visual_embeddings", VISUAL_MODEL, args.visual_dims)):
                t = time.perf_counter()
                built = ensure_scope_vector_indexes(engine, table, model, dims, min_images=args.exact_max,
                                                    maintenance_work_mem="1GB")
                if built:
                    timings[f"scope indexes {table}"] = time.perf_counter() - t
                    print(f"  {len(built)} per-scope {table} indexes built in {timings[f'scope indexes {table}']:.0f}s",
                          flush=True)
        if args.load_only:
            return
        order = sorted(range(len(sizes)), key=lambda n: -sizes[n])
        small = [n for n in order if sizes[n] <= 600]
        measured = list(dict.fromkeys([order[0], order[min(3, len(order) - 1)], order[min(6, len(order) - 1)]]
                                      + ([small[0], small[len(small) // 2], small[-1]] if small else [])))
        if args.measure:
            measured = [int(s.strip().lstrip("s")) for s in args.measure.split(",")]
        rows = []
        for n in measured:
            m = measure(engine, raw, f"s{n:03d}", args.queries, args.text_dims, args.visual_dims, True, 100 + n)
            rows.append((n, m))
            print(f"  scope s{n:03d} ({sizes[n]:,}) measured", flush=True)
        worst: dict[str, tuple[float, str]] = {"semantic": (1.0, ""), "visual": (1.0, "")}
        for n in range(len(sizes)):
            if n in measured or args.only_measured:
                continue
            m = measure(engine, raw, f"s{n:03d}", args.recall_queries, args.text_dims, args.visual_dims, False, 500 + n)
            for mode in worst:
                r = float(np.mean(m[mode]["recall"]))
                if r < worst[mode][0]:
                    worst[mode] = (r, f"s{n:03d} ({sizes[n]:,})")
        with engine.connect() as conn:
            usage = conn.execute(text("SELECT pg_size_pretty(pg_relation_size(:t)), pg_size_pretty(pg_relation_size(:v))"),
                                 {"t": vector_index_name("text_embeddings", TEXT_MODEL, args.text_dims),
                                  "v": vector_index_name("visual_embeddings", VISUAL_MODEL, args.visual_dims)}).one()
        engine.dispose()
        print(f"\n{platform.node()} · {os.cpu_count()} CPUs · {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
        print(f"command: python bench/search_scale.py --images {args.images} --scopes {args.scopes} --text-dims "
              f"{args.text_dims} --visual-dims {args.visual_dims} --queries {args.queries} --exact-max {args.exact_max}"
              f" --ef-search {args.ef_search}")
        if timings:
            print("load: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()))
        print(f"HNSW index sizes: text {usage[0]}, visual {usage[1]}; exact scan up to "
              f"{Q.EXACT_SCAN_MAX_IMAGES:,} images, hnsw.ef_search {Q.HNSW_EF_SEARCH}\n")
        print("| scope (images) | path | hybrid p50 / p99 ms | hybrid r@10 | semantic p50 / p99 ms | semantic r@10 |"
              " visual p50 / p99 ms | visual r@10 |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for n, m in rows:
            path = "exact" if sizes[n] <= args.exact_max else "planner" if args.exact_max < 0 else "hnsw"
            cells = [f"{pct(m[k]['ms'], .5):.1f} / {pct(m[k]['ms'], .99):.1f} | "
                     + (f"{np.mean(m[k]['recall']):.3f}" if m[k]["recall"] else "n/a")
                     for k in ("hybrid", "semantic", "visual")]
            print(f"| s{n:03d} ({sizes[n]:,}) | {path} | " + " | ".join(cells) + " |")
        print(f"\nevery other scope ({args.recall_queries} queries each): lowest semantic r@10 "
              f"{worst['semantic'][0]:.3f} {worst['semantic'][1]}, lowest visual r@10 {worst['visual'][0]:.3f} "
              f"{worst['visual'][1]}")
    finally:
        if not args.keep:
            svc.stop()
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
