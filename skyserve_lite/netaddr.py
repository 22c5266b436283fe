"""How a host address is written where a port follows it, and which socket family binds it. Pure.

An IPv6 address (``::1``) is written in brackets before a port, in urls (RFC 3986 3.2.2), known_hosts and
``HOST:PORT`` settings alike; a name or an IPv4 address as it is.
"""

from __future__ import annotations

import socket

__all__ = ["family_of", "host_port", "url_host"]


def url_host(host: str) -> str:
    """``host`` as it stands before ``:PORT``: ``[::1]`` for an IPv6 address, else itself."""
    return f"[{host}]" if ":" in host else host


def host_port(host: str, port: int) -> str:
    """``HOST:PORT``, an IPv6 host in brackets (``[::1]:30001``)."""
    return f"{url_host(host)}:{port}"


def family_of(host: str) -> socket.AddressFamily:
    """The socket family that binds ``host`` (an address as written): IPv6 for one with a colon."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET
