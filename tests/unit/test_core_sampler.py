"""The real-provider bench's core sampler (``bench/real_pipeline.CoreSampler``): it measures the
processes it is given up to the moment it stops, and reports the CPU it used itself."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.real_pipeline import _TICK, CoreSampler, _proc_ticks


def test_sampler_covers_the_window_to_its_stop_and_counts_a_busy_process():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)  # the child is running
        ticks0, t0 = _proc_ticks(spinner.pid), time.time()
        with CoreSampler(lambda: [spinner.pid]) as sampler:
            start = time.time()
            time.sleep(1.13)  # not a multiple of the processes' read interval: the last samples are pending
            end = time.time()
        ticks1, t1 = _proc_ticks(spinner.pid), time.time()
        s = sampler.summary(start, end, [("all", start, end)])
    finally:
        spinner.kill()
        spinner.wait()
    assert sampler.samples, "no samples"
    # the samples still pending when it stopped were flushed: the window is covered to its end
    assert sampler.samples[-1][0] >= end - 2 * sampler.period_s
    assert s["all"]["s"] >= 0.9 * (end - start)
    # the spinner's busy share is what the scheduler gave it (about a core on a quiet box, much less
    # on a loaded one): the sampler must read what /proc says it used over the same window — a
    # sampler that dropped the process would read 0
    used = (ticks1 - ticks0) / _TICK / (t1 - t0)
    assert abs(s["all"]["own_busy"] - used) <= 0.1 + 0.25 * used, (s["all"]["own_busy"], used)
    assert used < 0.05 or s["all"]["own_busy"] > 0
    assert s["all"]["own_busy"] <= sampler.cores + 0.01
    assert s["all"]["box_busy"] >= s["all"]["own_busy"] - 0.2
    assert 0.0 < sampler.cpu_s < 1.13  # it reports what it used itself, and used less than its window
