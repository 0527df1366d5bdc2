"""``open_clip``: image embeddings from an open_clip model whose weights are a local checkpoint file.

Optional: open_clip needs torchvision, which only imports beside its matching torch, so it lives
in a venv of its own (``make install-openclip`` -> ``.venv-openclip``, the ``openclip`` extra).
In any other venv, constructing the provider raises a ValueError that says so.

Offline by construction: the architecture is one of open_clip's bundled model configs (or one
registered with ``open_clip.add_model_config``), and the weights come only from
``checkpoint_path``, handed to open_clip's own loader as an absolute file path (never a
pretrained tag, never ``hf-hub:``).

``config()`` loads no model: dims come from the model config, and ``model`` carries the first 16
hex digits of the checkpoint's sha256, so other weights under the same architecture name are
another model for the visual stage fingerprint (SPEC §3.3) and for search.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from app.stages.base import canonical_json, l2_normalise
from app.stages.errors import PermanentError
from app.stages.images import DecodedImage

INSTALL_HINT = (
    "the open_clip visual provider needs the `openclip` extra, which lives in a venv of its own "
    "(torch 2.14.1 + torchvision 0.29.1 instead of the `ml` extra's torch 2.13.0): run "
    "`make install-openclip` and run this process from .venv-openclip"
)
_SCHEMAS = ("hf-hub:", "local-dir:")
_CHUNK = 1 << 20
log = logging.getLogger(__name__)


def import_open_clip():
    """The open_clip module, or a ValueError explaining how to get it."""
    # Everything here is local; these make sure no library reaches for the Hugging Face hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import open_clip
    except ImportError as exc:
        raise ValueError(f"{INSTALL_HINT} ({exc})") from exc
    return open_clip


def file_sha256(path: Path) -> str:
    """sha256 hex of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _file_identity(path: Path) -> tuple[int, int, int, int]:
    st = path.stat()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _size_pair(size: Any) -> list[int]:
    return [int(size), int(size)] if isinstance(size, int | float) else [int(s) for s in size]


def _plain(cfg: dict[str, Any]) -> dict[str, Any]:
    """JSON-shaped copy (tuples as lists), so configs compare and hash the same everywhere."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}


class OpenClipVisualProvider:
    """Embeds images with an open_clip model's image tower on CPU; vectors are unit length.

    The model loads lazily on first ``embed``, once per instance (the registry keeps one instance
    per process).
    """

    name = "open_clip"

    def __init__(
        self,
        *,
        checkpoint_path: str | os.PathLike[str] | None = None,
        model_name: str = "ViT-B-32",
        batch_size: int = 32,
        **_: Any,
    ) -> None:
        open_clip = import_open_clip()
        if not checkpoint_path:
            raise ValueError("the open_clip visual provider needs a local checkpoint file: set MEMEFLOW_OPEN_CLIP_CHECKPOINT")
        if not model_name or model_name.startswith(_SCHEMAS):
            raise ValueError(
                f"open_clip model name {model_name!r}: give an architecture name (e.g. ViT-B-32); "
                "weights come only from MEMEFLOW_OPEN_CLIP_CHECKPOINT, never from a hub or directory schema"
            )
        model_cfg = open_clip.get_model_config(model_name)
        if model_cfg is None:
            known = open_clip.list_models()
            raise ValueError(f"unknown open_clip model config {model_name!r} ({len(known)} known, e.g. {', '.join(known[:5])}, ...)")
        # Absolute, so open_clip never reads it as a pretrained tag (tags never contain "/").
        self.checkpoint_path = Path(checkpoint_path).expanduser().resolve()
        if not self.checkpoint_path.is_file():
            raise ValueError(f"open_clip checkpoint not found (not a file): {self.checkpoint_path}")
        try:
            self._identity = _file_identity(self.checkpoint_path)
            self.checkpoint_sha256 = file_sha256(self.checkpoint_path)
        except OSError as exc:
            raise ValueError(f"open_clip checkpoint unreadable: {self.checkpoint_path}: {exc}") from exc
        self.model_name = model_name
        self.dims = int(model_cfg["embed_dim"])
        vision_size = model_cfg["vision_cfg"].get("image_size", 224)
        # What open_clip's factory sets for a checkpoint given as a file path: its defaults, sized
        # for the image tower. Checked against the loaded model in _load.
        self.preprocess = _plain({**asdict(open_clip.transform.PreprocessCfg()), "size": _size_pair(vision_size)})
        self.batch_size = max(1, int(batch_size))
        self._model = None
        self._transform = None
        self._lock = threading.Lock()

    @property
    def preprocess_version(self) -> str:
        """Readable and exact: size, resize mode, interpolation, plus a digest of the whole cfg."""
        height, width = self.preprocess["size"]
        digest = hashlib.sha256(canonical_json(self.preprocess)).hexdigest()[:8]
        return f"open_clip-{height}x{width}-{self.preprocess['resize_mode']}-{self.preprocess['interpolation']}-{digest}"

    def config(self) -> dict[str, Any]:
        """Architecture, weights and preprocessing identity; part of the visual stage fingerprint."""
        return {
            "provider": self.name,
            "model": f"{self.model_name}@{self.checkpoint_sha256[:16]}",
            "architecture": self.model_name,
            "checkpoint_sha256": self.checkpoint_sha256,
            "preprocess_version": self.preprocess_version,
            "dims": self.dims,
        }

    def _load(self):
        with self._lock:
            if self._model is None:
                open_clip = import_open_clip()
                try:
                    model, _, transform = open_clip.create_model_and_transforms(
                        self.model_name, pretrained=str(self.checkpoint_path), device="cpu", precision="fp32"
                    )
                except Exception as exc:  # torch/open_clip raise RuntimeError, KeyError, pickle errors ...
                    # stored on the task and shown to the tenant: the path and torch's text go to the log
                    log.warning("cannot load open_clip %s from %s: %r", self.model_name, self.checkpoint_path, exc)
                    raise PermanentError(
                        f"cannot load the open_clip model {self.model_name}; the worker's log has the details",
                        code="visual_model_load_failed",
                    ) from exc
                try:
                    changed = _file_identity(self.checkpoint_path) != self._identity
                except OSError:
                    changed = True
                if changed:
                    # The weights just loaded may not be the ones config() hashed: never label them so.
                    log.warning("open_clip checkpoint %s changed after this process hashed it", self.checkpoint_path)
                    raise PermanentError(
                        "the open_clip checkpoint changed after this worker hashed it; "
                        "restart the worker to pick up the new weights",
                        code="visual_checkpoint_changed",
                    )
                loaded = open_clip.get_model_preprocess_cfg(model)
                loaded = _plain({**loaded, "size": _size_pair(loaded["size"])})
                if loaded != self.preprocess:
                    raise PermanentError(
                        f"open_clip preprocessing {loaded} differs from the configured {self.preprocess}",
                        code="visual_model_load_failed",
                    )
                model.eval()
                self._model, self._transform = model, transform
            return self._model, self._transform

    def embed(self, images: list[DecodedImage]) -> list[list[float]]:
        """One unit-length vector per image, computed in batches of ``batch_size``."""
        if not images:
            return []
        if not all(isinstance(img, DecodedImage) for img in images):
            raise PermanentError("images must be decoded with app.stages.images.decode_image", code="invalid_image")
        import torch

        model, transform = self._load()
        vectors: list[list[float]] = []
        with torch.inference_mode():
            for start in range(0, len(images), self.batch_size):
                chunk = images[start : start + self.batch_size]
                batch = torch.stack([transform(img.image) for img in chunk])
                features = model.encode_image(batch).to(torch.float64).numpy()
                vectors.extend(l2_normalise(np.asarray(row)).tolist() for row in features)
        return vectors
