"""Atomic file writes: a reader sees the old file or the whole new one, never a torn one (SPEC §4.1).

The one way memeflow writes a file that others read (stored images, thumbnails, agent result
records, samples): a temp file in the target's directory, fsync, rename over the target, then an
fsync of the directory so the rename itself survives a crash. A failed write removes its temp file;
a crash leaves one behind, named by ``prefix`` so its owner can find and remove it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(
    target: Path, data: bytes, *, prefix: str = ".tmp-", suffix: str = "", durable: bool = True,
    sync_dir: bool = True,
) -> None:
    """Replace ``target`` with ``data`` in one rename. ``durable``: fsync the file before the rename;
    ``sync_dir``: fsync the directory after it (both default on; off only for files that can be
    regenerated, where a crash may lose the write but never tear it)."""
    tmp = write_temp(target.parent, data, prefix=prefix, suffix=suffix, durable=durable)
    try:
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync_dir(target.parent)


def write_temp(directory: Path, data: bytes, *, prefix: str = ".tmp-", suffix: str = "",
               durable: bool = True) -> Path:
    """A new temp file in ``directory`` holding ``data`` (fsync'd if ``durable``) for the caller to
    rename or hard-link into place — ``write_atomic``'s first half, also the agent records' group
    data file (app/stages/agent/records.py). Removed again if the write fails."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` durable (a rename or unlink in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
