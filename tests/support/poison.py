"""Providers that fail on one poisoned input (or answer it with output the database refuses), for
the batch-isolation tests. Loaded by the
registry's ``module:Class`` names (``MEMEFLOW_VISUAL_PROVIDER=tests.support.poison:…``), so an
in-process orchestrator test and a Celery worker process load them the same way.

An image is poisoned when it is ``POISON_WIDTH`` pixels wide; a document when it contains
``POISON_WORD``; ``CrashVisual`` and ``ExitVisual`` kill the worker on one instead of failing.
Every call is recorded in ``CALLS`` (this process) and, when ``MEMEFLOW_TEST_CALL_LOG`` names a
file, appended to it as one line (other processes).
"""

from __future__ import annotations

import json
import os
import threading

from app.stages import registry
from app.stages.agent.deterministic import DeterministicAgent
from app.stages.errors import PermanentError
from app.stages.images import DecodedImage
from app.stages.text.deterministic import DeterministicTextProvider
from app.stages.visual.deterministic import DeterministicVisualProvider

POISON_WIDTH = 61
POISON_WORD = "POISON"
CALL_LOG_ENV = "MEMEFLOW_TEST_CALL_LOG"

#: One entry per provider call in this process: (lane, [pixels or characters per item], ok).
CALLS: list[tuple[str, list[int], bool]] = []


def reset() -> None:
    """Forget the recorded calls and the cached providers (before and after a test using them)."""
    CALLS.clear()
    registry.clear_cache()
_lock = threading.Lock()


def _record(lane: str, sizes: list[int], ok: bool) -> None:
    with _lock:
        CALLS.append((lane, sizes, ok))
    path = os.environ.get(CALL_LOG_ENV)
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps([lane, sizes, ok]) + "\n").encode())
        finally:
            os.close(fd)


def read_call_log(path) -> list[tuple[str, list[int], bool]]:
    """The calls other processes appended to ``path``."""
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return [tuple(json.loads(line)) for line in fh if line.strip()]


def is_poisoned(image: DecodedImage) -> bool:
    return image.width == POISON_WIDTH


class PoisonItemVisual(DeterministicVisualProvider):
    """Answers a poisoned image with an error in place of its vector; embeds the others."""

    def embed(self, images: list[DecodedImage]):
        _record("visual", [im.width * im.height for im in images], True)
        vectors = super().embed(images)
        return [PermanentError(f"cannot embed this {im.width}x{im.height} image", code="poisoned_image")
                if is_poisoned(im) else v for im, v in zip(images, vectors, strict=True)]


class PoisonMessageVisual(DeterministicVisualProvider):
    """Fails a poisoned image with an error whose message holds NUL and an unpaired surrogate (a
    provider quoting what its model or library said), which no text or jsonb column stores."""

    def embed(self, images: list[DecodedImage]):
        _record("visual", [im.width * im.height for im in images], True)
        vectors = super().embed(images)
        return [PermanentError("the model said: \x00\ud800" + "!" * 100_000, code="poisoned_image")
                if is_poisoned(im) else v for im, v in zip(images, vectors, strict=True)]


class PoisonBatchVisual(DeterministicVisualProvider):
    """The whole call crashes whenever a poisoned image is in it (as a model crashing on one bad
    input would), naming how many images the crashed call held."""

    def embed(self, images: list[DecodedImage]):
        poisoned = any(is_poisoned(im) for im in images)
        _record("visual", [im.width * im.height for im in images], not poisoned)
        if poisoned:
            raise RuntimeError(f"model crashed on a call of {len(images)} images")
        return super().embed(images)


class PoisonBatchText(DeterministicTextProvider):
    """The whole call fails permanently whenever a poisoned document is in it."""

    def embed(self, documents: list[str]):
        poisoned = any(POISON_WORD in d for d in documents)
        _record("embedding", [len(d) for d in documents], not poisoned)
        if poisoned:
            raise PermanentError(f"the model rejected a call of {len(documents)} documents", code="poisoned_document")
        return super().embed(documents)


class PoisonVectorVisual(DeterministicVisualProvider):
    """Answers a poisoned image with a NaN vector (as a broken model would): orjson writes NaN as
    null, which pgvector refuses."""

    def embed(self, images: list[DecodedImage]):
        _record("visual", [im.width * im.height for im in images], True)
        vectors = super().embed(images)
        return [[float("nan")] * len(v) if is_poisoned(im) else v for im, v in zip(images, vectors, strict=True)]


class PoisonZeroVectorVisual(DeterministicVisualProvider):
    """Answers a poisoned image with a vector pgvector stores but cannot compare: all zeros (its
    cosine distance to anything is NaN; an HNSW cosine index leaves it out)."""

    def embed(self, images: list[DecodedImage]):
        _record("visual", [im.width * im.height for im in images], True)
        vectors = super().embed(images)
        return [[0.0] * len(v) if is_poisoned(im) else v for im, v in zip(images, vectors, strict=True)]


class PoisonVectorText(DeterministicTextProvider):
    """Answers a poisoned document with a vector holding 1e39: a finite float, past float4's range."""

    def embed(self, documents: list[str]):
        _record("embedding", [len(d) for d in documents], True)
        vectors = super().embed(documents)
        return [[1e39, *v[1:]] if POISON_WORD in d else v for d, v in zip(documents, vectors, strict=True)]


class PoisonOutputAgent(DeterministicAgent):
    """Answers a poisoned image with pixel facts holding NUL, which no jsonb column stores: the
    worker's context check (app/stages/agent/context_text.py) reads the text fields only, so the
    database's refusal is what fails it (the completion's net, app/worker/run.complete_isolated)."""

    def describe(self, image: DecodedImage, *, attempt_id: str, reverse_image_policy: str):
        result = super().describe(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)
        if is_poisoned(image):
            result.context["facts"] = {**result.context["facts"], "note": "poisoned \x00 facts"}
        return result


class WrongTypesAgent(DeterministicAgent):
    """Answers a poisoned image with a context of the wrong shape — tags a number, the title a
    list (a provider without the openai-compatible parser's checks)."""

    def describe(self, image: DecodedImage, *, attempt_id: str, reverse_image_policy: str):
        result = super().describe(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)
        if is_poisoned(image):
            result.context["tags"] = 5
            result.context["title"] = ["a", "list"]
        return result


class OverlongContextAgent(DeterministicAgent):
    """Answers a poisoned image with a context PostgreSQL stores but a human could not save back
    (PATCH /images/{id}): OCR text, title and a tag past the API's limits (app/stages/agent/limits.py)."""

    def describe(self, image: DecodedImage, *, attempt_id: str, reverse_image_policy: str):
        result = super().describe(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)
        if is_poisoned(image):
            result.context.update(ocr_text="word " * 6000, title="t" * 600, tags=["x" * 500])
        return result


def nested(depth: int) -> dict:
    """``{"a": {"a": … {}}}``, ``depth`` objects deep (built without recursion)."""
    inner: dict = {}
    for _ in range(depth - 1):
        inner = {"a": inner}
    return inner


class DeepFactsAgent(DeterministicAgent):
    """Answers a poisoned image with pixel facts nested 100 000 objects deep: no JSON encoder of
    the completion can write them (RecursionError), which no refusal net caught."""

    def describe(self, image: DecodedImage, *, attempt_id: str, reverse_image_policy: str):
        result = super().describe(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)
        if is_poisoned(image):
            result.context["facts"] = nested(100_000)
        return result


class NaNFactsAgent(DeterministicAgent):
    """Answers a poisoned image with pixel facts holding NaN and infinity, which jsonb cannot store
    (the completion's encoder silently wrote them as null)."""

    def describe(self, image: DecodedImage, *, attempt_id: str, reverse_image_policy: str):
        result = super().describe(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)
        if is_poisoned(image):
            result.context["facts"] = {**result.context["facts"], "mean": float("nan"), "peak": float("inf")}
        return result


class HostileNamesAgent(DeterministicAgent):
    """Answers a poisoned image with a good context under names no column should store: its model
    holds NUL, its request id is 10 000 characters (a plugin without openai-compatible's checks)."""

    def describe(self, image: DecodedImage, *, attempt_id: str, reverse_image_policy: str):
        result = super().describe(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)
        if is_poisoned(image):
            result.model, result.request_id = "served\x00model", "r" * 10_000
        return result


def overlong_lexical_text(chars: int = 120_000) -> str:
    """Random Hangul syllables (nearly every bigram distinct): a text whose lexical document (bigrams and
    characters, app/search/lexical.py) passes PostgreSQL's 1 MB tsvector limit."""
    import random

    pick = random.Random(0).randrange
    return "".join(chr(0xAC00 + pick(11172)) for _ in range(chars))


class OverlongTextAgent(DeterministicAgent):
    """Answers a poisoned image with an OCR text past every limit the remote agent's parser and
    the API apply (a provider without those checks), whose lexical document PostgreSQL refuses
    ("string is too long for tsvector": a program limit, not a data error)."""

    def describe(self, image: DecodedImage, *, attempt_id: str, reverse_image_policy: str):
        result = super().describe(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)
        if is_poisoned(image):
            result.context["ocr_text"] = overlong_lexical_text()
        return result


class ProcessDied(BaseException):
    """In-process stand-in for a worker process that dies mid-call: no handler catches it (not an
    ``Exception``), so none of the batch's claims gets a terminal write, as after a real death."""


class CrashVisual(DeterministicVisualProvider):
    """Kills the worker whenever a poisoned image is in the call (a decoder or model segfault, an
    OOM kill): here by raising ``ProcessDied`` through the caller."""

    def embed(self, images: list[DecodedImage]):
        poisoned = any(is_poisoned(im) for im in images)
        _record("visual", [im.width * im.height for im in images], not poisoned)
        if poisoned:
            self.die()
        return super().embed(images)

    def die(self) -> None:
        raise ProcessDied()


class ExitVisual(CrashVisual):
    """``CrashVisual`` for a real worker process: it exits at once (``os._exit``: no cleanup, no
    exception handler, no acknowledgement), as a segfault would."""

    def die(self) -> None:
        os._exit(70)


class ExitAgent(DeterministicAgent):
    """A recall-safe local agent (as ``local-ocr``) whose process exits at once (``os._exit``, as
    a segfault or an OOM kill) when it is given a poisoned image."""

    recall_safe = True

    def describe(self, image: DecodedImage, *, attempt_id: str, reverse_image_policy: str):
        _record("agent", [image.width * image.height], not is_poisoned(image))
        if is_poisoned(image):
            os._exit(70)
        return super().describe(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)


class SimulatedProcess:
    """One worker process of several task threads, simulated in the test process: when one of its
    calls kills it, every call of it still in flight dies with it (``ThreadedCrashVisual``)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.in_flight = 0
        self.dead = False


#: The process ``ThreadedCrashVisual``'s calls run in (a test starts a new one per simulated worker).
PROCESS = SimulatedProcess()


def new_process() -> SimulatedProcess:
    global PROCESS
    PROCESS = SimulatedProcess()
    return PROCESS


class ThreadedCrashVisual(DeterministicVisualProvider):
    """``CrashVisual`` in a worker of several threads: a call holding a poisoned image waits (at most
    ``COMPANION_WAIT_S``) for another call of its process to be in flight — as in a threads pool
    whose threads run side by side — then kills the process; a call in flight then dies with it
    (a healthy call lingers ``GRACE_S`` first, so a poisoned one running beside it gets there)."""

    COMPANION_WAIT_S = 2.0
    GRACE_S = 1.0

    def embed(self, images: list[DecodedImage]):
        process = PROCESS
        poisoned = any(is_poisoned(im) for im in images)
        _record("visual", [im.width * im.height for im in images], not poisoned)
        with process.cond:
            if process.dead:
                raise ProcessDied()
            process.in_flight += 1
            process.cond.notify_all()
            try:
                if poisoned:
                    process.cond.wait_for(lambda: process.in_flight > 1, timeout=self.COMPANION_WAIT_S)
                    process.dead = True
                    process.cond.notify_all()
                    raise ProcessDied()
                if process.cond.wait_for(lambda: process.dead, timeout=self.GRACE_S):
                    raise ProcessDied()
            finally:
                process.in_flight -= 1
        return super().embed(images)


class PoisonQueryText(DeterministicTextProvider):
    """Embeds documents as ``deterministic`` does, but answers a search query holding
    ``POISON_WORD`` with NaN, ``ZEROWORD`` with all zeros and ``HUGEWORD`` with an element past
    float4 (a broken or hostile plugin model): the vectors a stored embedding could never be."""

    def embed_query(self, queries: list[str]) -> list[list[float]]:
        vectors = super().embed_query(queries)
        out = []
        for q, v in zip(queries, vectors, strict=True):
            if POISON_WORD.lower() in q.lower():
                v = [float("nan")] * len(v)
            elif "zeroword" in q.lower():
                v = [0.0] * len(v)
            elif "hugeword" in q.lower():
                v = [1e39, *v[1:]]
            out.append(v)
        return out


def hang_forever() -> None:
    """Block the calling thread for ever (a deadlocked or looping model call): only the end of its
    process gets it out."""
    threading.Event().wait()


class HangVisual(DeterministicVisualProvider):
    """Never returns from a call holding a poisoned image (a model that deadlocks on one input)."""

    def embed(self, images: list[DecodedImage]):
        poisoned = any(is_poisoned(im) for im in images)
        _record("visual", [im.width * im.height for im in images], not poisoned)
        if poisoned:
            hang_forever()
        return super().embed(images)


class HangAgent(DeterministicAgent):
    """A recall-safe local agent (as ``local-ocr``) whose call never returns on a poisoned image."""

    recall_safe = True

    def describe(self, image: DecodedImage, *, attempt_id: str, reverse_image_policy: str):
        _record("agent", [image.width * image.height], not is_poisoned(image))
        if is_poisoned(image):
            hang_forever()
        return super().describe(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)


class HangPaidAgent(DeterministicAgent):
    """A plugin agent that does not declare itself recall-safe (a paid call, as far as memeflow
    knows) whose call never returns on a poisoned image: it must never be called twice."""

    recall_safe = False

    def describe(self, image: DecodedImage, *, attempt_id: str, reverse_image_policy: str):
        _record("agent", [image.width * image.height], not is_poisoned(image))
        if is_poisoned(image):
            hang_forever()
        return super().describe(image, attempt_id=attempt_id, reverse_image_policy=reverse_image_policy)
