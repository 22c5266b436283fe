"""The upstream client contract: how the load balancer sends one request to a replica and reads the answer.

The contract is ``UpstreamClient`` (below); ``LoadBalancer`` takes a factory of one. The implementation is
``PooledUpstream`` (``pooled_upstream``): HTTP/1.1 keep-alive connections per replica url on plain asyncio
protocols, the request head and a buffered body in one ``transport.write``, the response framed by
llhttp (``http1.ResponseParser``): Content-Length, chunked, bodies that end with the connection, and no body
for HEAD, 1xx, 204 and 304. It does per request only what a proxy needs: about a
third less CPU per proxied request than aiohttp's ``ClientSession`` did (figures in docs/benchmarks.md).

A request that asks for a protocol switch (``upgrade``, a WebSocket handshake) and gets ``101 Switching
Protocols`` leaves HTTP behind: ``UpstreamResponse.tunnel`` then carries raw bytes both ways.

Errors, raised by ``UpstreamClient.request`` and by reading a response body, with the lower library's
error as ``__cause__``::

    UpstreamError              the replica's answer is unusable: an invalid response, a body cut off
     +-- UpstreamConnectError  nothing was sent: no connection could be made, or the pooled connection
     |                         was closed before the request's first byte; any request may be sent again
     +-- UpstreamResetError    the connection broke before the first byte of a response: the replica may
     |                         have seen the request, so only a body that can be sent again may be sent
     |                         again, and only for a method that may be repeated
     +-- UpstreamTimeoutError  no response head within the response timeout; the replica may still be
                               working on the request
"""

from __future__ import annotations

from typing import Final, Protocol

import aiohttp

from skyserve_lite.lb.http1 import RawHeaders

__all__ = [
    "CONNECT_TIMEOUT_SECONDS",
    "POOL_KEEPALIVE_SECONDS",
    "PendingResponse",
    "ResponseCallbacks",
    "UpstreamClient",
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamResetError",
    "UpstreamResponse",
    "UpstreamTimeoutError",
    "UpstreamTunnel",
    "describe",
]

# A replica on another machine that silently drops packets would hold a request for the kernel's SYN retry
# time (about 2 minutes); 5 s is far above a healthy connect (< 1 ms locally, < 100 ms across a region).
CONNECT_TIMEOUT_SECONDS: Final = 5.0
# Idle pooled connections are closed after 4 s. Common replica servers close idle keep-alive connections
# after 5 s (uvicorn, gunicorn use 2-5 s); closing ours first avoids sending a request down a connection
# the replica is closing at that very moment. Under load a connection is never idle that long.
POOL_KEEPALIVE_SECONDS: Final = 4.0


class UpstreamError(Exception):
    """The replica's answer is unusable (see the module docstring for the tree)."""


class UpstreamConnectError(UpstreamError):
    """Nothing was sent to the replica: no connection, or a pooled one found closed before writing."""


class UpstreamResetError(UpstreamError):
    """The connection broke before any byte of a response arrived."""


class UpstreamTimeoutError(UpstreamError):
    """No response head arrived within the response timeout; the connection was closed."""


def describe(exc: BaseException) -> str:
    """``"TypeName: message"``, or the type name alone for an exception without a message."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class UpstreamTunnel(Protocol):
    """The replica's side of a connection that switched protocols (101): raw bytes both ways.

    ``reader`` gives what the replica sends (b"" once it closed); ``write`` and ``drain`` send to it;
    ``close`` ends the connection (idempotent). The tunnel belongs to the response it came from:
    releasing that response closes it too.
    """

    @property
    def reader(self) -> aiohttp.StreamReader: ...

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...


class UpstreamResponse(Protocol):
    """A replica's response whose head has arrived; the body is read with ``read`` or ``read_chunk``.

    ``release`` must be called exactly once when done, whether or not the body was read: it returns the
    connection for reuse when the whole response was received, else closes it.
    """

    @property
    def status(self) -> int: ...

    @property
    def reason(self) -> str | None: ...

    @property
    def headers(self) -> RawHeaders:
        """As received, hop-by-hop headers included."""
        ...

    @property
    def content_length(self) -> int | None:
        """The Content-Length header as a number; None when absent."""
        ...

    async def read(self) -> bytes:
        """The whole (rest of the) body; b"" for a response without one. Raises ``UpstreamError``."""
        ...

    def read_now(self) -> bytes | None:
        """What ``read`` would return, when the whole body has arrived already (as a small answer's does,
        with its head); None, with nothing read, while some of it is still to come."""
        ...

    async def read_chunk(self, size: int) -> bytes:
        """Up to ``size`` bytes of the body; b"" once it is complete. Raises ``UpstreamError``."""
        ...

    def tunnel(self) -> UpstreamTunnel:
        """The switched connection of a 101 answer to a request sent with ``upgrade``. Raises
        ``UpstreamError`` for any other response."""
        ...

    def release(self) -> None: ...


class ResponseCallbacks(Protocol):
    """Told the outcome of a request sent with ``UpstreamClient.send_now``: exactly one of the two is called,
    once, from the event loop (never from within ``send_now`` itself), unless the request is cancelled."""

    def response_arrived(self, response: UpstreamResponse) -> None: ...

    def response_failed(self, error: UpstreamError) -> None: ...


class PendingResponse(Protocol):
    """A request sent with ``send_now`` whose response head has not arrived yet."""

    def cancel(self) -> None:
        """Stop waiting: the connection is closed (the replica can stop working on the request) and neither
        callback is called. Does nothing once one was."""
        ...


class UpstreamClient(Protocol):
    """Sends requests to replicas. Used from one event loop; created inside it.

    ``request`` waits for the response head; ``send_now`` is the same request sent without waiting, when
    it can go out at once (an idle pooled connection), its outcome told to callbacks: the load balancer's
    common case then runs without a coroutine (docs/architecture.md, "The load balancer").
    """

    async def request(
        self,
        url: str,
        method: str,
        path: str,
        headers: bytes,
        body: bytes | aiohttp.StreamReader | None,
        upgrade: bool = False,
        content_length: int | None = None,
    ) -> UpstreamResponse:
        """Send ``method path`` to the replica at ``url`` and return once the response head has arrived.

        ``url`` is the replica's base url (``http://host:port``, maybe with a path prefix); ``path`` is the
        raw path and query, starting with "/". ``headers`` are header lines, each ending in CRLF, sent as
        given (no default headers are added; none may be Host, Content-Length or Transfer-Encoding) plus
        Host and the body's framing: Content-Length for a ``bytes`` body (0 for no body, except for
        methods that have none by convention), and for a stream ``content_length`` when given, else chunked
        transfer coding. Informational (1xx)
        responses are skipped; with ``upgrade`` (``headers`` then carry Connection and Upgrade) a 101 is
        the response, and its ``tunnel`` the connection from then on. Raises ``UpstreamConnectError``,
        ``UpstreamResetError``, ``UpstreamTimeoutError`` or ``UpstreamError`` as the module docstring says.
        """
        ...

    def send_now(
        self,
        url: str,
        method: str,
        path: str,
        headers: bytes,
        body: bytes | None,
        callbacks: ResponseCallbacks,
    ) -> PendingResponse | None:
        """Send the request as ``request`` would (never an upgrade, never a streamed body) when it can be
        written at once, and return without waiting: ``callbacks`` are told the response or the failure,
        as ``request`` would return or raise them. None, with nothing sent, when it cannot go out without
        waiting (no idle connection to ``url``): the caller then uses ``request``."""
        ...

    async def close(self) -> None:
        """Close every pooled connection. Responses not released yet close theirs on release."""
        ...
