#!/usr/bin/env python3
"""Out-of-sample check of the slang glossary: document version 4 vs 5 on held-out memes.

The held-out memes (``bench/heldout_data.py``, written blind to the glossary and to the bench)
are ranked text-side, without OCR or the pipeline: each meme's context is its caption as
``ocr_text`` (no title, description or tags), its document is the served
``semantic_document(display_name, context, version)``, and queries are embedded and ranked as the
served search ranks them — ``bench/document_gap.py``'s ``Ranker`` (the concatenated
e5+MiniLM provider, ``semantic_query``, ``route_weights``, exact cosine; "hybrid" adds the
served lexical lift, ``fusion.fuse``, exact terms only).

One pool: the held-out memes of all languages, plus (default) the search bench's memes
(``bench.search_data.memes()``) with their captions as distractors — their own queries are not
scored. Queries: the paraphrase, and an "exact" query cut deterministically from the caption
(Chinese: 4 consecutive characters from the middle of the caption's letters; English: 3
consecutive words from the middle).

    PYTHONPATH=. HF_HUB_OFFLINE=1 python bench/slang_heldout.py [--no-distractors] [--out x.json]

Deterministic: same data in, same tables out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.document_gap import TEXT_PROVIDER, Ranker, Step  # noqa: E402
from bench.heldout_data import HELDOUT_MEMES  # noqa: E402

VERSIONS = ("4", "5")
GROUPS = ("zh-slang", "zh-plain", "en")
QUERY_TYPES = ("exact", "paraphrase")


@dataclass(frozen=True)
class HeldMeme:
    """What ``Ranker`` needs of a meme (id, lang, filename), plus the held-out fields."""

    id: str
    lang: str
    group: str
    caption: str
    exact: str
    paraphrase: str

    @property
    def filename(self) -> str:
        return f"meme-{self.id}.png"


def exact_query(caption: str, lang: str) -> str:
    """A deterministic exact query cut from the caption."""
    if lang == "zh":
        chars = [ch for ch in caption if unicodedata.category(ch)[0] in "LN"]
        if len(chars) <= 4:
            return "".join(chars)
        start = (len(chars) - 4) // 2
        return "".join(chars[start:start + 4])
    words = re.findall(r"[\w']+", caption)
    if len(words) <= 3:
        return " ".join(words)
    start = (len(words) - 3) // 2
    return " ".join(words[start:start + 3])


def held_memes() -> list[HeldMeme]:
    return [HeldMeme(m["id"], m["lang"], m["group"], m["caption"], exact_query(m["caption"], m["lang"]),
                     m["paraphrase"]) for m in HELDOUT_MEMES]


def metrics(ranks: list[int | None]) -> tuple[float, float, float]:
    """r@1, r@5, MRR; a rank of None (not returned) counts as a miss with reciprocal rank 0."""
    n = len(ranks)
    got = [r for r in ranks if r is not None]
    return (sum(r == 1 for r in got) / n, sum(r <= 5 for r in got) / n, sum(1 / r for r in got) / n)


def _key(rank: int | None) -> float:
    return float("inf") if rank is None else rank


def run(distractors: bool = True, echo=print) -> dict[str, Any]:
    from app.orchestrator.fingerprints import semantic_document
    from app.stages.registry import get_text_provider

    held = held_memes()
    pool: list[Any] = list(held)
    contexts = {m.id: {"ocr_text": m.caption, "title": "", "description": "", "tags": []} for m in held}
    if distractors:
        from bench.search_data import memes

        for m in memes():
            pool.append(m)
            contexts[m.id] = {"ocr_text": "\n".join(m.lines), "title": "", "description": "", "tags": []}
    echo(f"pool: {len(held)} held-out memes + {len(pool) - len(held)} bench distractors; "
         f"provider {TEXT_PROVIDER}")
    ranker = Ranker(get_text_provider(TEXT_PROVIDER), pool, contexts)
    docs = {v: {m.id: semantic_document(m.filename, contexts[m.id], v) for m in pool} for v in VERSIONS}

    # ---- glosses (version 5 vs 4: the appended line)
    echo("\n## version 5 gloss lines of the held-out documents\n")
    glossed: dict[str, list[str]] = {g: [] for g in GROUPS}
    gloss_of = {}
    for m in held:
        if docs["5"][m.id] != docs["4"][m.id]:
            gloss = docs["5"][m.id][len(docs["4"][m.id]):].lstrip("\n")
            gloss_of[m.id] = gloss
            glossed[m.group].append(m.id)
            echo(f"- {m.id} {m.caption!r} → {gloss!r}")
    counts = {g: sum(m.group == g for m in held) for g in GROUPS}
    for g in GROUPS:
        echo(f"{g}: {len(glossed[g])}/{counts[g]} documents got a gloss line")
    n_distr = sum(docs["5"][m.id] != docs["4"][m.id] for m in pool[len(held):])
    echo(f"bench distractors with a gloss line: {n_distr}/{len(pool) - len(held)}")
    # glossary terms the held-out captions share with the search bench's captions (the bench is
    # where the glossary was measured, so the cleanest out-of-sample cell is the one without them)
    from app.search import slang
    from bench.search_data import memes as bench_memes  # whether or not they are in the pool

    bench_terms = {t for m in bench_memes() for t in slang.chinese().terms("\n".join(m.lines))}
    terms_of = {m.id: slang.chinese().terms(m.caption) for m in held}
    shared = {m.id for m in held if m.group == "zh-slang" and set(terms_of[m.id]) & bench_terms}
    echo(f"zh-slang captions with a glossary term the bench captions also have: {len(shared)} "
         f"({', '.join(f'{i} {terms_of[i]}' for i in sorted(shared))})")

    # ---- ranks
    ranks: dict[tuple[str, str, str], dict[str, int | None]] = {}  # (step label, group, qtype) -> id -> rank
    ahead: dict[tuple[str, str, str], list[str]] = {}  # (step, id, qtype) -> up to 3 memes ranked above
    steps = []
    for v in VERSIONS:
        steps.append(Step(f"semantic v{v}", docs[v], version=v))
        steps.append(Step(f"hybrid v{v}", docs[v], version=v, hybrid=True))
    for step in steps:
        matrix = ranker.doc_matrix(step.docs)
        for m in held:
            for qt in QUERY_TYPES:
                ranked = ranker.ranked(step, matrix, getattr(m, qt))
                # None: not among the served candidates (hybrid), i.e. not returned at all
                rank = next((r for r, (i, _) in enumerate(ranked, 1) if i == m.id), None)
                ranks.setdefault((step.label, m.group, qt), {})[m.id] = rank
                ahead[(step.label, m.id, qt)] = [i for i, _ in ranked[: (rank or 4) - 1]][:3]

    cells = [(g, qt) for g in GROUPS for qt in QUERY_TYPES]
    table: dict[str, dict[str, list[float]]] = {}
    echo("\n## r@1 / r@5 / MRR per subgroup × query type\n")
    echo("| step | " + " | ".join(f"{g} {qt}" for g, qt in cells) + " |")
    echo("|---|" + "---:|" * len(cells))
    for step in steps:
        row = {}
        for g, qt in cells:
            row[f"{g}/{qt}"] = list(metrics(list(ranks[(step.label, g, qt)].values())))
        table[step.label] = row
        echo(f"| {step.label} | " + " | ".join("{:.3f} / {:.3f} / {:.3f}".format(*row[f"{g}/{qt}"])
                                               for g, qt in cells) + " |")
    echo("\n## zh-slang split: captions sharing a glossary term with the bench vs not (r@1 / r@5 / MRR)\n")
    echo("| step | shared exact | shared paraphrase | not shared exact | not shared paraphrase |")
    echo("|---|---:|---:|---:|---:|")
    for step in steps:
        vals = []
        for inside in (True, False):
            for qt in QUERY_TYPES:
                rs = [r for i, r in ranks[(step.label, "zh-slang", qt)].items() if (i in shared) == inside]
                vals.append("{:.3f} / {:.3f} / {:.3f}".format(*metrics(rs)) if rs else "—")
        echo(f"| {step.label} | " + " | ".join(vals) + " |")
    echo(f"(shared n={len(shared)}, not shared n={counts['zh-slang'] - len(shared)})")
    echo("\n## r@1 / r@5 / MRR per language × query type\n")
    echo("| step | zh exact | zh paraphrase | en exact | en paraphrase |")
    echo("|---|---:|---:|---:|---:|")
    for step in steps:
        vals = []
        for lang in ("zh", "en"):
            for qt in QUERY_TYPES:
                rs = [r for g in GROUPS if g.startswith(lang) for r in ranks[(step.label, g, qt)].values()]
                vals.append("{:.3f} / {:.3f} / {:.3f}".format(*metrics(rs)))
        echo(f"| {step.label} | " + " | ".join(vals) + " |")

    # ---- gained / lost, v4 → v5 per ranking kind
    flips = []
    by_id = {m.id: m for m in held}
    for kind in ("semantic", "hybrid"):
        echo(f"\n## {kind}: queries whose rank changes v4 → v5 (↑ gained, ↓ lost)")
        for g, qt in cells:
            a, b = ranks[(f"{kind} v4", g, qt)], ranks[(f"{kind} v5", g, qt)]
            for mid in a:
                if a[mid] == b[mid]:
                    continue
                m = by_id[mid]
                arrow = "↑" if _key(b[mid]) < _key(a[mid]) else "↓"
                flips.append({"kind": kind, "group": g, "qtype": qt, "meme": mid, "query": getattr(m, qt),
                              "rank_v4": a[mid], "rank_v5": b[mid], "glossed": mid in gloss_of})
                echo(f"{arrow} {g}/{qt} {mid} {getattr(m, qt)!r}: {a[mid]} → {b[mid]}"
                     f"  (caption {m.caption!r}{', glossed' if mid in gloss_of else ''})")
                if arrow == "↓":
                    for other in ahead[(f"{kind} v5", mid, qt)]:
                        glossed_other = docs["5"][other] != docs["4"][other]
                        echo(f"    now above: {other} {docs['5'][other]!r}"
                             f"{' (glossed)' if glossed_other else ''}")
    return {"table": table, "glossed": glossed, "glosses": gloss_of, "flips": flips,
            "distractors_glossed": n_distr, "terms": terms_of, "shared_with_bench": sorted(shared),
            "exact_queries": {m.id: m.exact for m in held}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--no-distractors", action="store_true", help="held-out memes only in the pool")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = run(distractors=not args.no_distractors)
    if args.out:
        args.out.write_text(json.dumps(result, ensure_ascii=False, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
