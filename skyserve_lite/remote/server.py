"""`sky-lite controller rpc`: serve one request (``protocol``) against this host's ``LocalController``.

The request comes on stdin, the answer goes to stdout; nothing else is ever written to stdout. Each method
is a thin call of ``LocalController`` with its parameters decoded to the api's types (``codec``), plus
what only a remote client needs: ``describe`` (what runs here, for `controller status`), ``missing_blobs``
and ``put_blobs`` (a submission uploads only the file contents the host lacks, then submits the version
in one call). Every method is safe to retry; submissions carry an idempotency key, and
``submission_outcome`` tells a client whose connection dropped whether its submission was stored. An answer
to a submission the host had stored already (a retry, or the same command run again) says so
(``replayed``).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from skyserve_lite import __version__
from skyserve_lite.api import DEFAULT_EVENTS, LocalController
from skyserve_lite.codec import decode, encode
from skyserve_lite.controller.fleet import list_controller_views
from skyserve_lite.errors import ControllerVersionError, NotFoundError, SkyLiteError, UsageError
from skyserve_lite.files.blobs import blob_store_of
from skyserve_lite.plan.canary import CanarySettings, Command
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.remote import protocol
from skyserve_lite.remote.wire import BlobHeader, HostInfo, SubmissionOutcome, WireTask

# At most this many bytes of one blob are held in memory while it is checked and stored.
_CHUNK = 1 << 20


class RpcServer:
    """One request's worth of serving. ``stdin``/``stdout`` are binary streams."""

    def __init__(self, home: Path, stdin: IO[bytes], stdout: IO[bytes],
                 controller: LocalController | None = None) -> None:
        self.home = home
        self._in = stdin
        self._out = stdout
        self._controller = controller or LocalController(home, stop_when_idle=False)

    def serve(self) -> int:
        """Read one request, answer it; the exit status (0 unless the request could not be read)."""
        try:
            request = protocol.read_message(self._in)
        except protocol.ProtocolError as exc:
            protocol.write_message(self._out, protocol.make_error(exc))
            return 2
        if request is None:
            return 2
        method = str(request.get("method"))
        try:
            problem = protocol.find_version_problem(request)
            if problem is not None and method not in protocol.VERSIONLESS_METHODS:
                raise ControllerVersionError(
                    f"the controller runs sky-lite {__version__} (protocol {protocol.PROTOCOL_VERSION}) and this "
                    f"client is {problem}; run `sky-lite controller upgrade` to install this client's version "
                    "on the controller host")
            handler = self._handlers().get(method)
            if handler is None:
                raise UsageError(f"the controller has no method {method!r}")
            params = request.get("params")
            if not isinstance(params, dict):
                raise protocol.ProtocolError("a request's params must be an object")
            handler(params, request.get("key"))
        except SkyLiteError as exc:
            protocol.write_message(self._out, protocol.make_error(exc))
        except ValueError as exc:  # params that do not decode (codec), named by field
            protocol.write_message(self._out, protocol.make_error(protocol.ProtocolError(str(exc))))
        except BrokenPipeError:  # the client went away (Ctrl-C on `serve logs --follow`)
            return 0
        return 0

    def _handlers(self) -> dict[str, Callable[[dict[str, Any], Any], None]]:
        c = self._controller
        return {
            "describe": lambda p, k: self._answer(self._describe()),
            "list_controllers": lambda p, k: self._answer(list_controller_views(self.home)),
            "create_service": lambda p, k: self._answer_submission(p, k, "create_service", lambda: c.create_service(
                _get(p, "name", str), _get(p, "task", WireTask).to_task(),
                endpoint_port=_get(p, "endpoint_port", int | None), key=_key(k))),
            "get_status": lambda p, k: self._answer(c.get_status(
                _get(p, "names", tuple[str, ...]), events=_get_or(p, "events", int, DEFAULT_EVENTS))),
            "get_status_report": lambda p, k: self._answer(c.get_status_report(
                _get(p, "names", tuple[str, ...]), events=_get_or(p, "events", int, DEFAULT_EVENTS))),
            "get_rollout_state": lambda p, k: self._answer(c.get_rollout_state(_get(p, "name", str))),
            "plan_create": lambda p, k: self._answer(c.plan_create(
                _get(p, "name", str), _get(p, "task", WireTask).to_task())),
            "plan_update": lambda p, k: self._answer(c.plan_update(
                _get(p, "name", str), _get(p, "task", WireTask).to_task(), _get(p, "mode", UpdateMode),
                reuse_identical_files=_get(p, "reuse_identical_files", bool),
                canary=_get_or(p, "canary", CanarySettings | None, None))),
            "submit_update": lambda p, k: self._answer_submission(p, k, "submit_update", lambda: c.submit_update(
                _get(p, "name", str), _get(p, "task", WireTask).to_task(), _get(p, "mode", UpdateMode),
                expect_version=_get(p, "expect_version", int | None), note=_get(p, "note", str | None),
                reuse_identical_files=_get(p, "reuse_identical_files", bool), key=_key(k),
                canary=_get_or(p, "canary", CanarySettings | None, None))),
            "request_rollout": lambda p, k: self._answer_after(lambda: c.request_rollout(
                _get(p, "name", str), _get(p, "command", Command))),
            "submission_outcome": lambda p, k: self._answer(self._submission_outcome(
                _get(p, "name", str), _required_key(k), _get(p, "method", str), _get(p, "base", int | None))),
            "controller_status": lambda p, k: self._answer(c.controller_status()),
            "start_controller": lambda p, k: self._answer(c.start_controller()),
            "request_down": lambda p, k: self._answer_after(lambda: c.request_down(_get(p, "names", tuple[str, ...]))),
            "finish_down": lambda p, k: self._answer_after(lambda: c.finish_down(
                _get(p, "names", tuple[str, ...]), _get(p, "timeout_seconds", float))),
            "request_replica_termination": lambda p, k: self._answer_after(lambda: c.request_replica_termination(
                _get(p, "name", str), _get(p, "replica_ids", tuple[int, ...]))),
            "force_down": lambda p, k: self._answer(c.force_down(_get(p, "regions", tuple[str, ...]))),
            "stream_log": lambda p, k: self._stream(c.stream_log(
                _get(p, "name", str), _get(p, "replica_id", int | None), controller=_get(p, "controller", bool),
                load_balancer=_get(p, "load_balancer", bool), follow=_get(p, "follow", bool),
                tail=_get_or(p, "tail", int | None, None),
                since_seconds=_get_or(p, "since_seconds", float | None, None)),
                until_client_leaves=_get(p, "follow", bool)),
            "missing_blobs": lambda p, k: self._answer(self._missing_blobs(_get(p, "digests", tuple[str, ...]))),
            "put_blobs": lambda p, k: self._answer(self._put_blobs(_get(p, "blobs", tuple[BlobHeader, ...]))),
        }

    def _answer_after(self, call: Callable[[], None]) -> None:
        call()
        self._answer(None)

    def _answer(self, result: object, *, replayed: bool = False) -> None:
        protocol.write_message(self._out, protocol.make_result(encode(result), replayed=replayed))

    def _answer_submission(self, params: dict[str, Any], key: object, method: str, call: Callable[[], object]) -> None:
        """Answer a submission, saying whether it is one this host had stored already (its key names the
        current version): then the answer is that version's, and nothing was stored."""
        found = _key(key)
        before = None if found is None else self._submission_outcome(_get(params, "name", str), found, method, None)
        result = call()
        self._answer(result, replayed=before is not None and before.stored and before.current)

    def _submission_outcome(self, name: str, key: str, method: str, base: int | None) -> SubmissionOutcome:
        """Whether the submission ``key`` (``method`` of service ``name``) was stored, and what: a `serve up`
        is stored under its key, an update under its key and the version it was applied on top of
        (``api.submission_key``): the current version's predecessor, or ``base`` (the version the client
        expected it on)."""
        from skyserve_lite.api import submission_key
        from skyserve_lite.state.store import Store

        if method not in ("create_service", "submit_update"):
            raise UsageError(f"params.method: {method!r} is not a submission (create_service or submit_update)")
        try:
            store = Store.open(self.home, create=False)
        except NotFoundError:  # no store: nothing was ever stored here
            return SubmissionOutcome(stored=False)
        try:
            try:
                current: int | None = store.get_service(name).current_version
            except NotFoundError:
                current = None
            bases = [b for b in (current - 1 if current else None, base) if b is not None]
            keys = [key] if method == "create_service" else [submission_key(key, b) for b in bases]
            for candidate in keys:
                done = store.find_submission(candidate)
                if done is not None and done[0] == name:
                    return SubmissionOutcome(stored=True, version=done[1], current=done[1] == current)
            return SubmissionOutcome(stored=False)
        finally:
            store.close()

    def _stream(self, chunks: Iterator[bytes], *, until_client_leaves: bool) -> None:
        """Send the header, then the chunks as raw bytes. With ``until_client_leaves`` (a follow), the
        client keeps its end open while it reads, and closing it (stdin at EOF) stops the stream: a follow
        nobody reads any more must not run forever."""
        first = next(chunks, b"")  # errors before the first chunk are answered as errors
        protocol.write_message(self._out, protocol.make_stream_header())
        gone = threading.Event()
        if until_client_leaves:
            threading.Thread(target=_watch_eof, args=(self._in, gone), daemon=True).start()
        try:
            self._out.write(first)
            self._out.flush()
            for chunk in chunks:
                if gone.is_set():
                    break
                if chunk:
                    self._out.write(chunk)
                    self._out.flush()
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    def _describe(self) -> HostInfo:
        return describe_host(self._controller)

    def _missing_blobs(self, digests: Sequence[str]) -> list[str]:
        blobs = blob_store_of(self.home)
        return [d for d in digests if not blobs.has(_check_digest(d))]

    def _put_blobs(self, headers: Sequence[BlobHeader]) -> int:
        """Store the blobs that follow the request line, each checked against its digest; the number
        stored. A blob whose bytes do not hash to its digest (the file changed while it was read) is
        refused and nothing after it is read."""
        blobs = blob_store_of(self.home)
        for header in headers:
            _check_digest(header.digest)
            reader = _Exactly(self._in, header.size)
            digest, size = blobs.put(reader)  # type: ignore[arg-type]
            if reader.left or size != header.size:
                raise protocol.ProtocolError(f"blob {header.digest[:12]} was cut off after {size} bytes")
            if digest != header.digest:
                # put() stored it under its real digest; nothing refers to that one, so GC will collect it.
                raise UsageError(f"a file changed while it was uploaded (sha256 {header.digest[:12]} became "
                                 f"{digest[:12]}); submit again")
        return len(headers)


def describe_host(controller: LocalController) -> HostInfo:
    """What this host runs for the state directory of ``controller``."""
    from skyserve_lite.controller.cron import is_cron_daemon_running, is_cron_installed
    from skyserve_lite.remote.wheel import installed_digest
    from skyserve_lite.state.store import Store

    state = controller.controller_status()
    services = tuple(view.service.name for view in controller.get_status())
    store = Store.open(controller.home)
    try:
        controller_id = store.controller_id
    finally:
        store.close()
    return HostInfo(sky_lite=__version__, protocol=protocol.PROTOCOL_VERSION, home=str(controller.home),
                    python=sys.version.split()[0], executable=sys.executable,
                    cron_installed=is_cron_installed(controller.home), build=installed_digest(),
                    running=state.running, pid=state.pid, last_pass_at=state.last_pass_at, services=services,
                    cron_running=is_cron_daemon_running(), controller_id=controller_id)


class _Exactly:
    """A reader of exactly ``size`` bytes of ``stream``."""

    def __init__(self, stream: IO[bytes], size: int) -> None:
        self._stream = stream
        self.left = size

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        wanted = self.left if n < 0 else min(n, self.left, _CHUNK)
        data = self._stream.read(wanted)
        self.left -= len(data)
        return data


def _watch_eof(stream: IO[bytes], gone: threading.Event) -> None:
    try:
        while stream.read(4096):
            pass
    except (OSError, ValueError):
        pass
    gone.set()


def _check_digest(digest: str) -> str:
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise UsageError(f"not a sha256 digest: {digest[:80]!r}")
    return digest


def _required_key(key: object) -> str:
    found = _key(key)
    if found is None:
        raise protocol.ProtocolError("this request needs an idempotency key")
    return found


def _get(params: dict[str, Any], name: str, tp: Any) -> Any:
    if name not in params:
        raise protocol.ProtocolError(f"the request has no parameter {name!r}")
    return decode(tp, params[name], f"params.{name}")


def _get_or(params: dict[str, Any], name: str, tp: Any, default: Any) -> Any:
    """An optional parameter: ``default`` when the request leaves it out."""
    return decode(tp, params[name], f"params.{name}") if name in params else default


def _key(key: object) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str) or not 8 <= len(key) <= 128:
        raise protocol.ProtocolError("an idempotency key must be a string of 8 to 128 characters")
    return key


def serve_stdio(home: Path, first_line: bytes = b"") -> int:
    """`sky-lite controller rpc`: serve the request on this process's stdin (``first_line``: its first line,
    already read by ``relay``). Nothing else may write to stdout, so it is taken from ``sys.stdout`` and
    given to the server alone."""
    from skyserve_lite.remote.relay import Prefixed

    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed by mistake goes to stderr, not into the protocol
    stdin: IO[bytes] = Prefixed(first_line, sys.stdin.buffer) if first_line else sys.stdin.buffer  # type: ignore[assignment]
    try:
        return RpcServer(home, stdin, out).serve()
    finally:
        out.close()

