"""Providers for the chaos test, loaded in worker processes by ``module:Class`` names.

``AttemptRecordingAgent`` logs every paid call with its attempt id (``agent <pid> <attempt_id>
<pixel key>``), lets the deterministic agent record the result under that attempt id (so a
recovering claim can adopt it via ``lookup``), then lingers a little so a SIGKILL often lands
inside the call.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

from app.stages.agent.deterministic import DeterministicAgent
from app.stages.images import DecodedImage
from tests.integration.fakes import pixel_key, record_call

AGENT_LINGER_ENV = "MEMEFLOW_TEST_AGENT_LINGER_S"


class AttemptRecordingAgent(DeterministicAgent):
    name = "attempt-recording-agent"

    def describe(self, image: DecodedImage, *, attempt_id: str, reverse_image_policy: str):
        record_call("agent", f"{attempt_id} {pixel_key(image)}")
        result = super().describe(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)
        time.sleep(float(os.environ.get(AGENT_LINGER_ENV, "0")))  # the "server" answers slowly
        return result

    def lookup(self, attempt_id: str, *, image: DecodedImage | None = None):
        found = super().lookup(attempt_id, image=image)
        record_call("lookup", f"{attempt_id} {found.status}")
        return found


def agent_calls(path: Path) -> Iterator[tuple[int, str, str]]:
    """(pid, attempt_id, pixel key) per recorded paid agent call."""
    if not path.exists():
        return
    for line in path.read_text().splitlines():
        parts = line.split(" ")
        if parts[0] == "agent":
            yield int(parts[1]), parts[2], parts[3]


def recorded(path: Path, stage: str) -> list[str]:
    """Keys of every line recorded for ``stage`` (e.g. ``hint-dropped``, ``lookup``)."""
    if not path.exists():
        return []
    return [line.split(" ", 2)[2] for line in path.read_text().splitlines() if line.split(" ", 1)[0] == stage]
