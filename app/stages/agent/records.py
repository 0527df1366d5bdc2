"""Durable per-attempt result records, so another process can adopt a finished local attempt.

``results_dir`` is shared by every worker that may recover another's attempt (by default
``<storage>/.agent-results``, next to the images every worker already shares): a record only one
machine can read would turn another machine's recovery into ``unknown_execution``. Records that
older versions kept under ``<var>/agent-results`` are still read from ``legacy_dir``.

A record lives under its scope's storage namespace, ``results_dir/<namespace>/<attempt_id>.json``
(the namespace of the claim's storage key, set by the worker around the agent call with
:func:`in_namespace`; a call outside one writes to ``results_dir`` itself). It is needed only while
its attempt may still be adopted (``external_started``): the worker discards it once the attempt's
completion committed (:func:`discard`), and ``memeflow gc`` prunes any left behind (:func:`prune`).

**Group commit.** The calls of one agent batch run concurrently (in threads) and form a
:class:`CallGroup` (the worker sets it around each call with :func:`in_group`). Their records are
made durable together: a record waits — at most ``linger_s`` after it arrived — while calls of
its group are still computing, then one flush takes every record of the group that is waiting.
A flush of several records of one namespace writes **one** data file holding all of them
(``{"format": "memeflow-agent-records-v2", "records": {attempt_id: result}}``), fsyncs it once,
hard-links it as every attempt's ``<attempt_id>.json`` and fsyncs the directory once — two
fsyncs for N attempts instead of 2N. Every name appears only after its data is durable, and no
``write`` returns before the directory fsync, so a record is durable before its attempt can be
reported complete. The data's inode lives as long as any attempt's name does: ``discard`` and
``prune`` still remove one name per attempt, and the data goes with the last one. A namespace's
data file holds that scope's records only. A record outside a group (a worker running one call
per thread, e.g. ``local-ocr`` in a threads pool) is written at once, concurrently with the
others, as one file: tmp + fsync + rename + directory fsync (so is a lone record of a group, and
every record on a filesystem without hard links). Both paths write through ``app/atomic.py``:
``write_atomic`` for a single record, ``held_temp`` (its fsync'd, locked temp file) for a group's data
file, which is hard-linked instead of renamed.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Container, Iterable, Iterator
from pathlib import Path

from app.atomic import fsync_dir, held_temp, remove_files, write_atomic
from app.stages.base import AgentResult
from app.stages.errors import PermanentError

_ATTEMPT_ID = re.compile(r"^[0-9A-Fa-f][0-9A-Fa-f-]{0,63}$")
_BATCH_FORMAT = "memeflow-agent-records-v2"
_NAMESPACE: contextvars.ContextVar[str | None] = contextvars.ContextVar("records_namespace", default=None)
_MEMBER: contextvars.ContextVar[_Member | None] = contextvars.ContextVar("records_group_member", default=None)
#: One lock for every CallGroup of the process.
_COND = threading.Condition()


class CallGroup:
    """The concurrent calls of one agent batch: ``computing`` counts those that have neither
    written their record nor ended; ``pending`` holds the records waiting for the group's flush."""

    def __init__(self, size: int, *, linger_s: float = 0.05) -> None:
        self.computing = size
        self.linger_s = linger_s
        self.pending: list[_Pending] = []
        self.flushing = False

    def _arrived(self) -> None:  # under _COND
        self.computing -= 1
        if self.computing <= 0:
            # The group's last call is in: its waiting records may flush now. An earlier arrival
            # changes nothing a waiter checks (calls are still computing), so waking them all then
            # only made each go back to sleep: n²/2 wake-ups for a batch of n.
            _COND.notify_all()


class _Member:
    __slots__ = ("group", "counted")

    def __init__(self, group: CallGroup) -> None:
        self.group, self.counted = group, False

    def arrive(self) -> None:  # under _COND
        if not self.counted:
            self.counted = True
            self.group._arrived()


@contextlib.contextmanager
def in_group(group: CallGroup | None) -> Iterator[None]:
    """This block (this thread) is one call of ``group``; leaving it without a record counts too."""
    if group is None:
        yield
        return
    member = _Member(group)
    token = _MEMBER.set(member)
    try:
        yield
    finally:
        _MEMBER.reset(token)
        with _COND:
            member.arrive()


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


class _Pending:
    """One record waiting for a group flush."""

    __slots__ = ("directory", "attempt_id", "data", "path", "error", "done")

    def __init__(self, directory: Path, attempt_id: str, data: dict) -> None:
        self.directory, self.attempt_id, self.data = directory, attempt_id, data
        self.path: Path | None = None
        self.error: BaseException | None = None
        self.done = False


class ResultRecords:
    """``results_dir/<attempt_id>.json`` records, durable before ``write`` returns; concurrent
    writes share their fsyncs (group commit, see the module docstring)."""

    def __init__(self, results_dir: str | os.PathLike[str], *, legacy_dir: str | os.PathLike[str] | None = None
                 ) -> None:
        self.root = Path(results_dir)
        # read only: where versions before the shared location wrote (this machine's var dir)
        self.legacy = Path(legacy_dir) if legacy_dir else None
        self.flushes = 0  # how many flushes ran (observability, tests)

    @property
    def results_dir(self) -> Path:
        """Where this thread's records go: the current scope namespace's directory, or the root."""
        namespace = _NAMESPACE.get()
        return self.root / namespace if namespace else self.root

    def write(self, attempt_id: str, result: AgentResult) -> Path:
        """Persist ``result`` durably before it is returned; readers never see a torn file."""
        entry = _Pending(self.results_dir, check_attempt_id(attempt_id), result.to_json())
        member = _MEMBER.get()
        if member is None or member.counted:  # not in a batch (or the call's second record): at once
            _flush([entry])
            with _COND:
                self.flushes += 1
        else:
            self._write_in_group(member, entry)
        if entry.error is not None:
            raise entry.error
        assert entry.path is not None
        return entry.path

    def _write_in_group(self, member: _Member, entry: _Pending) -> None:
        group = member.group
        with _COND:
            group.pending.append(entry)
            member.arrive()
            deadline = time.monotonic() + group.linger_s
            while not entry.done:
                if group.flushing:  # a flush that did not take this record: wait for it to end
                    _COND.wait()
                    continue
                remaining = deadline - time.monotonic()
                if group.computing > 0 and remaining > 0:  # more of the batch is coming: flush it together
                    _COND.wait(remaining)
                    continue
                group.flushing = True  # this thread flushes every record of the group waiting now
                batch, group.pending = group.pending, []
                _COND.release()
                try:
                    _flush(batch)
                finally:
                    _COND.acquire()
                    group.flushing = False
                    self.flushes += 1
                    _COND.notify_all()

    def read(self, attempt_id: str) -> AgentResult | None:
        """Return the recorded result, or None if this attempt never finished here."""
        check_attempt_id(attempt_id)
        # the root: records of versions before namespaces; the legacy dir: before the shared location
        directories = [self.results_dir, self.root]
        if self.legacy is not None:
            namespace = _NAMESPACE.get()
            directories += [self.legacy / namespace, self.legacy] if namespace else [self.legacy]
        for directory in dict.fromkeys(directories):
            try:
                data = json.loads((directory / f"{attempt_id}.json").read_bytes())
            except FileNotFoundError:
                continue
            if isinstance(data, dict) and data.get("format") == _BATCH_FORMAT:
                one = data["records"].get(attempt_id)  # None only if the file was tampered with
                return None if one is None else AgentResult.from_json(one)
            return AgentResult.from_json(data)
        return None


def _flush(batch: list[_Pending]) -> None:
    """Make every record of ``batch`` durable: per directory, one data file for all its records."""
    by_dir: dict[Path, list[_Pending]] = {}
    for entry in batch:
        by_dir.setdefault(entry.directory, []).append(entry)
    for directory, entries in by_dir.items():
        try:
            directory.mkdir(parents=True, exist_ok=True)
            if len(entries) == 1 or not _write_group(directory, entries):
                for entry in entries:
                    entry.path = _write_single(directory, entry)
        except BaseException as exc:  # noqa: BLE001 - every waiting writer gets the failure
            for entry in entries:
                entry.error = exc
        for entry in entries:
            entry.done = True


def _write_single(directory: Path, entry: _Pending) -> Path:
    """One record in its own file: tmp + fsync + rename + directory fsync (``app.atomic``)."""
    target = directory / f"{entry.attempt_id}.json"
    payload = json.dumps(entry.data, ensure_ascii=False, sort_keys=True).encode("utf-8")
    write_atomic(target, payload, prefix=f".{entry.attempt_id}.", suffix=".tmp")
    return target


def _write_group(directory: Path, entries: list[_Pending]) -> bool:
    """The records of ``entries`` in one fsync'd data file, hard-linked under every attempt's name,
    then one directory fsync. False (nothing linked) if this filesystem has no hard links."""
    payload = json.dumps({"format": _BATCH_FORMAT, "records": {e.attempt_id: e.data for e in entries}},
                         ensure_ascii=False, sort_keys=True).encode("utf-8")
    with held_temp(directory, payload, prefix=f".group-{secrets.token_hex(8)}.", suffix=".tmp") as tmp_name:
        try:
            for entry in entries:
                target = directory / f"{entry.attempt_id}.json"
                try:
                    os.link(tmp_name, target)
                except FileExistsError:  # an earlier write of this attempt: replaced, as os.replace would
                    link_tmp = directory / f".{entry.attempt_id}.{secrets.token_hex(4)}.tmp"
                    os.link(tmp_name, link_tmp)  # the same (locked) file: gc leaves it alone too
                    os.replace(link_tmp, target)
                except OSError:
                    if entry is entries[0]:
                        return False  # no hard links here (e.g. some network or FUSE filesystems)
                    raise
                entry.path = target
        finally:
            tmp_name.unlink(missing_ok=True)  # the data lives on under the attempts' names
    fsync_dir(directory)  # every name durable (and the data file's, already fsync'd, with it)
    return True


def discard(results_dir: str | os.PathLike[str], namespace: str, attempt_ids: Iterable[str]) -> None:
    """Remove the records of attempts whose completion committed (never needed again)."""
    directory = Path(results_dir) / check_attempt_id(namespace)
    for attempt_id in attempt_ids:
        (directory / f"{check_attempt_id(attempt_id)}.json").unlink(missing_ok=True)


def prune(
    results_dir: str | os.PathLike[str], still_open: Callable[[list[str]], set[str]], *, min_age_s: float,
    dry_run: bool = False, namespaces: Container[str] | None = None, failed: list[tuple[Path, OSError]] | None = None,
) -> list[Path]:
    """Remove records older than ``min_age_s`` whose attempt may no longer be adopted:
    ``still_open(ids)`` returns those of ``ids`` still in flight (their records are kept). Also
    removes stale temp files of interrupted writes. Returns the paths removed (or, dry, removable).
    ``namespaces``: only those namespace directories are considered (the scopes of the database
    ``still_open`` asks: another's attempts are unknown to it, never "in flight"). ``failed``: where
    removals the filesystem refuses go (left out of the result); without it they raise."""
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
        if namespaces is not None and path.parent != root and path.parent.name not in namespaces:
            continue
        if path.suffix == ".tmp":
            temps.append(path)
        elif _ATTEMPT_ID.fullmatch(path.stem):
            candidates.setdefault(path.stem, []).append(path)
    keep = still_open(list(candidates)) if candidates else set()
    removed = [p for attempt_id, paths in candidates.items() if attempt_id not in keep for p in paths] + temps
    return remove_files(removed, is_temp=lambda path: path.suffix == ".tmp", failed=failed, dry_run=dry_run)
