"""Workers expose their Prometheus metrics on MEMEFLOW_METRICS_PORT."""

from __future__ import annotations

import urllib.request

from app import metrics


def test_worker_metrics_server_serves_memeflow_counters():
    metrics.CLAIMS.labels("visual").inc()
    port = metrics.serve(0, "127.0.0.1")
    assert metrics.serve(0, "127.0.0.1") == port  # idempotent per process
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'memeflow_claims_total{lane="visual"}' in body
    assert "memeflow_fencing_rejections_total" in body or "memeflow_stage_duration_seconds" in body
