"""``RemoteController``: ``api.Controller`` over a ``Transport`` (one `controller rpc` run per call).

Every call is retried when the connection drops before its answer arrives (ssh's exit status 255, or the
command killed): reads are safe to repeat, and each submission carries an idempotency key, so a retried
`serve update` finds the version its first attempt stored. The key is a digest of what was asked (service
name, task text and source, the files' digest, the inputs given, the options), keyed with this state
directory's ``submission_secret`` (the inputs hold secret values): the same command run again sends the same
key, and the host answers with what the first run stored instead of refusing a `serve up` of a name that
exists or storing a second version. Without a secret (tests) each submission gets a random key.

After a dropped connection, a submission's retry first asks the host what became of it
(``submission_outcome``) and says so through ``say``: stored (its answer is asked for again) or not stored
(it is sent again). When the host stays out of reach the error says whether the submission was stored, as
far as known, and that running the same command again is safe.

A submission hashes the task's files here, asks the host which blobs it lacks, uploads only those, then stores
the version in one call; blobs collected on the host in between are uploaded again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from skyserve_lite.api import DEFAULT_EVENTS, ControllerStatus, RolloutState, ServiceView, StatusReport
from skyserve_lite.clock import Clock, SystemClock
from skyserve_lite.codec import decode, encode
from skyserve_lite.controller.fleet import ControllerView
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.errors import ControllerError, HostKeyError, MissingBlobsError, SpecError
from skyserve_lite.files.capture import capture_task_files, find_local_paths, find_task_dir, needs_capture
from skyserve_lite.plan.canary import CanarySettings, Command
from skyserve_lite.plan.placement import LaunchPlan
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.plan.update import UpdatePlan
from skyserve_lite.remote import protocol
from skyserve_lite.remote.transport import Channel, Transport
from skyserve_lite.remote.wire import BlobHeader, HostInfo, SubmissionOutcome, WireTask
from skyserve_lite.spec.inputs import fill_paths
from skyserve_lite.spec.model import SubmittedTask, TaskSpec
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
    """See the module docstring. ``host_key_hint`` finishes the message of a refused host key;
    ``submission_secret`` keys the digests that make submissions' idempotency keys (None: random keys);
    ``say`` receives a line for the user about a submission's fate after a dropped connection."""

    def __init__(self, transport: Transport, clock: Clock | None = None, *, host_key_hint: str = "",
                 retry_pause_seconds: float = RETRY_PAUSE_SECONDS, submission_secret: bytes | None = None,
                 say: Callable[[str], None] | None = None, fallbacks: Sequence[Transport] = ()) -> None:
        self.transport = transport
        # Other controller hosts on the same database, in order: a dropped connection moves to the next at
        # once (any live controller answers for every service), and the rest of the command stays there.
        self._fallbacks = list(fallbacks)
        self._clock = clock or SystemClock()
        self._host_key_hint = host_key_hint
        self._retry_pause = retry_pause_seconds
        self._secret = submission_secret
        self._say = say or (lambda _line: None)
        # The spec each prepared snapshot was captured from (by its digest): where its files are read again
        # for an upload, with the envs it was filled with.
        self._captured_from: dict[str, TaskSpec] = {}

    # --- the api.Controller methods --------------------------------------------------------------
    def create_service(self, name: str, task: SubmittedTask, *, endpoint_port: int | None = None) -> ServiceRecord:
        wire = self._prepare(task)
        key = self._submission_key("create_service", name, wire, {"endpoint_port": endpoint_port})
        outcome = {"name": name, "method": "create_service", "base": None}
        return cast(ServiceRecord, self._submit(wire, lambda w: decode(ServiceRecord, self._call(
            "create_service", {"name": name, "task": encode(w), "endpoint_port": endpoint_port}, key=key,
            outcome=outcome))))

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
                    reuse_identical_files: bool = False, canary: CanarySettings | None = None) -> UpdatePlan:
        wire = self._prepare(task, name)  # hashed here; the host compares manifests, it needs no bytes for a plan
        return cast(UpdatePlan, decode(UpdatePlan, self._call("plan_update", {
            "name": name, "task": encode(wire), "mode": mode.value, "reuse_identical_files": reuse_identical_files,
            **_canary_param(canary)})))

    def submit_update(self, name: str, task: SubmittedTask, mode: UpdateMode, *,
                      expect_version: int | None = None, note: str | None = None,
                      reuse_identical_files: bool = False, canary: CanarySettings | None = None) -> VersionRecord:
        wire = self._prepare(task, name)
        # Not expect_version: a rerun plans again, from the version the lost first run may have stored.
        key = self._submission_key("submit_update", name, wire, {
            "mode": mode.value, "note": note, "reuse_identical_files": reuse_identical_files,
            **_canary_param(canary)})
        outcome = {"name": name, "method": "submit_update", "base": expect_version}
        return cast(VersionRecord, self._submit(wire, lambda w: decode(VersionRecord, self._call("submit_update", {
            "name": name, "task": encode(w), "mode": mode.value, "expect_version": expect_version, "note": note,
            "reuse_identical_files": reuse_identical_files, **_canary_param(canary)}, key=key, outcome=outcome))))

    def request_rollout(self, name: str, command: Command) -> None:
        self._call("request_rollout", {"name": name, "command": command.value})

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

    def list_controllers(self) -> list[ControllerView]:
        """Every controller sharing the host's database (``fleet.list_controller_views``)."""
        return cast(list[ControllerView], decode(list[ControllerView], self._call("list_controllers", {})))

    # --- submissions -----------------------------------------------------------------------------
    def _prepare(self, task: SubmittedTask, updating: str | None = None) -> WireTask:
        """The task with its files hashed here (read once, stored nowhere), captured at the paths the host
        fills in from envs: the file's, those given now and, for an update of the service ``updating``, the
        current version's values of what the file leaves null (asked of the host only when such a name is
        not given now and files are captured)."""
        inherited: tuple[tuple[str, str], ...] = ()
        given = {name for name, _ in task.inputs.envs}
        if updating is not None and needs_capture(task.spec) and any(n not in given for n in task.spec.unset_envs):
            state = self.get_rollout_state(updating)
            inherited = state.version(state.service.current_version).inputs.envs
        spec = fill_paths(task, inherited)
        if needs_capture(spec):
            files = capture_task_files(spec, find_task_dir(task.source), task.source, None,
                                       ControllerSettings.from_env().snapshot_limit_bytes)
            task = dataclasses.replace(task, spec=dataclasses.replace(spec, files=files))
            if files is not None:
                self._captured_from[files.digest] = spec
        return WireTask.of(task)

    def _submission_key(self, method: str, name: str, wire: WireTask, options: dict[str, Any]) -> str:
        """The idempotency key of a submission: an HMAC of everything it asks, so the same command run again
        (same service, task text and source, files, inputs and options) sends the same key."""
        if self._secret is None:
            return uuid.uuid4().hex
        document = {"method": method, "name": name, "task": encode(dataclasses.replace(wire, files=None)),
                    "files": wire.files.digest if wire.files is not None else None, "options": options}
        text = json.dumps(document, sort_keys=True, separators=(",", ":"))
        return hmac.new(self._secret, text.encode(), hashlib.sha256).hexdigest()

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
        spec = self._captured_from.get(wire.files.digest) or fill_paths(task)
        paths = find_local_paths(spec, find_task_dir(task.source), wire.files)
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
              payload: Callable[[IO[bytes]], None] | None = None, outcome: dict[str, Any] | None = None) -> Any:
        channel, message = self._open_answered(method, params, key=key, payload=payload, outcome=outcome)
        channel.finish()
        return message.get("result")

    def _open_answered(self, method: str, params: dict[str, Any], *, key: str | None = None,
                       payload: Callable[[IO[bytes]], None] | None = None, keep_open: bool = False,
                       outcome: dict[str, Any] | None = None) -> tuple[Channel, dict[str, Any]]:
        """Send the request (retrying a dropped connection); the channel, positioned after the answer line,
        and that line. An error answer is raised here, as the sky-lite error it carries. ``outcome``: the
        ``submission_outcome`` params of a submission, asked after a drop before the request goes again."""
        known: SubmissionOutcome | None = None
        tries = 0  # on the current host
        failed: list[str] = []  # the hosts left before it, each with why
        dropped_at = self.transport.where
        while True:
            try:
                if (tries > 0 or failed) and outcome is not None and key is not None:
                    known = self._ask_outcome(outcome, key, dropped_at)
                channel, message = self._exchange(method, params, key, payload, keep_open)
            except _Dropped as exc:
                tries += 1
                dropped_at = self.transport.where
                if self._fallbacks:
                    failed.append(f"{self.transport.where} ({exc})")
                    self.transport, tries = self._fallbacks.pop(0), 0
                    continue
                if tries == ATTEMPTS:
                    tried = f" (and {'; '.join(failed)})" if failed else ""
                    raise ControllerError(f"lost the connection to the controller at {self.transport.where} "
                                          f"{ATTEMPTS} times ({exc}){tried}; "
                                          + ("is the host up?" if outcome is None else _fate(known))) from None
                self._clock.sleep(self._retry_pause)
                continue
            if failed:
                self._say(f"The controller at {'; '.join(failed)} did not answer; {self.transport.where} answered.")
            if message.get("replayed") and outcome is not None:
                self._say(f"The controller at {self.transport.where} had stored this request already (an earlier "
                          "attempt or run sent the same one); this is its answer, and nothing was stored again.")
            return channel, message

    def _ask_outcome(self, params: dict[str, Any], key: str, where: str) -> SubmissionOutcome:
        """What became of the submission ``key`` whose connection to ``where`` dropped, said to the user (asked
        of the current host: another host on the same database knows it as well). One try: a drop raises
        ``_Dropped``."""
        channel, message = self._exchange("submission_outcome", params, key, None, False)
        channel.finish()
        found = cast(SubmissionOutcome, decode(SubmissionOutcome, message.get("result")))
        if found.stored:
            self._say(f"The connection to {where} dropped before its answer arrived; the controller had stored it "
                      f"(version {found.version}). Asking for its answer again.")
        else:
            self._say(f"The connection to {where} dropped before its answer arrived; the controller had not "
                      "stored it. Sending it again.")
        return found

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


def _fate(known: SubmissionOutcome | None) -> str:
    """The end of the message of a submission whose connection kept dropping: what is known of its fate."""
    again = ("Run the same command again: it sends the same request, so the controller answers with what it "
             "stored instead of storing it twice.")
    if known is None:
        return f"whether the controller stored the request is not known. {again}"
    if known.stored:
        return f"the controller had stored the request (version {known.version}), but its answer was lost. {again}"
    return f"the controller had not stored the request when last asked. {again}"


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _canary_param(canary: CanarySettings | None) -> dict[str, Any]:
    """A canary update's settings as a request parameter; none without them (what an older host knows)."""
    return {} if canary is None else {"canary": encode(canary)}
