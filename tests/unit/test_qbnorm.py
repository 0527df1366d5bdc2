"""Query-bank normalisation (app/search/qbnorm.py): the re-ordering rule on hand-made vectors."""

from __future__ import annotations

import numpy as np

from app.search import qbnorm


def unit(*xs: float) -> list[float]:
    v = np.asarray(xs, dtype=np.float64)
    return (v / np.linalg.norm(v)).tolist()


def test_a_hub_that_every_bank_query_prefers_loses_its_near_tie() -> None:
    """``hub`` leads the query by 0.005 of cosine, but the other candidates' bank queries all find the
    hub nearest: normalised by the bank, the runner-up (which no other query wants) takes first place."""
    passages = {"hub": unit(1, 1, 1), "target": unit(0, 1, 0), "other": unit(0, 0, 1)}
    bank = {"hub": unit(1, 0, 0), "target": unit(1, 0.9, 0.2), "other": unit(1, 0.2, 0.9)}
    cosines = {"hub": 0.805, "target": 0.800, "other": 0.40}
    new = qbnorm.reorder(cosines, bank, passages, beta=20.0)
    assert new is not None
    assert max(new, key=new.get) == "target"
    assert sorted(new.values()) == sorted(cosines.values())  # the served cosines, handed out anew


def test_no_hub_no_change() -> None:
    """The top candidate is nobody's nearest candidate: nothing changes (dynamic QB-Norm)."""
    passages = {"a": unit(1, 0, 0), "b": unit(0, 1, 0), "c": unit(0, 0, 1)}
    bank = {"a": unit(0, 0.2, 1), "b": unit(0.1, 0, 1), "c": unit(0.1, 1, 0)}  # b and c want each other
    assert qbnorm.reorder({"a": 0.9, "b": 0.8, "c": 0.7}, bank, passages) is None


def test_too_few_candidates_or_vectors() -> None:
    assert qbnorm.reorder({"a": 0.9}, {"a": unit(1, 0)}, {"a": unit(1, 0)}) is None
    assert qbnorm.reorder({"a": 0.9, "b": 0.8}, {"a": unit(1, 0)}, {"a": unit(1, 0)}) is None


def test_only_the_top_k_move() -> None:
    rng = np.random.default_rng(7)
    ids = [f"d{n:02d}" for n in range(30)]
    passages = {i: unit(*rng.normal(size=8)) for i in ids}
    hub = unit(*np.mean([passages[i] for i in ids], axis=0))
    passages["d00"] = hub  # the top candidate is close to everything: a hub
    bank = {i: unit(*(np.asarray(passages[i]) + 0.1 * rng.normal(size=8))) for i in ids}
    cosines = {i: 0.9 - 0.01 * n for n, i in enumerate(ids)}
    new = qbnorm.reorder(cosines, bank, passages, top_k=5)
    assert new is not None and set(new) == set(ids[:5])
