"""Reading a stored original for an answer: the bytes the API serves or derives are the bytes it
stored. Every read is :meth:`app.storage.FileStore.read_verified` (a regular file whose bytes hash
to the sha256 its key names), the check a worker makes before computing; hashing costs about what
reading the file already does (one pass, ~1 GB/s)."""

from __future__ import annotations

import logging

from app.api.errors import ApiError
from app.storage import ContentMismatch, FileStore

log = logging.getLogger("memeflow.api")


def read_original(store: FileStore, key: str) -> bytes:
    """The bytes of ``key``, proven to be its content. FileNotFoundError passes through (the caller
    reads the image row again: replaced or deleted since); bytes that are not the content (tampered,
    truncated, a symlink to other bytes) are a 503 ``storage_corrupt``; a path that is not a regular
    file or cannot be read (a directory, a FIFO — refused without blocking —, permissions, I/O) a 503
    ``storage_unavailable``. The operator's fix is a restore from backup (docs/operations.md)."""
    try:
        return store.read_verified(key)
    except FileNotFoundError:
        raise
    except ContentMismatch as exc:
        log.error("stored file refused: %s", exc, extra={"code": "storage_corrupt"})
        raise ApiError(503, "storage_corrupt",
                       "the stored file of this image does not hold its content; restore it from a backup") from None
    except OSError as exc:
        log.error("stored file unreadable: %s: %s", key, exc.strerror or type(exc).__name__,
                  extra={"code": "storage_unavailable"})
        raise ApiError(503, "storage_unavailable", "the stored file of this image cannot be read") from None
