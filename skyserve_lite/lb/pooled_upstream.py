"""``PooledUpstream``: keep-alive HTTP/1.1 connections on asyncio protocols (contract in ``upstream``).

Per request it does only what a proxy needs: take an idle connection (or connect), write the request head
and a buffered body with one ``transport.write``, and let llhttp (``lb.http1.ResponseParser``) frame the
answer: Content-Length, chunked, a body that ends with the connection, and no body for HEAD, 1xx, 204 and
304. The parser feeds the body into an aiohttp ``StreamReader``, which pauses reading from the replica
while the load balancer has not taken what it holds (back-pressure from a slow client).

Requests waiting for a response head are checked against the response timeout by one sweep (every
``TIMEOUT_SWEEP_SECONDS``, while any waits), not by a timer per request. A 101 answer to a request sent
with ``upgrade`` turns its connection into a tunnel (``_Tunnel``): the bytes after the head go to a reader,
and the connection never returns to the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final, Protocol, cast

import aiohttp
from yarl import URL

from skyserve_lite.lb.http1 import RawHeaders, ResponseHead, ResponseParser, new_stream
from skyserve_lite.lb.settings import DEFAULT_UPSTREAM_TIMEOUT_SECONDS
from skyserve_lite.lb.upstream import (
    CONNECT_TIMEOUT_SECONDS,
    POOL_KEEPALIVE_SECONDS,
    ResponseCallbacks,
    UpstreamConnectError,
    UpstreamError,
    UpstreamResetError,
    UpstreamResponse,
    UpstreamTimeoutError,
    describe,
)
from skyserve_lite.netaddr import url_host

__all__ = ["READ_LIMIT", "TIMEOUT_SWEEP_SECONDS", "PooledUpstream"]

# Response body buffered per connection before reading from the replica pauses: aiohttp's default read
# buffer. The stream pauses above twice this (128 KiB) and resumes below it; but aiohttp's StreamReader
# raises both marks to the size a reader asks for, so once the server relays a streamed body in
# STREAM_CHUNK (256 KiB) reads it pauses above 512 KiB: a slow client holds at most that plus one socket
# read (256 KiB) per streamed response (measured: paused at 528 KiB fed in 16 KiB reads).
READ_LIMIT: Final = 64 * 1024

# How often requests waiting for a response head are checked against the response timeout: one timer a
# second for the whole pool rather than one per request, so a timeout fires up to a second late.
TIMEOUT_SWEEP_SECONDS: Final = 1.0

# Methods whose requests carry no body by convention; the others get "Content-Length: 0" when they have
# none, as aiohttp's client sends (and as some servers require for POST).
_NO_BODY_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
# Raised by transport.pause_reading()/resume_reading() on a transport that is closing or cannot pause.
_PAUSE_ERRORS: Final = (AttributeError, NotImplementedError, RuntimeError)


_Found = tuple[ResponseHead, "aiohttp.StreamReader | bytes"]
_NO_HEADERS: Final = RawHeaders([])  # a response's until its head comes


class _HeadWaiter(Protocol):
    """What a connection tells the response head (or the failure before it) to: the future ``request``
    awaits, or the ``_PooledResponse`` of ``send_now``. The three methods of a future that ``_Connection`` uses."""

    def done(self) -> bool: ...

    def set_result(self, result: _Found, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


class _Connection(asyncio.Protocol):
    """One keep-alive connection to a replica, carrying one request at a time.

    ``begin`` arms the response parser and returns the future of the response head. The parser feeds the
    body into a ``StreamReader``, which pauses reading from the socket when its buffer is full. A
    connection that receives bytes nobody asked for, or an invalid response, is closed. After a 101 to a
    request that asked for it, every byte goes to ``tunnel`` instead.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self.head_deadline = 0.0
        self.tunnel: aiohttp.StreamReader | None = None
        self._parser = ResponseParser(self, loop, READ_LIMIT)
        self._head: _HeadWaiter | None = None
        self._payload: aiohttp.StreamReader | None = None
        self._got_bytes = False
        self._lost = False
        self._reading_paused = False
        self._write_paused = False
        self._drain_future: asyncio.Future[None] | None = None

    @property
    def is_open(self) -> bool:
        transport = self.transport
        return transport is not None and not self._lost and not transport.is_closing()

    @property
    def connected(self) -> bool:  # asked by the body's StreamReader before it waits
        return self.transport is not None and not self._lost

    @property
    def reusable(self) -> bool:
        """The response was whole, the replica keeps the connection and sent nothing more."""
        return self._parser.reusable

    def begin(
        self, response_with_body: bool, upgrade: bool = False
    ) -> asyncio.Future[tuple[ResponseHead, aiohttp.StreamReader | bytes]]:
        head: asyncio.Future[tuple[ResponseHead, aiohttp.StreamReader | bytes]] = self._loop.create_future()
        self.begin_with(head, response_with_body, upgrade)
        return head

    def begin_with(self, head: _HeadWaiter, response_with_body: bool, upgrade: bool = False) -> None:
        """Arm the parser for one request's response, which (or whose failure) goes to ``head``."""
        self._parser.begin(response_with_body, upgrade)
        self._payload = None
        self._got_bytes = False
        self._head = head

    def finish(self) -> None:
        """The response is over (released); bytes from now on are out of step."""
        self._parser.finish()
        self._head = None
        self._payload = None

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        """Close after what is buffered has been sent (a tunnel's last bytes)."""
        if self.transport is not None:
            self.transport.close()

    def time_out(self, seconds: float) -> None:
        """No response head within ``seconds``: fail the wait for it and close the connection."""
        self._fail(UpstreamTimeoutError(f"no response head from the replica within {seconds:g} s"))

    def write(self, data: bytes) -> None:
        transport = self.transport
        if transport is None:
            raise UpstreamResetError("the connection to the replica is closed")
        transport.write(data)

    async def drain(self) -> None:
        """Wait until the socket's write buffer has room (asyncio's high-water mark, 64 KiB)."""
        if not self._write_paused:
            return
        waiter = self._drain_future
        if waiter is None:
            waiter = self._drain_future = self._loop.create_future()
        await waiter

    # -- asyncio.Protocol ----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not derive from asyncio.Transport; both have what is used here.
        self.transport = cast(asyncio.Transport, transport)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_drain()

    def pause_reading(self) -> None:
        # Called by the body's StreamReader when its buffer is full. Only the socket pauses: the parser
        # keeps no unparsed tail, so an end of the connection while paused still ends the body correctly.
        if self._reading_paused:
            return
        self._reading_paused = True
        transport = self.transport
        if transport is not None:
            with contextlib.suppress(*_PAUSE_ERRORS):
                transport.pause_reading()

    def resume_reading(self, resume_parser: bool = True) -> None:
        # The body's reader calls this after every read below its low-water mark: return early when not
        # paused, which is every read of a small body.
        if not self._reading_paused:
            return
        self._reading_paused = False
        transport = self.transport
        if transport is not None:
            with contextlib.suppress(*_PAUSE_ERRORS):
                transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        tunnel = self.tunnel
        if tunnel is not None:
            tunnel.feed_data(data)
            return
        if data:
            self._got_bytes = True
        parser = self._parser
        feed = parser.feed(data)
        if feed.error is not None:
            self._fail(UpstreamError(feed.error))
            return
        if parser.stray and not parser.active:
            self.abort()  # bytes nobody asked for
            return
        found = feed.response
        head = self._head
        if found is None or head is None or head.done():
            return
        self._payload = found[1] if not isinstance(found[1], bytes) else None  # bytes: whole, nothing to fail
        head.set_result(found)
        if feed.tunnel is not None:
            self._start_tunnel(feed.tunnel)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._lost = True
        self.transport = None
        self._write_paused = False
        self._wake_drain()
        if self.tunnel is not None:
            self.tunnel.feed_eof()
            return
        error = self._parser.feed_eof()
        if error is None:
            return
        head = self._head
        if head is not None and not head.done():
            reason = describe(exc) if exc is not None else "the replica closed the connection"
            error_class = UpstreamError if self._got_bytes else UpstreamResetError
            head.set_exception(error_class(f"{reason} before a complete response head"))
            return
        payload = self._payload
        if payload is not None and not payload.is_eof():
            payload.set_exception(UpstreamError(error))

    def _start_tunnel(self, tail: bytes) -> None:
        # The parser is done: from here on the connection carries the switched protocol's bytes.
        self._parser.finish()
        tunnel = self.tunnel = new_stream(self, self._loop, READ_LIMIT)
        if tail:
            tunnel.feed_data(tail)

    def _fail(self, error: UpstreamError) -> None:
        head, payload = self._head, self._payload
        if head is not None and not head.done():
            head.set_exception(error)
        elif payload is not None and not payload.is_eof():
            payload.set_exception(error)
        self._parser.finish()
        self.abort()

    def _wake_drain(self) -> None:
        waiter = self._drain_future
        if waiter is not None:
            self._drain_future = None
            if not waiter.done():
                waiter.set_result(None)


class _Replica:
    """What the pooled client keeps per replica url: where to connect and its idle connections."""

    def __init__(self, url: str) -> None:
        self.url = url
        parsed = URL(url)
        if parsed.scheme not in ("http", "https") or not parsed.raw_host:
            raise UpstreamConnectError(f"not an http(s) url: {url!r}")
        self.host: str = parsed.raw_host
        self.port: int = parsed.port or (443 if parsed.scheme == "https" else 80)
        self.ssl = parsed.scheme == "https"
        host = url_host(self.host)
        default_port = 443 if self.ssl else 80
        self.host_header = host if self.port == default_port else f"{host}:{self.port}"
        self.host_header_bytes = self.host_header.encode("ascii")  # yarl's raw_host: IDNA already
        self.prefix = parsed.raw_path.rstrip("/")
        self.idle: list[_Connection] = []


class _PooledResponse:
    """A response on a pooled connection (``UpstreamResponse``). ``request`` makes it once the head is there;
    ``send_now`` makes it before, as the request it wrote (``PendingResponse``): the connection then tells it
    the head as it would a future (``_HeadWaiter``), and it tells the ``ResponseCallbacks`` itself as what
    ``request`` would have returned, or what it would have raised. One object per request either way."""

    __slots__ = ("_callbacks", "_connection", "_data", "_done", "_payload", "_pool", "_released", "_replica",
                 "content_length", "headers", "reason", "status")

    def __init__(
        self,
        pool: PooledUpstream,
        replica: _Replica,
        connection: _Connection,
        callbacks: ResponseCallbacks | None = None,
    ) -> None:
        self._pool = pool
        self._replica = replica
        self._connection = connection
        self._callbacks = callbacks
        self._done = False  # the head, a failure or a cancel came (``send_now``'s)
        self._released = False
        # A body that came whole with the head is kept as bytes (``_data``); else it is read from the stream.
        self._data: bytes | None = None
        self._payload: aiohttp.StreamReader | None = None
        self.status = 0
        self.reason: str | None = None
        self.headers = _NO_HEADERS
        self.content_length: int | None = None

    def _take(self, message: ResponseHead, payload: aiohttp.StreamReader | bytes) -> None:
        """The head has come, and the body or its stream."""
        if isinstance(payload, bytes):
            self._data = payload
        else:
            self._payload = payload
        self.status, self.reason, self.headers, _, self.content_length = message

    # -- UpstreamResponse ------------------------------------------------------------------------------------

    async def read(self) -> bytes:
        data = self.read_now()
        if data is not None:
            return data
        payload = self._payload
        assert payload is not None  # read_now answers whenever there is none
        try:
            return await payload.read()
        except UpstreamError:
            raise
        except OSError as exc:
            raise UpstreamError(describe(exc)) from exc

    def read_now(self) -> bytes | None:
        data, payload = self._data, self._payload
        if payload is None:
            self._data = b""
            return data or b""
        if payload.is_eof() and payload.exception() is None:
            # The whole body is here: 0.4 us against 1.3 us for the stream's read, which awaits one
            # coroutine per buffered block.
            return payload.read_nowait()
        return None

    async def read_chunk(self, size: int) -> bytes:
        payload = self._payload
        if payload is None:
            data = self._data or b""
            chunk, self._data = data[:size], data[size:]
            return chunk
        try:
            return await payload.read(size)
        except UpstreamError:
            raise
        except OSError as exc:
            raise UpstreamError(describe(exc)) from exc

    def tunnel(self) -> _Tunnel:
        if self.status != 101 or self._connection.tunnel is None:
            raise UpstreamError(f"a {self.status} response has no tunnel")
        return _Tunnel(self._connection)

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        if self.status == 101:
            # A switched connection never goes back to the pool; its last bytes still go out.
            self._connection.finish()
            self._connection.close()
            return
        payload = self._payload
        whole = payload is None or (payload.is_eof() and payload.exception() is None)
        reusable = whole and self._connection.reusable
        self._pool._give_back(self._replica, self._connection, reusable)

    # -- _HeadWaiter and PendingResponse, for ``send_now`` ---------------------------------------------------

    def done(self) -> bool:
        return self._done

    def write(self, data: bytes) -> None:
        """Send the request, unless it was cancelled since ``send_now``. Called soon after it rather than
        in it: a write wakes the process that reads it, which on a busy machine then takes the CPU from
        the load balancer before it has handled the other sockets that were ready; writing after them
        took about a fifth off the kernel's time per request in benchmarks/lb_bench.py."""
        if self._done:
            return
        transport = self._connection.transport
        if transport is None:
            self.set_exception(UpstreamConnectError("the pooled connection closed before the request was sent"))
            return
        transport.write(data)

    def set_result(self, result: _Found, /) -> None:
        if self._done:
            return
        self._done = True
        connection = self._connection
        self._pool._awaiting_head.discard(connection)
        self._take(*result)
        # Told once: the reference goes, or the callbacks (which keep this response) and this response would
        # be a cycle left for the garbage collector, one per request.
        callbacks, self._callbacks = self._callbacks, None
        assert callbacks is not None, "set_result is for a response send_now made"
        callbacks.response_arrived(self)

    def set_exception(self, exception: BaseException, /) -> None:
        if self._stop():
            error = exception if isinstance(exception, UpstreamError) else UpstreamError(describe(exception))
            callbacks, self._callbacks = self._callbacks, None
            assert callbacks is not None, "set_exception is for a response send_now made"
            callbacks.response_failed(error)

    def cancel(self) -> None:
        self._stop()
        self._callbacks = None

    def _stop(self) -> bool:
        """Stop waiting and close the connection (a half-done request leaves it unusable), as ``request``
        does when it fails or is cancelled; False when the response or a failure was told already."""
        if self._done:
            return False
        self._done = True
        connection = self._connection
        self._pool._awaiting_head.discard(connection)
        connection.finish()
        connection.abort()
        return True


class _Tunnel:
    """``UpstreamTunnel`` over a connection that switched protocols."""

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection

    @property
    def reader(self) -> aiohttp.StreamReader:
        reader = self._connection.tunnel
        assert reader is not None
        return reader

    def write(self, data: bytes) -> None:
        self._connection.write(data)

    async def drain(self) -> None:
        await self._connection.drain()

    def close(self) -> None:
        self._connection.close()


class PooledUpstream:
    """``UpstreamClient`` with keep-alive HTTP/1.1 connections per replica url, unlimited in number.

    A request takes the most recently used idle connection of its replica (an idle one older than
    ``keepalive_seconds`` is closed instead) or opens one, with ``connect_timeout`` for the TCP connect.
    Idle connections are swept every ``keepalive_seconds`` while there are any. A request whose response
    head has not come ``response_timeout`` after it was sent fails with ``UpstreamTimeoutError``, checked
    every ``TIMEOUT_SWEEP_SECONDS`` (or every ``response_timeout``, when that is shorter).
    """

    def __init__(
        self,
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
        keepalive_seconds: float = POOL_KEEPALIVE_SECONDS,
        response_timeout: float = DEFAULT_UPSTREAM_TIMEOUT_SECONDS,
    ) -> None:
        self._connect_timeout = connect_timeout
        self._keepalive_seconds = keepalive_seconds
        self._response_timeout = response_timeout
        self._replicas: dict[str, _Replica] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._awaiting_head: set[_Connection] = set()
        self._timeout_sweep: asyncio.TimerHandle | None = None
        self._closed = False

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
        replica = self._replicas.get(url)
        if replica is None:
            replica = self._replicas[url] = _Replica(url)
        connection = self._checkout(replica)  # open, or None
        if connection is None:
            connection = await self._connect(replica)
            if not connection.is_open:  # closed between the connect and now: nothing was sent
                raise UpstreamConnectError(f"the connection to {replica.host}:{replica.port} closed at once")
        head = connection.begin(method != "HEAD", upgrade)
        try:
            if isinstance(body, aiohttp.StreamReader):
                request_head = _render_head(replica, method, path, headers, body, content_length)
                await _send_streamed(connection, request_head, body, content_length is None)
            else:
                connection.write(_render_head(replica, method, path, headers, body) + (body or b""))
            if head.done():
                message, payload = head.result()
            else:
                self._watch(connection)
                try:
                    message, payload = await head
                finally:
                    self._awaiting_head.discard(connection)
        except BaseException:  # including cancellation: a half-sent request leaves the connection unusable
            connection.finish()
            connection.abort()
            raise
        response = _PooledResponse(self, replica, connection)
        response._take(message, payload)
        return response

    def send_now(
        self,
        url: str,
        method: str,
        path: str,
        headers: bytes,
        body: bytes | None,
        callbacks: ResponseCallbacks,
    ) -> _PooledResponse | None:
        replica = self._replicas.get(url)
        if replica is None:
            return None  # never connected: ``request`` connects
        connection = self._checkout(replica)
        if connection is None:
            return None
        pending = _PooledResponse(self, replica, connection, callbacks)
        connection.begin_with(pending, method != "HEAD")
        # Written once this turn of the event loop has run its other callbacks (see ``_PooledResponse.write``).
        connection._loop.call_soon(pending.write, _render_head(replica, method, path, headers, body) + (body or b""))
        self._watch(connection)
        return pending

    def _watch(self, connection: _Connection) -> None:
        """Hold ``connection``, about to wait for a response head, to the response timeout."""
        loop = connection._loop
        connection.head_deadline = loop.time() + self._response_timeout
        self._awaiting_head.add(connection)
        if self._timeout_sweep is None:
            self._timeout_sweep = loop.call_later(self._timeout_sweep_seconds, self._sweep_timeouts)

    @property
    def _timeout_sweep_seconds(self) -> float:
        return min(TIMEOUT_SWEEP_SECONDS, self._response_timeout)

    def _sweep_timeouts(self) -> None:
        """Fail the requests past the response timeout; runs while any request waits for a head."""
        self._timeout_sweep = None
        awaiting = self._awaiting_head
        if not awaiting:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        for connection in [connection for connection in awaiting if connection.head_deadline <= now]:
            awaiting.discard(connection)
            connection.time_out(self._response_timeout)
        if awaiting and not self._closed:
            self._timeout_sweep = loop.call_later(self._timeout_sweep_seconds, self._sweep_timeouts)

    async def close(self) -> None:
        self._closed = True
        for handle in (self._sweep, self._timeout_sweep):
            if handle is not None:
                handle.cancel()
        self._sweep = self._timeout_sweep = None
        for replica in self._replicas.values():
            for connection in replica.idle:
                connection.abort()
            replica.idle.clear()
        self._replicas.clear()

    def _checkout(self, replica: _Replica) -> _Connection | None:
        idle = replica.idle
        if not idle:
            return None
        # The connection's loop is the running one; asyncio.get_running_loop() costs a getpid() call.
        oldest_usable = idle[-1]._loop.time() - self._keepalive_seconds
        while idle:
            connection = idle.pop()
            if connection.is_open and connection.idle_since >= oldest_usable:
                return connection
            connection.abort()
        return None

    async def _connect(self, replica: _Replica) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(loop),
                    replica.host,
                    replica.port,
                    ssl=True if replica.ssl else None,
                ),
                self._connect_timeout,
            )
        except (OSError, asyncio.TimeoutError) as exc:
            raise UpstreamConnectError(f"cannot connect to {replica.host}:{replica.port}: {describe(exc)}") from exc
        return connection

    def _give_back(self, replica: _Replica, connection: _Connection, reusable: bool) -> None:
        connection.finish()
        if not reusable or self._closed or not connection.is_open:
            connection.abort()
            return
        loop = connection._loop
        connection.idle_since = loop.time()
        # The sweep may have forgotten this replica while the request ran; put it back, or the connection
        # would sit in a list nobody looks at.
        self._replicas.setdefault(replica.url, replica).idle.append(connection)
        if self._sweep is None:
            self._sweep = loop.call_later(self._keepalive_seconds, self._sweep_idle)

    def _sweep_idle(self) -> None:
        """Close idle connections past ``keepalive_seconds``; forget replicas with none left."""
        self._sweep = None
        loop = asyncio.get_running_loop()
        oldest_usable = loop.time() - self._keepalive_seconds
        for url, replica in list(self._replicas.items()):
            kept = []
            for connection in replica.idle:
                if connection.is_open and connection.idle_since >= oldest_usable:
                    kept.append(connection)
                else:
                    connection.abort()
            replica.idle = kept
            if not kept:
                del self._replicas[url]
        if self._replicas:
            self._sweep = loop.call_later(self._keepalive_seconds, self._sweep_idle)


def _render_head(
    replica: _Replica,
    method: str,
    path: str,
    headers: bytes,
    body: bytes | aiohttp.StreamReader | None,
    content_length: int | None = None,
) -> bytes:
    """The request line and headers, framing included, as bytes ready to write."""
    if isinstance(body, bytes):
        framing = b"Content-Length: %d\r\n" % len(body)
    elif body is None:
        framing = b"" if method in _NO_BODY_METHODS else b"Content-Length: 0\r\n"
    elif content_length is not None:
        framing = b"Content-Length: %d\r\n" % content_length
    else:
        framing = b"Transfer-Encoding: chunked\r\n"
    # The path arrived as bytes decoded with surrogateescape; this gives back the very same bytes.
    line = f"{method} {replica.prefix}{path} HTTP/1.1\r\n".encode("utf-8", "surrogateescape")
    return b"%sHost: %s\r\n%s%s\r\n" % (line, replica.host_header_bytes, headers, framing)


async def _send_streamed(connection: _Connection, head: bytes, body: aiohttp.StreamReader, chunked: bool) -> None:
    """Write ``head`` and then ``body`` as it arrives (in chunked coding with ``chunked``), waiting whenever
    the socket's buffer is full."""
    connection.write(head)
    while True:
        try:
            chunk = await body.readany()
        except (OSError, aiohttp.ClientError) as exc:
            raise UpstreamError(f"the request body from the client broke off: {describe(exc)}") from exc
        if not chunk:
            break
        if chunked:
            connection.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        else:
            connection.write(chunk)
        await connection.drain()
        if not connection.is_open:
            return  # the replica answered or closed early; the head future says which
    if chunked:
        connection.write(b"0\r\n\r\n")
