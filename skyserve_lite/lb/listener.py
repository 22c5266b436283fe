"""Accepting client connections: at most ``max_connections`` open, and backing off at the open-file limit.

The server does not use ``loop.create_server``: asyncio's accept loop (CPython 3.11) logs a traceback for
every accept that fails with EMFILE and goes on with the rest of its batch of 100, scheduling a retry for
each failure. Under a limit of 64 open files, 150 idle connections made 972 tracebacks (400 KB of log) in
3 s; under 1,024 with 2,000 idle connections, 427,236 tracebacks (418 MB) in 87 s. ``Listener`` does the
accepting itself:

* A listening socket is read (``loop.add_reader``) while the listener accepts; each wake-up accepts what
  is waiting, up to ``ACCEPT_BATCH`` connections, and hands each to asyncio as a transport.
* A connection from an address that has ``max_per_client`` open already is refused: it gets
  ``client_refusal`` (the server's 503 with ``Connection: close``) and is closed at once, holding its file
  descriptor for microseconds.
* With ``max_connections`` open, a new connection asks the server to close its longest idle one
  (``evict``) and takes its place; when none is idle it is refused with ``refusal`` the same way. Keeping
  the limit below the open-file limit is what keeps the next failure mode away.
* When accepting fails (EMFILE or ENFILE: no file descriptor left; ENOBUFS, ENOMEM), the listener stops
  reading its sockets until a connection closes or ``backoff_seconds`` pass, whichever comes first. New
  connections wait in the kernel's backlog meanwhile, and every open connection goes on being served.
* With TLS (``ssl_context`` gives a context, read afresh for every connection, so a new certificate is
  used from the next one on), asyncio does the handshake, within ``handshake_seconds``, before the
  protocol sees the connection. A refused connection is closed without the 503, which a TLS client could
  not read anyway.
* Refusals (per kind), idle connections closed to make room, failed accepts and failed TLS handshakes (a
  plain-HTTP client, a scanner) are logged once per ``log_interval`` each, with the count since the last
  line (``IntervalTally``), never once per connection.

``raise_open_file_limit`` raises the process's soft limit on open files to its hard limit, for the process
entry point to call at start: many systems start processes at a soft limit of 1,024 with a hard limit of
524,288 or more.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import math
import resource
import socket
import ssl
from collections.abc import Callable
from typing import Final

from skyserve_lite.lb.guard import compute_client_key
from skyserve_lite.lb.settings import MAX_CONNECTIONS_PER_CLIENT_VARIABLE, MAX_CONNECTIONS_VARIABLE

__all__ = [
    "ACCEPT_BACKOFF_SECONDS",
    "ACCEPT_BATCH",
    "LISTEN_BACKLOG",
    "LOG_INTERVAL_SECONDS",
    "IntervalTally",
    "Listener",
    "bind_listening_sockets",
    "compute_raised_open_file_limit",
    "raise_open_file_limit",
]

log = logging.getLogger(__name__)

# Connections accepted per wake-up of a listening socket: asyncio's own batch. A burst of 1,000 connects is
# taken in 10 loop iterations, with the requests of open connections served in between.
ACCEPT_BATCH: Final = 100
# nginx's default. Connections wait here while accepting is paused; Linux caps it at net.core.somaxconn
# (4,096 since 5.4).
LISTEN_BACKLOG: Final = 511
# How long accepting pauses after a failed accept when no connection closes first. A closing connection
# resumes at once, so this only matters when descriptors come free elsewhere (an idle upstream connection
# closed by the pool after 4 s): at 0.5 s a load balancer stuck at its limit tries 2 accepts a second.
ACCEPT_BACKOFF_SECONDS: Final = 0.5
# At most one line per kind (refusals, failed accepts) every 10 s: 8,640 lines a day, about 2 MB, for a load
# balancer stuck at its limit all day long.
LOG_INTERVAL_SECONDS: Final = 10.0
# accept() errors after which accepting again at once would fail the same way.
_RESOURCE_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# Bytes of an early request read before a refused connection is closed: closing a socket with unread
# bytes sends a reset, which can make the client drop the 503 unread. A request head is rarely bigger.
_REFUSAL_DRAIN: Final = 64 * 1024
# The soft limit to ask for when the hard limit is "unlimited" (macOS): its usual kern.maxfilesperproc floor.
_UNLIMITED_FALLBACK: Final = 10_240


class IntervalTally:
    """Counts events and says when to log them: the first at once, the next ones at most once per
    ``interval``, as the count since the line before. Pure: the time comes in.

    With an interval of 10: events at 0, 1, 2 and 15 log 1 at 0, then (``take_due`` at 10) 2, then 1 at 15.
    """

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._pending = 0
        self._quiet_until: float | None = None

    def add(self, now: float) -> int:
        """Count one event at ``now``; the count to log now (0: not yet, see ``due_at``)."""
        self._pending += 1
        return self.take_due(now)

    def take_due(self, now: float) -> int:
        """The count to log at ``now``, which restarts the interval; 0 when nothing is pending or not yet due."""
        if not self._pending or (self._quiet_until is not None and now < self._quiet_until):
            return 0
        count, self._pending = self._pending, 0
        self._quiet_until = now + self._interval
        return count

    @property
    def due_at(self) -> float | None:
        """When the pending count is due; None when nothing is pending."""
        if not self._pending:
            return None
        return self._quiet_until if self._quiet_until is not None else float("-inf")


def compute_raised_open_file_limit(soft: int, hard: int) -> int:
    """The soft limit on open files to ask for: the hard limit, or a fallback when that is unlimited.

    (1024, 524288) -> 524288; (1024, 1024) -> 1024; (256, unlimited) -> 10240; never lower than ``soft``.
    """
    if hard == resource.RLIM_INFINITY:
        return soft if soft == resource.RLIM_INFINITY else max(soft, _UNLIMITED_FALLBACK)
    return max(soft, hard)


def raise_open_file_limit() -> tuple[int, int]:
    """Raise this process's soft limit on open files as far as allowed; ``(before, after)``.

    Leaves the limit as it was when the system refuses (``after`` is then ``before``). Never raises.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = compute_raised_open_file_limit(soft, hard)
    if target != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
            return soft, soft
    return soft, target


def bind_listening_sockets(host: str, port: int, backlog: int = LISTEN_BACKLOG) -> list[socket.socket]:
    """Non-blocking sockets listening on every address ``host`` resolves to. Raises OSError when one cannot
    be bound (the others are closed then). Never SO_REUSEPORT: the port is this process's alone, so a
    second load balancer started on it fails to bind (several processes serve one port through a parent
    that hands them its connections: ``lb.workers``)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio does: one socket per family, no mapped addresses
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class _Slot:
    """One accepted connection's place under ``max_connections`` and its address's under
    ``max_per_client``; ``release`` gives both back once, then tells ``released`` (the parent that handed
    the connection over, for a worker: ``Listener.take``)."""

    __slots__ = ("_client", "_listener", "_released", "_then")

    def __init__(self, listener: Listener, client: str, then: Callable[[], None] | None = None) -> None:
        self._listener = listener
        self._client = client
        self._released = False
        self._then = then

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._listener._connection_closed(self._client)
            if self._then is not None:
                self._then()


class Listener:
    """Accepts client connections for one server, as the module docstring says.

    ``make_protocol(release)`` builds the protocol of an accepted connection; the protocol must call
    ``release`` when its connection is lost (more calls are ignored). ``name`` starts every log line.
    ``ssl_context()`` is asked for every accepted connection: a context serves it over TLS, None in plain
    text. ``evict()`` is asked, at ``max_connections``, to close an idle connection (True when it did; its
    ``release`` may come later). ``max_per_client`` None puts no limit per address. The constructor only
    stores its arguments; ``start`` binds and listens, ``close`` stops. Used from one event loop; not
    reusable after ``close``.

    With several worker processes (``lb.workers``) the parent's listener accepts and, instead of serving a
    connection it admits, gives it to ``hand_off(connection, release)``: True when a worker took it (the
    parent then calls ``release`` when the worker says the connection closed), False to refuse it. A
    worker's listener binds nothing (``start_taking``) and is given each connection with ``take``; the
    parent, which has no TLS context, is told by ``over_tls()`` whether its refusals must be silent.
    """

    def __init__(
        self,
        make_protocol: Callable[[Callable[[], None]], asyncio.Protocol],
        refusal: bytes,
        name: str,
        max_connections: int,
        backoff_seconds: float = ACCEPT_BACKOFF_SECONDS,
        log_interval: float = LOG_INTERVAL_SECONDS,
        ssl_context: Callable[[], ssl.SSLContext | None] = lambda: None,
        max_per_client: int | None = None,
        client_refusal: bytes = b"",
        evict: Callable[[], bool] = lambda: False,
        handshake_seconds: float | None = None,
        hand_off: Callable[[socket.socket, Callable[[], None]], bool] | None = None,
        over_tls: Callable[[], bool] | None = None,
    ) -> None:
        self._make_protocol = make_protocol
        self._hand_off = hand_off
        self._refusal = refusal
        self._name = name
        self._max_connections = max_connections
        self._backoff_seconds = backoff_seconds
        self._ssl_context = ssl_context
        # Whether clients speak TLS now, so that a refusal is a close without the 503 they could not read:
        # ssl_context() says so, or for a parent that hands connections over (no context of its own) this.
        self._over_tls = over_tls if over_tls is not None else lambda: ssl_context() is not None
        self._max_per_client = max_per_client
        self._client_refusal = client_refusal or refusal
        self._evict = evict
        self._handshake_seconds = handshake_seconds
        self._per_client: dict[str, int] = {}
        self._refused = IntervalTally(log_interval)
        self._refused_client = IntervalTally(log_interval)
        self._evicted = IntervalTally(log_interval)
        self._failed = IntervalTally(log_interval)
        self._handshakes = IntervalTally(log_interval)
        self._unplaced = IntervalTally(log_interval)
        self._tallies = (self._refused, self._refused_client, self._evicted, self._failed, self._handshakes,
                         self._unplaced)
        self._last_client = ""
        self._last_error = ""
        self._last_handshake_error = ""
        self._sockets: list[socket.socket] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open = 0
        self._reading = False
        self._closed = False
        self._resume_handle: asyncio.TimerHandle | None = None
        self._log_handle: asyncio.TimerHandle | None = None
        self._admitting: set[asyncio.Task[tuple[asyncio.Transport, asyncio.Protocol]]] = set()

    @property
    def open_connections(self) -> int:
        """Connections accepted and not released yet."""
        return self._open

    def open_from(self, client: str) -> int:
        """Connections accepted from the address ``client`` and not released yet."""
        return self._per_client.get(client, 0)

    def start(self, host: str, port: int, accepting: bool = True) -> list[tuple[str, int]]:
        """Listen on ``host:port`` and start accepting (``accepting`` False: once ``accept`` is called; new
        connections wait in the backlog meanwhile); the bound (host, port) pairs. Raises OSError."""
        self._loop = asyncio.get_running_loop()
        self._sockets = bind_listening_sockets(host, port)
        if accepting:
            self._read()
        return [(str(sock.getsockname()[0]), int(sock.getsockname()[1])) for sock in self._sockets]

    def accept(self) -> None:
        """Start accepting, after ``start(..., accepting=False)``."""
        self._read()

    def start_taking(self) -> None:
        """Start without a listening socket: connections come through ``take`` (a worker's listener)."""
        self._loop = asyncio.get_running_loop()

    def take(self, connection: socket.socket, address: object, released: Callable[[], None]) -> None:
        """Serve ``connection``, accepted elsewhere from ``address`` (the parent of a worker), under this
        listener's limits as an accepted one is; ``released`` is called once it is closed, refused or not."""
        if self._closed:
            connection.close()
            released()
            return
        self._decide(connection, address, released)

    def close(self) -> None:
        """Stop accepting and close the listening sockets; open connections are the server's. Idempotent."""
        self._closed = True
        self._pause()
        for handle in (self._resume_handle, self._log_handle):
            if handle is not None:
                handle.cancel()
        self._resume_handle = self._log_handle = None
        self._log_due(math.inf)  # what is pending, due or not: nothing logs after this
        for sock in self._sockets:
            sock.close()
        self._sockets = []

    def _read(self) -> None:
        if self._reading or self._closed:
            return
        loop = self._loop
        assert loop is not None
        for sock in self._sockets:
            loop.add_reader(sock, self._accept, sock)
        self._reading = True

    def _pause(self) -> None:
        if not self._reading:
            return
        loop = self._loop
        assert loop is not None
        for sock in self._sockets:
            loop.remove_reader(sock)
        self._reading = False

    def _accept(self, listening: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                connection, address = listening.accept()
            except (BlockingIOError, InterruptedError):
                return  # nothing more waits
            except ConnectionAbortedError:
                continue  # the client gave up while in the backlog
            except OSError as exc:
                self._back_off(exc)
                return
            self._decide(connection, address, None)

    def _decide(self, connection: socket.socket, address: object, released: Callable[[], None] | None) -> None:
        # One client as the rate limits count one: an IPv6 /64 together, `::ffff:1.2.3.4` as `1.2.3.4`.
        client = compute_client_key(str(address[0])) if isinstance(address, tuple) and address else ""
        if self._max_per_client is not None and self._per_client.get(client, 0) >= self._max_per_client:
            self._last_client = client
            self._refuse(connection, self._client_refusal, self._refused_client)
        elif self._open >= self._max_connections and not self._make_room():
            self._refuse(connection, self._refusal, self._refused)
        else:
            self._admit(connection, client, released)
            return
        if released is not None:
            released()

    def _make_room(self) -> bool:
        if not self._evict():
            return False
        self._count(self._evicted)
        return True

    def _admit(self, connection: socket.socket, client: str, released: Callable[[], None] | None) -> None:
        loop = self._loop
        assert loop is not None
        connection.setblocking(False)
        self._open += 1
        self._per_client[client] = self._per_client.get(client, 0) + 1
        slot = _Slot(self, client, released)
        if self._hand_off is not None:
            if not self._hand_off(connection, slot.release):
                slot.release()
                self._refuse(connection, self._refusal, self._unplaced)
            return
        context = self._ssl_context()
        extra = {"ssl_handshake_timeout": self._handshake_seconds} if context is not None else {}
        task = loop.create_task(
            loop.connect_accepted_socket(lambda: self._make_protocol(slot.release), connection, ssl=context, **extra)
        )
        self._admitting.add(task)
        task.add_done_callback(lambda done: self._admitted(done, connection, slot))

    def _admitted(
        self,
        task: asyncio.Task[tuple[asyncio.Transport, asyncio.Protocol]],
        connection: socket.socket,
        slot: _Slot,
    ) -> None:
        self._admitting.discard(task)
        error = None if task.cancelled() else task.exception()
        if task.cancelled() or error is not None:
            # No transport came of it (e.g. the loop is closing): the connection holds nothing any more.
            connection.close()
            slot.release()
            if isinstance(error, (ssl.SSLError, ConnectionError, asyncio.TimeoutError)):
                # A failed TLS handshake: the client's doing (plain HTTP, a scanner, a timeout), counted.
                self._last_handshake_error = str(error) or type(error).__name__
                self._count(self._handshakes)
            elif error is not None:
                log.warning("%s: setting up an accepted connection failed: %s", self._name, error)

    def _refuse(self, connection: socket.socket, refusal: bytes, tally: IntervalTally) -> None:
        with contextlib.suppress(OSError):
            connection.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                connection.recv(_REFUSAL_DRAIN)
            if not self._over_tls():
                connection.send(refusal)
            connection.shutdown(socket.SHUT_WR)
        connection.close()
        self._count(tally)

    def _back_off(self, exc: OSError) -> None:
        loop = self._loop
        assert loop is not None
        self._pause()
        if self._resume_handle is None:
            self._resume_handle = loop.call_later(self._backoff_seconds, self._resume)
        self._last_error = exc.strerror or str(exc)
        if exc.errno not in _RESOURCE_ERRNOS:
            self._last_error += f" (errno {exc.errno})"
        self._count(self._failed)

    def _resume(self) -> None:
        self._resume_handle = None
        self._read()

    def _connection_closed(self, client: str) -> None:
        self._open -= 1
        left = self._per_client.get(client, 0) - 1
        if left > 0:
            self._per_client[client] = left
        else:
            self._per_client.pop(client, None)
        if self._resume_handle is not None:  # paused for want of descriptors: one just came free
            self._resume_handle.cancel()
            self._resume()

    def _count(self, tally: IntervalTally) -> None:
        loop = self._loop
        assert loop is not None
        count = tally.add(loop.time())
        if count:
            self._log(tally, count)
        else:
            self._schedule_log()

    def _schedule_log(self) -> None:
        loop = self._loop
        assert loop is not None
        if self._log_handle is not None or self._closed:
            return
        due = [tally.due_at for tally in self._tallies if tally.due_at is not None]
        if due:
            self._log_handle = loop.call_at(min(due), self._log_due_and_reschedule)

    def _log_due_and_reschedule(self) -> None:
        assert self._loop is not None
        self._log_handle = None
        self._log_due(self._loop.time())
        self._schedule_log()

    def _log_due(self, now: float) -> None:
        for tally in self._tallies:
            count = tally.take_due(now)
            if count:
                self._log(tally, count)

    def _log(self, tally: IntervalTally, count: int) -> None:
        if tally is self._refused:
            log.warning(
                "%s: refused %d connection(s) since the last report: %d client connections are open, the limit "
                "set by %s",
                self._name,
                count,
                self._open,
                MAX_CONNECTIONS_VARIABLE,
            )
        elif tally is self._refused_client:
            log.warning(
                "%s: refused %d connection(s) since the last report from client addresses at their limit of %d "
                "connections, set by %s (the last from %s)",
                self._name,
                count,
                self._max_per_client,
                MAX_CONNECTIONS_PER_CLIENT_VARIABLE,
                self._last_client,
            )
        elif tally is self._evicted:
            log.info(
                "%s: closed %d idle connection(s) since the last report to make room for new ones (%d open, the "
                "limit set by %s)",
                self._name,
                count,
                self._open,
                MAX_CONNECTIONS_VARIABLE,
            )
        elif tally is self._unplaced:
            log.warning("%s: refused %d connection(s) since the last report: no worker process took them (all "
                        "starting again, or their queues full)", self._name, count)
        elif tally is self._handshakes:
            log.info(
                "%s: %d TLS handshake(s) failed since the last report (the last: %s)",
                self._name,
                count,
                self._last_handshake_error,
            )
        else:
            log.warning(
                "%s: %d accept(s) failed since the last report: %s; %d client connections open (limit %d, %s); "
                "accepting again once one closes or after %.1f s",
                self._name,
                count,
                self._last_error,
                self._open,
                self._max_connections,
                MAX_CONNECTIONS_VARIABLE,
                self._backoff_seconds,
            )
