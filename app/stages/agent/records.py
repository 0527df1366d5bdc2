"""Durable per-attempt result records, so another process can adopt a finished local attempt."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from app.stages.base import AgentResult
from app.stages.errors import PermanentError

_ATTEMPT_ID = re.compile(r"^[0-9A-Fa-f][0-9A-Fa-f-]{0,63}$")


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
        self.results_dir = Path(results_dir)

    def write(self, attempt_id: str, result: AgentResult) -> Path:
        """Persist ``result`` durably before it is returned; readers never see a torn file."""
        check_attempt_id(attempt_id)
        self.results_dir.mkdir(parents=True, exist_ok=True)
        target = self.results_dir / f"{attempt_id}.json"
        payload = json.dumps(result.to_json(), ensure_ascii=False, sort_keys=True).encode("utf-8")
        fd, tmp_name = tempfile.mkstemp(
            prefix=f".{attempt_id}.", suffix=".tmp", dir=self.results_dir
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
        dir_fd = os.open(self.results_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # make the rename itself durable
        finally:
            os.close(dir_fd)
        return target

    def read(self, attempt_id: str) -> AgentResult | None:
        """Return the recorded result, or None if this attempt never finished here."""
        check_attempt_id(attempt_id)
        try:
            data = (self.results_dir / f"{attempt_id}.json").read_bytes()
        except FileNotFoundError:
            return None
        return AgentResult.from_json(json.loads(data))
