"""IPv6 addresses that reach IPv4 ones through a gateway, or lie in reserved space, are judged by
where they lead: a webhook URL must not reach a private network through NAT64 or 6to4."""

from __future__ import annotations

import pytest

from app.netguard import OutboundRefused, allowed_networks, check_outbound_url, outbound_address_allowed


@pytest.mark.parametrize(("address", "ok"), [
    ("64:ff9b::a00:5", False),          # NAT64 → 10.0.0.5
    ("64:ff9b::a9fe:a9fe", False),      # NAT64 → 169.254.169.254 (cloud metadata)
    ("64:ff9b::7f00:1", False),         # NAT64 → 127.0.0.1
    ("64:ff9b::5db8:d822", True),       # NAT64 → 93.184.216.34: a public receiver seen through DNS64
    ("64:ff9b:1::a00:5", False),        # local-use NAT64 prefix (reserved)
    ("2002:a00:1::1", False),           # 6to4 → 10.0.0.1
    ("2002:5db8:d822::1", True),        # 6to4 → 93.184.216.34
    ("::a00:5", False),                 # IPv4-compatible (reserved, deprecated)
    ("::7f00:1", False),
    ("fec0::1", False),                 # site-local (deprecated)
    ("2606:4700::1111", True),
])
def test_gateway_and_reserved_ipv6_are_judged_by_where_they_lead(address, ok):
    assert outbound_address_allowed(address) is ok


def test_an_allowed_network_still_admits_its_addresses_through_nat64():
    assert outbound_address_allowed("64:ff9b::a00:5", allowed_networks("10.0.0.0/8"))


@pytest.mark.parametrize("url", ["http://[64:ff9b::a00:5]/hook", "http://[::a9fe:a9fe]/", "http://[2002:c0a8:101::]/"])
def test_such_a_url_is_refused_as_forbidden(url):
    with pytest.raises(OutboundRefused) as err:
        check_outbound_url(url)
    assert err.value.code == "webhook_url_forbidden"
