"""How many cores this process may use, for sizing local CPU-bound providers.

Local models (OCR through ONNX Runtime, sentence-transformers through torch) each default to one
intra-op thread per core *of the machine*, and their thread pools spin while waiting for work.
Several such pools in one process (an agent batch's concurrent calls) or in several processes (one
worker per lane) then oversubscribe the cores: measured on a 2-core box, PP-OCR with 2 intra-op
threads cost 182 ms of CPU per meme against 112 ms with 1 (docs/performance.md §7). memeflow
therefore runs each local inference single-threaded and gets its parallelism from running as many
inferences at once as the process has cores (the local agent's worker runs one hint per core in
threads, see :func:`app.cli.processes.lane_pool`) and from the other lanes' workers.
"""

from __future__ import annotations

import os
from pathlib import Path


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
