"""The exposure guards as pure functions: loopback detection, the bind check, the Host allow-list."""

from __future__ import annotations

import pytest

from app.config import Settings
from app.netguard import UnsafeBind, allowed_hosts, check_bind, host_allowed, is_loopback, split_bind


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "LOCALHOST", "unix:/tmp/s"])
def test_loopback_addresses(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "", "::", "*", "10.0.0.5", "192.168.1.2", "fe80::1", "2001:db8::1",
                                  "no-such-host.invalid"])
def test_remote_addresses(host):
    assert not is_loopback(host)


@pytest.mark.parametrize(("bind", "host"), [("0.0.0.0:5000", "0.0.0.0"), ("[::1]:80", "::1"),
                                            ("unix:/run/x.sock", "unix:/run/x.sock"), ("localhost", "localhost"),
                                            ("::", "::")])
def test_split_bind(bind, host):
    assert split_bind(bind) == host


def test_auth_none_refuses_a_remote_bind_with_a_clear_message():
    s = Settings(auth="none")
    check_bind(s, "127.0.0.1")
    with pytest.raises(UnsafeBind) as err:
        check_bind(s, "0.0.0.0")
    msg = str(err.value)
    assert "MEMEFLOW_AUTH=none" in msg and "MEMEFLOW_ALLOW_UNAUTHENTICATED_REMOTE=1" in msg and "0.0.0.0" in msg
    check_bind(Settings(auth="none", allow_unauthenticated_remote=True), "0.0.0.0")
    check_bind(Settings(auth="token"), "0.0.0.0")


def test_opt_in_is_read_from_the_environment():
    s = Settings.from_env({"MEMEFLOW_ALLOW_UNAUTHENTICATED_REMOTE": "1"})
    assert s.allow_unauthenticated_remote
    check_bind(s, "0.0.0.0")


def test_default_allowed_hosts_are_loopback_names_and_the_bind_address():
    assert allowed_hosts(Settings()) == {"localhost", "127.0.0.1", "::1"}
    assert allowed_hosts(Settings(api_host="0.0.0.0")) == {"localhost", "127.0.0.1", "::1"}
    assert allowed_hosts(Settings(api_host="10.1.2.3")) == {"localhost", "127.0.0.1", "::1", "10.1.2.3"}


def test_configured_allowed_hosts_and_the_star_opt_out():
    assert allowed_hosts(Settings(allowed_hosts="api.example.com, .corp.example")) == {"api.example.com",
                                                                                        ".corp.example"}
    assert allowed_hosts(Settings(allowed_hosts="*")) is None


@pytest.mark.parametrize(("header", "ok"), [
    ("localhost", True), ("localhost:5000", True), ("127.0.0.1:8080", True), ("[::1]:5000", True),
    ("LocalHost.", True), ("evil.example", False), ("evil.example:5000", False), ("127.0.0.1.evil.example", False),
    ("", False), (None, False), ("[::1", False), ("localhost.evil.example", False),
])
def test_host_header_matching(header, ok):
    assert host_allowed(header, frozenset({"localhost", "127.0.0.1", "::1"})) is ok


def test_subdomain_entries():
    allowed = frozenset({".corp.example"})
    assert host_allowed("corp.example", allowed) and host_allowed("a.b.corp.example:443", allowed)
    assert not host_allowed("evilcorp.example", allowed)
    assert host_allowed("anything", None)
