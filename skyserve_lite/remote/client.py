"""``RemoteController``: ``api.Controller`` over a ``Transport`` (one `controller rpc` run per call).

Every call is retried when the connection drops before its answer arrives (ssh's exit status 255, or the
command killed): reads are safe to repeat, and each submission carries an idempotency key made once per
submission, so a retried `serve update` finds the version its first attempt stored. A submission hashes the
task's files here, asks the host which blobs it lacks, uploads only those, then stores the version in one
call; blobs collected on the host in between are uploaded again.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from skyserve_lite.api import DEFAULT_EVENTS, ControllerStatus, RolloutState, ServiceView, StatusReport
from skyserve_lite.clock import Clock, SystemClock
from skyserve_lite.codec import decode, encode
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.errors import ControllerError, HostKeyError, MissingBlobsError, SpecError
from skyserve_lite.files.capture import capture_task_files, find_local_paths, find_task_dir, needs_capture
from skyserve_lite.plan.placement import LaunchPlan
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.plan.update import UpdatePlan
from skyserve_lite.remote import protocol
from skyserve_lite.remote.transport import Channel, Transport
from skyserve_lite.remote.wire import BlobHeader, HostInfo, WireTask
from skyserve_lite.spec.inputs import fill_paths
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.state.models import ServiceRecord, VersionRecord

if TYPE_CHECKING:
    from skyserve_lite.forcedown import ForceDownReport

# A dropped connection is retried this many times in all, with this pause between tries.
ATTEMPTS = 3
RETRY_PAUSE_SECONDS = 1.0
# Blob uploads go in batches of about this many bytes (one rpc run each).
UPLOAD_BATCH_BYTES = 64 << 20
_HOST_KEY_SIGNS = ("Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED")
_CHUNK = 1 << 20


class _Dropped(Exception):
    """The channel ended before a whole answer arrived, in a way a retry may not see again."""


class RemoteController:
    """See the module docstring. ``host_key_hint`` finishes the message of a refused host key."""

    def __init__(self, transport: Transport, clock: Clock | None = None, *, host_key_hint: str = "",
                 retry_pause_seconds: float = RETRY_PAUSE_SECONDS) -> None:
        self.transport = transport
        self._clock = clock or SystemClock()
        self._host_key_hint = host_key_hint
        self._retry_pause = retry_pause_seconds

    # --- the api.Controller methods --------------------------------------------------------------
    def create_service(self, name: str, task: SubmittedTask, *, endpoint_port: int | None = None) -> ServiceRecord:
        wire = self._prepare(task)
        key = uuid.uuid4().hex
        return cast(ServiceRecord, self._submit(wire, lambda w: decode(ServiceRecord, self._call(
            "create_service", {"name": name, "task": encode(w), "endpoint_port": endpoint_port}, key=key))))

    def get_status(self, names: Sequence[str] = (), *, events: int = DEFAULT_EVENTS) -> list[ServiceView]:
        return cast(list[ServiceView], decode(list[ServiceView], self._call(
            "get_status", {"names": list(names), "events": events})))

    def get_status_report(self, names: Sequence[str] = (), *, events: int = DEFAULT_EVENTS) -> StatusReport:
        return cast(StatusReport, decode(StatusReport, self._call(
            "get_status_report", {"names": list(names), "events": events})))

    def get_rollout_state(self, name: str) -> RolloutState:
        return cast(RolloutState, decode(RolloutState, self._call("get_rollout_state", {"name": name})))

    def plan_create(self, name: str, task: SubmittedTask) -> LaunchPlan:
        wire = self._prepare(task)  # hashed here: a plan needs no bytes
        return cast(LaunchPlan, decode(LaunchPlan, self._call("plan_create", {"name": name, "task": encode(wire)})))

    def plan_update(self, name: str, task: SubmittedTask, mode: UpdateMode, *,
                    reuse_identical_files: bool = False) -> UpdatePlan:
        wire = self._prepare(task)  # hashed here; the host compares manifests, it needs no bytes for a plan
        return cast(UpdatePlan, decode(UpdatePlan, self._call("plan_update", {
            "name": name, "task": encode(wire), "mode": mode.value, "reuse_identical_files": reuse_identical_files})))

    def submit_update(self, name: str, task: SubmittedTask, mode: UpdateMode, *,
                      expect_version: int | None = None, note: str | None = None,
                      reuse_identical_files: bool = False) -> VersionRecord:
        wire = self._prepare(task)
        key = uuid.uuid4().hex
        return cast(VersionRecord, self._submit(wire, lambda w: decode(VersionRecord, self._call("submit_update", {
            "name": name, "task": encode(w), "mode": mode.value, "expect_version": expect_version, "note": note,
            "reuse_identical_files": reuse_identical_files}, key=key))))

    def controller_status(self) -> ControllerStatus:
        return cast(ControllerStatus, decode(ControllerStatus, self._call("controller_status", {})))

    def start_controller(self) -> ControllerStatus:
        return cast(ControllerStatus, decode(ControllerStatus, self._call("start_controller", {})))

    def request_down(self, names: Sequence[str]) -> None:
        self._call("request_down", {"names": list(names)})

    def finish_down(self, names: Sequence[str], timeout_seconds: float) -> None:
        self._call("finish_down", {"names": list(names), "timeout_seconds": timeout_seconds})

    def request_replica_termination(self, name: str, replica_ids: Sequence[int]) -> None:
        self._call("request_replica_termination", {"name": name, "replica_ids": list(replica_ids)})

    def stream_log(self, name: str, replica_id: int | None, *, controller: bool = False,
                   load_balancer: bool = False, follow: bool = False, tail: int | None = None,
                   since_seconds: float | None = None) -> Iterator[bytes]:
        # A duration, not a moment: the host's clock decides what is recent, as its clock wrote the times.
        params = {"name": name, "replica_id": replica_id, "controller": controller, "load_balancer": load_balancer,
                  "follow": follow, "tail": tail, "since_seconds": since_seconds}
        channel, _header = self._open_answered("stream_log", params, keep_open=follow)
        return _read_stream(channel)

    def force_down(self, regions: Sequence[str] = ()) -> ForceDownReport:
        from skyserve_lite.forcedown import ForceDownReport

        return cast(ForceDownReport, decode(ForceDownReport, self._call("force_down", {"regions": list(regions)})))

    # --- for `sky-lite controller status` --------------------------------------------------------
    def describe(self) -> HostInfo:
        return cast(HostInfo, decode(HostInfo, self._call("describe", {})))

    # --- submissions -----------------------------------------------------------------------------
    def _prepare(self, task: SubmittedTask) -> WireTask:
        """The task with its files hashed here (read once, stored nowhere); ``file_mounts`` are captured at
        the paths the host will fill in from envs (the file's and those given now)."""
        spec = fill_paths(task)
        if needs_capture(spec):
            files = capture_task_files(spec, find_task_dir(task.source), task.source, None,
                                       ControllerSettings.from_env().snapshot_limit_bytes)
            task = dataclasses.replace(task, spec=dataclasses.replace(spec, files=files))
        return WireTask.of(task)

    def _submit(self, wire: WireTask, store: Callable[[WireTask], Any]) -> Any:
        """Upload the blobs the host lacks, then ``store``; blobs collected meanwhile go up again (twice at
        most: a host that keeps losing them is broken)."""
        if wire.files is not None:
            self._upload(wire, self._missing(sorted(wire.files.blob_digests())))
        for attempt in range(3):
            try:
                return store(wire)
            except MissingBlobsError as exc:
                if attempt == 2:
                    raise
                self._upload(wire, exc.digests)
        raise AssertionError("unreachable")

    def _missing(self, digests: Sequence[str]) -> list[str]:
        if not digests:
            return []
        return cast(list[str], decode(list[str], self._call("missing_blobs", {"digests": list(digests)})))

    def _upload(self, wire: WireTask, digests: Sequence[str]) -> None:
        if not digests or wire.files is None:
            return
        task = wire.to_task()
        paths = find_local_paths(fill_paths(task), find_task_dir(task.source), wire.files)
        batch: list[tuple[str, Path, int]] = []
        size = 0
        for digest in digests:
            path = paths.get(digest)
            if path is None:
                raise SpecError(task.source, "", f"the controller lacks a file (sha256 {digest[:12]}) that is not "
                                "on this machine either; submit the task from its files again")
            try:
                length = path.stat().st_size
            except OSError as exc:
                raise SpecError(task.source, "", f"cannot read {path}: {exc.strerror or exc}") from exc
            batch.append((digest, path, length))
            size += length
            if size >= UPLOAD_BATCH_BYTES:
                self._put(batch)
                batch, size = [], 0
        if batch:
            self._put(batch)

    def _put(self, batch: list[tuple[str, Path, int]]) -> None:
        def send(stream: IO[bytes]) -> None:
            for _digest, path, length in batch:
                with open(path, "rb") as source:
                    left = length
                    while left > 0:
                        chunk = source.read(min(_CHUNK, left))
                        if not chunk:  # the file shrank since it was hashed; the host refuses the blob
                            chunk = b"\0" * left
                        stream.write(chunk)
                        left -= len(chunk)

        headers = [BlobHeader(digest, length) for digest, _path, length in batch]
        self._call("put_blobs", {"blobs": encode(headers)}, payload=send)

    # --- one call ---------------------------------------------------------------------------------
    def _call(self, method: str, params: dict[str, Any], *, key: str | None = None,
              payload: Callable[[IO[bytes]], None] | None = None) -> Any:
        channel, message = self._open_answered(method, params, key=key, payload=payload)
        channel.finish()
        return message.get("result")

    def _open_answered(self, method: str, params: dict[str, Any], *, key: str | None = None,
                       payload: Callable[[IO[bytes]], None] | None = None,
                       keep_open: bool = False) -> tuple[Channel, dict[str, Any]]:
        """Send the request (retrying a dropped connection); the channel, positioned after the answer line,
        and that line. An error answer is raised here, as the sky-lite error it carries."""
        for attempt in range(ATTEMPTS):
            try:
                return self._exchange(method, params, key, payload, keep_open)
            except _Dropped as exc:
                if attempt == ATTEMPTS - 1:
                    raise ControllerError(f"lost the connection to the controller at {self.transport.where} "
                                          f"{ATTEMPTS} times ({exc}); is the host up?") from None
                self._clock.sleep(self._retry_pause)
        raise AssertionError("unreachable")

    def _exchange(self, method: str, params: dict[str, Any], key: str | None,
                  payload: Callable[[IO[bytes]], None] | None, keep_open: bool) -> tuple[Channel, dict[str, Any]]:
        try:
            channel = self.transport.open()
        except OSError as exc:
            raise ControllerError(f"cannot run the command that reaches {self.transport.where}: {exc}") from exc
        try:
            protocol.write_message(channel.stdin, protocol.make_request(method, params, key))
            if payload is not None:
                payload(channel.stdin)
            channel.stdin.flush()
            if not keep_open:
                channel.stdin.close()
        except (BrokenPipeError, ConnectionError, ValueError):
            pass  # the command ended early; its exit status and stderr tell why
        try:
            message = protocol.read_message(channel.stdout)
        except protocol.ProtocolError as exc:
            code, stderr = channel.finish()
            self._raise_failure(code, stderr, str(exc))
        if message is None:
            code, stderr = channel.finish()
            self._raise_failure(code, stderr, "no answer")
        assert message is not None
        if "error" in message:
            channel.finish()
            protocol.raise_error(message["error"])
        return channel, message

    def _raise_failure(self, code: int, stderr: str, what: str) -> None:
        text = stderr.strip()
        if any(sign in text for sign in _HOST_KEY_SIGNS):
            raise HostKeyError(f"the SSH host key of {self.transport.where} is not the one pinned when the "
                               f"controller was set up; refusing to connect. {self._host_key_hint}".rstrip())
        if code == 255 or code < 0:
            raise _Dropped(f"exit {code}: {_last_line(text) or what}")
        raise ControllerError(f"the controller command at {self.transport.where} failed (exit {code}): "
                              f"{_last_line(text) or what}")


def _read_stream(channel: Channel) -> Iterator[bytes]:
    """The raw bytes after a stream header, in chunks, until the command ends; closes the channel (which
    ends a follow on the host: it stops when its stdin closes)."""
    read = getattr(channel.stdout, "read1", channel.stdout.read)
    try:
        while chunk := read(_CHUNK):
            yield chunk
    finally:
        channel.finish()


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""
