"""The wire protocol of `sky-lite controller rpc`: one request per process, JSON lines on its stdio.

A request is one line::

    {"protocol": 1, "sky_lite": "0.1.0", "method": "get_status", "params": {...}, "key": null}

``key`` is the idempotency key of a submission: a digest of what was asked (service, task, files,
options), so a retried `serve update`, or the same command run again, stores its version once
(``submission_outcome`` asks what became of one). Some methods send raw bytes after the line
(``put_blobs``: the blobs, back to back, sizes in ``params``). The answer is one line, ``{"protocol": 1,
"sky_lite": ..., "result": ...}`` (with ``"replayed": true`` when it answers a submission stored before,
storing nothing) or ``{..., "error": {"type": "NotFoundError", "message": ...}}``; a streamed answer
(``stream_log``) is ``{..., "stream": true}`` followed by raw bytes until the command exits.

Versions: the host refuses every method but ``describe`` from a client whose protocol or sky-lite version
differs from its own (``ControllerVersionError``, naming `sky-lite controller upgrade`), so two versions
never exchange values whose shapes they might read differently.
"""

from __future__ import annotations

import json
from typing import IO, Any, NoReturn

from skyserve_lite import __version__, errors

PROTOCOL_VERSION = 1
# Methods a client of any version may call: enough to say what the host runs.
VERSIONLESS_METHODS = frozenset({"describe"})
# The longest request or answer line read (a status of 10,000 replicas is about 5 MB).
MAX_LINE_BYTES = 256 << 20


class ProtocolError(errors.ControllerError):
    """A message that is not this protocol (a garbled line, a missing field)."""


def make_request(method: str, params: dict[str, Any], key: str | None = None) -> dict[str, Any]:
    return {"protocol": PROTOCOL_VERSION, "sky_lite": __version__, "method": method, "params": params,
            "key": key}


def make_result(result: Any, *, replayed: bool = False) -> dict[str, Any]:
    message = {"protocol": PROTOCOL_VERSION, "sky_lite": __version__, "result": result}
    return message | {"replayed": True} if replayed else message


def make_stream_header() -> dict[str, Any]:
    return {"protocol": PROTOCOL_VERSION, "sky_lite": __version__, "stream": True}


def make_error(exc: errors.SkyLiteError) -> dict[str, Any]:
    error: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, errors.SpecError):
        error |= {"source": exc.source, "path": exc.path, "problem": exc.problem}
    elif isinstance(exc, errors.StateDamagedError):
        error["path"] = exc.path
    elif isinstance(exc, errors.MissingBlobsError):
        error["digests"] = list(exc.digests)
    return {"protocol": PROTOCOL_VERSION, "sky_lite": __version__, "error": error}


def write_message(stream: IO[bytes], message: dict[str, Any]) -> None:
    stream.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
    stream.flush()


def read_message(stream: IO[bytes]) -> dict[str, Any] | None:
    """The next message line; None at a clean end of stream. Raises ``ProtocolError`` for anything else."""
    line = stream.readline(MAX_LINE_BYTES + 1)
    if not line:
        return None
    if not line.endswith(b"\n"):
        raise ProtocolError("the controller's message was cut off (the connection dropped?)"
                            if len(line) <= MAX_LINE_BYTES else "a message longer than the protocol allows")
    try:
        message = json.loads(line)
    except ValueError as exc:
        raise ProtocolError(f"not a protocol message: {line[:80]!r}") from exc
    if not isinstance(message, dict) or "protocol" not in message:
        raise ProtocolError(f"not a protocol message: {line[:80]!r}")
    return message


def find_version_problem(message: dict[str, Any]) -> str | None:
    """Why a peer's message cannot be served (another protocol or sky-lite version); None if it can."""
    theirs, protocol = message.get("sky_lite"), message.get("protocol")
    if protocol == PROTOCOL_VERSION and theirs == __version__:
        return None
    return f"sky-lite {theirs} (protocol {protocol})"


def raise_error(error: dict[str, Any]) -> NoReturn:
    """Raise the sky-lite error an answer carries, as the same class where this version knows it."""
    kind, message = str(error.get("type")), str(error.get("message"))
    if kind == "SpecError":
        raise errors.SpecError(str(error.get("source")), str(error.get("path")), str(error.get("problem")))
    if kind == "StateDamagedError":
        raise errors.StateDamagedError(str(error.get("path")), message)
    if kind == "MissingBlobsError":
        raise errors.MissingBlobsError(tuple(str(d) for d in error.get("digests") or ()))
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, errors.SkyLiteError) and cls not in (
            errors.SpecError, errors.StateDamagedError, errors.MissingBlobsError):
        raise cls(message)
    raise errors.ControllerError(message)
