#!/usr/bin/env python3
"""Where do paraphrase queries get lost between the captions and the served search? Step by step.

``bench/text_models.py`` ranks the benchmark's *captions*; the served search ranks what the
pipeline made of the images: OCR text → context (title, tags) → semantic document
(``document_version``) → embedding, then hybrid ranking. This script rebuilds the served ranking
bench-side, one step at a time, with the served code's own functions (``semantic_document``,
``semantic_query``, ``route_weights``, the concatenated provider, ``lexical``, ``fusion``), and
prints r@1 per language × query type after every step, then every query that changes between
two steps — its rank, its own text at both steps and the texts that now rank above it (so a
loss reads as "own text changed" or "a competitor's text changed").

Steps (the documents of every meme rendered one way; queries as the served search embeds them):

1. ``caption``: the caption lines joined by spaces (``bench/text_models.py``'s documents);
2. ``caption lines``: the caption lines joined by newlines (as the OCR agent joins lines);
3. ``ocr text``: ``context.ocr_text`` alone;
4. ``document vN``: ``semantic_document(display_name, context, N)`` — what the text stage embeds —
   with queries folded by ``semantic_query(q, N)``; semantic ranking (exact, as the served
   exact scan of a scope under 20,000 images);
5. ``hybrid vN``: the same plus the lexical lift (``fusion.fuse``), candidates = top 100 by
   cosine ∪ top 100 exact lexical matches (the served ``_CANDIDATES``), df/n over the benchmark's
   images, exact terms only (the search before near matches);
6. ``hybrid vN, near matches W`` (``--near W,…``): a query word the text holds one edit away
   (``lexical.near_terms``, an OCR misread) counts W of its idf (served: ``fusion.NEAR_MATCH_WEIGHT``).

Contexts come from a ``bench/search_quality.py --json`` file (its ``contexts``; older files only
have ``ocr_all``, then title and tags are left empty — they rarely add words to the document) or,
with ``--ocr``, from the local OCR agent run in-process on the benchmark's images (same code and
bytes as the pipeline; ~1 min). The served ranks in the JSON (``misses``) are compared with the
reproduction of the served default when the versions match.

    PYTHONPATH=. HF_HUB_OFFLINE=1 python bench/document_gap.py --json /tmp/sq.json [--versions 3,4] [--near 0.5]
    PYTHONPATH=. HF_HUB_OFFLINE=1 python bench/document_gap.py --ocr [--versions 3,4] [--out gap.json]

Deterministic: same contexts in, same tables out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.search_data import Meme, memes, render  # noqa: E402

LANGS = ("en", "zh")
QUERY_TYPES = ("exact", "paraphrase")
TEXT_PROVIDER = "multilingual-e5-small+all-MiniLM-L6-v2"
CANDIDATES = 100  # app/search/service.py _CANDIDATES


# ---------------------------------------------------------------------------- contexts
def contexts_from_json(path: Path, chosen: Sequence[Meme]) -> tuple[dict[str, dict], dict[str, Any]]:
    """(meme id -> context, the JSON) from a search_quality.py --json file."""
    data = json.loads(path.read_text())
    ctxs = data.get("contexts") or {mid: {"ocr_text": text} for mid, text in data["ocr_all"].items()}
    return {m.id: dict(ctxs[m.id]) for m in chosen}, data


def contexts_from_ocr(chosen: Sequence[Meme]) -> dict[str, dict]:
    """The local OCR agent's context of every meme, run in-process on the rendered images."""
    from app.stages.agent.local_ocr import LocalOcrAgent
    from app.stages.images import decode_image
    from bench.search_data import _encode  # the bytes the benchmark uploads

    with tempfile.TemporaryDirectory(prefix="docgap-ocr-") as tmp:
        agent = LocalOcrAgent(results_dir=tmp)
        out = {}
        for n, meme in enumerate(chosen):
            data = _encode(render(meme), meme.fmt)
            ctx = agent.describe(decode_image(data), attempt_id=f"{n:08x}",
                                 reverse_image_policy="forbid").context
            out[meme.id] = {k: ctx[k] for k in ("title", "description", "ocr_text", "tags")}
    return out


# ---------------------------------------------------------------------------- ranking
@dataclass
class Step:
    label: str
    docs: dict[str, str]  # meme id -> text embedded
    version: str | None = None  # document version (queries folded as it folds them); None = raw
    hybrid: bool = False
    near: float = 0.0  # hybrid: weight of a query word met one edit away (fusion.NEAR_MATCH_WEIGHT)


class Ranker:
    """The served ranking over given documents: concatenated e5+MiniLM, per-query route weights,
    exact cosine; optionally the hybrid lexical lift over the memes' contexts."""

    def __init__(self, provider: Any, chosen: Sequence[Meme], contexts: dict[str, dict]) -> None:
        from app.search import lexical

        self.provider, self.memes, self.contexts = provider, list(chosen), contexts
        self.ids = [m.id for m in chosen]
        self.by_id = {m.id: m for m in chosen}
        self._doc_cache: dict[str, np.ndarray] = {}
        self._query_cache: dict[tuple[str, str | None], np.ndarray] = {}
        self.terms = {m.id: set(lexical.document_terms(lexical.lexical_fields(m.filename, contexts[m.id])))
                      for m in chosen}

    def doc_matrix(self, docs: dict[str, str]) -> np.ndarray:
        todo = [t for t in dict.fromkeys(docs[i] for i in self.ids) if t not in self._doc_cache]
        if todo:
            self._doc_cache.update(zip(todo, np.asarray(self.provider.embed(todo), dtype=np.float64), strict=True))
        return np.vstack([self._doc_cache[docs[i]] for i in self.ids])

    def query_vector(self, query: str, version: str | None) -> np.ndarray:
        from app.orchestrator.fingerprints import semantic_query
        from app.search.service import embed_query

        key = (query, version)
        if key not in self._query_cache:
            q = semantic_query(query, version) if version else query
            self._query_cache[key] = np.asarray(embed_query(self.provider, q)[0], dtype=np.float64)
        return self._query_cache[key]

    def ranked(self, step: Step, matrix: np.ndarray, query: str) -> list[tuple[str, float]]:
        """(meme id, score) best first, as the served search orders them."""
        from app.search import fusion, lexical
        from app.search.service import cosine_scale, route_weights

        cos = matrix @ self.query_vector(query, step.version)
        scale = cosine_scale(2, route_weights(query, ["multilingual-e5-small", "all-MiniLM-L6-v2"]))
        order = sorted(range(len(self.ids)), key=lambda k: (-cos[k], self.ids[k]))
        if not step.hybrid:
            return [(self.ids[k], float(cos[k]) * scale) for k in order]
        terms = lexical.query_terms(query)
        df = {t: sum(t in self.terms[i] for i in self.ids) for t in terms}
        n = len(self.ids)
        matched = {i: [t for t in terms if t in self.terms[i]] for i in self.ids}
        exact = {i: fusion.lexical_score(matched[i], terms, df, n) for i in self.ids}
        # the served candidates: top CANDIDATES by cosine ∪ top CANDIDATES exact lexical matches
        pool = {self.ids[k] for k in order[:CANDIDATES]}
        pool |= set(sorted((i for i in self.ids if exact[i] > 0), key=lambda i: (-exact[i], i))[:CANDIDATES])
        words = lexical.query_words(query) if step.near > 0 else {}
        index = {i: k for k, i in enumerate(self.ids)}
        cands = []
        for i in pool:
            near = lexical.near_terms(words, [t for t in terms if t not in matched[i]],
                                      lexical.lexical_fields(self.by_id[i].filename, self.contexts[i])) if words else []
            score = fusion.lexical_score(matched[i], terms, df, n, near, step.near)
            cands.append(fusion.Candidate(image_id=i, cosine=float(cos[index[i]]) * scale, lexical=score))
        params = fusion.FusionParams(near=step.near)
        return [(c.image_id, c.score) for c in fusion.fuse(cands, params)]


def evaluate(ranker: Ranker, step: Step) -> dict[tuple[str, str], list[tuple[int, list[tuple[str, float]]]]]:
    """Per (lang, query type): per meme (rank of its own image, the ranked list)."""
    matrix = ranker.doc_matrix(step.docs)
    out: dict[tuple[str, str], list] = {}
    for meme in ranker.memes:
        for qt in QUERY_TYPES:
            ranked = ranker.ranked(step, matrix, getattr(meme, qt))
            rank = next(r for r, (i, _) in enumerate(ranked, 1) if i == meme.id)
            out.setdefault((meme.lang, qt), []).append((rank, ranked))
    return out


def r1(results: list[tuple[int, Any]]) -> float:
    return sum(r == 1 for r, _ in results) / len(results)


# ---------------------------------------------------------------------------- report
def steps_for(chosen: Sequence[Meme], contexts: dict[str, dict], versions: Sequence[str],
              near: Sequence[float] = ()) -> list[Step]:
    from app.orchestrator.fingerprints import semantic_document

    steps = [
        Step("caption (lines joined by spaces)", {m.id: m.caption for m in chosen}),
        Step("caption lines (joined by newlines)", {m.id: "\n".join(m.lines) for m in chosen}),
        Step("ocr text", {m.id: contexts[m.id].get("ocr_text", "") for m in chosen}),
    ]
    for v in versions:
        docs = {m.id: semantic_document(m.filename, contexts[m.id], v) for m in chosen}
        steps.append(Step(f"document v{v}", docs, version=v))
        steps.append(Step(f"hybrid v{v}", docs, version=v, hybrid=True))
        for w in near:
            steps.append(Step(f"hybrid v{v}, near matches {w:g}", docs, version=v, hybrid=True, near=w))
    return steps


def report(chosen: Sequence[Meme], contexts: dict[str, dict], versions: Sequence[str],
           served: dict[str, Any] | None, near: Sequence[float] = (),
           echo: Callable[[str], None] = print) -> dict[str, Any]:
    from app.stages.registry import get_text_provider

    by_id = {m.id: m for m in chosen}
    provider = get_text_provider(TEXT_PROVIDER)  # document version only matters to semantic_document
    ranker = Ranker(provider, chosen, contexts)
    steps = steps_for(chosen, contexts, versions, near)
    results = [(s, evaluate(ranker, s)) for s in steps]
    cells = [(lang, qt) for lang in LANGS for qt in QUERY_TYPES]
    echo("\n## r@1 per step (served ranking reproduced bench-side)\n")
    echo("| step | " + " | ".join(f"{lang} {qt}" for lang, qt in cells) + " |")
    echo("|---|" + "---:|" * len(cells))
    table = {}
    for step, res in results:
        table[step.label] = {f"{lang}/{qt}": r1(res[(lang, qt)]) for lang, qt in cells}
        echo(f"| {step.label} | " + " | ".join(f"{r1(res[c]):.3f}" for c in cells) + " |")

    def text_of(step: Step, mid: str) -> str:
        return step.docs[mid].replace("\n", " ⏎ ")

    echo("\n## queries whose top hit changes between consecutive steps (⏎ = line break)")
    flips = []
    for (prev, prev_res), (cur, cur_res) in zip(results, results[1:], strict=False):
        if prev.hybrid and not cur.hybrid:  # a new version starts from the previous semantic step
            prev, prev_res = next((s, r) for s, r in results if s.label == "ocr text")
        for c in cells:
            chosen_c = [m for m in chosen if m.lang == c[0]]
            for meme, (pr, _), (cr, ranked) in zip(chosen_c, prev_res[c], cur_res[c], strict=True):
                if (pr == 1) == (cr == 1):
                    continue
                query = getattr(meme, c[1])
                own_changed = prev.docs[meme.id] != cur.docs[meme.id]
                ahead = [i for i, _ in ranked[: cr - 1]][:3] if cr > 1 else [ranked[1][0]]
                flips.append({"from": prev.label, "to": cur.label, "cell": f"{c[0]}/{c[1]}", "meme": meme.id,
                              "query": query, "rank_from": pr, "rank_to": cr, "own_text_changed": own_changed,
                              "ahead": ahead})
                verb = "LOST" if cr > 1 else "gained"
                echo(f"\n{verb} {c[0]}/{c[1]} {meme.id} {query!r}: rank {pr} → {cr}  [{prev.label} → {cur.label}]")
                echo(f"    own    {'CHANGED' if own_changed else 'same   '} {text_of(prev, meme.id)!r} → "
                     f"{text_of(cur, meme.id)!r}")
                label = "now above" if cr > 1 else "now below"
                for other in ahead:
                    changed = prev.docs[other] != cur.docs[other]
                    echo(f"    {label} {'CHANGED' if changed else 'same   '} {other} "
                         f"{text_of(prev, other)!r} → {text_of(cur, other)!r} (caption {by_id[other].caption!r})")
    out: dict[str, Any] = {"table": table, "flips": flips}
    if served:
        out["served_check"] = check_served(results, served, chosen, echo)
    return out


def check_served(results, served: dict[str, Any], chosen: Sequence[Meme], echo) -> dict[str, Any]:
    """Compare the reproduced hybrid/semantic ranks with the served ones of the JSON (its misses)."""
    misses = served.get("misses") or {}
    out = {}
    for served_label, kind in (("served default", "hybrid"), ("served mode=semantic", "document")):
        if served_label not in misses:
            continue
        want = {(m, qt): r for m, qt, _q, r in misses[served_label]}
        for step, res in results:
            if not step.label.startswith(kind + " v"):
                continue
            got = {}
            for c in [(lang, qt) for lang in LANGS for qt in QUERY_TYPES]:
                for meme, (rank, _) in zip([m for m in chosen if m.lang == c[0]], res[c], strict=True):
                    if rank != 1:
                        got[(meme.id, c[1])] = rank if rank <= 10 else None
            agree = got == want
            out[f"{served_label} vs {step.label}"] = agree
            diff = sorted(set(got.items()) ^ set(want.items()))
            echo(f"\nserved check: {served_label} vs reproduced {step.label}: "
                 + ("identical misses and ranks" if agree else f"differs at {diff[:10]}"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--json", type=Path, help="a bench/search_quality.py --json file (its contexts)")
    src.add_argument("--ocr", action="store_true", help="run the local OCR agent in-process instead")
    parser.add_argument("--versions", default="3", help="document versions to render, comma-separated")
    parser.add_argument("--near", default="", help="near-match weights to add hybrid steps for, comma-separated")
    parser.add_argument("--subset", action="store_true", help="only the quality gate's subset")
    parser.add_argument("--out", type=Path, default=None, help="also write the tables and flips as JSON")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    chosen = memes(subset=args.subset)
    served = None
    if args.json:
        contexts, served = contexts_from_json(args.json, chosen)
    else:
        contexts = contexts_from_ocr(chosen)
    result = report(chosen, contexts, [v.strip() for v in args.versions.split(",") if v.strip()], served,
                    [float(w) for w in args.near.split(",") if w.strip()])
    if args.out:
        result["contexts"] = contexts
        args.out.write_text(json.dumps(result, ensure_ascii=False, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
