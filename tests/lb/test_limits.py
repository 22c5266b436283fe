"""Limits on client connections: the connection cap refuses cleanly, and at the open-file limit the load
balancer backs off accepting, logs a bounded number of lines and keeps serving its open connections."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from skyserve_lite.lb.listener import IntervalTally, compute_raised_open_file_limit

from .serving import serving

REPO = Path(__file__).resolve().parents[2]
GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
INF = resource.RLIM_INFINITY


def _run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


# -- pure helpers -----------------------------------------------------------------------------------------

# (time, "event" or "tick") -> the count logged then; interval 10 s.
_TALLY_SCENARIOS = {
    "first at once, the rest after the interval": [(0, "event", 1), (1, "event", 0), (2, "event", 0), (10, "tick", 2)],
    "a tick before the interval logs nothing": [(0, "event", 1), (3, "event", 0), (9.9, "tick", 0), (10, "tick", 1)],
    "quiet for an interval: the next one at once": [(0, "event", 1), (15, "event", 1), (16, "event", 0)],
    "nothing pending: a tick logs nothing": [(0, "tick", 0), (0, "event", 1), (20, "tick", 0)],
    "a burst of 10,000 is one line": [(0, "event", 1)] + [(t / 1000, "event", 0) for t in range(1, 10_000)],
}


@pytest.mark.parametrize("steps", list(_TALLY_SCENARIOS.values()), ids=list(_TALLY_SCENARIOS))
def test_interval_tally_logs_the_first_at_once_then_counts_once_per_interval(
    steps: list[tuple[float, str, int]],
) -> None:
    tally = IntervalTally(10.0)
    for now, kind, expected in steps:
        logged = tally.add(now) if kind == "event" else tally.take_due(now)
        assert logged == expected, (now, kind)


def test_interval_tally_says_when_the_pending_count_is_due() -> None:
    tally = IntervalTally(10.0)
    assert tally.due_at is None
    tally.add(5.0)
    assert tally.due_at is None  # logged at once, nothing pending
    tally.add(6.0)
    assert tally.due_at == 15.0


@pytest.mark.parametrize(
    ("soft", "hard", "expected"),
    [(1_024, 524_288, 524_288), (1_024, 1_024, 1_024), (256, INF, 10_240), (20_000, INF, 20_000), (INF, INF, INF)],
)
def test_raised_open_file_limit_is_the_hard_limit(soft: int, hard: int, expected: int) -> None:
    assert compute_raised_open_file_limit(soft, hard) == expected


# -- the connection cap, in process -----------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _serving(max_connections: int) -> AsyncIterator[int]:
    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", ok)
    async with serving(app, max_connections=max_connections) as (_host, port):
        yield port


async def _ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    """Send one GET on a kept-alive connection and read the whole response; returns its status line."""
    writer.write(GET)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length:"))
    await asyncio.wait_for(reader.readexactly(length), 10)
    return lines[0]


@pytest.mark.timeout(60)
def test_connections_beyond_the_cap_get_503_and_a_close_and_one_log_line_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def body() -> None:
        caplog.set_level(logging.WARNING, logger="skyserve_lite.lb.listener")
        async with _serving(max_connections=3) as port:
            kept = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
            for reader, writer in kept:
                assert (await _ask(reader, writer)).startswith(b"HTTP/1.1 200 ")
            refused = 20
            for _ in range(refused):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(GET)
                answer = await asyncio.wait_for(reader.read(), 10)  # to the end: the server closes
                head, _, text = answer.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 503 ")
                assert b"Connection: close" in head.split(b"\r\n")
                assert b"SKY_LITE_LB_MAX_CONNECTIONS" in text
                writer.close()
            # The connections within the cap were not disturbed.
            for reader, writer in kept:
                assert (await _ask(reader, writer)).startswith(b"HTTP/1.1 200 ")
            # One closes: its place is free for the next connection (once the server has seen the close).
            kept[0][1].close()
            deadline = time.monotonic() + 10
            while True:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(GET)
                status_line = (await asyncio.wait_for(reader.readuntil(b"\r\n"), 10)).strip()
                writer.close()
                if status_line.startswith(b"HTTP/1.1 200 "):
                    break
                assert status_line.startswith(b"HTTP/1.1 503 ")
                refused += 1
                assert time.monotonic() < deadline, "the closed connection's place never came free"
                await asyncio.sleep(0.01)
            for _, other in kept[1:]:
                other.close()
        refusals = [record.getMessage() for record in caplog.records if "refused" in record.getMessage()]
        # The first refusal at once, all the others in one line (here when the server closed, within 10 s).
        assert len(refusals) == 2, refusals
        assert "refused 1 connection(s)" in refusals[0]
        assert f"refused {refused - 1} connection(s)" in refusals[1]

    _run(body)


# -- the open-file limit, in a process of its own ---------------------------------------------------------

# The load balancer process may open 64 files; it uses about 15 before its first client. 150 idle clients
# take the rest, and the ones beyond wait in the listening socket's backlog (511).
_OPEN_FILE_LIMIT = 64
_IDLE_CLIENTS = 150


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _wait_until_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while True:
        assert process.poll() is None, "the load balancer exited"
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            assert time.monotonic() < deadline, "the load balancer never listened"
            await asyncio.sleep(0.02)
        else:
            writer.close()
            return


def _limit_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (_OPEN_FILE_LIMIT, _OPEN_FILE_LIMIT))


@pytest.mark.timeout(60)
def test_at_the_open_file_limit_it_backs_off_logs_little_and_keeps_serving(tmp_path: Path) -> None:
    async def body() -> None:
        async def ok(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/", ok)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        log_path = tmp_path / "lb.log"
        port = _free_port()
        idle: list[asyncio.StreamWriter] = []
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            host, backend_port = runner.addresses[0][:2]
            # The cap (10,000) is far above what 64 files allow: accepting itself fails.
            command = [sys.executable, "-m", "tests.lb.serve_static", str(port), "10000"]
            with log_path.open("wb") as log_file:
                process = subprocess.Popen(
                    [*command, f"http://{host}:{backend_port}"],
                    cwd=REPO,
                    stdout=subprocess.DEVNULL,
                    stderr=log_file,
                    preexec_fn=_limit_open_files,
                )
            try:
                await _wait_until_listening(port, process)
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                assert (await _ask(reader, writer)).startswith(b"HTTP/1.1 200 ")
                for _ in range(_IDLE_CLIENTS):
                    _, idle_writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
                    idle.append(idle_writer)
                # Time for today's asyncio accept loop to write hundreds of tracebacks.
                await asyncio.sleep(1.5)
                # The open connection is still served at the limit.
                assert (await _ask(reader, writer)).startswith(b"HTTP/1.1 200 ")
                # Once clients go, it accepts again: a new client is served.
                for idle_writer in idle:
                    idle_writer.close()
                idle.clear()
                fresh_reader, fresh_writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
                assert (await _ask(fresh_reader, fresh_writer)).startswith(b"HTTP/1.1 200 ")
                fresh_writer.close()
                writer.close()
            finally:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        finally:
            for idle_writer in idle:
                idle_writer.close()
            await runner.cleanup()
        log = log_path.read_text()
        lines = log.splitlines()
        assert "Traceback" not in log
        assert len(lines) <= 10, log
        failed = [line for line in lines if "accept(s) failed" in line]
        assert failed, log
        assert "Too many open files" in failed[0]
        assert process.returncode == 0, log

    _run(body)
