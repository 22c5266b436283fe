"""The values only the protocol carries: a submitted task on its way, a blob's header, what a host runs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from skyserve_lite.files.manifest import TaskFiles
from skyserve_lite.spec.model import SubmittedTask, TaskInputs
from skyserve_lite.spec.parse import parse_task


@dataclass(frozen=True)
class HostInfo:
    """What `sky-lite controller status` shows of the host side (``describe``)."""

    sky_lite: str
    protocol: int
    home: str
    python: str
    executable: str
    cron_installed: bool | None  # None: crontab could not be read here
    build: str | None = None  # the installed package's content digest (``wheel.package_digest``)
    # The loop and the services: a client of another version reads them too (``describe`` is versionless),
    # so each has a default and none is a nested value whose shape could change.
    running: bool = False
    pid: int | None = None
    last_pass_at: float | None = None
    services: tuple[str, ...] = ()
    cron_running: bool | None = None  # whether a cron daemon runs on the host; None: cannot tell (no /proc)
    controller_id: str | None = None  # of the host's state directory: what a controller VM's grants name


@dataclass(frozen=True)
class WireTask:
    """A submitted task as it travels: its text and where it came from, the snapshot of its files the
    client captured, and what the command line added (secret values included: the channel is SSH's). The
    host parses the text itself, with its own version of the parser."""

    text: str
    source: str
    files: TaskFiles | None = None
    inputs: TaskInputs = dataclasses.field(default_factory=TaskInputs)

    @classmethod
    def of(cls, task: SubmittedTask) -> WireTask:
        return cls(task.text, task.source, task.spec.files, task.inputs)

    def to_task(self) -> SubmittedTask:
        spec = parse_task(self.text, source=self.source)
        return SubmittedTask(self.text, self.source, dataclasses.replace(spec, files=self.files), self.inputs)


@dataclass(frozen=True)
class SubmissionOutcome:
    """What became of a submission (``submission_outcome``): whether the host stored it, the version it
    stored (1 for a `serve up`), and whether that version is still the service's current one."""

    stored: bool
    version: int | None = None
    current: bool = False


@dataclass(frozen=True)
class BlobHeader:
    digest: str
    size: int
