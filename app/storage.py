"""Content-addressed file store: ``<storage_dir>/<namespace>/<sha256><ext>``.

Files are written atomically (temp file in the same directory, fsync, rename, fsync of the
directory), so a reader never sees a partial file and a crash leaves at most an orphan temp file
or an orphan complete file that :meth:`FileStore.orphans` reports for ``memeflow gc``. Whether a
file may be removed is decided from the database under the key's lock
(``app.orchestrator.files``), never from this directory alone. Directories whose name starts
with a dot (``.thumbs``, ``.agent-results``) hold other shared files, not namespaces: never listed.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

from app.atomic import fsync_dir, write_atomic

_KEY = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/[0-9a-f]{64}\.[a-z0-9]{1,6}$")
_TMP_PREFIX = ".tmp-"


class InvalidStorageKey(ValueError):
    """A storage key must be ``<uuid namespace>/<sha256 hex>.<ext>``."""


class NotARegularFile(OSError):
    """The path of a key holds something other than a regular file (a directory, a FIFO, a device)."""


class ContentMismatch(ValueError):
    """A stored file's bytes do not hash to the sha256 its key names (truncated, replaced, tampered with)."""


def storage_key(namespace: uuid.UUID | str, sha256: str, extension: str) -> str:
    """The key of a file: never derived from the scope id itself, only its namespace uuid."""
    ext = extension if extension.startswith(".") else f".{extension}"
    key = f"{uuid.UUID(str(namespace))}/{sha256}{ext}"
    _check(key)
    return key


def _check(key: str) -> str:
    if not _KEY.match(key):
        raise InvalidStorageKey(f"invalid storage key {key!r}")
    return key


class FileStore:
    """Atomic, content-addressed files under one root directory."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def path(self, key: str) -> Path:
        """Absolute path of ``key`` (validated: no traversal is possible)."""
        return self.root / _check(key)

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def write(self, key: str, data: bytes) -> bool:
        """Write ``data`` under ``key`` atomically; returns True if the file was newly created.

        Content addressing makes an existing file with the same key identical, so it is kept, and
        its mtime is refreshed: ``memeflow gc`` measures a file's age from its latest upload.
        Callers that go on to reference the file hold the key's lock (``orchestrator.files``).
        """
        target = self.path(key)
        try:
            os.utime(target)
            return False
        except FileNotFoundError:
            pass
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target, data, prefix=_TMP_PREFIX)
        return True

    def size_and_mtime(self, key: str) -> tuple[int, float] | None:
        """(size in bytes, mtime) of the file of ``key``, or None if there is none."""
        try:
            st = self.path(key).stat()
        except FileNotFoundError:
            return None
        return st.st_size, st.st_mtime

    def read(self, key: str) -> bytes:
        return self.path(key).read_bytes()

    def read_verified(self, key: str) -> bytes:
        """The bytes of ``key``, proven to be the content its key names: they must come from a
        regular file (a FIFO would block the reader forever, a device never end) and hash to the
        key's sha256. Raises FileNotFoundError, NotARegularFile or another OSError (permission
        denied, I/O error), or ContentMismatch. A symlink is followed: the content check is what
        makes its target harmless."""
        path = self.path(key)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # NONBLOCK: a FIFO opens, and is refused
        with os.fdopen(fd, "rb") as f:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise NotARegularFile(f"{key} is not a regular file (mode {stat.filemode(mode)})")
            data = f.read()
        expected = Path(key).stem
        if hashlib.sha256(data).hexdigest() != expected:
            raise ContentMismatch(f"{key}: the stored bytes ({len(data)}) do not hash to the key's sha256")
        return data

    def delete(self, key: str) -> bool:
        """Remove the file of ``key``; True if it existed."""
        try:
            self.path(key).unlink()
        except FileNotFoundError:
            return False
        fsync_dir(self.path(key).parent)
        return True

    def namespaces(self) -> list[str]:
        """The namespace directories under the root (``.thumbs``, ``.agent-results``: not namespaces)."""
        if not self.root.is_dir():
            return []
        return sorted(d.name for d in os.scandir(self.root) if d.is_dir() and not d.name.startswith("."))

    def iter_keys(self, namespaces: Iterable[str] | None = None) -> Iterator[str]:
        """Every complete file key under the root, or in ``namespaces`` (temp files excluded) —
        streamed, one directory entry at a time, in no particular order."""
        for ns in self.namespaces() if namespaces is None else namespaces:
            try:
                entries = os.scandir(self.root / ns)
            except (FileNotFoundError, NotADirectoryError):
                continue
            with entries:
                for f in entries:
                    key = f"{ns}/{f.name}"
                    if _KEY.match(key) and f.is_file():
                        yield key

    def orphans(self, referenced: Iterable[str]) -> list[str]:
        """Keys of files no image row references (``referenced`` = all images.storage_key)."""
        known = set(referenced)
        return [k for k in self.iter_keys() if k not in known]

    def stale_temp_files(self) -> list[Path]:
        """Temp files of writes: those of a crash mid-write, and of writes in flight — remove them
        only through :func:`app.atomic.remove_abandoned_temp`, which leaves a live write's alone."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.glob(f"*/{_TMP_PREFIX}*")
                      if p.is_file() and not p.parent.name.startswith("."))  # namespaces only

