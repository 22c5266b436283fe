"""``procs.is_port_free`` and ``procs.find_free_port`` bind on the family of the address they are given, so
that a controller host on ``::1`` checks its load balancers' ports where they listen; ``netaddr`` writes an
address before its port."""

from __future__ import annotations

import socket

import pytest

from skyserve_lite import netaddr, procs


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_a_port_in_use_is_not_free_and_is_free_once_closed(host: str) -> None:
    if ":" in host and not _has_ipv6_loopback():
        pytest.skip("this machine has no IPv6 loopback")
    port = procs.find_free_port(host)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as held:
        held.bind((host, port))
        held.listen()
        assert procs.is_port_free(port, host) is False
    assert procs.is_port_free(port, host) is True


@pytest.mark.parametrize(("host", "written"), [
    ("127.0.0.1", "127.0.0.1:30001"),
    ("::1", "[::1]:30001"),
    ("2001:db8::5", "[2001:db8::5]:30001"),
    ("web-1.example", "web-1.example:30001"),
])
def test_an_ipv6_host_is_written_in_brackets_before_its_port(host: str, written: str) -> None:
    assert netaddr.host_port(host, 30001) == written
    assert netaddr.url_host(host) == written.rpartition(":")[0]
    assert netaddr.family_of(host) == (socket.AF_INET6 if host.count(":") else socket.AF_INET)
