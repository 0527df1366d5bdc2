#!/usr/bin/env python3
"""Search quality: the benchmark memes through the real pipeline, measured through the served API.

Writes the memes of :mod:`bench.search_data`, starts the embedded stack (fresh PostgreSQL and
Redis under a temporary ``MEMEFLOW_VAR_DIR``, the API, one worker per lane, maintenance, beat)
with the default providers (or whatever ``MEMEFLOW_*_PROVIDER`` says), uploads the memes through
``POST /api/v1/images``, waits until every job is terminal, then prints r@1, r@5 and MRR per
language × query type for:

- ``served``: ``GET /api/v1/search/text?q=…&limit=10`` as it is served (today: vector-only);
- ``served mode=lexical|semantic`` (and ``mode=semantic&model=…`` per listed model) when the
  API answers with ``mode``/``models`` (skipped on an API that does not know them);
- each text model alone, bench-side: the pipeline's stored semantic documents (and the bare OCR
  text) embedded by the provider, ranked by cosine (``embed_query`` for queries if it exists);
- ``bm25 ocr``: BM25 (rank-bm25) over each image's stored ``context.ocr_text`` (lower-cased Latin
  words + Chinese character bigrams);

plus look-alike twins (r@1 of ``POST /search/visual`` with the twin's bytes), OCR word accuracy
against the known captions (with the worst outputs) and ``/search/text`` latency per mode.

    python bench/search_quality.py [--subset] [--keep-var] [--json out.json] [--timeout 1800] [--scale N]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.search_data import Meme, memes, write_dataset  # noqa: E402

LANGS = ("en", "zh")
QUERY_TYPES = ("exact", "paraphrase")
TERMINAL = ("succeeded", "failed", "blocked", "unknown_execution", "target_changed", "superseded", "cancelled")
LIMIT = 10

Search = Callable[[str], list[str]]  # query -> ranked image ids


# ---------------------------------------------------------------------------- metrics
def rank_of(target: str, ranked: Sequence[str]) -> int | None:
    """1-based rank of ``target`` in ``ranked`` (None when absent)."""
    for i, image_id in enumerate(ranked, start=1):
        if image_id == target:
            return i
    return None


def summarize(ranks: Sequence[int | None]) -> dict[str, float]:
    """r@1, r@5 and MRR (over the top ``LIMIT``) of a list of ranks."""
    n = len(ranks)
    if n == 0:
        return {"n": 0, "r1": float("nan"), "r5": float("nan"), "mrr": float("nan")}
    return {
        "n": n,
        "r1": sum(1 for r in ranks if r == 1) / n,
        "r5": sum(1 for r in ranks if r is not None and r <= 5) / n,
        "mrr": sum(1.0 / r for r in ranks if r is not None) / n,
    }


@dataclass
class Evaluation:
    """Per (lang, query type): the rank of the right meme for every query; misses for a report."""

    ranks: dict[tuple[str, str], list[int | None]] = field(default_factory=dict)
    misses: list[tuple[str, str, str, int | None]] = field(default_factory=list)  # meme id, qtype, query, rank

    def table(self) -> dict[str, dict[str, float]]:
        return {f"{lang}/{qt}": summarize(self.ranks.get((lang, qt), [])) for lang in LANGS for qt in QUERY_TYPES}


def gate_failures(table: dict[str, dict[str, float]], thresholds: dict[str, float]) -> list[str]:
    """The cells of ``table`` whose r@1 is below its threshold (``"en/exact": 0.9`` …), as messages."""
    return [f"{cell}: r@1 {table[cell]['r1']:.2f} < {minimum:.2f} (n={table[cell]['n']})"
            for cell, minimum in thresholds.items() if not table[cell]["r1"] >= minimum]


def evaluate(search: Search, chosen: Iterable[Meme], image_ids: dict[str, str]) -> Evaluation:
    """Run both queries of every meme through ``search``; the right answer is the meme's image."""
    ev = Evaluation()
    for meme in chosen:
        for qt in QUERY_TYPES:
            query = getattr(meme, qt)
            r = rank_of(image_ids[meme.id], search(query))
            ev.ranks.setdefault((meme.lang, qt), []).append(r)
            if r != 1:
                ev.misses.append((meme.id, qt, query, r))
    return ev


# ---------------------------------------------------------------------------- bench-side rankers
_LATIN = re.compile(r"[a-z0-9]+")
_CJK_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")


def tokenize(text: str) -> list[str]:
    """Lower-cased Latin/digit words plus Chinese character bigrams (a lone character as itself)."""
    text = text.lower()
    tokens = _LATIN.findall(text)
    for run in _CJK_RUN.findall(text):
        tokens.extend([run] if len(run) == 1 else [run[i:i + 2] for i in range(len(run) - 1)])
    return tokens


def bm25_search(docs: dict[str, str]) -> Search:
    """BM25 (Okapi, rank-bm25 defaults) over ``docs`` (image id -> text)."""
    from rank_bm25 import BM25Okapi

    ids = list(docs)
    index = BM25Okapi([tokenize(docs[i]) or ["\x00"] for i in ids])

    def search(query: str) -> list[str]:
        scores = index.get_scores(tokenize(query))
        order = sorted(range(len(ids)), key=lambda k: (-scores[k], k))
        return [ids[k] for k in order[:LIMIT] if scores[k] > 0]

    return search


def cosine_search(provider: Any, docs: dict[str, str], queries: Sequence[str] = ()) -> Search:
    """Cosine ranking of ``docs`` embedded by ``provider`` (``embed_query`` for queries if it has one);
    ``queries`` known in advance are embedded in one batch."""
    import numpy as np

    def unit(rows: Any) -> Any:
        m = np.asarray(rows, dtype=np.float32).reshape(len(rows), -1)
        return m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)

    ids = list(docs)
    matrix = unit(provider.embed([docs[i] for i in ids]))
    embed_query = getattr(provider, "embed_query", None) or provider.embed
    distinct = list(dict.fromkeys(queries))
    cache = dict(zip(distinct, unit(embed_query(distinct)), strict=True)) if distinct else {}

    def search(query: str) -> list[str]:
        vec = cache[query] if query in cache else unit(embed_query([query]))[0]
        scores = matrix @ vec
        return [ids[k] for k in np.argsort(-scores, kind="stable")[:LIMIT]]

    return search


def text_providers(extra: Sequence[str] = ()) -> dict[str, Any]:
    """The text providers available here (MiniLM always; multilingual-e5-small when registered;
    any ``extra`` registry names, e.g. ``package.module:Class``)."""
    from app.stages.registry import get_text_provider

    out: dict[str, Any] = {}
    for name in dict.fromkeys(("all-MiniLM-L6-v2", "multilingual-e5-small", *extra)):
        try:
            out[name] = get_text_provider(name)
        except (ValueError, ImportError) as exc:
            print(f"  (text provider {name} not available: {exc})", file=sys.stderr)
    return out


# ---------------------------------------------------------------------------- OCR accuracy
def _edit_distance(a: Sequence[str], b: Sequence[str]) -> int:
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        cur = [i] + [0] * len(b)
        for j, y in enumerate(b, start=1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y))
        prev = cur
    return prev[-1]


def ocr_units(text: str, lang: str) -> list[str]:
    """What OCR accuracy counts: Latin words (lower-cased) for en; non-space characters for zh."""
    text = text.lower()
    if lang == "en":
        return re.findall(r"[a-z0-9]+(?:'[a-z]+)?", text)
    return [c for c in text if not c.isspace() and c.isalnum()]


def ocr_accuracy(caption: str, ocr_text: str, lang: str) -> float:
    """1 - (word or character) error rate of ``ocr_text`` against ``caption``, floored at 0."""
    ref, hyp = ocr_units(caption, lang), ocr_units(ocr_text or "", lang)
    if not ref:
        return 1.0
    return max(0.0, 1.0 - _edit_distance(ref, hyp) / len(ref))


# ---------------------------------------------------------------------------- served API
class Api:
    """The served REST API (requests), timing every text search."""

    def __init__(self, base_url: str) -> None:
        import requests

        self.base = base_url.rstrip("/")
        self.session = requests.Session()
        self.latency: dict[str, list[float]] = {}

    def text(self, q: str, **params: Any) -> tuple[int, dict]:
        label = ",".join(f"{k}={v}" for k, v in sorted(params.items())) or "default"
        t0 = time.perf_counter()
        resp = self.session.get(f"{self.base}/api/v1/search/text", params={"q": q, "limit": LIMIT, **params},
                                timeout=120)
        self.latency.setdefault(label, []).append(time.perf_counter() - t0)
        try:
            return resp.status_code, resp.json()
        except ValueError:
            return resp.status_code, {"error": "bad_response", "message": resp.text[:200]}

    def text_search(self, **params: Any) -> Search:
        def search(q: str) -> list[str]:
            status, body = self.text(q, **params)
            if status != 200:
                raise RuntimeError(f"/search/text {params} q={q!r}: {status} {body}")
            return [hit["image"]["id"] for hit in body.get("items", [])]

        return search

    def visual_by_file(self, name: str, data: bytes, label: str = "visual") -> list[str]:
        return [hit["image"]["id"] for hit in self.visual_hits(name, data, label)]

    def visual_hits(self, name: str, data: bytes, label: str = "visual") -> list[dict]:
        t0 = time.perf_counter()
        resp = self.session.post(f"{self.base}/api/v1/search/visual", files={"file": (name, data)},
                                 data={"limit": str(LIMIT)}, timeout=120)
        self.latency.setdefault(label, []).append(time.perf_counter() - t0)
        resp.raise_for_status()
        return list(resp.json().get("items", []))


def served_modes(api: Api, probe: str) -> tuple[list[dict[str, str]], dict]:
    """The parameter sets to measure: always the default; ``mode=…`` (and ``model=…``) only when the
    API answers with ``mode``/``models`` (an API that ignores or rejects them is not asked)."""
    status, body = api.text(probe)
    variants: list[dict[str, str]] = [{}]
    if status != 200:
        raise RuntimeError(f"/search/text answers {status}: {body}")
    if "mode" not in body and "models" not in body:
        return variants, body
    for mode in ("lexical", "semantic"):
        st, b = api.text(probe, mode=mode)
        if st == 200 and b.get("mode", mode) == mode:
            variants.append({"mode": mode})
    for entry in body.get("models") or []:
        name = entry if isinstance(entry, str) else entry.get("name") or entry.get("model")
        if not name:
            continue
        st, b = api.text(probe, mode="semantic", model=name)
        if st == 200:
            variants.append({"mode": "semantic", "model": str(name)})
    return variants, body


# ---------------------------------------------------------------------------- the stack
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_stack(var_dir: Path, echo: Callable[[str], None]):
    """The embedded stack (API, lane workers, maintenance, beat; no Flower) under ``var_dir``."""
    from app.cli.stack import Stack
    from app.config import Settings

    settings = Settings.from_env(database_url=None, broker_url=None, var_dir=var_dir, api_port=_free_port(),
                                 log_level="WARNING")
    stack = Stack(settings, components=("api", "visual", "agent", "embedding", "maintenance", "beat"),
                  start_timeout_s=300.0, echo=lambda msg, **_: echo(str(msg)))
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


def wait_terminal(engine, image_ids: list[str], timeout_s: float, echo: Callable[[str], None]) -> dict[str, int]:
    """Poll until every image's latest job is terminal; returns latest jobs by status."""
    from app.cli.demo import stage_progress

    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        per_stage, jobs = stage_progress(engine, image_ids)
        done = sum(n for st, n in jobs.items() if st in TERMINAL)
        line = " ".join(f"{s}={d}/{t}" for s, (d, t) in sorted(per_stage.items()))
        if line != last:
            echo(f"  {line}  terminal={done}/{len(image_ids)}")
            last = line
        if done >= len(image_ids):
            return jobs
        if time.monotonic() > deadline:
            raise SystemExit(f"timeout: {done}/{len(image_ids)} jobs terminal after {timeout_s:.0f}s: {jobs}")
        time.sleep(1.0)


def stored_contexts(engine, image_ids: list[str]) -> dict[str, dict[str, Any]]:
    """image id -> the context's text fields (title, description, ocr_text, tags) from the database."""
    from sqlalchemy import text

    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id::text, context FROM images WHERE id = ANY(CAST(:ids AS uuid[]))"),
                            {"ids": image_ids}).all()
    return {r[0]: {k: (r[1] or {}).get(k) for k in ("title", "description", "ocr_text", "tags")} for r in rows}


def stored_texts(engine, image_ids: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """(image id -> current semantic document, image id -> context.ocr_text) from the database."""
    from sqlalchemy import text

    with engine.connect() as conn:
        docs = conn.execute(text("""
            SELECT DISTINCT ON (i.id) i.id::text, t.document
              FROM images i JOIN text_embeddings t
                ON t.scope_id = i.scope_id AND t.image_id = i.id AND t.image_sha256 = i.sha256
               AND t.metadata_hash = i.metadata_hash AND t.status = 'ready'
             WHERE i.id = ANY(CAST(:ids AS uuid[])) ORDER BY i.id, t.id DESC"""), {"ids": image_ids}).all()
        ocr = conn.execute(text(
            "SELECT id::text, coalesce(context->>'ocr_text', '') FROM images WHERE id = ANY(CAST(:ids AS uuid[]))"),
            {"ids": image_ids}).all()
    return {r[0]: r[1] for r in docs}, {r[0]: r[1] for r in ocr}


# ---------------------------------------------------------------------------- --scale
_SCALE_WORDS = ("when", "me", "monday", "cat", "dog", "code", "work", "boss", "pizza", "coffee", "weekend",
                "friday", "bug", "deploy", "school", "money", "the", "my", "again", "today")
_SCALE_ZH = ("我", "今天", "上班", "老板", "猫", "狗", "加班", "周末", "红包", "奶茶", "考试", "工资")


def insert_synthetic(engine, n: int, seed: int = 7) -> int:
    """Bulk-insert ``n`` synthetic images into the scope with ready contexts (OCR text drawn from
    common meme words, so lexical matching has work to do) and, for every text model the scope
    already has, a current text embedding with a random unit vector. Returns rows inserted.

    The lexical terms (``images.search_tsv``) are written as the store writes them when this
    code base has them (``app.search.lexical.image_terms``).
    """
    import random

    from sqlalchemy import text

    rng = random.Random(seed)
    texts = []
    for i in range(n):
        if i % 3 == 2:
            texts.append("".join(rng.choice(_SCALE_ZH) for _ in range(rng.randint(3, 8))))
        else:
            texts.append(" ".join(rng.choice(_SCALE_WORDS) for _ in range(rng.randint(3, 9))))
    try:
        from app.search.lexical import image_terms
    except ImportError:  # a code base without the lexical index
        image_terms = None
    terms = [image_terms(f"synthetic-{i + 1}.png", {"ocr_text": t}) if image_terms else "" for i, t in enumerate(texts)]
    tsv_col, tsv_val = (", search_tsv", ", to_tsvector('simple', t.terms)") if image_terms else ("", "")
    with engine.begin() as conn:
        scope_id = conn.execute(text("SELECT scope_id FROM images LIMIT 1")).scalar_one()
        models = conn.execute(text(
            "SELECT DISTINCT model, dims, document_version FROM text_embeddings WHERE scope_id = :s"),
            {"s": scope_id}).all()
        conn.execute(text(f"""
            INSERT INTO images (id, scope_id, sha256, extension, media_type, size_bytes, width, height,
                                storage_key, display_name, context, context_status, metadata_hash{tsv_col})
            SELECT gen_random_uuid(), :s, md5('syn-a' || t.i) || md5('syn-b' || t.i), '.png', 'image/png', 1000,
                   480, 360, 'synthetic/' || t.i || '.png', 'synthetic-' || t.i || '.png',
                   jsonb_build_object('ocr_text', t.txt), 'ready', md5('syn-m' || t.i) || md5('x' || t.i){tsv_val}
              FROM unnest(CAST(:texts AS text[]), CAST(:terms AS text[])) WITH ORDINALITY AS t(txt, terms, i)"""),
            {"s": scope_id, "texts": texts, "terms": terms})
        for model, dims, version in models:
            conn.execute(text(f"""
                INSERT INTO text_embeddings (scope_id, image_id, image_sha256, metadata_hash, model, dims,
                                             document_version, document, embedding, status)
                SELECT i.scope_id, i.id, i.sha256, i.metadata_hash, :m, :d, :v, i.context->>'ocr_text',
                       (SELECT CAST(array_agg(random() - 0.5) AS vector({int(dims)}))
                          FROM generate_series(1, :d) WHERE i.id IS NOT NULL), 'ready'
                  FROM images i WHERE i.scope_id = :s AND i.storage_key LIKE 'synthetic/%'"""),
                {"s": scope_id, "m": model, "d": int(dims), "v": version})
        conn.execute(text("ANALYZE images; ANALYZE text_embeddings"))
    return n


def scale_latency(api: Api, engine, chosen: list[Meme], variants: list[dict[str, str]], n: int) -> dict:
    """p50/p99 of /search/text per variant over every query, after ``n`` synthetic images."""
    t0 = time.monotonic()
    insert_synthetic(engine, n)
    print(f"\ninserted {n} synthetic images with text rows in {time.monotonic() - t0:.0f}s")
    api.latency.clear()
    for params in variants:
        for _ in range(4):
            api.text("warm up", **params)
    api.latency.clear()
    queries = [getattr(m, qt) for m in chosen for qt in QUERY_TYPES]
    for params in variants:
        for q in queries:
            api.text(q, **params)
    out = {label: {"n": len(v), "p50": pct(v, 0.5) * 1000, "p99": pct(v, 0.99) * 1000}
           for label, v in api.latency.items()}
    print(f"/search/text latency at {n} extra images: " + "; ".join(
        f"{k}: p50 {v['p50']:.0f} ms p99 {v['p99']:.0f} ms (n={v['n']})" for k, v in out.items()))
    return out


def scale_quality(api: Api, chosen: list[Meme], image_ids: dict[str, str], variants: list[dict[str, str]],
                  n: int) -> dict[str, Any]:
    """r@1/r@5/MRR of every served variant once the scope holds ``n`` more (synthetic) images.

    The synthetic images' vectors are random (cosine ≈ 0 to any query), their text common meme
    words: they rarely outrank a real meme semantically, so a cell that falls here mostly shows the
    approximate index (a scope above ``EXACT_SCAN_MAX_IMAGES`` is searched through HNSW — the
    concatenated vector's index, also for a query that weighs only some of its models), or a
    lexical distractor."""
    rows: dict[str, Any] = {}
    for params in variants:
        label = "served" + ("".join(f" {k}={v}" for k, v in params.items()) if params else " default")
        ev = evaluate(api.text_search(**params), chosen, image_ids)
        rows[label] = {"table": ev.table(), "misses": ev.misses}
    print(f"\n## text search after {n} extra images: r@1 | r@5 | MRR\n")
    print(format_table({k: v["table"] for k, v in rows.items()}))
    return rows


# ---------------------------------------------------------------------------- printing
def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def format_table(rows: dict[str, dict[str, dict[str, float]]]) -> str:
    """Markdown table: one row per method, r@1 / r@5 / MRR per lang × query type."""
    cols = [f"{lang}/{qt}" for lang in LANGS for qt in QUERY_TYPES]
    head = "| method | " + " | ".join(f"{c} r@1 | r@5 | MRR" for c in cols) + " |"
    sep = "|---|" + "---:|" * (3 * len(cols))
    lines = [head, sep]
    for method, table in rows.items():
        cells = []
        for c in cols:
            m = table.get(c, {})
            cells += [f"{m.get('r1', float('nan')):.2f}", f"{m.get('r5', float('nan')):.2f}",
                      f"{m.get('mrr', float('nan')):.2f}"]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine() -> dict[str, str]:
    cpu = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"nproc": str(os.cpu_count()), "cpu": cpu, "python": platform.python_version(),
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "command": " ".join(["python", _script_path(), *sys.argv[1:]])}


def _script_path() -> str:
    script = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else Path(__file__).resolve()
    with contextlib.suppress(ValueError):
        return str(script.relative_to(ROOT))
    return str(script)


# ---------------------------------------------------------------------------- main
def run(args: argparse.Namespace) -> dict[str, Any]:
    from app.cli.ingest import http_uploader, image_files, ingest_files
    from app.db.engine import make_engine

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    info = machine()
    print(f"machine: nproc={info['nproc']} cpu={info['cpu']}  date: {info['date']}")
    print(f"command: {info['command']}")
    chosen = memes(subset=args.subset)
    tmp = Path(tempfile.mkdtemp(prefix="memeflow-searchq-"))
    os.environ["MEMEFLOW_VAR_DIR"] = str(tmp / "var")  # nothing in this process resolves ./var
    result: dict[str, Any] = {"machine": info, "memes": len(chosen)}
    t_start = time.monotonic()
    try:
        written = write_dataset(tmp / "data", chosen)
        print(f"{len(written.images)} memes ({sum(m.lang == 'en' for m in chosen)} en, "
              f"{sum(m.lang == 'zh' for m in chosen)} zh), {len(written.twins)} twins in {tmp / 'data'}")
        with running_stack(tmp / "var", print) as stack:
            api_url = stack.urls()["api"]
            api = Api(api_url)
            t0 = time.monotonic()
            report = ingest_files(image_files(tmp / "data" / "images"), http_uploader(api_url))
            if report.failed:
                raise SystemExit(f"uploads failed: {report.failed}")
            by_name = report.image_ids
            image_ids = {m.id: by_name[m.filename] for m in chosen}
            engine = make_engine(stack.database_url)
            try:
                jobs = wait_terminal(engine, list(image_ids.values()), args.timeout, print)
                pipeline_s = time.monotonic() - t0
                print(f"pipeline: {len(image_ids)} images in {pipeline_s:.0f}s; latest jobs {jobs}")
                result.update(pipeline_s=pipeline_s, jobs=jobs)
                docs, ocr = stored_texts(engine, list(image_ids.values()))
                ctxs = stored_contexts(engine, list(image_ids.values()))
                result["contexts"] = {m.id: ctxs.get(image_ids[m.id], {}) for m in chosen}  # bench/document_gap.py
                result["documents"] = {m.id: docs.get(image_ids[m.id], "") for m in chosen}
                result.update(measure(api, chosen, image_ids, written.twins, docs, ocr, args.model))
                if args.scale:
                    variants, _ = served_modes(api, "monday")
                    result["scale_latency_ms"] = scale_latency(api, engine, chosen, variants, args.scale)
                    result["scale_quality"] = scale_quality(api, chosen, image_ids, variants, args.scale)
                    result["scale_n"] = args.scale
            finally:
                engine.dispose()
    finally:
        if args.keep_var:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    result["total_s"] = time.monotonic() - t_start
    print(f"total {result['total_s']:.0f}s")
    return result


def measure(api: Api, chosen: list[Meme], image_ids: dict[str, str], twins: dict[str, Path],
            docs: dict[str, str], ocr: dict[str, str], extra_models: Sequence[str] = ()) -> dict[str, Any]:
    """Every measurement once the pipeline is done; prints the tables, returns them."""
    out: dict[str, Any] = {}
    rows: dict[str, dict[str, dict[str, float]]] = {}
    misses: dict[str, list] = {}

    variants, probe = served_modes(api, "monday")
    out["served_response_keys"] = sorted(probe)
    for params in variants:  # warm every API worker (model loading) before anything is timed
        for _ in range(4):
            api.text("warm up", **params)
    api.latency.clear()
    for params in variants:
        label = "served" + ("".join(f" {k}={v}" for k, v in params.items()) if params else " default")
        ev = evaluate(api.text_search(**params), chosen, image_ids)
        rows[label], misses[label] = ev.table(), ev.misses

    all_ids = list(image_ids.values())
    doc_texts = {i: docs.get(i, "") for i in all_ids}
    ocr_texts = {i: ocr.get(i, "") for i in all_ids}
    for name, provider in text_providers(extra_models).items():
        for what, texts in (("stored doc", doc_texts), ("ocr text", ocr_texts)):
            label = f"{name} over {what} (bench-side)"
            queries = [getattr(m, qt) for m in chosen for qt in QUERY_TYPES]
            ev = evaluate(cosine_search(provider, texts, queries), chosen, image_ids)
            rows[label], misses[label] = ev.table(), ev.misses
    ev = evaluate(bm25_search(ocr_texts), chosen, image_ids)
    rows["bm25 over ocr text (bench-side)"], misses["bm25"] = ev.table(), ev.misses
    out["tables"] = rows
    print("\n## text search: r@1 | r@5 | MRR per language/query type\n")
    print(format_table(rows))

    twin_ranks = []
    margins: dict[str, list[float]] = {"score": [], "lookalike": []}
    for label in ("visual (first query of each twin)", "visual (repeated)"):
        twin_ranks, margins = [], {"score": [], "lookalike": []}
        for meme_id, path in sorted(twins.items()):
            hits = api.visual_hits(path.name, path.read_bytes(), label)
            target = image_ids[meme_id]
            twin_ranks.append(rank_of(target, [h["image"]["id"] for h in hits]))
            for key in margins:  # the original's lead over the best other image, per ordering key
                own = [h[key] for h in hits if h["image"]["id"] == target and key in h]
                others = [h[key] for h in hits if h["image"]["id"] != target and key in h]
                if own and others:
                    margins[key].append(own[0] - max(others))
    out["twins"] = summarize(twin_ranks)
    out["twin_margins"] = {k: sorted(v) for k, v in margins.items() if v}
    print(f"\nlook-alike twins: r@1 {out['twins']['r1']:.2f} over {len(twin_ranks)} "
          f"(ranks {twin_ranks})")
    for key, values in out["twin_margins"].items():
        print(f"  margin of the original over the best other image by {key}: min {values[0]:.3f}, "
              f"median {statistics.median(values):.3f}, max {values[-1]:.3f}")

    accs = []
    for meme in chosen:
        text_ = ocr.get(image_ids[meme.id], "")
        accs.append((ocr_accuracy(meme.caption, text_, meme.lang), meme, text_))
    out["ocr_accuracy"] = {lang: statistics.fmean(a for a, m, _ in accs if m.lang == lang)
                           for lang in LANGS if any(m.lang == lang for _, m, _ in accs)}
    out["ocr_exact_captions"] = {lang: sum(1 for a, m, _ in accs if m.lang == lang and a == 1.0)
                                 for lang in LANGS}
    print("\nOCR accuracy (1 - WER for en words, 1 - CER for zh characters): "
          + ", ".join(f"{k} {v:.3f} ({out['ocr_exact_captions'][k]} perfect)" for k, v in out["ocr_accuracy"].items()))
    by_style: dict[str, list[float]] = {}
    for a, m, _ in accs:
        by_style.setdefault(f"{m.lang}/{m.style}", []).append(a)
    out["ocr_accuracy_by_style"] = {k: statistics.fmean(v) for k, v in sorted(by_style.items())}
    print("by style: " + ", ".join(f"{k} {v:.2f}" for k, v in out["ocr_accuracy_by_style"].items()))
    out["ocr_all"] = {m.id: t for _, m, t in accs}
    worst = sorted(accs, key=lambda t: (t[0], t[1].id))[:12]
    out["ocr_worst"] = [{"id": m.id, "style": m.style, "acc": a, "caption": m.caption, "ocr": t} for a, m, t in worst]
    print("worst OCR outputs:")
    for a, m, t in worst:
        print(f"  {a:.2f} {m.id} [{m.style}] {m.caption!r} -> {t!r}")

    out["latency_ms"] = {label: {"n": len(v), "p50": pct(v, 0.5) * 1000, "p99": pct(v, 0.99) * 1000}
                         for label, v in api.latency.items()}
    print("\n/search/text and /search/visual latency: " + "; ".join(
        f"{k}: p50 {v['p50']:.0f} ms p99 {v['p99']:.0f} ms (n={v['n']})" for k, v in out["latency_ms"].items()))

    print("\nserved default misses (meme, query type, query, rank):")
    for miss in misses[next(iter(misses))][:40]:
        print(f"  {miss}")
    out["misses"] = misses
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--subset", action="store_true", help="only the quality gate's subset (~24 memes)")
    parser.add_argument("--keep-var", action="store_true", help="keep the temporary data and var directory")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure to this JSON file")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for the pipeline to finish")
    parser.add_argument("--model", action="append", default=[], metavar="NAME",
                        help="another text provider (registry name) to rank the stored texts with, bench-side")
    parser.add_argument("--scale", type=int, default=0, metavar="N",
                        help="afterwards insert N synthetic images with text rows (SQL) and time /search/text again")
    args = parser.parse_args(argv)
    result = run(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, ensure_ascii=False, default=str))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
