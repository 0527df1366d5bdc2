"""Durable per-attempt result records, so another process can adopt a finished local attempt.

A record lives under its scope's storage namespace, ``results_dir/<namespace>/<attempt_id>.json``
(the namespace of the claim's storage key, set by the worker around the agent call with
:func:`in_namespace`; a call outside one writes to ``results_dir`` itself). It is needed only while
its attempt may still be adopted (``external_started``): the worker discards it once the attempt's
completion committed (:func:`discard`), and ``memeflow gc`` prunes any left behind (:func:`prune`).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from app.stages.base import AgentResult
from app.stages.errors import PermanentError

_ATTEMPT_ID = re.compile(r"^[0-9A-Fa-f][0-9A-Fa-f-]{0,63}$")
_NAMESPACE: contextvars.ContextVar[str | None] = contextvars.ContextVar("records_namespace", default=None)


def namespace_of(storage_key: str) -> str:
    """The scope's storage namespace of a storage key (``<namespace>/<sha256><ext>``)."""
    return check_attempt_id(storage_key.split("/", 1)[0])  # a UUID: the same safe alphabet


@contextlib.contextmanager
def in_namespace(namespace: str) -> Iterator[None]:
    """Records written or read in this block (this thread) belong to scope namespace ``namespace``."""
    token = _NAMESPACE.set(check_attempt_id(namespace))
    try:
        yield
    finally:
        _NAMESPACE.reset(token)


def check_attempt_id(attempt_id: str) -> str:
    """Return ``attempt_id`` if it is a safe token (hex digits and dashes, e.g. a UUID)."""
    if not isinstance(attempt_id, str) or not _ATTEMPT_ID.fullmatch(attempt_id):
        raise PermanentError(
            f"attempt_id must be hex/uuid characters, got {attempt_id!r}", code="invalid_attempt_id"
        )
    return attempt_id


class ResultRecords:
    """``results_dir/<attempt_id>.json`` files, written atomically (tmp + fsync + rename)."""

    def __init__(self, results_dir: str | os.PathLike[str]) -> None:
        self.root = Path(results_dir)

    @property
    def results_dir(self) -> Path:
        """Where this thread's records go: the current scope namespace's directory, or the root."""
        namespace = _NAMESPACE.get()
        return self.root / namespace if namespace else self.root

    def write(self, attempt_id: str, result: AgentResult) -> Path:
        """Persist ``result`` durably before it is returned; readers never see a torn file."""
        check_attempt_id(attempt_id)
        results_dir = self.results_dir
        results_dir.mkdir(parents=True, exist_ok=True)
        target = results_dir / f"{attempt_id}.json"
        payload = json.dumps(result.to_json(), ensure_ascii=False, sort_keys=True).encode("utf-8")
        fd, tmp_name = tempfile.mkstemp(
            prefix=f".{attempt_id}.", suffix=".tmp", dir=results_dir
        )
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(payload)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp_name, target)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
        dir_fd = os.open(results_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # make the rename itself durable
        finally:
            os.close(dir_fd)
        return target

    def read(self, attempt_id: str) -> AgentResult | None:
        """Return the recorded result, or None if this attempt never finished here."""
        check_attempt_id(attempt_id)
        for directory in dict.fromkeys((self.results_dir, self.root)):  # the root: records of older versions
            try:
                data = (directory / f"{attempt_id}.json").read_bytes()
            except FileNotFoundError:
                continue
            return AgentResult.from_json(json.loads(data))
        return None


def discard(results_dir: str | os.PathLike[str], namespace: str, attempt_ids: Iterable[str]) -> None:
    """Remove the records of attempts whose completion committed (never needed again)."""
    directory = Path(results_dir) / check_attempt_id(namespace)
    for attempt_id in attempt_ids:
        (directory / f"{check_attempt_id(attempt_id)}.json").unlink(missing_ok=True)


def prune(
    results_dir: str | os.PathLike[str], still_open: Callable[[list[str]], set[str]], *, min_age_s: float,
    dry_run: bool = False,
) -> list[Path]:
    """Remove records older than ``min_age_s`` whose attempt may no longer be adopted:
    ``still_open(ids)`` returns those of ``ids`` still in flight (their records are kept). Also
    removes stale temp files of interrupted writes. Returns the paths removed (or, dry, removable)."""
    root = Path(results_dir)
    if not root.is_dir():
        return []
    now = time.time()
    candidates: dict[str, list[Path]] = {}
    temps: list[Path] = []
    for path in [*root.glob("*.json"), *root.glob("*/*.json"), *root.glob(".*.tmp"), *root.glob("*/.*.tmp")]:
        try:
            if now - path.stat().st_mtime < min_age_s:
                continue
        except FileNotFoundError:
            continue
        if path.suffix == ".tmp":
            temps.append(path)
        elif _ATTEMPT_ID.fullmatch(path.stem):
            candidates.setdefault(path.stem, []).append(path)
    keep = still_open(list(candidates)) if candidates else set()
    removed = [p for attempt_id, paths in candidates.items() if attempt_id not in keep for p in paths] + temps
    if not dry_run:
        for path in removed:
            path.unlink(missing_ok=True)
    return removed
