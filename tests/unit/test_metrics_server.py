"""Workers expose their Prometheus metrics on MEMEFLOW_METRICS_PORT."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from app import metrics


def test_worker_metrics_server_serves_memeflow_counters():
    metrics.CLAIMS.labels("visual").inc()
    port = metrics.serve(0, "127.0.0.1")
    assert metrics.serve(0, "127.0.0.1") == port  # idempotent per process
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'memeflow_claims_total{lane="visual"}' in body
    assert "memeflow_fencing_rejections_total" in body or "memeflow_stage_duration_seconds" in body


def test_worker_metrics_require_the_metrics_token_when_one_is_set():
    """MEMEFLOW_METRICS_TOKEN guards every metrics endpoint, the workers' as the API's: a worker's
    metrics listen on 0.0.0.0 by default and show every tenant's activity."""
    server = metrics.start_server(0, "127.0.0.1", token="s3cret")
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"},
                        {"Authorization": "Bearer s3cret\u00e9"}):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5)
            assert refused.value.code == 401
            assert json.loads(refused.value.read())["error"] == "unauthorized"
        ok = urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": "Bearer s3cret"}), timeout=5)
        assert "memeflow_claims_total" in ok.read().decode()
    finally:
        server.shutdown()
        server.server_close()
