"""Settings that every process reads and that no value may turn into a crash, a stall or a busy
loop: refused at start with the variable's name (``Settings.from_env`` → ``SettingsError``), so
``memeflow up``/``api``/``worker``/``beat`` exit 1 with a message instead of failing later."""

from __future__ import annotations

import pytest

from app.config import Settings, SettingsError


@pytest.mark.parametrize(
    ("name", "value"),
    [
        # range(0, n, 0) in the planner's wake-up groups: every upload a 500
        ("MEMEFLOW_VISUAL_BATCH_SIZE", "0"),
        ("MEMEFLOW_EMBEDDING_BATCH_SIZE", "0"),
        ("MEMEFLOW_VISUAL_BATCH_SIZE", "-1"),
        # beat sends a sweep every loop tick; the registry thread upserts in a busy loop
        ("MEMEFLOW_SWEEP_INTERVAL_S", "0"),
        ("MEMEFLOW_SWEEP_INTERVAL_S", "-5"),
        ("MEMEFLOW_WORKER_REGISTRY_INTERVAL_S", "0"),
        # every sweep step selects LIMIT 0: nothing is ever re-hinted or recovered
        ("MEMEFLOW_SWEEP_BATCH_LIMIT", "0"),
        ("MEMEFLOW_REHINT_GRACE_S", "-1"),
        ("MEMEFLOW_BACKOFF_BASE_S", "-1"),
        ("MEMEFLOW_BACKOFF_MAX_S", "-1"),
        # every upload refused / every image "too large"
        ("MEMEFLOW_MAX_UPLOAD_BYTES", "0"),
        ("MEMEFLOW_MAX_IMAGE_PIXELS", "0"),
        ("MEMEFLOW_AGENT_TIMEOUT_S", "0"),
        ("MEMEFLOW_AGENT_DEADLINE_S", "-1"),
        # nan compares false with every bound (so it passed 0 < heartbeat < lease); timedelta(nan)
        # then raised in every claim. inf overflows timedelta the same way.
        ("MEMEFLOW_LEASE_S", "nan"),
        ("MEMEFLOW_HEARTBEAT_S", "nan"),
        ("MEMEFLOW_LEASE_S", "inf"),
        ("MEMEFLOW_SWEEP_INTERVAL_S", "nan"),
        ("MEMEFLOW_BACKOFF_MAX_S", "inf"),
        ("MEMEFLOW_RETENTION_JOBS_S", "nan"),
    ],
)
def test_a_value_that_would_crash_stall_or_spin_is_refused_at_start(name, value):
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: value})


def test_the_defaults_and_the_documented_special_values_still_pass():
    Settings.from_env({})
    Settings.from_env({"MEMEFLOW_REHINT_GRACE_S": "0", "MEMEFLOW_BACKOFF_BASE_S": "0", "MEMEFLOW_BACKOFF_MAX_S": "0",
                       "MEMEFLOW_AGENT_DEADLINE_S": "0", "MEMEFLOW_SEARCH_CUTOVER_CHECK_S": "0",
                       "MEMEFLOW_VISUAL_BATCH_SIZE": "1", "MEMEFLOW_EMBEDDING_BATCH_SIZE": "1"})
