from pathlib import Path

import pytest

from app.config import Settings, SettingsError
from app.scopes import InvalidScopeId, validate_scope_id


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "a\\b", "x\ny", "\x00", "x" * 129, 5])
def test_invalid_scope_ids(bad):
    with pytest.raises(InvalidScopeId):
        validate_scope_id(bad)


@pytest.mark.parametrize("good", ["local", "a.b", "...", "x" * 128, "租户"])
def test_valid_scope_ids(good):
    assert validate_scope_id(good) == good


def test_settings_from_env_types_and_defaults():
    s = Settings.from_env(
        {
            "MEMEFLOW_LEASE_S": "1.5",
            "MEMEFLOW_HEARTBEAT_S": "0.25",
            "MEMEFLOW_AGENT_LANE_LIMIT": "2",
            "MEMEFLOW_VAR_DIR": "/tmp/x",
            "MEMEFLOW_LOG_JSON": "false",
            "MEMEFLOW_DATABASE_URL": "postgresql://h/db",
        }
    )
    assert s.lease_s == 1.5 and s.heartbeat_s == 0.25 and s.agent_lane_limit == 2
    assert s.var_dir == Path("/tmp/x") and s.log_json is False
    assert s.database_url == "postgresql://h/db" and s.broker_url is None
    assert s.max_upload_bytes == 20 * 1024 * 1024 and s.auth == "none" and s.api_port == 5000


@pytest.mark.parametrize(
    "env",
    [{"MEMEFLOW_AUTH": "maybe"}, {"MEMEFLOW_LEASE_S": "abc"}, {"MEMEFLOW_HEARTBEAT_S": "100"}, {"MEMEFLOW_LOG_JSON": "2"}],
)
def test_settings_reject_bad_values(env):
    with pytest.raises(SettingsError):
        Settings.from_env(env)
