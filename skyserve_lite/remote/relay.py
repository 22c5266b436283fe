"""`controller rpc` as a relay to the running controller loop, so a call costs no import of sky-lite.

The controller loop serves the protocol on ``$SKY_LITE_HOME/rpc.sock`` (``listener``). A `controller rpc`
process (one per call, started by ssh) then only has to start Python, read the request line, and copy
bytes both ways between its stdio and that socket: a few milliseconds, where loading sky-lite to serve the
call itself takes a few hundred. When no loop listens (stopped, starting, a home whose path is too long
for a socket) or the method must not run inside the loop (``force_down`` stops the loop itself), the
caller serves the request in its own process instead, from the line this module read.

Only the standard library is imported here.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from pathlib import Path
from typing import IO

SOCKET_FILE = "rpc.sock"
# Linux's limit for a socket's path (sun_path is 108 bytes, with its terminating NUL).
_SOCKET_PATH_LIMIT = 107
# Methods served by the caller itself, never by the loop: force_down stops the loop it would run in.
NOT_RELAYED = frozenset({"force_down"})
_CHUNK = 1 << 16


def socket_path(home: Path) -> Path | None:
    """Where the loop of ``home`` listens; None when the path is too long to be a socket's."""
    path = home / SOCKET_FILE
    return path if len(os.fsencode(path)) <= _SOCKET_PATH_LIMIT else None


def relay(home: Path, stdin: IO[bytes], stdout_fd: int) -> tuple[int | None, bytes]:
    """Relay one request from ``stdin`` to the loop of ``home`` and its answer to ``stdout_fd``.

    Returns ``(exit status, b"")`` when relayed, else ``(None, the request line read)`` for the caller to
    serve (see the module docstring)."""
    line = stdin.readline(1 << 28)
    path = socket_path(home)
    if path is None or _method_of(line) in NOT_RELAYED:
        return None, line
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(os.fspath(path))
    except OSError:
        connection.close()
        return None, line

    def upstream() -> None:
        read = getattr(stdin, "read1", stdin.read)
        with contextlib.suppress(OSError):
            connection.sendall(line)
            while data := read(_CHUNK):
                connection.sendall(data)
        with contextlib.suppress(OSError):  # the end of the request (and, for a follow, the client leaving)
            connection.shutdown(socket.SHUT_WR)

    threading.Thread(target=upstream, daemon=True).start()
    answered = False
    try:
        while data := connection.recv(_CHUNK):
            answered = True
            _write_all(stdout_fd, data)
    except BrokenPipeError:  # the client went away
        return 0, b""
    finally:
        connection.close()
    return (0 if answered else 1), b""


def _method_of(line: bytes) -> object:
    try:
        request = json.loads(line)
    except ValueError:
        return None
    return request.get("method") if isinstance(request, dict) else None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class Prefixed:
    """``stream`` with ``first`` put back in front of it (the request line ``relay`` read)."""

    def __init__(self, first: bytes, stream: IO[bytes]) -> None:
        self._first = first
        self._stream = stream

    def readline(self, limit: int = -1) -> bytes:
        if self._first:
            line, self._first = self._first, b""
            return line
        return self._stream.readline(limit)

    def read(self, n: int = -1) -> bytes:
        if self._first:
            head = self._first if n < 0 else self._first[:n]
            self._first = self._first[len(head):]
            return head
        return self._stream.read(n)
