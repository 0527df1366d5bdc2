"""Provider interfaces, result types and the canonical config hash."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from app.stages.images import DecodedImage

CONTEXT_KEYS = ("title", "description", "ocr_text", "tags", "facts")
REVERSE_IMAGE_POLICIES = ("forbid", "auto")


@dataclass
class AgentResult:
    """What an agent produced for one attempt.

    ``context`` has exactly the keys title, description, ocr_text, tags, facts.
    """

    context: dict[str, Any]
    model: str
    request_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able form (used for result records)."""
        return {"context": self.context, "model": self.model, "request_id": self.request_id}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AgentResult:
        """Inverse of :meth:`to_json`."""
        return cls(context=data["context"], model=data["model"], request_id=data.get("request_id"))


@dataclass
class LookupResult:
    """Answer to "what happened to attempt X?" (complete, never received, or cannot tell)."""

    status: Literal["complete", "not_received", "unknown"]
    result: AgentResult | None = field(default=None)


@runtime_checkable
class VisualProvider(Protocol):
    """Turns images into L2-normalised vectors of length ``config()["dims"]``."""

    name: str

    def config(self) -> dict[str, Any]:
        """Keys: provider, model, preprocess_version, dims (+ provider specifics)."""
        ...

    def embed(self, images: list[DecodedImage]) -> list[list[float]]:
        """One normalised vector per image, in order."""
        ...


@runtime_checkable
class AgentProvider(Protocol):
    """Describes an image as a context dict; may call a paid service.

    A provider may declare ``recall_safe = True`` on its class: running ``describe`` again for an
    attempt whose worker died repeats no external effect and costs nothing (local compute). The
    lease recovery then runs such an attempt again instead of ending it ``unknown_execution``
    (docs/architecture.md, "Recall-safe agents"). Read with :func:`is_recall_safe`: undeclared —
    a plugin's class, or a subclass that did not declare it itself — means False.
    """

    name: str

    def config(self) -> dict[str, Any]:
        """Keys: provider, model, version (+ provider specifics)."""
        ...

    def describe(
        self, image: DecodedImage, *, attempt_id: str, reverse_image_policy: str
    ) -> AgentResult:
        """Describe one image; ``attempt_id`` is the idempotency key of this attempt."""
        ...

    def lookup(self, attempt_id: str, *, image: DecodedImage | None = None) -> LookupResult:
        """Ask what became of an earlier attempt (for adoption after a crash)."""
        ...


@runtime_checkable
class TextEmbeddingProvider(Protocol):
    """Embeds semantic documents (``embed``) and search queries (``embed_query``) into
    normalised vectors of length ``config()["dims"]``."""

    name: str

    def config(self) -> dict[str, Any]:
        """Keys: provider, model, dims, document_version."""
        ...

    def embed(self, documents: list[str]) -> list[list[float]]:
        """One normalised vector per document, in order (batched internally)."""
        ...

    def embed_query(self, queries: list[str]) -> list[list[float]]:
        """One normalised vector per search query, comparable with :meth:`embed`'s vectors.

        Models trained with roles (e5: ``query: `` / ``passage: ``) embed queries differently
        from documents; for symmetric models (MiniLM, deterministic) this equals ``embed``.
        """
        ...


def is_recall_safe(provider: Any) -> bool:
    """Whether ``provider`` declared itself recall-safe (see :class:`AgentProvider`): only a class's
    *own* ``recall_safe = True`` (or its instance's) counts, never an inherited one — a plugin that
    subclasses a local agent to call a paid service must not inherit the right to be re-run."""
    own = vars(provider).get("recall_safe") if hasattr(provider, "__dict__") else None
    if own is None:
        own = vars(type(provider)).get("recall_safe")
    return own is True


def canonical_json(value: Any) -> bytes:
    """Canonical UTF-8 JSON: sorted keys, no whitespace, non-ASCII kept."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8"
    )


def config_hash(config: dict[str, Any]) -> str:
    """sha256 hex of the canonical JSON of ``config``; equal configs give equal hashes."""
    return hashlib.sha256(canonical_json(config)).hexdigest()


def l2_normalise(vector: np.ndarray) -> np.ndarray:
    """Return ``vector`` scaled to unit length (a zero vector is returned unchanged)."""
    vector = np.asarray(vector, dtype=np.float64)
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector


def check_reverse_image_policy(policy: str) -> None:
    """Reject a policy value that is not one of REVERSE_IMAGE_POLICIES."""
    from app.stages.errors import PermanentError

    if policy not in REVERSE_IMAGE_POLICIES:
        raise PermanentError(
            f"reverse_image_policy must be one of {REVERSE_IMAGE_POLICIES}, got {policy!r}",
            code="invalid_reverse_image_policy",
        )
