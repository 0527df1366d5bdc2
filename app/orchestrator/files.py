"""Stored files and the image rows that reference them: a committed image row always has its file.

Everything that decides whether a file exists takes the storage key's transaction-level advisory
lock (``images.lock_storage_key_txn``):

- an upload or content replace takes it in its own transaction, *then* writes the file (or, when
  the file is already there, refreshes its mtime), then inserts or updates its row, and holds the
  lock to commit;
- a removal (after a delete or replace committed, after a failed upload, or by ``memeflow gc``)
  takes it, re-reads whether any row references the key, and unlinks only if none does — still
  holding the lock.

So a removal either runs wholly before an upload's critical section (the upload then finds the
file gone and writes it again) or after the upload committed (and sees its row). A crash after
a file write and before the commit leaves an unreferenced file, which ``memeflow gc`` removes.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from typing import TYPE_CHECKING

from sqlalchemy.engine import Connection

from app.orchestrator.errors import StorageFull, StorageUnavailable
from app.orchestrator.store import images
from app.storage import FileStore

if TYPE_CHECKING:
    from app.orchestrator.service import Orchestrator

log = logging.getLogger(__name__)


def store_file_txn(conn: Connection, files: FileStore | None, storage_key: str, data: bytes | None) -> None:
    """In the transaction that will reference ``storage_key``, before its row is written: take the
    key's lock (held to commit) and make sure the file is there. ``files=None``: the caller stored
    the file itself (tools and tests); the lock is still taken.

    A write the filesystem refuses raises :class:`StorageFull` (no space, filesystem quota) or
    :class:`StorageUnavailable` (read-only, permissions, I/O) — a clear answer for the client and
    one log line naming the path for the operator; the caller's transaction then rolls back, and
    the write left no temp file (``app.atomic``)."""
    images.lock_storage_key_txn(conn, storage_key)
    if files is not None:
        if data is None:
            raise ValueError("the file's bytes are needed to store it")
        try:
            files.write(storage_key, data)
        except OSError as exc:
            raise storage_error(exc, files.path(storage_key)) from exc


def storage_error(exc: OSError, path: os.PathLike[str] | str) -> StorageFull | StorageUnavailable:
    """The typed error for a write the storage filesystem refused (logged with its path, which
    the client's message leaves out)."""
    log.error("the storage refused a write: %s: %s", path, exc.strerror or exc)
    reason = exc.strerror or type(exc).__name__
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageFull(f"the image storage is full ({reason}); nothing was stored")
    return StorageUnavailable(f"the image storage refused the write ({reason}); nothing was stored")


def remove_unreferenced_file(
    orch: Orchestrator, files: FileStore, storage_key: str, *, min_age_s: float | None = None,
    now: float | None = None, dry_run: bool = False,
) -> int | None:
    """Remove the file of ``storage_key`` if no image row references it (decided under the key's
    lock) and, with ``min_age_s``, its mtime is at least that old. Returns the bytes removed (or,
    with ``dry_run``, that would be), None when the file stays or is not there."""
    with orch.engine.begin() as conn:
        images.lock_storage_key_txn(conn, storage_key)
        if images.storage_key_in_use_txn(conn, storage_key):
            return None
        stat = files.size_and_mtime(storage_key)
        if stat is None:
            return None
        size, mtime = stat
        if min_age_s is not None and (time.time() if now is None else now) - mtime < min_age_s:
            return None
        if not dry_run:
            files.delete(storage_key)
    return size


def release_file(orch: Orchestrator, files: FileStore | None, storage_key: str) -> None:
    """Best effort, after a row change committed (delete, replace) or a transaction that stored
    ``storage_key`` failed: remove the file unless a row uses it. If the database cannot be
    reached now, the file stays for ``memeflow gc`` (a file without a row is harmless)."""
    if files is None:
        return
    try:
        remove_unreferenced_file(orch, files, storage_key)
    except Exception:  # noqa: BLE001 - the caller's outcome stands; gc removes the orphan later
        log.warning("could not remove an unreferenced file; memeflow gc will", exc_info=True)


def owned_namespaces(orch: Orchestrator) -> set[str]:
    """The storage namespaces this database's scopes own (gc decides over those alone)."""
    with orch.engine.connect() as conn:
        return images.storage_namespaces_txn(conn)


def referenced_keys(orch: Orchestrator, storage_keys: list[str]) -> set[str]:
    """Which of ``storage_keys`` some image row references now (a first, lock-free filter for gc)."""
    with orch.engine.connect() as conn:
        return images.referenced_storage_keys_txn(conn, storage_keys)
