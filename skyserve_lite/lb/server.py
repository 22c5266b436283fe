"""The client-facing server: HTTP/1.1 on a plain asyncio protocol, framed by llhttp (``lb.http1``).

``serve`` runs a ``LoadBalancer`` (``skyserve_lite.lb.proxy``) on it. The server does per request only what
the HTTP side needs (no request or response objects) and leaves every proxy decision to the load balancer:
``check_request`` (the guard: 429, 401), ``select_target``, ``forward``, and the answers it makes itself
(503, 502, 504).

Connections are accepted by a ``Listener`` (``skyserve_lite.lb.listener``) under the ``ConnectionLimits``
(``skyserve_lite.lb.settings``): at most ``max_connections`` at once, at most ``per_client`` from one client
address (the next one gets 503 with ``Connection: close`` at once), and at the limit a new connection
closes the one idle the longest (``HttpServer.idle``, oldest first) to take its place, or gets the 503
when none is idle. At the open-file limit accepting pauses instead of failing in a loop, and open
connections go on being served.

Deadlines, checked by one sweep every ``SWEEP_SECONDS`` over the idle connections (never a timer per
request or per connection): a new connection must send a whole request head within ``head_seconds``; a
connection idle after a response is closed after ``keepalive_seconds``, or ``head_seconds`` after the
first byte of its next head if that head is not whole by then. A connection closed with part of a head
gets 408 first. A request being answered has no deadline here: its replica's is the upstream timeout
(``pooled_upstream``), and a client that goes away ends it (the replica's connection is closed, and the
request stops counting as in flight).

Per connection:

* keep-alive, HTTP/1.0 and 1.1; pipelined requests are answered one at a time, in order. Once
  ``MAX_PIPELINED`` parsed requests wait, reading from the client pauses until fewer do (one socket read,
  at most 256 KiB, may hold more: they are parsed, heads of a few hundred bytes each).
* request bodies: up to ``BUFFER_LIMIT`` with a Content-Length they are read whole (one write to the
  replica); larger or chunked ones go to the replica as a stream, reading from the client paused whenever
  ``READ_LIMIT`` is buffered.
* ``Expect: 100-continue`` is answered "100 Continue" once a replica was chosen, right before the body is
  read (a 503 goes out instead, and the connection closes); any other expectation gets 417 and a close.
* a request the parser refuses (``lb.http1`` lists what: the request smuggling cases, faulty framing)
  gets 400 and a close, after the requests whose heads came before the malformed bytes are answered.
  After a request that closes the connection (``Connection: close``, HTTP/1.0 without keep-alive) the
  client's bytes are not parsed: its answer is the last.
* responses: the head and a buffered body go out in one ``transport.write``; a streamed body is written
  chunk by chunk, waiting while the socket's write buffer is above ``WRITE_HIGH_WATER`` (the replica's
  side then pauses too: its reader stops taking bytes). A body of unknown length goes out chunked to
  HTTP/1.1 clients and ends with the connection for HTTP/1.0 ones.
* a connection whose request body was not read to its end (a 503 before reading, a replica that answered
  early) is closed after the response: the rest of the body cannot be told from a next request.
* an upgrade to WebSocket (``Connection: Upgrade``, ``Upgrade: websocket``, no body) is forwarded with
  both headers; when the replica answers 101 the 101 goes to the client and from then on the bytes pass
  both ways unchanged until either side closes (``_tunnel``); any other answer is relayed and the
  connection closed.

The server adds no headers of its own to relayed responses (no Server, no Date: the replica's are kept),
except ``Connection: close`` or ``keep-alive`` where the connection's fate needs saying.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import http
import importlib.util
import logging
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, cast

import aiohttp
from multidict import istr

from skyserve_lite.lb.http1 import RawHeaders, RequestHead, RequestParser, compute_origin_form, new_stream
from skyserve_lite.lb.listener import Listener
from skyserve_lite.lb.proxy import (
    BUFFER_LIMIT,
    HOP_BY_HOP_NAMES,
    STREAM_CHUNK,
    Forwarded,
    LoadBalancer,
    LocalAnswer,
    PendingForward,
    is_buffered_response,
    render_upstream_headers,
)
from skyserve_lite.lb.settings import (
    HEAD_SECONDS_VARIABLE,
    MAX_CONNECTIONS_PER_CLIENT_VARIABLE,
    MAX_CONNECTIONS_VARIABLE,
    ConnectionLimits,
)
from skyserve_lite.lb.upstream import UpstreamError, UpstreamTunnel

__all__ = [
    "MAX_PIPELINED",
    "READ_LIMIT",
    "SHUTDOWN_SECONDS",
    "SWEEP_SECONDS",
    "WRITE_HIGH_WATER",
    "HttpServer",
    "describe_build",
    "describe_loop",
    "is_compiled",
    "render_local_answer",
    "render_response_head",
    "serve",
    "serve_taking",
    "too_many_connections_message",
    "too_many_from_client_message",
]

log = logging.getLogger(__name__)

# Request body buffered per connection before reading from the client pauses: aiohttp's own default, as
# on the upstream side. A chunked 5 MiB upload then holds at most about 128 KiB in the load balancer.
READ_LIMIT: Final = 64 * 1024
# Parsed requests waiting behind the one being answered. Clients that pipeline send a handful (wrk's
# pipelining scripts use 16); 16 heads of a few hundred bytes each are nothing, and a client sending
# thousands is paused instead of filling memory.
MAX_PIPELINED: Final = 16
# The socket's write buffer above which a streamed body waits (asyncio's default is 64 KiB): 256 KiB is
# one STREAM_CHUNK, so a fast client never waits and a slow one holds one chunk plus what the kernel holds.
WRITE_HIGH_WATER: Final = 256 * 1024
# How often idle connections are checked against their deadlines: one timer a second for the whole
# server, so a deadline of 10 s closes a connection 10 to 11 s after it started waiting.
SWEEP_SECONDS: Final = 1.0
# How long closing the server waits for requests in flight before cutting them: aiohttp's default too.
SHUTDOWN_SECONDS: Final = 60.0

_UPGRADE = istr("Upgrade")
_CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"
_FRAMING: Final = frozenset({b"content-length"})
_LAST_CHUNK: Final = b"0\r\n\r\n"
_FIELD_SEPARATOR: Final = b": "


def _reason(status: int, reason: str | None) -> str:
    if reason:
        return reason
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


# Replicas send a handful of (status, reason) pairs; the cache is bounded against one making up reasons.
@functools.lru_cache(maxsize=256)
def _render_status_line(status: int, reason: str | None) -> bytes:
    return f"HTTP/1.1 {status} {reason or _reason(status, reason)}\r\n".encode("utf-8", "surrogateescape")


def render_response_head(status: int, reason: str | None, headers: RawHeaders, extra: bytes = b"") -> bytes:
    """The status line and ``headers`` minus hop-by-hop ones (``HOP_BY_HOP_NAMES`` and the names their
    ``Connection`` lists), then ``extra`` (whole header lines), as bytes: the replica's very bytes."""
    status_line = _render_status_line(status, reason)
    raw = headers.raw
    if not headers.hop_by_hop and raw:  # nothing to drop: every line as it came, joined in C
        return b"%s%s\r\n%s\r\n" % (status_line, b"\r\n".join(map(_FIELD_SEPARATOR.join, raw)), extra)
    drop = HOP_BY_HOP_NAMES
    listed = headers.connection_tokens()
    if listed:
        # Never the Content-Length a buffered body is sent with: a replica naming it in Connection would
        # leave the client no way to tell where the body ends.
        drop = drop | (listed - _FRAMING)
    lines = [b"%s: %s\r\n" % (name, value) for name, value in raw if name.lower() not in drop]
    return b"%s%s%s\r\n" % (status_line, b"".join(lines), extra)


def too_many_connections_message(service: str, max_connections: int) -> str:
    """The 503 body for a connection beyond ``max_connections``: what is wrong and which setting it is."""
    return (
        f"Service unavailable: the load balancer for service {service} has {max_connections} client "
        f"connections open, its limit ({MAX_CONNECTIONS_VARIABLE}). Try again later.\n"
    )


def too_many_from_client_message(service: str, per_client: int) -> str:
    """The 503 body for a connection beyond ``per_client`` from one address."""
    return (
        f"Service unavailable: the load balancer for service {service} has {per_client} connections open "
        f"from this client address, its limit ({MAX_CONNECTIONS_PER_CLIENT_VARIABLE}). Close idle "
        "connections or try again later.\n"
    )


def _head_timeout_text(seconds: float) -> str:
    return f"Request timeout: the request head did not arrive within {seconds:g} s ({HEAD_SECONDS_VARIABLE}).\n"


def render_local_answer(answer: LocalAnswer, keep_alive: bool, head_only: bool) -> bytes:
    """A whole response for an answer the load balancer makes itself, as UTF-8 text, with its own
    headers (``Retry-After``, ``WWW-Authenticate``: values the load balancer wrote, never a client's)."""
    body = answer.text.encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in answer.headers)
    head = (
        f"HTTP/1.1 {answer.status} {_reason(answer.status, None)}\r\n"
        f"Content-Type: {answer.content_type}\r\nContent-Length: {len(body)}\r\n{extra}"
        f"{'' if keep_alive else 'Connection: close' + chr(13) + chr(10)}\r\n"
    ).encode()
    return head if head_only else head + body


class _ClientConnection(asyncio.Protocol):
    """One client connection: parses requests as bytes arrive and answers them in order on one task.

    Reading from the socket pauses while ``MAX_PIPELINED`` requests wait or while a request body's stream
    holds more than its limit (the stream calls ``pause_reading``/``resume_reading``, the names aiohttp's
    streams call); writing waits in ``_drain`` while the socket's buffer is above ``WRITE_HIGH_WATER``.

    While no request is queued or being answered the connection is in ``server.idle`` (in the order it
    became idle) with a ``deadline``: ``idle_since`` plus the head deadline for a new connection, plus the
    keep-alive timeout after a response, replaced by the head deadline from the first byte of a next head.
    """

    def __init__(self, server: HttpServer, loop: asyncio.AbstractEventLoop, release: Callable[[], None]) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self._server = server
        self._lb = server.lb
        self._release = release
        self._requests = RequestParser(self, loop, READ_LIMIT)
        self._queue: collections.deque[tuple[RequestHead, aiohttp.StreamReader | None]] = collections.deque()
        self._bad_request: str | None = None
        self._queue_paused = False  # MAX_PIPELINED requests wait
        self._body_paused = False  # a body's stream is full
        self._reading = True
        self._write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._body: aiohttp.StreamReader | None = None
        # The request answered without the task (``_answer_now``) while it waits for its replica: what it
        # waits on, and what its answer needs.
        self._pending: PendingForward | None = None
        self._now: tuple[RequestHead, bool] | None = None  # its head, whether to keep the connection open
        # What the task is to await next for such a request, and what undoes it if the task never does.
        self._handoff: tuple[Coroutine[Any, Any, bool], Callable[[], None]] | None = None
        self._ended = False  # such a request's answer was the connection's last
        # The client's bytes after a WebSocket handshake, once the parser has switched.
        self._tunnel_in: aiohttp.StreamReader | None = None
        self._peer: str | None = None
        self._scheme = "http"  # X-Forwarded-Proto: "https" on a TLS connection
        self._lost = False
        self._served = False  # a response went out: the wait for the next head is keep-alive
        self._head_started = False  # part of a head came while idle
        self.closing = False
        self.busy = False
        self.idle_since = 0.0
        self.deadline = 0.0

    # -- asyncio.Protocol ----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not derive from asyncio.Transport; both have what is used here.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        peer = transport.get_extra_info("peername")
        self._peer = str(peer[0]) if isinstance(peer, (tuple, list)) and peer else None
        self._scheme = "https" if transport.get_extra_info("sslcontext") is not None else "http"
        server = self._server
        server.connections.add(self)
        now = self._loop.time()
        self.idle_since = now
        self.deadline = now + server.head_seconds
        server.idle[self] = None
        self._task = self._loop.create_task(self._run())

    def data_received(self, data: bytes) -> None:
        tunnel = self._tunnel_in
        if tunnel is not None:
            tunnel.feed_data(data)
            return
        if self._lost:
            return
        requests = self._requests
        feed = requests.feed(data)
        if feed.tunnel is not None:
            self._start_tunnel_input(feed.tunnel)
        if feed.error is not None:
            # The requests before the malformed bytes are answered, then 400 and a close.
            self._bad_request = feed.error
            self._set_reading(queue_paused=True)
        messages = feed.requests
        if not messages:
            if requests.done:
                self._wake()
            elif data and not self.busy and not self._queue and not self._head_started:
                self._note_head_started()
            return
        self._server.idle.pop(self, None)
        queue = self._queue
        queue.extend(messages)
        if len(queue) >= MAX_PIPELINED and not self._queue_paused:
            self._set_reading(queue_paused=True)
        if not self.busy and len(queue) == 1 and self._bad_request is None and self._answer_now():
            return
        self._wake()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        waiter = self._drain_waiter
        if waiter is not None:
            self._drain_waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # -- what the body streams call ----------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self.transport is not None and not self._lost

    def pause_reading(self) -> None:
        self._set_reading(body_paused=True)

    def resume_reading(self, resume_parser: bool = True) -> None:
        if self._body_paused:
            self._set_reading(body_paused=False)

    def _set_reading(self, *, queue_paused: bool | None = None, body_paused: bool | None = None) -> None:
        """Pause the socket while any reason to holds, resume it when none does."""
        if queue_paused is not None:
            self._queue_paused = queue_paused
        if body_paused is not None:
            self._body_paused = body_paused
        reading = not (self._queue_paused or self._body_paused)
        transport = self.transport
        if reading == self._reading or transport is None:
            return
        self._reading = reading
        with contextlib.suppress(RuntimeError, AttributeError, NotImplementedError):  # closing, or cannot pause
            if reading:
                transport.resume_reading()
            else:
                transport.pause_reading()

    async def _drain(self) -> None:
        """Wait while the socket's write buffer is above ``WRITE_HIGH_WATER``; raises ConnectionResetError
        once the client is gone."""
        if self._lost:
            raise ConnectionResetError("the client closed the connection")
        if not self._write_paused:
            return
        waiter = self._drain_waiter
        if waiter is None:
            waiter = self._drain_waiter = self._loop.create_future()
        await waiter
        if self._lost:
            raise ConnectionResetError("the client closed the connection")

    def connection_lost(self, exc: BaseException | None) -> None:
        self._lost = True
        self.transport = None
        # A response waiting in _drain wakes as for a drained buffer, then sees _lost and raises.
        self.resume_writing()
        server = self._server
        server.connections.discard(self)
        server.idle.pop(self, None)
        self._release()
        # A body being read (by the relay to a replica) or queued must end, not wait for bytes forever.
        error = ConnectionResetError("the client closed the connection")
        bodies = [self._body, *(payload for _, payload in self._queue)]
        for body in bodies:
            if body is not None and not body.is_eof():
                body.set_exception(error)
        if self._tunnel_in is not None and not self._tunnel_in.is_eof():
            self._tunnel_in.feed_eof()
        self._queue.clear()
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()  # as the task's cancellation below does to a request it answers
        handoff, self._handoff = self._handoff, None
        if handoff is not None:
            coroutine, undo = handoff
            coroutine.close()
            undo()
        self._wake()
        if self.busy and self._task is not None:
            # Nobody is left to answer: stop waiting for the replica, whose connection closes so that it can
            # stop working on the request too, and the request stops counting as in flight.
            self._task.cancel()

    # -- deadlines and closing -------------------------------------------------------------------------------

    def _note_head_started(self) -> None:
        # A new connection keeps the deadline it got at the start: its first head must be whole by then.
        self._head_started = True
        if self._served:
            self.deadline = self._loop.time() + self._server.head_seconds

    def _become_idle(self) -> None:
        now = self._loop.time()
        self.idle_since = now
        self.deadline = now + self._server.keepalive_seconds
        self._served = True
        self._head_started = False
        self._server.idle[self] = None

    def time_out(self) -> None:
        """Close an idle connection past its deadline; with 408 when part of a head had come."""
        if self._head_started:
            answer = LocalAnswer(408, _head_timeout_text(self._server.head_seconds))
            self._write(render_local_answer(answer, False, False))
        self.close_when_idle()

    def close_when_idle(self) -> None:
        """Close now when no request is being answered, else right after the current response."""
        self.closing = True
        if not self.busy and not self._queue and self.transport is not None:
            self._server.idle.pop(self, None)
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # -- the request loop ----------------------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _write(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None:
            transport.write(data)

    async def _run(self) -> None:
        """Answer queued requests in order until the connection ends. Never raises; ends cancelled when the
        client goes away while a request is being answered.

        A request ``_answer_now`` began is its own until it ends (``_end_now`` wakes this loop) or hands
        over what waits (``_hand_off``): the loop then awaits that in the request's stead."""
        try:
            while not self._lost:
                handoff = self._handoff
                if handoff is not None:
                    self._handoff = None
                    try:
                        keep_alive = await handoff[0]
                    finally:
                        self.busy = False
                        self._body = None
                    if not keep_alive:
                        break
                    self._after_answer()
                    continue
                if self.busy or not self._queue:
                    if not self.busy:
                        if self._bad_request is not None:
                            answer = LocalAnswer(400, f"Bad request: {self._bad_request}\n")
                            self._write(render_local_answer(answer, False, False))
                            break
                        if self.closing or self._requests.done or self._ended:
                            # Nothing more will be parsed (a last request, Connection: close, was answered;
                            # or a switch to another protocol): bytes after it are dropped by the parser.
                            break
                    self._waiter = self._loop.create_future()
                    await self._waiter
                    continue
                message, payload = self._take()
                self.busy = True
                try:
                    keep_alive = await self._answer(message, payload)
                finally:
                    self.busy = False
                    self._body = None
                if not keep_alive:
                    break
                self._after_answer()
        except Exception:  # top of the connection's loop: log with context, drop this connection only
            log.exception("load balancer for service %s: answering a request failed", self._lb.service)
            self.abort()
            return
        if self.transport is not None:
            self.transport.close()  # after what is buffered has been sent

    def _take(self) -> tuple[RequestHead, aiohttp.StreamReader | None]:
        message, payload = self._queue.popleft()
        if self._queue_paused and self._bad_request is None and len(self._queue) < MAX_PIPELINED:
            self._set_reading(queue_paused=False)
        return message, payload

    def _after_answer(self) -> None:
        if not self._queue and not self.closing and not self._lost and not self._requests.done:
            self._become_idle()

    # -- answering without the task --------------------------------------------------------------------------

    def _answer_now(self) -> bool:
        """Begin answering the one queued request here, in the protocol's callback, when nothing in it has to
        wait: no body still to come, no Expect, no upgrade. Whatever then has to wait (holding for a
        replica, a new connection, a streamed response) goes to the task with ``_hand_off``; a response that
        came whole is relayed in the replica's callback (``forwarded``). The same steps as ``_answer``, in
        the same order; False, with nothing done, when the request is not one of these. (One method, not
        several: it runs per request, and a call costs about what a step does.)"""
        queue = self._queue
        message, payload = queue[0]
        if message.upgrade or self.closing or message.expect is not None:
            return False
        body = None
        if payload is not None:
            if message.chunked or not payload.is_eof() or payload.exception() is not None:
                return False
            body = payload.read_nowait()
        self._take()
        self.busy = True
        lb = self._lb
        try:
            keep_alive = message.keep_alive and not self.closing
            target = message.target
            refusal = lb.check_request(target, self._peer, message.headers)
            if refusal is not None:
                self._write(render_local_answer(refusal, keep_alive, message.method == "HEAD"))
                self._end_now(keep_alive)
                return True
            url = lb.select_now()
            if url is None:
                self._hand_off(self._answer_held(message, body, keep_alive))
                return True
            headers = render_upstream_headers(message.headers, self._peer, self._scheme, lb.strips_authorization)
            path = target if target[:1] == "/" else compute_origin_form(target)
            pending = lb.forward_now(url, message.method, path, headers, body, self)
            if pending is None:
                self._hand_off(self._forward_and_relay(message, url, headers, body, keep_alive),
                               lambda: lb.abandon_unsent(url, 1))
                return True
            self._pending = pending
            self._now = (message, keep_alive)
        except Exception:  # as the task's loop does: log with context, drop this connection only
            self._failed_now()
        return True

    def _hand_off(self, coroutine: Coroutine[Any, Any, bool], undo: Callable[[], None] = lambda: None) -> None:
        """Have the task await ``coroutine`` for the request begun here; ``undo`` if the client goes first."""
        self._handoff = (coroutine, undo)
        self._wake()

    def _end_now(self, keep_alive: bool) -> None:
        """The request begun here is answered."""
        self.busy = False
        if not keep_alive:
            self._ended = True
            self._wake()
        elif self._queue or self._bad_request is not None or self.closing or self._requests.done:
            self._wake()
        elif not self._lost:
            self._become_idle()

    # ForwardListener: the end of the request begun here, told by the load balancer.

    def forwarded(self, forwarded: Forwarded) -> None:
        assert self._now is not None
        message, keep_alive = self._now
        self._pending = self._now = None
        try:
            self._relay_now(message, forwarded, keep_alive and not self._lost)
        except Exception:  # a callback of the replica's connection: this request's client alone is dropped
            forwarded.release()
            self._failed_now()

    def _relay_now(self, message: RequestHead, forwarded: Forwarded, keep_alive: bool) -> None:
        """Relay a response that came whole here; hand any other to the task (``_relay``)."""
        response = forwarded.response
        length = response.content_length
        if (length is not None and length <= BUFFER_LIMIT) or is_buffered_response(
            response.status, length, message.method
        ):
            data = response.read_now()
            if data is not None:
                try:
                    head = render_response_head(
                        response.status, response.reason, response.headers, _connection_line(message, keep_alive)
                    )
                finally:
                    forwarded.release()
                # Written after the other callbacks of this turn of the loop, as pooled_upstream writes
                # requests (``pooled_upstream._PooledResponse.write`` says why). The request stays this
                # connection's until then: a pipelined request's answer, or a close of the idle connection,
                # must not come first.
                self._loop.call_soon(self._send_and_end, head + data, keep_alive)
                return
        self._hand_off(self._relay(message, forwarded, keep_alive, False), forwarded.release)

    def _send_and_end(self, data: bytes, keep_alive: bool) -> None:
        self._write(data)
        self._end_now(keep_alive)

    def answer(self, answer: LocalAnswer) -> None:
        assert self._now is not None
        message, keep_alive = self._now
        self._pending = self._now = None
        try:
            keep_alive = keep_alive and not self._lost
            self._write(render_local_answer(answer, keep_alive, message.method == "HEAD"))
            self._end_now(keep_alive)
        except Exception:  # as in ``forwarded``
            self._failed_now()

    def go_on(self, forwarding: Coroutine[Any, Any, Forwarded | LocalAnswer], abandon: Callable[[], None]) -> None:
        assert self._now is not None
        message, keep_alive = self._now
        self._pending = self._now = None

        def undo() -> None:
            forwarding.close()
            abandon()

        self._hand_off(self._relay_result(message, forwarding, keep_alive, False), undo)

    def _failed_now(self) -> None:
        """Answering the request begun here failed: log with context and drop this connection, as the
        task's loop does."""
        log.exception("load balancer for service %s: answering a request failed", self._lb.service)
        self.busy = False
        self.abort()

    async def _answer_held(self, message: RequestHead, body: bytes | None, keep_alive: bool) -> bool:
        url = await self._lb.hold_target()
        if url is None:
            self._write(render_local_answer(self._lb.no_replica_answer(), keep_alive, message.method == "HEAD"))
            return keep_alive
        lb = self._lb
        headers = render_upstream_headers(message.headers, self._peer, self._scheme, lb.strips_authorization)
        return await self._forward_and_relay(message, url, headers, body, keep_alive)

    async def _forward_and_relay(
        self,
        message: RequestHead,
        url: str,
        headers: bytes,
        body: bytes | aiohttp.StreamReader | None,
        keep_alive: bool,
        payload: aiohttp.StreamReader | None = None,
        upgrade: bool = False,
    ) -> bool:
        """Forward the request to ``url`` and relay what comes back; ``payload`` is the body's stream when it
        was read here (the connection stays open only when it was read to its end)."""
        length = None if message.chunked else message.content_length  # for a streamed body
        forwarding = self._lb.forward(url, message.method, compute_origin_form(message.target), headers, body, upgrade,
                                      content_length=length)
        return await self._relay_result(message, forwarding, keep_alive, upgrade, payload)

    async def _relay_result(
        self,
        message: RequestHead,
        forwarding: Coroutine[Any, Any, Forwarded | LocalAnswer],
        keep_alive: bool,
        upgrade: bool,
        payload: aiohttp.StreamReader | None = None,
    ) -> bool:
        result = await forwarding
        keep_alive = keep_alive and (payload is None or payload.is_eof()) and not self._lost
        if isinstance(result, LocalAnswer):
            self._write(render_local_answer(result, keep_alive, message.method == "HEAD"))
            return keep_alive
        return await self._relay(message, result, keep_alive, upgrade)

    async def _answer(self, message: RequestHead, payload: aiohttp.StreamReader | None) -> bool:
        """Answer one request; returns whether the connection stays open for the next one."""
        lb = self._lb
        method = message.method
        head_only = method == "HEAD"
        upgrade = message.upgrade
        keep_alive = message.keep_alive and not upgrade and not self.closing
        expect = message.expect
        if expect is not None and expect.lower() != "100-continue":
            answer = LocalAnswer(417, f"Unsupported expectation: {expect!r}; only 100-continue is.\n")
            self._write(render_local_answer(answer, False, head_only))
            return False
        # The guard first, WebSocket handshakes included: a refused request holds no replica and no place in
        # the hold. Its body is not read, so unless it is all here the connection closes after the answer.
        refusal = lb.check_request(message.target, self._peer, message.headers)
        if refusal is not None:
            keep_alive = keep_alive and (payload is None or payload.is_eof())
            self._write(render_local_answer(refusal, keep_alive, head_only))
            return keep_alive
        url = await lb.select_target()
        if url is None:
            keep_alive = keep_alive and (payload is None or payload.is_eof())
            self._write(render_local_answer(lb.no_replica_answer(), keep_alive, head_only))
            return keep_alive
        body: bytes | aiohttp.StreamReader | None = None
        if payload is not None:
            self._body = payload
            if expect is not None and message.version >= (1, 1):
                self._write(_CONTINUE)
            length = message.content_length
            if not message.chunked and length is not None and length <= BUFFER_LIMIT:
                try:
                    body = await payload.read()
                except OSError:
                    return False  # the client went away, or sent a broken body: nobody to answer
            else:
                body = payload
        headers = render_upstream_headers(message.headers, self._peer, self._scheme, lb.strips_authorization)
        # A WebSocket handshake the parser switched on (no body: the switch waits for none) goes to the
        # replica with the two headers that ask for it; any other Upgrade is dropped as hop-by-hop.
        upgrade = message.websocket and self._tunnel_in is not None
        if upgrade:
            headers += b"Connection: Upgrade\r\nUpgrade: %s\r\n" % message.headers.get(_UPGRADE, "").encode(
                "utf-8", "surrogateescape")
        return await self._forward_and_relay(message, url, headers, body, keep_alive, payload, upgrade)

    async def _relay(self, message: RequestHead, forwarded: Forwarded, keep_alive: bool, upgrade: bool) -> bool:
        """Send the replica's response to the client; always releases it. Returns whether to keep alive."""
        try:
            response = forwarded.response
            status = response.status
            if status == 101 and upgrade:
                await self._tunnel(response.tunnel(), response.headers, response.reason)
                return False
            length = response.content_length
            if is_buffered_response(status, length, message.method):
                try:
                    data = await response.read()
                except UpstreamError as exc:
                    last_error = str(exc)
                    log.warning(
                        "service %s: reading the response of %s failed: %s", self._lb.service, forwarded.url, last_error
                    )
                    answer = self._lb.bad_gateway_answer(1, last_error)
                    self._write(render_local_answer(answer, keep_alive, message.method == "HEAD"))
                    return keep_alive
                # Content-Length stays as the replica sent it: ``data`` is exactly that many bytes (a HEAD
                # answer keeps the length of the body it did not send).
                self._write(
                    render_response_head(
                        status, response.reason, response.headers, _connection_line(message, keep_alive)
                    )
                    + data
                )
                return keep_alive
            return await self._stream(message, forwarded, keep_alive)
        finally:
            forwarded.release()

    async def _stream(self, message: RequestHead, forwarded: Forwarded, keep_alive: bool) -> bool:
        response = forwarded.response
        chunked = response.content_length is None and message.version >= (1, 1)
        if response.content_length is None and not chunked:
            keep_alive = False  # an HTTP/1.0 client learns where the body ends by the connection's end
        extra = _connection_line(message, keep_alive) + (b"Transfer-Encoding: chunked\r\n" if chunked else b"")
        self._write(render_response_head(response.status, response.reason, response.headers, extra))
        while True:
            try:
                chunk = await response.read_chunk(STREAM_CHUNK)
            except UpstreamError as exc:
                # The status line is out: the only honest signal left is to cut the client's connection, so
                # that it sees a truncated body rather than a complete-looking short one.
                self._lb.log_body_failure(forwarded.url, exc)
                self.abort()
                return False
            if not chunk:
                break
            if self.transport is None:
                return False  # the client went away
            self._write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
            if self._write_paused:
                try:
                    await self._drain()
                except ConnectionError:
                    return False
        if chunked:
            self._write(_LAST_CHUNK)
        return keep_alive

    # -- WebSocket tunnels -----------------------------------------------------------------------------------

    def _start_tunnel_input(self, tail: bytes) -> None:
        # The parser has switched: what the client sends from here on belongs to the tunnel, read by
        # ``_tunnel`` (or by nobody, when the replica refuses the upgrade and the connection closes).
        reader = new_stream(self, self._loop, READ_LIMIT)
        if tail:
            reader.feed_data(tail)
        self._tunnel_in = reader

    async def _tunnel(self, upstream: UpstreamTunnel, headers: RawHeaders, reason: str | None) -> None:
        """Send the 101, then pass bytes both ways until either side closes or fails; closes the replica's side."""
        client_in = self._tunnel_in
        assert client_in is not None
        upgrade = headers.get(_UPGRADE, "websocket")
        extra = f"Connection: Upgrade\r\nUpgrade: {upgrade}\r\n".encode("utf-8", "surrogateescape")
        self._write(render_response_head(101, reason, headers, extra))
        pipes = (
            self._loop.create_task(_pipe(client_in, upstream.write, upstream.drain)),
            self._loop.create_task(_pipe(upstream.reader, self._write, self._drain)),
        )
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()
            upstream.close()


async def _pipe(
    reader: aiohttp.StreamReader, write: Callable[[bytes], None], drain: Callable[[], Awaitable[None]]
) -> None:
    """Copy ``reader`` to ``write`` until its end or a failure on either side, waiting on ``drain``."""
    try:
        while True:
            data = await reader.readany()
            if not data:
                return
            write(data)
            await drain()
    except (OSError, UpstreamError):  # either side went away: the tunnel ends
        return


def _connection_line(message: RequestHead, keep_alive: bool) -> bytes:
    if not keep_alive:
        return b"Connection: close\r\n"
    # HTTP/1.1 keeps alive unless told; an HTTP/1.0 client that asked for keep-alive must hear it granted.
    return b"" if message.version >= (1, 1) else b"Connection: keep-alive\r\n"


class HttpServer:
    """The listening sockets and the connections, for one ``LoadBalancer`` that has been started.

    ``start`` binds and listens; ``close`` stops listening, closes idle connections, lets requests in
    flight finish for up to ``shutdown_seconds`` and then cuts what is left. ``limits`` bound the client
    connections as the module docstring says (``Listener`` refuses, ``evict_oldest_idle`` makes room, the
    sweep enforces the deadlines). A connection accepted while ``ssl_context()`` gives a context is served
    over TLS with it (``lb.tls``), its handshake within the head deadline. Not reusable after ``close``.
    """

    def __init__(
        self,
        lb: LoadBalancer,
        limits: ConnectionLimits | None = None,
        shutdown_seconds: float = SHUTDOWN_SECONDS,
        ssl_context: Callable[[], ssl.SSLContext | None] = lambda: None,
    ) -> None:
        self.lb = lb
        self.limits = limits if limits is not None else ConnectionLimits()
        self.head_seconds = self.limits.head_seconds
        self.keepalive_seconds = self.limits.keepalive_seconds
        self.connections: set[_ClientConnection] = set()
        # The idle connections, the one idle longest first (dicts keep insertion order; a connection is
        # taken out when a request arrives and put back at the end after its response).
        self.idle: dict[_ClientConnection, None] = {}
        self._shutdown_seconds = shutdown_seconds
        self.ssl_context = ssl_context
        self._listener: Listener | None = None
        self._sweep: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int) -> list[tuple[str, int]]:
        """Listen on ``host:port``; returns the bound addresses (host, port). Raises OSError when it cannot."""
        listener = self._make_listener(per_client=True)
        addresses = listener.start(host, port)
        self._started(listener)
        return addresses

    async def start_taking(self) -> Listener:
        """Start without listening, for a worker process (``lb.workers``): the listener returned is given
        the connections its parent accepted (``Listener.take``). The parent holds every client address to
        its limit, so this one counts only its share of the connections (``limits.max_connections``)."""
        listener = self._make_listener(per_client=False)
        listener.start_taking()
        self._started(listener)
        return listener

    def _started(self, listener: Listener) -> None:
        self._listener = listener
        self._sweep = asyncio.get_running_loop().call_later(SWEEP_SECONDS, self._sweep_idle)

    def _make_listener(self, per_client: bool) -> Listener:
        loop = asyncio.get_running_loop()
        limits = self.limits
        refusal = render_local_answer(
            LocalAnswer(503, too_many_connections_message(self.lb.service, limits.max_connections)), False, False
        )
        client_refusal = render_local_answer(
            LocalAnswer(503, too_many_from_client_message(self.lb.service, limits.per_client)), False, False
        )
        return Listener(
            lambda release: _ClientConnection(self, loop, release),
            refusal,
            f"load balancer for service {self.lb.service}",
            limits.max_connections,
            ssl_context=self.ssl_context,
            max_per_client=limits.per_client if per_client else None,
            client_refusal=client_refusal,
            evict=self.evict_oldest_idle,
            handshake_seconds=limits.head_seconds,
        )

    async def close(self) -> None:
        """Stop listening and end every connection, as the class docstring says. Idempotent."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        listener, self._listener = self._listener, None
        if listener is None:
            return
        listener.close()
        for connection in list(self.connections):
            connection.close_when_idle()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._shutdown_seconds
        while self.connections and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(self.connections):
            connection.abort()

    def evict_oldest_idle(self) -> bool:
        """Close the connection idle the longest, to make room for a new one; False when none is idle."""
        for connection in self.idle:
            connection.close_when_idle()  # takes it out of ``idle``
            return True
        return False

    def _sweep_idle(self) -> None:
        """Close idle connections past their deadline; runs every ``SWEEP_SECONDS`` while listening.

        Only the connections idle for the shorter of the two deadlines are looked at: ``idle`` is in the
        order connections became idle, and no deadline comes sooner than that after ``idle_since``.
        """
        loop = asyncio.get_running_loop()
        now = loop.time()
        horizon = now - min(self.head_seconds, self.keepalive_seconds)
        expired = []
        for connection in self.idle:
            if connection.idle_since > horizon:
                break
            if connection.deadline <= now:
                expired.append(connection)
        for connection in expired:
            connection.time_out()
        self._sweep = loop.call_later(SWEEP_SECONDS, self._sweep_idle)


async def serve(
    lb: LoadBalancer,
    host: str,
    port: int,
    stop: asyncio.Event,
    limits: ConnectionLimits | None = None,
    ssl_context: Callable[[], ssl.SSLContext | None] = lambda: None,
    on_listening: Callable[[list[tuple[str, int]]], Awaitable[None]] | None = None,
) -> None:
    """Run ``lb`` on ``host:port`` under ``limits`` (the defaults when None) until ``stop`` is set or its
    source says the service is gone; over TLS for the connections accepted while ``ssl_context()`` gives a
    context. ``on_listening`` is awaited with the addresses bound, once they are.

    Raises OSError when the port cannot be bound. On return the listening sockets are closed, the requests
    in flight are answered, the counts of completed seconds are flushed and the upstream client is closed.
    """
    server = HttpServer(lb, limits, ssl_context=ssl_context)

    async def begin() -> str:
        addresses = await server.start(host, port)
        if on_listening is not None:
            await on_listening(addresses)
        limits = server.limits
        return (f"listening on {', '.join(f'{address[0]}:{address[1]}' for address in addresses)}"
                f"{_over_https(server)} (at most {limits.max_connections} client connections, {limits.per_client} "
                "per client address")

    await _serve(lb, server, begin, stop)


async def serve_taking(
    lb: LoadBalancer,
    stop: asyncio.Event,
    attach: Callable[[Listener], None],
    limits: ConnectionLimits | None = None,
    ssl_context: Callable[[], ssl.SSLContext | None] = lambda: None,
) -> None:
    """Run ``lb`` as one worker of several (``lb.workers``): nothing is bound; ``attach`` is called with the
    listener once it is started, to give it the connections the parent accepted (``Listener.take``), and
    ``limits.max_connections`` is this worker's share. Returns, as ``serve`` does, when ``stop`` is set or
    the service is gone, with the requests in flight answered."""
    server = HttpServer(lb, limits, ssl_context=ssl_context)

    async def begin() -> str:
        attach(await server.start_taking())
        return (f"taking the connections its parent accepts{_over_https(server)} (at most "
                f"{server.limits.max_connections} client connections, its share; the parent holds each client "
                "address to its limit")

    await _serve(lb, server, begin, stop)


async def _serve(lb: LoadBalancer, server: HttpServer, begin: Callable[[], Awaitable[str]],
                 stop: asyncio.Event) -> None:
    await lb.start()
    try:
        where = await begin()
        log.info(
            "load balancer for service %s %s; head deadline %g s, keep-alive %g s; event loop: %s; %s)",
            lb.service,
            where,
            server.limits.head_seconds,
            server.limits.keepalive_seconds,
            describe_loop(asyncio.get_running_loop()),
            describe_build(__file__),
        )
        await _wait_until_stopped(lb, stop)
    finally:
        # Stop accepting, answer the held requests and finish the ones in flight first, then close the
        # upstream client they use.
        lb.stop_holding()
        await server.close()
        await lb.close()


def _over_https(server: HttpServer) -> str:
    return " over HTTPS" if server.ssl_context() is not None else ""


def is_compiled() -> bool:
    """Whether this module runs compiled by mypyc (setup.py): then the others of the request path do too."""
    return describe_build(__file__) != "interpreted"


def describe_build(module_file: str) -> str:
    """Whether this module (its ``__file__``) runs compiled by mypyc (setup.py) or as Python source, for the
    log: an extension module's file is not a .py."""
    return "interpreted" if module_file.endswith((".py", ".pyc")) else "compiled with mypyc"


def describe_loop(loop: asyncio.AbstractEventLoop) -> str:
    """Which event loop ``loop`` is, for the log: "uvloop", or asyncio's own (where uvloop is not installed,
    as on Windows, the entry point runs on it)."""
    if type(loop).__module__.split(".", 1)[0] == "uvloop":
        return "uvloop"
    return "asyncio's own" + (" (uvloop is not installed)" if importlib.util.find_spec("uvloop") is None else "")


async def _wait_until_stopped(lb: LoadBalancer, stop: asyncio.Event) -> None:
    """Return when ``stop`` is set or the service is gone from the store, whichever comes first."""
    waits = [asyncio.create_task(stop.wait()), asyncio.create_task(lb.wait_source_gone())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
