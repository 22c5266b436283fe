"""The controller loop's protocol socket: ``$SKY_LITE_HOME/rpc.sock`` (see ``relay``).

Each connection is one request, served by ``RpcServer`` against the home's ``LocalController`` in a thread
of its own (a follow of a log can last long), at most ``MAX_CONNECTIONS`` at once; the loop's passes go
on meanwhile. The socket is private (mode 0600, in the home, which is 0700) and goes with the loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from pathlib import Path

from skyserve_lite.remote.relay import socket_path

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 32


class RpcListener:
    """Created idle; ``start()`` binds and accepts in a thread, ``close()`` stops and removes the socket."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self._socket: socket.socket | None = None
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._closed = threading.Event()

    def start(self) -> bool:
        """Listen; False (logged) when it cannot, and calls are then served by each `controller rpc` alone.
        The caller holds the controller lock, so a socket file left there is a dead loop's."""
        path = socket_path(self.home)
        if path is None:
            log.warning("%s is too long a path for a socket; each call will load sky-lite itself", self.home)
            return False
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            old_umask = os.umask(0o177)
            try:
                listener.bind(os.fspath(path))
            finally:
                os.umask(old_umask)
            listener.listen(MAX_CONNECTIONS)
        except OSError as exc:
            listener.close()
            log.warning("cannot listen on %s (%s); each call will load sky-lite itself", path, exc)
            return False
        self._socket = listener
        threading.Thread(target=self._accept, name="rpc-listener", daemon=True).start()
        return True

    def close(self) -> None:
        self._closed.set()
        if self._socket is not None:
            self._socket.close()
            path = socket_path(self.home)
            if path is not None:
                path.unlink(missing_ok=True)

    def _accept(self) -> None:
        assert self._socket is not None
        while not self._closed.is_set():
            self._slots.acquire()
            try:
                connection, _ = self._socket.accept()
            except OSError:
                self._slots.release()
                return  # closed
            threading.Thread(target=self._serve, args=(connection,), name="rpc", daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        from skyserve_lite.api import LocalController
        from skyserve_lite.remote.server import RpcServer

        try:
            with connection, connection.makefile("rb") as reader, connection.makefile("wb") as writer:
                RpcServer(self.home, reader, writer, LocalController(self.home, stop_when_idle=False)).serve()
        except Exception:  # a thread's top: log with context, the connection closes without an answer
            log.exception("serving a call on %s failed", socket_path(self.home))
        finally:
            self._slots.release()
