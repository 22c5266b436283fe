"""One load balancer on several processes: a parent that owns the port and workers that serve.

With ``SKY_LITE_LB_WORKERS`` above 1 (``lb.settings``) the load-balancer process is a *parent*: it binds the
service's port alone (no SO_REUSEPORT: no other process can join the port, so a second load balancer
started on it still fails to bind), accepts every connection under the per-client limit, and hands each
one it admits to a *worker* over a Unix socket (the descriptor travels as SCM_RIGHTS, with an 8-byte
token naming it). A worker is a whole load balancer as the single process is (its own upstream pools,
in-flight ledger, outlier ejection, guard, TLS and metrics file); the parent does nothing per request.

* **Routing**: a new connection goes to the running worker holding the fewest open connections
  (``pick_worker``); the parent counts them from the tokens workers send back when a connection closes
  (``WorkerPool``), so the per-client limit is exact across workers, and each worker holds its share of
  ``max_connections`` (``compute_share``) with the single process's eviction of the longest idle.
* **Lifetimes**: workers are started by the parent and report ready (the zero token) once serving. A
  worker that exits before it is ready at the load balancer's start ends the parent with its exit status
  (e.g. 1: the API keys cannot be read), so that a load balancer that cannot serve still fails as one
  (``plan_worker_exit``); a worker that dies later is started again (``compute_restart_delay``) and its
  connections are released; a worker that stops on its own with status 0 means the service is gone, and
  the parent stops too (a worker stopped by a signal exits with ``STOPPED_STATUS`` and is started again). A
  worker whose parent is gone (the control socket's end of file) stops after answering the requests in
  flight; the parent's SIGTERM is passed on to every worker and waited for.
* **Shared**: the rate limits' buckets (``lb.buckets.SharedBuckets``: one table in a file every worker
  maps, so a client whose connections land on two workers gets its rate once, not twice), the request
  counts and the load report (the store adds them up: each worker reports under its own name); the
  metrics files are one per worker, served with a ``worker`` label (``controller.metrics``).

Where descriptors cannot be passed (Windows), or with one worker, the load balancer is one process as
before.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import functools
import itertools
import logging
import math
import signal
import socket
import struct
import sys
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from skyserve_lite.lb.listener import Listener
from skyserve_lite.lb.settings import ConnectionLimits

__all__ = [
    "READY_TOKEN",
    "STOPPED_STATUS",
    "ExitPlan",
    "HandoffReceiver",
    "Worker",
    "WorkerPool",
    "can_hand_off",
    "compute_exit_status",
    "compute_restart_delay",
    "compute_share",
    "decode_tokens",
    "encode_tokens",
    "make_control_pair",
    "pick_worker",
    "plan_worker_exit",
    "run_parent",
]

log = logging.getLogger(__name__)

_TOKEN: Final = struct.Struct("!Q")
_PEER_GONE: Final = frozenset({errno.EPIPE, errno.ECONNRESET, errno.ECONNREFUSED, errno.ENOTCONN})
# A worker's first message: it is serving. Connection tokens start at 1.
READY_TOKEN: Final = 0
# A worker's exit status when it was stopped (a signal, its parent's end), not because the service is gone
# (0): a worker stopped by hand is started again rather than taken for the end of the service.
STOPPED_STATUS: Final = 3
# Tokens per message a worker sends back: 512 x 8 bytes, one page-sized datagram.
_TOKENS_PER_MESSAGE: Final = 512
# Connections received per wake-up of a worker's control socket, as the listener's ACCEPT_BATCH.
_RECEIVE_BATCH: Final = 100
# A worker that ran this long before dying is started again at once; one that keeps dying sooner waits
# longer each time, up to _MAX_RESTART_DELAY.
_STEADY_SECONDS: Final = 10.0
_MAX_RESTART_DELAY: Final = 30.0


def can_hand_off() -> bool:
    """Whether this platform can pass a socket to another process (SCM_RIGHTS) over a Unix SOCK_SEQPACKET
    pair (message boundaries, and an end of file when the other side is gone): Linux, not Windows."""
    if not hasattr(socket, "send_fds") or not hasattr(socket, "AF_UNIX") or not hasattr(socket, "SOCK_SEQPACKET"):
        return False
    try:
        pair = make_control_pair()
    except OSError:
        return False
    for sock in pair:
        sock.close()
    return True


def make_control_pair() -> tuple[socket.socket, socket.socket]:
    """A connected SOCK_SEQPACKET pair for a parent and one worker (``can_hand_off`` says whether there is
    one). Raises OSError."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def encode_tokens(tokens: Sequence[int]) -> bytes:
    return b"".join(_TOKEN.pack(token) for token in tokens)


def decode_tokens(message: bytes) -> list[int]:
    """The tokens of a message; a trailing partial token (never sent whole) is ignored."""
    return [token for (token,) in _TOKEN.iter_unpack(message[: len(message) - len(message) % _TOKEN.size])]


def pick_worker(open_connections: Sequence[int | None], ready: Sequence[bool] | None = None) -> list[int]:
    """The workers to offer a new connection to, in order: the running ones (``None``: not running), those
    serving (``ready``; all when None) before those still starting, each by fewest open connections and
    the lower index first among equals. Pure."""
    running = [(not (ready is None or ready[index]), count, index)
               for index, count in enumerate(open_connections) if count is not None]
    return [index for _, _, index in sorted(running)]


def compute_share(max_connections: int, workers: int) -> int:
    """Each worker's part of ``max_connections``, rounded up: together they hold at most ``workers - 1``
    more than the limit, and a limit below the count of workers still gives each one connection."""
    return max(1, math.ceil(max_connections / workers))


def compute_restart_delay(quick_deaths: int) -> float:
    """Seconds before starting a worker again after it died ``quick_deaths`` times in a row within
    ``_STEADY_SECONDS`` of its start: 0 after a steady run, then 0.5, 1, 2 ... up to 30. Pure."""
    if quick_deaths <= 0:
        return 0.0
    return min(_MAX_RESTART_DELAY, 0.5 * 2.0 ** (quick_deaths - 1))


class ExitPlan(enum.Enum):
    """What the parent does when a worker exits (``plan_worker_exit``)."""

    NOTHING = "nothing"  # the parent is stopping: it asked for this exit
    FAIL = "fail"  # the first start failed: the load balancer exits with the worker's status
    FINISH = "finish"  # the worker stopped on its own, status 0: the service is gone
    RESTART = "restart"  # it died while serving, or a restart failed: start it again after a delay


def plan_worker_exit(stopping: bool, starting: bool, status: int) -> ExitPlan:
    """The parent's decision for a worker that exited with ``status``: ``starting`` while the pool's first
    start has not finished (a worker that cannot start then is a load balancer that cannot start); a later
    exit is a crash to recover from, unless it is a clean stop on its own (0). Pure."""
    if stopping:
        return ExitPlan.NOTHING
    if starting:
        return ExitPlan.FAIL
    if status == 0:
        return ExitPlan.FINISH
    return ExitPlan.RESTART


def compute_exit_status(status: int) -> int:
    """A process exit status for a worker's: a death by signal N (-N from ``wait``) as a shell shows it,
    128 + N. Pure."""
    return 128 - status if status < 0 else status


class WorkerProcess(Protocol):
    """What the pool needs of a started worker: ``asyncio.subprocess.Process`` is one."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def send_signal(self, signum: int) -> None: ...


@dataclass
class Worker:
    """The parent's record of one worker."""

    index: int
    control: socket.socket | None = None
    process: WorkerProcess | None = None
    ready: bool = False
    started_at: float = 0.0
    quick_deaths: int = 0
    # token -> the listener's release of that connection
    pending: dict[int, Callable[[], None]] = field(default_factory=dict)

    @property
    def open_connections(self) -> int | None:
        """Connections it holds; None when it is not running (one starting takes them: they wait in its
        control socket until it serves)."""
        return len(self.pending) if self.control is not None else None


class WorkerPool:
    """The parent's workers: starts them, hands them connections (``hand_off``, for the parent's
    ``Listener``), releases a connection when its worker says it closed, and starts a dead worker again.

    ``spawn(index, control)`` starts worker ``index`` with ``control`` as its end of the control socket
    (the caller passes it on and the pool closes its copy). ``finished`` is set when the pool will serve no
    more: a worker failed to start (``exit_status`` is its status) or stopped on its own (the service is
    gone; ``exit_status`` 0). Used from one event loop.
    """

    def __init__(self, count: int, spawn: Callable[[int, socket.socket], Awaitable[WorkerProcess]],
                 name: str) -> None:
        self._spawn = spawn
        self._name = name
        self._workers = [Worker(index) for index in range(count)]
        self._tokens = itertools.count(READY_TOKEN + 1)
        self._stopping = False
        self._watchers: set[asyncio.Task[None]] = set()
        self.finished = asyncio.Event()
        self.exit_status = 0
        self._all_ready = asyncio.Event()
        self._starting = True
        self._stop = asyncio.Event()

    @property
    def workers(self) -> Sequence[Worker]:
        return self._workers

    async def start(self) -> bool:
        """Start every worker and wait until each is serving; False (``finished`` set) when one could not."""
        try:
            for worker in self._workers:
                await self._start(worker)
        except OSError as exc:  # no process could be made (EAGAIN, EMFILE): nothing serves
            log.error("%s: cannot start its worker processes: %s", self._name, exc)
            self.exit_status = 1
            self.finished.set()
            return False
        waits = [asyncio.ensure_future(self._all_ready.wait()), asyncio.ensure_future(self.finished.wait()),
                 asyncio.ensure_future(self._stop.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
        self._starting = False
        return self._all_ready.is_set() and not self.finished.is_set() and not self._stop.is_set()

    def hand_off(self, connection: socket.socket, release: Callable[[], None]) -> bool:
        """Give ``connection`` to the worker with the fewest open connections (the next one when a worker's
        queue is full or it just died); False when no worker takes it. The parent's copy is closed once
        it is sent."""
        token = next(self._tokens)
        message = _TOKEN.pack(token)
        workers = self._workers
        for index in pick_worker([worker.open_connections for worker in workers], [w.ready for w in workers]):
            worker = self._workers[index]
            assert worker.control is not None
            try:
                socket.send_fds(worker.control, [message], [connection.fileno()])
            except OSError:  # a full queue (BlockingIOError) or a worker just gone: the next may take it
                continue
            worker.pending[token] = release
            connection.close()
            return True
        return False

    async def stop(self) -> None:
        """SIGTERM to every worker and wait for them to finish their requests in flight. Idempotent."""
        self._stopping = True
        self._stop.set()  # a restart waiting out its delay gives up
        for worker in self._workers:
            if worker.process is not None and worker.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(signal.SIGTERM)
        if self._watchers:
            await asyncio.gather(*self._watchers, return_exceptions=True)

    async def _start(self, worker: Worker) -> None:
        parent_end, worker_end = make_control_pair()
        try:
            parent_end.setblocking(False)
            process = await self._spawn(worker.index, worker_end)
        except BaseException:
            parent_end.close()
            raise
        finally:
            worker_end.close()
        loop = asyncio.get_running_loop()
        worker.control, worker.process, worker.ready = parent_end, process, False
        worker.started_at = loop.time()
        loop.add_reader(parent_end, self._read, worker)
        watcher = asyncio.ensure_future(self._watch(worker, process))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)

    def _read(self, worker: Worker) -> None:
        control = worker.control
        assert control is not None
        for _ in range(_RECEIVE_BATCH):
            try:
                message = control.recv(_TOKENS_PER_MESSAGE * _TOKEN.size)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # not the end of the worker (that is b""): try again at the next wake-up
                log.warning("%s: reading worker %d's control socket failed: %s", self._name, worker.index, exc)
                return
            if not message:  # the worker is gone: its process's exit says how (``_watch``)
                asyncio.get_running_loop().remove_reader(control)
                return
            self._released(worker, decode_tokens(message))

    def _released(self, worker: Worker, tokens: Iterable[int]) -> None:
        for token in tokens:
            if token == READY_TOKEN:
                worker.ready = True
                if all(each.ready for each in self._workers):
                    self._all_ready.set()
                continue
            release = worker.pending.pop(token, None)
            if release is not None:
                release()

    async def _watch(self, worker: Worker, process: WorkerProcess) -> None:
        status = await process.wait()
        loop = asyncio.get_running_loop()
        control, worker.control = worker.control, None
        if control is not None:
            with contextlib.suppress(ValueError, OSError):
                loop.remove_reader(control)
            control.close()
        pending, worker.pending = worker.pending, {}
        for release in pending.values():  # its connections died with it
            release()
        worker.ready = False
        plan = plan_worker_exit(self._stopping, self._starting, status)
        if plan is ExitPlan.NOTHING:
            return
        if plan is not ExitPlan.RESTART:
            if plan is ExitPlan.FAIL:
                log.error("%s: worker %d exited with status %d before it served", self._name, worker.index, status)
            self.exit_status = compute_exit_status(status) if plan is ExitPlan.FAIL else 0
            self._stopping = True
            self.finished.set()
            return
        log.warning("%s: worker %d (pid %d) exited with status %d; %d connection(s) lost", self._name,
                    worker.index, process.pid, status, len(pending))
        await self._restart(worker, steady=loop.time() - worker.started_at >= _STEADY_SECONDS)

    async def _restart(self, worker: Worker, steady: bool) -> None:
        """Start ``worker`` again after the delay its recent deaths call for; a start that fails (no process
        could be made) counts as one more and is tried again, until the pool stops."""
        while not self._stopping:
            worker.quick_deaths = 0 if steady else worker.quick_deaths + 1
            delay = compute_restart_delay(worker.quick_deaths)
            log.warning("%s: starting worker %d again%s", self._name, worker.index, f" in {delay:g} s" if delay else "")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
            if self._stopping:
                return
            try:
                await self._start(worker)
                return
            except OSError as exc:
                log.error("%s: cannot start worker %d: %s", self._name, worker.index, exc)
                steady = False


class HandoffReceiver:
    """A worker's end of its control socket: gives each connection the parent sends to ``listener``
    (``Listener.take``), tells the parent when one is released (the tokens, sent in batches once per
    loop turn) and that the worker is ready, and calls ``parent_gone`` at the control socket's end of file.
    """

    def __init__(self, control: socket.socket, parent_gone: Callable[[], None]) -> None:
        self._control = control
        self._parent_gone = parent_gone
        self._listener: Listener | None = None
        self._released: list[int] = []
        self._flush_scheduled = False
        self._closed = False
        control.setblocking(False)

    def attach(self, listener: Listener) -> None:
        """Start receiving connections for ``listener`` and tell the parent this worker serves."""
        self._listener = listener
        loop = asyncio.get_running_loop()
        self._release(READY_TOKEN)
        loop.add_reader(self._control, self._receive)

    def close(self) -> None:
        """Stop receiving; the releases still due are sent. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(ValueError, OSError, RuntimeError):
            asyncio.get_running_loop().remove_reader(self._control)
        self._flush()

    def _receive(self) -> None:
        listener = self._listener
        assert listener is not None
        for _ in range(_RECEIVE_BATCH):
            try:
                message, fds, _flags, _address = socket.recv_fds(self._control, _TOKEN.size, 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                message, fds = b"", []
            if not message:
                self.close()
                self._parent_gone()
                return
            (token,) = _TOKEN.unpack(message[: _TOKEN.size])
            if not fds:  # the descriptor did not arrive (no file descriptor left here): the client's is closed
                log.warning("a connection handed over by the parent arrived without its socket (open-file limit?)")
                self._release(token)
                continue
            connection = socket.socket(fileno=fds[0])
            try:
                address = connection.getpeername()
            except OSError:  # the client is gone already
                connection.close()
                self._release(token)
                continue
            listener.take(connection, address, functools.partial(self._release, token))

    def _release(self, token: int) -> None:
        self._released.append(token)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        released, self._released = self._released, []
        for start in range(0, len(released), _TOKENS_PER_MESSAGE):
            chunk = released[start:start + _TOKENS_PER_MESSAGE]
            try:
                self._control.send(encode_tokens(chunk))
            except BlockingIOError:  # the parent is behind: keep the rest for the next turn
                self._released = released[start:] + self._released
                self._flush_scheduled = True
                asyncio.get_running_loop().call_later(0.01, self._flush)
                return
            except OSError as exc:
                if exc.errno in _PEER_GONE:
                    return  # the parent is gone: nobody counts them any more
                # ENOBUFS, ENOMEM: a moment's shortage; the tokens must reach the parent
                log.warning("telling the parent of closed connections failed (%s); trying again", exc)
                self._released = released[start:] + self._released
                self._flush_scheduled = True
                asyncio.get_running_loop().call_later(0.1, self._flush)
                return


async def run_parent(
    service: str,
    host: str,
    port: int,
    limits: ConnectionLimits,
    count: int,
    spawn: Callable[[int, socket.socket], Awaitable[WorkerProcess]],
    stop: asyncio.Event,
    on_serving: Callable[[list[tuple[str, int]]], Awaitable[None]] | None = None,
    over_tls: Callable[[], bool] = lambda: False,
) -> int:
    """The parent of ``count`` workers started by ``spawn``: bind ``host:port`` alone, hand the connections
    it admits to them, until ``stop`` is set or the pool finishes (the module docstring says when); then
    SIGTERM to the workers, and wait for them. ``on_serving`` is awaited with the bound addresses once every
    worker serves. ``over_tls()`` says whether the service is served over TLS now (its refusals are then
    a close, as a TLS client could not read a plain 503). Returns the exit status: 0, 1 when the port cannot
    be bound, or the status of a worker that could not start."""
    from skyserve_lite.lb.proxy import LocalAnswer
    from skyserve_lite.lb.server import render_local_answer, too_many_from_client_message

    name = f"load balancer for service {service}"
    pool = WorkerPool(count, spawn, name)
    client_refusal = render_local_answer(
        LocalAnswer(503, too_many_from_client_message(service, limits.per_client)), False, False)
    unplaced = render_local_answer(
        LocalAnswer(503, f"Service {service} is busy: no worker process of its load balancer could take the "
                         "connection. Retry shortly.\n"), False, False)
    # The parent holds each client address to its limit; the total is the workers' (each holds its share
    # and makes room by closing its longest idle connection), so the parent never refuses for it.
    listener = Listener(lambda release: asyncio.Protocol(), unplaced, name, sys.maxsize,
                        max_per_client=limits.per_client, client_refusal=client_refusal, hand_off=pool.hand_off,
                        over_tls=over_tls)
    try:
        try:
            # Bound first (a port taken fails before any worker starts), accepting once the workers run.
            addresses = listener.start(host, port, accepting=False)
        except OSError as exc:
            print(f"sky-lite {name}: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        if not await pool.start():
            return pool.exit_status
        listener.accept()
        log.info("%s listening on %s, handing connections to %d worker processes (%d per client address)", name,
                 ", ".join(f"{address[0]}:{address[1]}" for address in addresses), count, limits.per_client)
        if on_serving is not None:
            await on_serving(addresses)
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(pool.finished.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
        return pool.exit_status
    finally:
        listener.close()
        await pool.stop()  # each worker answers its requests in flight first
        log.info("%s stopped", name)
