"""How many cores this process may use, for sizing local CPU-bound providers.

Local models (OCR through ONNX Runtime, sentence-transformers through torch) each default to one
intra-op thread per core *of the machine*, and their thread pools spin while waiting for work.
Several such pools in one process (an agent batch's concurrent calls) or in several processes (one
worker per lane) then oversubscribe the cores: measured on a 2-core box, PP-OCR with 2 intra-op
threads cost 182 ms of CPU per meme against 112 ms with 1 (docs/performance-log.md §7). memeflow
therefore runs each local inference single-threaded and gets its parallelism from running as many
inferences at once as the process has cores (the local agent's worker runs one hint per core in
threads, see :func:`app.cli.processes.lane_pool`) and from the other lanes' workers.

**Bursts.** At the end of a burst of uploads the embedding worker's last batch runs while no
visual or agent task is queued or running: the other lanes' cores are idle. With
``MEMEFLOW_LOCAL_BURST_CORES`` on (off by default: no gain shown on a shared 2-core box) the worker
then runs that batch inside :func:`burst` with the cores it may use, and a provider made of several models
(the concatenated text provider) computes its parts at once, each still single-threaded
(:func:`run_concurrently`): the same computation, so the same vectors, in about half the time on
two cores. Raising a call's own intra-op threads instead (OpenMP, torch) was measured and not
kept: on a box shared with other work, every parallel region waits for a thread the scheduler
gave away (docs/performance-log.md §35).
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_BURST: contextvars.ContextVar[int] = contextvars.ContextVar("memeflow_burst_cores", default=1)


def available_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota (>= 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


@contextmanager
def burst(cores: int) -> Iterator[None]:
    """Within the block, the local model calls of this thread (and of the threads it starts with
    :func:`run_concurrently`) may keep up to ``cores`` cores busy at once (1: one, the default)."""
    token = _BURST.set(max(1, int(cores)))
    try:
        yield
    finally:
        _BURST.reset(token)


def burst_cores() -> int:
    """The cores this thread's local model calls may use at once right now (see :func:`burst`)."""
    return _BURST.get()


def run_concurrently(calls: Sequence[Callable[[], T]], cores: int) -> list[T]:
    """Each of ``calls``' results, in order, computed on up to ``cores`` threads at once, each in a
    copy of the caller's context (so inside its :func:`burst`). The first exception, in order, is
    raised after every call ended. Threads are started per use: bursts are rare, and no pool
    outlives the call (nothing to inherit across a fork)."""
    if cores <= 1 or len(calls) <= 1:
        return [call() for call in calls]
    with ThreadPoolExecutor(max_workers=min(cores, len(calls)), thread_name_prefix="burst") as pool:
        futures = [pool.submit(contextvars.copy_context().run, call) for call in calls]
    return [f.result() for f in futures]
