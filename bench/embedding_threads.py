"""Does the embedding lane scale with threads? The default text provider (every part of it, as the
embedding worker runs it) embeds a backlog of real documents in batches, from 1..N threads of one
process at once, each thread taking the next batch as a worker thread takes the next hint.

Prints documents/s per thread count, the speedup over one thread, and checks that every vector
equals the one-thread run's (the calls are independent: threads change the speed, not the answer).
On a box with more cores than this one the same numbers say how far a dedicated embedding worker
of ``MEMEFLOW_EMBEDDING_WORKER_THREADS`` threads (``Settings.embedding_threads``) goes before its
threads, not its cores, are the limit (docs/performance-log.md §41).

    HF_HUB_OFFLINE=1 PYTHONPATH=. python bench/embedding_threads.py [--docs 192] [--batch 8] [--threads 1,2]
"""

from __future__ import annotations

import argparse
import os
import platform
import queue
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from app.config import Settings  # noqa: E402
from app.orchestrator.fingerprints import semantic_document  # noqa: E402
from app.stages.cpu import available_cores  # noqa: E402
from app.stages.providers import Providers  # noqa: E402
from bench import search_data  # noqa: E402


def documents(n: int, version: str) -> list[str]:
    """``n`` semantic documents as the text stage renders them, from the search bench's captions
    (both languages), each made unique by its index."""
    memes = search_data.memes()
    out = []
    for i in range(n):
        meme = memes[i % len(memes)]
        context = {"ocr_text": " ".join(meme.lines), "title": meme.subject, "tags": [meme.style, str(i)]}
        out.append(semantic_document(None, context, version))
    return out


def run(provider, docs: list[str], batch: int, threads: int) -> tuple[float, list[list[float]], float]:
    """Wall seconds, the vectors in document order, and the process CPU seconds, for ``threads``
    threads draining ``docs`` in batches of ``batch``."""
    work: queue.Queue[int] = queue.Queue()
    for start in range(0, len(docs), batch):
        work.put(start)
    out: list[list[float] | None] = [None] * len(docs)
    errors: list[BaseException] = []

    def drain() -> None:
        try:
            while True:
                try:
                    start = work.get_nowait()
                except queue.Empty:
                    return
                vectors = provider.embed(docs[start:start + batch])
                out[start:start + len(vectors)] = vectors
        except BaseException as exc:  # noqa: BLE001 — reported below
            errors.append(exc)

    pool = [threading.Thread(target=drain) for _ in range(threads)]
    cpu0, t0 = time.process_time(), time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if errors:
        raise errors[0]
    return wall, out, cpu  # type: ignore[return-value]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=192)
    ap.add_argument("--batch", type=int, default=8, help="documents per batch (per model call)")
    ap.add_argument("--threads", default=None, help="thread counts, e.g. 1,2 (default 1..cores)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is printed")
    args = ap.parse_args()
    settings = Settings()
    counts = [int(x) for x in args.threads.split(",")] if args.threads else list(range(1, available_cores() + 1))
    provider = Providers(settings).text
    provider.warm()
    docs = documents(args.docs, settings.text_document_version)
    print(f"# {platform.machine()}, {available_cores()} cores, python {platform.python_version()}, "
          f"load {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    print(f"# text provider {settings.text_provider}, document version {settings.text_document_version}, "
          f"{len(docs)} documents, batches of {args.batch}, {args.rounds} rounds")
    baseline = None
    walls: dict[int, list[float]] = {k: [] for k in counts}
    cpus: dict[int, list[float]] = {k: [] for k in counts}
    for _ in range(args.rounds):
        for k in counts:
            wall, vectors, cpu = run(provider, docs, args.batch, k)
            if baseline is None:
                baseline = np.asarray(vectors)
            elif not np.array_equal(np.asarray(vectors), baseline):
                raise SystemExit(f"{k} threads gave other vectors than the first run")
            walls[k].append(wall)
            cpus[k].append(cpu)
    one = float(np.median(walls[counts[0]]))
    for k in counts:
        wall = float(np.median(walls[k]))
        print(f"threads {k}: {len(docs) / wall:7.1f} documents/s  (median wall {wall:.2f}s of "
              f"{', '.join(f'{w:.2f}' for w in walls[k])}; CPU {1000 * float(np.median(cpus[k])) / len(docs):.1f} "
              f"ms/document)  speedup {one / wall:.2f}x over {counts[0]}")
    print("vectors: identical across thread counts and rounds")


if __name__ == "__main__":
    main()
