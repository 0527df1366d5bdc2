"""Pure webhook rules: outbound address policy, URL checks without DNS, the retry decision, the
signature, and which pool a webhooks worker runs."""

from __future__ import annotations

import random
from datetime import datetime, timezone

import pytest

from app.cli.processes import lane_pool
from app.config import Settings
from app.netguard import OutboundRefused, allowed_networks, check_outbound_url, outbound_address_allowed
from app.orchestrator.retry import decide_delivery_retry
from app.worker.webhook_sender import signature, verify


@pytest.mark.parametrize(("address", "ok"), [
    ("93.184.216.34", True), ("2606:4700::1111", True),
    ("127.0.0.1", False), ("::1", False), ("10.0.0.1", False), ("172.16.5.4", False), ("192.168.1.1", False),
    ("169.254.169.254", False), ("fe80::1", False), ("100.64.0.1", False), ("0.0.0.0", False),
    ("224.0.0.1", False), ("::ffff:127.0.0.1", False), ("fc00::1", False),
])
def test_only_public_addresses_by_default(address, ok):
    assert outbound_address_allowed(address) is ok


def test_allowed_networks_are_explicit_exceptions():
    nets = allowed_networks("127.0.0.0/8, 10.1.0.0/16")
    assert outbound_address_allowed("127.0.0.1", nets) and outbound_address_allowed("10.1.2.3", nets)
    assert not outbound_address_allowed("10.2.0.1", nets) and not outbound_address_allowed("::1", nets)


@pytest.mark.parametrize(("url", "code"), [
    ("gopher://x/", "invalid_webhook_url"), ("http:///x", "invalid_webhook_url"),
    ("http://a b/", "invalid_webhook_url"), ("http://x:99999/", "invalid_webhook_url"),
    ("https://u@x/", "invalid_webhook_url"), ("http://x/" + "y" * 2048, "webhook_url_too_long"),
])
def test_url_shape(url, code):
    with pytest.raises(OutboundRefused) as err:
        check_outbound_url(url, resolve=False)
    assert err.value.code == code


def test_url_parts_without_resolving():
    assert check_outbound_url("HTTPS://Example.com/h?q=1", resolve=False) == ("https", "example.com", 443, [])


def test_delivery_retry_backs_off_with_jitter_then_gives_up():
    now = datetime(2026, 12, 1, tzinfo=timezone.utc)
    rand = random.Random(1)
    first = decide_delivery_retry(1, max_attempts=3, now=now, base_s=1, max_s=10, rand=rand)
    second = decide_delivery_retry(2, max_attempts=3, now=now, base_s=1, max_s=10, rand=rand)
    assert not first.give_up and 0.5 <= (first.available_at - now).total_seconds() <= 1
    assert 1 <= (second.available_at - now).total_seconds() <= 2
    assert decide_delivery_retry(3, max_attempts=3, now=now, base_s=1, max_s=10).give_up


def test_signature_verifies_only_with_the_secret_body_and_a_fresh_timestamp():
    body = b'{"id":1}'
    header = f"t=1000,v1={signature('whsec_a', 1000, body)}"
    assert verify("whsec_a", header, body, now=1010)
    assert not verify("whsec_b", header, body, now=1010)
    assert not verify("whsec_a", header, body + b" ", now=1010)
    assert not verify("whsec_a", header, body, now=5000)  # replayed later
    assert not verify("whsec_a", "garbage", body, now=1010)


def test_a_webhooks_worker_runs_threads_unless_told_otherwise():
    assert lane_pool(Settings(), ["webhooks"]) == ("threads", 8)
    assert lane_pool(Settings(), ["visual"]) == ("solo", 1)
    assert lane_pool(Settings(), ["visual", "webhooks"]) == ("solo", 1)
