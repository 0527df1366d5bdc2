#!/usr/bin/env python3
"""Re-scoring levers over the served ranking, measured bench-side (branch ``rerank``).

The served search ranks a scope's documents by the weighted mean of per-model cosines (e5 +
MiniLM, ``route_weights``) and lifts strong lexical matches (``fusion.fuse``). This script rebuilds
exactly that ranking from a ``bench/search_quality.py --json`` file's contexts (document version 4,
near matches 0.5: the served default; the first row must equal the served cells) and measures
levers that change only the *scores*, with no new weights:

- ``center``: subtract the scope's mean document vector (per model) from documents and query,
  re-normalise (a hub/anisotropy correction: e5 puts all short captions close together);
- ``csls kK bB``: cross-domain similarity local scaling, ``cos(q, d) − B · r_K(d)`` with ``r_K(d)``
  the mean cosine of ``d`` to its ``K`` nearest other documents (penalises "hub" documents that
  are near everything; ``B`` 0.5 is CSLS's ``2cos − r_d`` up to a per-query constant);
- ``e5 query role``: the query embedded with e5's ``passage:`` role, or the mean of both roles;
- ``--wordllama DIR`` / ``--splade DIR``: an extra model part (WordLlama ``l2_supercat`` static
  embeddings from the ``wordllama`` wheel, its cache dir holding ``tokenizer/``; a SPLADE
  BertForMaskedLM directory), alone and fused as an English-only part.

Every row prints r@1 / r@5 / MRR (over the top 10) per language × query type and the queries
whose top hit changes against the served row.

    PYTHONPATH=. HF_HUB_OFFLINE=1 python bench/rerank_levers.py --json /tmp/sq.json [--docs v4|caption]
        [--wordllama /tmp/rr-wl] [--splade DIR]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.document_gap import CANDIDATES, contexts_from_json  # noqa: E402
from bench.search_data import memes  # noqa: E402

VERSION = "4"
NEAR = 0.5
CELLS = [(lang, qt) for lang in ("en", "zh") for qt in ("exact", "paraphrase")]


class Part:
    """One model's unit document matrix and unit query vectors."""

    def __init__(self, name: str, multilingual: bool, docs: np.ndarray, queries: dict[str, np.ndarray]) -> None:
        self.name, self.multilingual = name, multilingual
        self.D = docs / np.linalg.norm(docs, axis=1, keepdims=True)
        self.Q = {q: v / np.linalg.norm(v) for q, v in queries.items()}


def unit(rows) -> np.ndarray:
    m = np.asarray(rows, dtype=np.float64)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


class Bench:
    def __init__(self, json_path: Path, docs: str) -> None:
        from app.orchestrator.fingerprints import semantic_document, semantic_query
        from app.search import lexical

        self.memes = memes()
        self.ids = [m.id for m in self.memes]
        self.by_id = {m.id: m for m in self.memes}
        self.ctx, _ = contexts_from_json(json_path, self.memes)
        if docs == "v4":
            self.texts = [semantic_document(m.filename, self.ctx[m.id], VERSION) for m in self.memes]
        else:
            self.texts = [m.caption for m in self.memes]
        self.queries = [(m, qt, getattr(m, qt)) for m in self.memes for qt in ("exact", "paraphrase")]
        self.folded = [semantic_query(q, VERSION) for _, _, q in self.queries]
        self.terms = {m.id: set(lexical.document_terms(lexical.lexical_fields(m.filename, self.ctx[m.id])))
                      for m in self.memes}

    def part(self, name: str, multilingual: bool, embed_docs: Callable, embed_queries: Callable) -> Part:
        qv = unit(embed_queries(self.folded))
        return Part(name, multilingual, unit(embed_docs(self.texts)),
                    {q: qv[k] for k, (_, _, q) in enumerate(self.queries)})

    def served_parts(self) -> list[Part]:
        from app.stages.registry import get_text_provider

        provider = get_text_provider("multilingual-e5-small+all-MiniLM-L6-v2")
        self.e5 = provider.parts[0]
        return [self.part(name, "multilingual" in name, p.embed, p.embed_query)
                for p, name in zip(provider.parts, provider.part_names, strict=True)]

    @staticmethod
    def weights(query: str, parts: list[Part], extra: dict[str, float] | None = None) -> dict[str, float]:
        """route_weights for any set of parts: multilingual 1; English-only 0 for CJK queries, else
        LATIN_SPECIALIST_WEIGHT (or ``extra[name]``)."""
        from app.search import lexical
        from app.search.service import LATIN_SPECIALIST_WEIGHT

        cjk = lexical.has_cjk(query)
        return {p.name: 1.0 if p.multilingual else 0.0 if cjk else (extra or {}).get(p.name, LATIN_SPECIALIST_WEIGHT)
                for p in parts}

    def rank_all(self, parts: list[Part], sim: Callable[[Part, str], np.ndarray] | None = None,
                 extra: dict[str, float] | None = None, hybrid: bool = True) -> dict[tuple[str, str], list[tuple[str, int]]]:
        """Per cell: (meme id, rank of its image) for every query, ranked as served."""
        from app.search import fusion, lexical

        out: dict[tuple[str, str], list[tuple[str, int]]] = {}
        n = len(self.ids)
        index = {i: k for k, i in enumerate(self.ids)}
        for m, qt, q in self.queries:
            w = self.weights(q, parts, extra)
            total = sum(w.values())
            cos = sum(w[p.name] * (sim(p, q) if sim else p.D @ p.Q[q]) for p in parts if w[p.name] > 0) / total
            order = sorted(range(n), key=lambda k: (-cos[k], self.ids[k]))
            if hybrid:
                qterms = lexical.query_terms(q)
                df = {t: sum(t in self.terms[i] for i in self.ids) for t in qterms}
                matched = {i: [t for t in qterms if t in self.terms[i]] for i in self.ids}
                exact = {i: fusion.lexical_score(matched[i], qterms, df, n) for i in self.ids}
                pool = {self.ids[k] for k in order[:CANDIDATES]}
                pool |= set(sorted((i for i in self.ids if exact[i] > 0), key=lambda i: (-exact[i], i))[:CANDIDATES])
                words = lexical.query_words(q)
                cands = []
                for i in pool:
                    near = lexical.near_terms(words, [t for t in qterms if t not in matched[i]],
                                              lexical.lexical_fields(self.by_id[i].filename, self.ctx[i]))
                    score = fusion.lexical_score(matched[i], qterms, df, n, near, NEAR)
                    cands.append(fusion.Candidate(image_id=i, cosine=float(cos[index[i]]), lexical=score))
                ranked = [c.image_id for c in fusion.fuse(cands, fusion.FusionParams(near=NEAR))]
            else:
                ranked = [self.ids[k] for k in order]
            rank = ranked.index(m.id) + 1 if m.id in ranked else 10_000
            out.setdefault((m.lang, qt), []).append((m.id, rank))
        return out


def summary(ranks: list[tuple[str, int]]) -> tuple[float, float, float]:
    r = [x for _, x in ranks]
    return (sum(x <= 1 for x in r) / len(r), sum(x <= 5 for x in r) / len(r),
            sum(1 / x for x in r if x <= 10) / len(r))


def show(label: str, res, base=None) -> None:
    cells = ["{:.3f} / {:.2f} / {:.3f}".format(*summary(res[c])) for c in CELLS]
    print(f"| {label} | " + " | ".join(cells) + " |", flush=True)
    if base is not None:
        changes = [f"{mid} {qt[:4]} {r0}→{r1}" for c in CELLS for (mid, r0), (_, r1) in zip(base[c], res[c], strict=True)
                   for qt in [c[1]] if (r0 == 1) != (r1 == 1)]
        print(f"|   r@1 changes ({len(changes)}) | {', '.join(changes) or '–'} | | | |", flush=True)


def centered(parts: list[Part]) -> Callable[[Part, str], np.ndarray]:
    pre = {}
    for p in parts:
        mu = p.D.mean(0)
        pre[p.name] = (mu, unit(p.D - mu))

    def sim(p: Part, q: str) -> np.ndarray:
        mu, dc = pre[p.name]
        v = p.Q[q] - mu
        return dc @ (v / np.linalg.norm(v))
    return sim


def csls(parts: list[Part], k: int, beta: float) -> Callable[[Part, str], np.ndarray]:
    hub = {}
    for p in parts:
        s = p.D @ p.D.T
        np.fill_diagonal(s, -np.inf)
        hub[p.name] = np.sort(s, axis=1)[:, -k:].mean(1)
    return lambda p, q: p.D @ p.Q[q] - beta * hub[p.name]


def splade_encoder(path: str) -> Callable[[list[str]], np.ndarray]:
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForMaskedLM.from_pretrained(path).eval()

    def enc(texts: list[str]) -> np.ndarray:
        rows = []
        with torch.no_grad():
            for i in range(0, len(texts), 32):
                b = tok(texts[i:i + 32], padding=True, truncation=True, max_length=128, return_tensors="pt")
                v = torch.log1p(torch.relu(model(**b).logits)) * b["attention_mask"].unsqueeze(-1)
                rows.append(v.max(1).values.numpy())
        return np.vstack(rows)
    return enc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, required=True, help="a bench/search_quality.py --json file (its contexts)")
    ap.add_argument("--docs", choices=("v4", "caption"), default="v4")
    ap.add_argument("--wordllama", help="a cache dir for WordLlama.load (holding tokenizer/l2_supercat_tokenizer_config.json)")
    ap.add_argument("--splade", help="a SPLADE (BertForMaskedLM) model directory")
    args = ap.parse_args(argv)

    bench = Bench(args.json, args.docs)
    parts = bench.served_parts()
    print(f"documents: {args.docs}; r@1 / r@5 / MRR, hybrid as served (near matches {NEAR})\n")
    print("| setting | " + " | ".join(f"{lang} {qt}" for lang, qt in CELLS) + " |")
    print("|---|" + "---|" * len(CELLS))
    base = bench.rank_all(parts)
    show("served (e5 + MiniLM, route weights)", base)
    show("center (scope mean removed, per model)", bench.rank_all(parts, centered(parts)), base)
    for k in (5, 10, 20):
        for beta in (0.5, 1.0):
            show(f"CSLS k{k} β{beta}", bench.rank_all(parts, csls(parts, k, beta)), base)
    qp = unit(bench.e5.embed(bench.folded))
    qq = np.vstack([parts[0].Q[q] for _, _, q in bench.queries])
    for label, m in (("e5 query with the passage: role", qp), ("e5 query = mean of both roles", qp + qq)):
        alt = Part(parts[0].name, True, parts[0].D, {q: m[k] for k, (_, _, q) in enumerate(bench.queries)})
        show(label, bench.rank_all([alt, parts[1]]), base)
    extras = []
    if args.wordllama:
        from wordllama import WordLlama

        wl = WordLlama.load(cache_dir=args.wordllama, disable_download=True)
        extras.append(bench.part("wordllama-l2-supercat", False, lambda t: wl.embed(t, norm=True),
                                 lambda t: wl.embed(t, norm=True)))
    if args.splade:
        enc = splade_encoder(args.splade)
        extras.append(bench.part("splade", False, enc, enc))
    for extra in extras:
        alone = Part(extra.name, True, extra.D, extra.Q)
        show(f"{extra.name} alone", bench.rank_all([alone]))
        for w in (0.5, 1.0):
            show(f"e5 + MiniLM + {extra.name} (English queries, weight {w})",
                 bench.rank_all(parts + [extra], extra={extra.name: w}), base)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
