"""Query-bank normalisation of the semantic candidates (QB-Norm, Bogolin et al. 2022), local form.

Short Chinese captions sit within a few hundredths of cosine of each other under
multilingual-e5-small, and a few "hub" documents win many queries by such margins. QB-Norm
re-scores a candidate ``d`` by how much more the query prefers it than other queries do:

    score(q, d) = exp(β s(q, d)) / (exp(β s(q, d)) + Σ_b exp(β s(b, d)))

over a bank of queries ``b``. Here the bank is the candidates themselves, each embedded with e5's
``query:`` role (the stored ``…-querybank`` part: "a query this document answers"), and ``s(b, d)``
is its e5 cosine with candidate ``d``'s passage vector (a document is not its own bank query).
Dynamic form: the candidates are re-ordered only when the top one is a hub of the bank (the
nearest candidate of at least one bank query); otherwise nothing changes. The re-ordered
candidates take the served cosines in their new order, so scores keep their scale and the hybrid
fusion downstream is unchanged.

Chosen by measurement (bench/late_levers.py, docs/search-log.md "Late interaction, …"): applied to
queries routed to e5 alone (CJK script) — on English queries it lost more than it gained; bank =
the top ``TOP_K`` 20, β 5: both picked on half of the benchmark's memes and held on the other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

TOP_K = 20
BETA = 5.0


def top_ids(cosines: Mapping[str, float], top_k: int = TOP_K) -> list[str]:
    """The ``top_k`` candidates by cosine (ties by id): the bank and the candidates re-ordered."""
    return [i for i, _ in sorted(cosines.items(), key=lambda kv: (-kv[1], kv[0]))[:top_k]]


def reorder(cosines: Mapping[str, float], bank: Mapping[str, Sequence[float]], passages: Mapping[str, Sequence[float]],
            *, top_k: int = TOP_K, beta: float = BETA) -> dict[str, float] | None:
    """New cosines for the top ``top_k`` candidates (by cosine, ties by id), or None when unchanged.

    ``cosines`` are the served (query, candidate) cosines; ``bank`` and ``passages`` the candidates'
    unit bank and passage vectors (a candidate missing either is left where it is).
    """
    top = [i for i in top_ids(cosines, top_k) if i in bank and i in passages]
    if len(top) < 2:
        return None
    B = np.asarray([bank[i] for i in top], dtype=np.float64)
    D = np.asarray([passages[i] for i in top], dtype=np.float64)
    S = B @ D.T  # bank query (row) against candidate (column)
    np.fill_diagonal(S, -np.inf)
    if 0 not in set(np.argmax(S, axis=1).tolist()):  # the top candidate is no hub of the bank
        return None
    c = np.asarray([cosines[i] for i in top], dtype=np.float64)
    E = np.where(np.isfinite(S), np.exp(beta * (S - 1.0)), 0.0)
    new = beta * (c - 1.0) - np.log(E.sum(axis=0) + np.exp(beta * (c - 1.0)))
    order = np.argsort(-new, kind="stable")
    handed = sorted(c.tolist(), reverse=True)
    out = {top[int(k)]: handed[n] for n, k in enumerate(order)}
    return out if any(not math.isclose(out[i], cosines[i]) for i in top) else None
