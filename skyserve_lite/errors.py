"""Every error sky-lite raises on purpose.

The tree::

    SkyLiteError                    base; the CLI prints its message without a traceback
    ├── SpecError                   the task YAML is invalid (exit 2); names the file and field path
    ├── UsageError                  a bad command-line argument (exit 2), e.g. an invalid service name
    ├── NotFoundError               a service, version or replica that does not exist (exit 1)
    ├── StateConflictError          the request contradicts the stored state (exit 1):
    │                               the service exists already, an expected version does not match
    │   └── MissingBlobsError       a submission names file contents the controller does not hold
    ├── StateDamagedError           the state database is not SQLite, truncated or corrupt (exit 1)
    ├── StateBusyError              the state database stayed locked by another process (exit 1)
    ├── StateUnwritableError        the state database cannot be written: a full disk, a read-only home (exit 1)
    ├── StateUnavailableError       the state's PostgreSQL server cannot be reached or refuses the login (exit 1)
    ├── ControllerError             the controller could not be reached, started or locked (exit 1)
    │   ├── ControllerVersionError  the controller host runs another sky-lite version (exit 1)
    │   └── HostKeyError            the controller host's SSH key is not the pinned one (exit 1)
    ├── WaitTimeoutError            a wait (`serve up` until READY, `serve down`) ran out of time (exit 1)
    └── ProviderError               a provider call failed; vendor errors are translated into these
        ├── TransientProviderError  worth retrying on a later pass (throttling, a busy API)
        └── PermanentProviderError  retrying will not help (bad parameters, no permission)
            └── ProviderNotConfiguredError  the cloud has no credentials here at all

Vendor exceptions (botocore, OSError from a spawn) are translated into ``ProviderError`` subclasses
in exactly one place per provider, with ``raise ... from exc``; ``sqlite3`` and ``psycopg`` errors into the
``State*Error`` classes in one place per engine, the state store's connection.
"""

from __future__ import annotations


class SkyLiteError(Exception):
    """Base of every error sky-lite raises on purpose."""

    exit_code = 1


class SpecError(SkyLiteError):
    """The task YAML is invalid.

    ``source`` is the file (or ``<string>``), ``path`` the dotted field path (``service.replica_policy``),
    empty when the whole document is at fault.
    """

    exit_code = 2

    def __init__(self, source: str, path: str, problem: str) -> None:
        self.source = source
        self.path = path
        self.problem = problem
        where = f"{source}: {path}" if path else source
        super().__init__(f"{where}: {problem}")


class UsageError(SkyLiteError):
    """A command-line argument is invalid."""

    exit_code = 2


class NotFoundError(SkyLiteError):
    """A named service, version or replica does not exist."""


class StateConflictError(SkyLiteError):
    """The request contradicts the stored state; nothing was changed."""


class MissingBlobsError(StateConflictError):
    """A submission's snapshot names blobs the controller does not hold (never uploaded, or collected since
    the upload): ``digests`` are the missing ones. A remote client uploads them and submits again."""

    def __init__(self, digests: tuple[str, ...]) -> None:
        self.digests = digests
        super().__init__(f"the controller lacks {len(digests)} of the submission's files "
                         f"(first: sha256 {digests[0][:12] if digests else '?'}); submit again")


class StateDamagedError(SkyLiteError):
    """The state database cannot be read: not an SQLite file, truncated or corrupt.

    ``path`` is the database file; the message says how to get going again without it.
    """

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(message)


class StateBusyError(SkyLiteError):
    """The state database stayed locked by another process for longer than sky-lite waits for it."""


class StateUnwritableError(SkyLiteError):
    """The state database cannot be written (a full disk, a read-only file system); nothing was changed."""


class StateUnavailableError(SkyLiteError):
    """The PostgreSQL server holding the state cannot be reached, refuses the login or lost the connection;
    a later attempt may succeed. The message names the database without its password."""


class ControllerError(SkyLiteError):
    """The controller could not be started, reached or locked."""


class ControllerVersionError(ControllerError):
    """The controller host runs a sky-lite version (or protocol) other than this one's."""


class HostKeyError(ControllerError):
    """The controller host presented an SSH host key other than the one pinned at `controller up`."""


class WaitTimeoutError(SkyLiteError):
    """A wait ran out of time; the message says what was still pending."""


class ProviderError(SkyLiteError):
    """A provider call failed."""


class TransientProviderError(ProviderError):
    """A provider call failed in a way that a later pass may not see again."""


class PermanentProviderError(ProviderError):
    """A provider call failed in a way that retrying will not fix."""


class ProviderNotConfiguredError(PermanentProviderError):
    """The cloud has no credentials on this machine at all (none was ever set up), so nothing can have
    been launched with them from here either."""
