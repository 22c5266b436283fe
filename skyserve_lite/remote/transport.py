"""How a request reaches `sky-lite controller rpc`: a one-method interface and its implementations.

``Transport.open()`` starts one run of the remote command and returns its ``Channel``: write the request
to ``stdin``, read the answer from ``stdout``, then ``finish()`` for the exit status and stderr. That is the
whole contract; the protocol on top of it is ``protocol``'s.

- ``CommandTransport`` runs an argv per request: ``ssh [options] HOST 'SKY_LITE_HOME=... <venv>/bin/sky-lite
  controller rpc'`` for a controller host, or the rpc command itself on this machine (what the latency
  benchmark compares against).
- ``InProcessTransport`` runs the server in a thread of this process on a state directory: a test double
  that speaks the real protocol through real pipes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Protocol


def _close_all(*streams: IO[bytes]) -> None:
    for stream in streams:
        with contextlib.suppress(OSError):
            stream.close()


class Channel(Protocol):
    stdin: IO[bytes]
    stdout: IO[bytes]

    def finish(self) -> tuple[int, str]:
        """Close both ends, wait for the command to end; its exit status (negative: killed by that signal)
        and what it wrote to stderr."""
        ...

    def kill(self) -> None:
        """End the command now (what a dropped connection looks like)."""
        ...


class Transport(Protocol):
    where: str  # for messages: "ssh://ubuntu@203.0.113.5:22"

    def open(self) -> Channel:
        """Start one run of the rpc command. Raises ``OSError`` when it cannot be started."""
        ...


class _ProcessChannel:
    def __init__(self, process: subprocess.Popen[bytes], stderr: IO[bytes]) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process = process
        self.stdin = process.stdin
        self.stdout = process.stdout
        self._stderr = stderr

    def finish(self) -> tuple[int, str]:
        _close_all(self.stdin, self.stdout)
        code = self.process.wait()
        self._stderr.seek(0)
        text = self._stderr.read().decode(errors="replace")
        self._stderr.close()
        return code, text

    def kill(self) -> None:
        self.process.kill()


class CommandTransport:
    """Runs ``argv`` for each request (stderr to a temporary file, so a chatty command never blocks)."""

    def __init__(self, argv: Sequence[str], *, where: str, env: Mapping[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.where = where
        self._env = dict(env) if env is not None else None

    def open(self) -> Channel:
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 (the channel closes it in finish())
        try:
            process = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                       env=self._env, start_new_session=True)
        except OSError:
            stderr.close()
            raise
        return _ProcessChannel(process, stderr)


class _ThreadChannel:
    def __init__(self, home: Path, start_daemon: bool) -> None:
        from skyserve_lite.api import LocalController
        from skyserve_lite.remote.server import RpcServer

        request_read, request_write = os.pipe()
        answer_read, answer_write = os.pipe()
        self.stdin: IO[bytes] = os.fdopen(request_write, "wb")
        self.stdout: IO[bytes] = os.fdopen(answer_read, "rb")
        self._server_in = os.fdopen(request_read, "rb")
        self._server_out = os.fdopen(answer_write, "wb")
        self._code = 0
        self._error = ""

        def run() -> None:
            try:
                controller = LocalController(home, start_daemon=start_daemon)
                self._code = RpcServer(home, self._server_in, self._server_out, controller).serve()
            except Exception as exc:  # reported as the command's stderr, like a traceback
                self._code, self._error = 1, f"{type(exc).__name__}: {exc}"
            finally:
                _close_all(self._server_out, self._server_in)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def finish(self) -> tuple[int, str]:
        _close_all(self.stdin, self.stdout)
        self._thread.join(timeout=60)
        return self._code, self._error

    def kill(self) -> None:
        _close_all(self.stdin, self.stdout)


class InProcessTransport:
    """The server of the state directory ``home``, run in a thread per request (``start_daemon``: whether
    its submissions start a background controller, as on a real host)."""

    def __init__(self, home: Path, *, start_daemon: bool = False) -> None:
        self.home = home
        self.where = f"in-process controller of {home}"
        self._start_daemon = start_daemon

    def open(self) -> Channel:
        return _ThreadChannel(self.home, self._start_daemon)



