"""Telling a service's own endpoint from whatever else answers on its port.

Every load balancer answers ``GET /.sky-lite/identity`` itself, before API keys, rate limits and the
replicas (``lb.proxy.IDENTITY_PATH``), with JSON naming its service, the ``controller_id`` of the state it
belongs to (each state directory, or database, has its own) and its pid::

    {"controller_id": "3f9a0c1d2e4b", "pid": 41230, "service": "minimal"}

A wait (`serve up`) or a status asks that path, never a bare TCP connect: on a host with two state
directories, port 30001 may well accept connections while being another state's load balancer, or a
service of the same name in another home.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

__all__ = ["IDENTITY_HEADER", "IDENTITY_PATH", "EndpointIdentity", "find_identity_problem", "read_endpoint_identity"]

# The reserved path every load balancer answers itself. Under ``/.sky-lite/``, which no replica's path is
# expected to use. Outside ``lb`` and stdlib-only, so that `serve status` and the waits load none of the load
# balancer's modules or libraries.
IDENTITY_PATH: Final = "/.sky-lite/identity"
# Its answer carries the service name in this header too, for a HEAD or a quick ``curl -I``.
IDENTITY_HEADER: Final = "X-Sky-Lite-Service"


@dataclass(frozen=True)
class EndpointIdentity:
    """What an endpoint said it is."""

    service: str
    controller_id: str
    pid: int


class TimedOut(str):
    """``read_endpoint_identity``'s sentence for an endpoint whose host sent nothing back within the timeout
    (packets dropped: a host gone), as opposed to one that refused at once or answered: a ``str`` like every
    other reason, told apart by its type."""

    __slots__ = ()


def read_endpoint_identity(endpoint: str, timeout_seconds: float = 2.0) -> EndpointIdentity | str:
    """Ask ``endpoint`` (``http://HOST:PORT`` or ``https://``) who it is: its identity, or a sentence saying
    why there is none (nothing listens, it answered something else). Never raises for network trouble.

    Over HTTPS the certificate is not checked: the question is which load balancer answers, not whether the
    service's certificate is trusted here (a self-signed one is common), and the answer holds no secret.
    """
    parts = urlsplit(endpoint)
    host, port = parts.hostname or "", parts.port
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        import ssl  # only for an https endpoint: `serve status` of plain ones does not load it

        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        connection = http.client.HTTPSConnection(host, port, timeout=timeout_seconds, context=context)
    else:
        connection = http.client.HTTPConnection(host, port, timeout=timeout_seconds)
    try:
        connection.request("GET", IDENTITY_PATH)
        response = connection.getresponse()
        body = response.read(64 * 1024)
    except (OSError, http.client.HTTPException) as exc:
        said = f"nothing answers at {endpoint} ({exc.__class__.__name__}: {exc})"
        return TimedOut(said) if isinstance(exc, TimeoutError) else said
    finally:
        connection.close()
    if response.status != 200:
        return f"{endpoint} is not a sky-lite load balancer ({IDENTITY_PATH} answered {response.status})"
    try:
        document = json.loads(body)
        return EndpointIdentity(str(document["service"]), str(document["controller_id"]), int(document["pid"]))
    except (ValueError, TypeError, KeyError):
        return f"{endpoint} is not a sky-lite load balancer ({IDENTITY_PATH} answered no identity)"


def find_identity_problem(identity: EndpointIdentity | str, service: str, controller_id: str | None,
                          endpoint: str) -> str | None:
    """None when ``identity`` is ``service``'s load balancer of the controller ``controller_id`` (None: any
    controller, for an older host that does not say), else why not, in one sentence. Pure."""
    if isinstance(identity, str):
        return identity
    if identity.service != service or (controller_id is not None and identity.controller_id != controller_id):
        return (f"{endpoint} is the endpoint of service {identity.service!r} of controller "
                f"{identity.controller_id} (pid {identity.pid}), not of this service yet")
    return None
