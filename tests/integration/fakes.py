"""Providers for the integration tests, loaded in worker processes by ``module:Class`` names.

They wrap the deterministic providers and append one line per provider invocation to the file
named by ``MEMEFLOW_TEST_CALL_LOG`` (``O_APPEND`` writes of one short line are atomic), so a
test can count calls across processes. ``BlockingAgent`` additionally parks inside the call.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

from app.stages.agent.deterministic import DeterministicAgent
from app.stages.images import DecodedImage
from app.stages.text.deterministic import DeterministicTextProvider
from app.stages.visual.deterministic import DeterministicVisualProvider

CALL_LOG_ENV = "MEMEFLOW_TEST_CALL_LOG"
GATE_DIR_ENV = "MEMEFLOW_TEST_GATE_DIR"


def pixel_key(image: DecodedImage) -> str:
    return hashlib.sha256(image.image.tobytes()).hexdigest()[:16]


def write_gate(path: Path, content: str) -> None:
    """Write a gate file whole: a test polling for it reads all of its content or no file at all
    (a plain write_text creates it empty first, and a reader between the two saw '')."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(content)
    os.replace(tmp, path)


def record_call(stage: str, key: str) -> None:
    path = os.environ.get(CALL_LOG_ENV)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{stage} {os.getpid()} {key}\n".encode())
    finally:
        os.close(fd)


def read_calls_by_pid(path: Path) -> list[tuple[str, int, str]]:
    """(stage, pid, key) per recorded line."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        stage, pid, key = line.split(" ", 2)
        out.append((stage, int(pid), key))
    return out


def read_calls(path: Path) -> list[tuple[str, str]]:
    """(stage, key) per recorded invocation."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        stage, _pid, key = line.split(" ", 2)
        out.append((stage, key))
    return out


class CountingVisual(DeterministicVisualProvider):
    name = "counting-visual"

    def __init__(self, **options) -> None:
        record_call("init-visual", "-")  # proves which processes load which stage's "model"
        super().__init__(**options)

    def embed(self, images: list[DecodedImage]) -> list[list[float]]:
        for image in images:
            record_call("visual", pixel_key(image))
        return super().embed(images)


class FlakyVisual(CountingVisual):
    """``CountingVisual`` whose first call for each image fails with a retryable error (a flaky
    provider), across processes: ``visual-failed <key>`` in the call log marks an image as failed once."""

    name = "flaky-visual"

    def embed(self, images: list[DecodedImage]) -> list[list[float]]:
        from app.stages.errors import RetryableError

        path = os.environ.get(CALL_LOG_ENV)
        failed = {key for stage, key in read_calls(Path(path))} if path else set()
        for image in images:
            key = pixel_key(image)
            if key not in failed:
                record_call("visual-failed", key)
                raise RetryableError("the provider is busy; try again", code="provider_busy")
        return super().embed(images)


class CountingAgent(DeterministicAgent):
    name = "counting-agent"

    def __init__(self, **options) -> None:
        record_call("init-agent", "-")
        super().__init__(**options)

    def describe(self, image: DecodedImage, *, attempt_id: str, reverse_image_policy: str):
        record_call("agent", pixel_key(image))
        return super().describe(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)


class CountingText(DeterministicTextProvider):
    name = "counting-text"

    def __init__(self, **options) -> None:
        record_call("init-text", "-")
        super().__init__(**options)

    def embed(self, documents: list[str]) -> list[list[float]]:
        for doc in documents:
            record_call("text", hashlib.sha256(doc.encode()).hexdigest()[:16])
        return super().embed(documents)


class OverlapText(CountingText):
    """``CountingText`` whose first two calls in a process wait for each other inside
    the call (up to 15 s): ``text-overlap met`` is logged by each when two ran at once, ``text-overlap alone``
    when the first waited in vain (the worker runs its batches one after another; the second call
    then finds the barrier broken and logs it too)."""

    name = "overlap-text"
    _lock = threading.Lock()
    _calls = 0
    _barrier = threading.Barrier(2)

    def embed(self, documents: list[str]) -> list[list[float]]:
        with OverlapText._lock:
            OverlapText._calls += 1
            first_two = OverlapText._calls <= 2
        if first_two:
            try:
                OverlapText._barrier.wait(timeout=15)
                record_call("text-overlap", "met")
            except threading.BrokenBarrierError:
                record_call("text-overlap", "alone")
        return super().embed(documents)


class BlockingAgent(DeterministicAgent):
    """Records its result (the "server" did the work), then parks until ``<gate>/release`` exists.

    ``<gate>/entered`` tells the test the worker is inside the call; killing the worker there
    leaves an ``external_started`` attempt whose result ``lookup`` can still find.
    """

    name = "blocking-agent"

    def describe(self, image: DecodedImage, *, attempt_id: str, reverse_image_policy: str):
        record_call("agent", pixel_key(image))
        result = super().describe(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)
        gate = Path(os.environ[GATE_DIR_ENV])
        write_gate(gate / "entered", attempt_id)
        deadline = time.monotonic() + 120
        while not (gate / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return result


class BlockingVisual(DeterministicVisualProvider):
    """The first call parks inside ``embed`` (after writing ``entered-visual``) until
    ``<gate>/release-visual`` exists; later calls run straight through."""

    name = "blocking-visual"

    def embed(self, images: list[DecodedImage]) -> list[list[float]]:
        for image in images:
            record_call("visual", pixel_key(image))
        gate = Path(os.environ[GATE_DIR_ENV])
        if (gate / "entered-visual").exists():  # only the first execution parks
            return super().embed(images)
        write_gate(gate / "entered-visual", str(os.getpid()))
        deadline = time.monotonic() + 120
        while not (gate / "release-visual").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return super().embed(images)



class FaultyPublisher:
    """Wraps a publisher: drops 30% of hints and sends 30% twice (seeded per process)."""

    def __init__(self, inner, drop: float = 0.3, dup: float = 0.3, seed: int | None = None) -> None:
        import random

        self.inner, self.drop, self.dup = inner, drop, dup
        self.rng = random.Random(seed if seed is not None else os.getpid())

    def publish(self, hints) -> None:
        out = []
        for hint in hints:
            r = self.rng.random()
            if r < self.drop:
                record_call("hint-dropped", str(hint.task_id))
                continue
            out.append(hint)
            if r < self.drop + self.dup:
                out.append(hint)
        self.inner.publish(out)


def faulty_celery_publisher(celery_app) -> FaultyPublisher:
    """``MEMEFLOW_WORKER_PUBLISHER`` factory for worker processes."""
    from app.publisher import CeleryHintPublisher

    return FaultyPublisher(CeleryHintPublisher(celery_app))


class RecordingPublisher:
    """Wraps a publisher: records every hint it is handed (``hint-published <lane>``) in the call log."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def publish(self, hints) -> None:
        hints = list(hints)
        for hint in hints:
            record_call("hint-published", str(hint.lane))
        self.inner.publish(hints)


def recording_celery_publisher(celery_app) -> RecordingPublisher:
    """``MEMEFLOW_WORKER_PUBLISHER`` factory: a worker's published hints, by lane, in the call log."""
    from app.publisher import CeleryHintPublisher

    return RecordingPublisher(CeleryHintPublisher(celery_app))


class ParkingLocalAgent(DeterministicAgent):
    """A recall-safe local agent (as ``local-ocr``): its first call parks inside (writing
    ``<gate>/entered``) *before* any result exists, until ``<gate>/release``; later calls run
    straight through. Killing the worker there leaves an attempt no lookup can adopt."""

    name = "parking-local-agent"
    recall_safe = True

    def describe(self, image: DecodedImage, *, attempt_id: str, reverse_image_policy: str):
        record_call("agent", pixel_key(image))
        gate = Path(os.environ[GATE_DIR_ENV])
        if not (gate / "entered").exists():
            write_gate(gate / "entered", str(os.getpid()))
            deadline = time.monotonic() + 120
            while not (gate / "release").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
        return super().describe(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)
