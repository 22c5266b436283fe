"""Instance emulation: boot what a cloud API reports running as local processes.

For testing a cloud provider end to end against an API emulator (moto) whose instances do not exist:
switched on by ``SKY_LITE_EMULATE_INSTANCES=1``. Each instance the cloud reports RUNNING is booted here by
running its workload (the same setup/run/envs its user data would run) on a free 127.0.0.1 port, and its
url is replaced by that local one, so probes and the load balancer never contact the instance's private
address. When the cloud reports the instance gone, the local process is stopped.

The wrapper is a ``Provider`` itself: the controller cannot tell it apart from the cloud it wraps.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from skyserve_lite.clock import Clock
from skyserve_lite.providers.base import Instance, InstanceState, LaunchOutcome, LaunchRequest, Provider
from skyserve_lite.providers.local import LocalProvider
from skyserve_lite.spec.model import ReadinessProbe, ServiceSpec, TaskSpec

log = logging.getLogger(__name__)

ENV_SWITCH = "SKY_LITE_EMULATE_INSTANCES"


@dataclass(frozen=True)
class BootSpec:
    """What an instance would run: decoded from its user data."""

    envs: tuple[tuple[str, str], ...]
    setup: str | None
    run: str


class EmulatedProvider:
    """Wraps a cloud provider; see the module docstring. ``boot_spec_of`` reads an instance's user data
    (``None`` when it cannot be read yet: the instance is then reported as PENDING)."""

    def __init__(self, inner: Provider, home: Path, clock: Clock,
                 boot_spec_of: Callable[[Instance], BootSpec | None]) -> None:
        self.name = inner.name
        self._inner = inner
        self._boot_spec_of = boot_spec_of
        self._local = LocalProvider(home / "emulated" / inner.name, clock, grace_seconds=2.0)
        self._specs: dict[str, BootSpec] = {}  # instance id -> what it runs (user data never changes)

    def launch(self, requests: Sequence[LaunchRequest]) -> list[LaunchOutcome]:
        # Booting happens when the cloud reports the instance running (list_instances), as on a real VM.
        return [dataclasses.replace(o, instance=self._emulate_one(o.instance, {}))
                if o.instance is not None else o for o in self._inner.launch(requests)]

    def list_instances(self, regions: Collection[str] = ()) -> list[Instance]:
        instances = self._inner.list_instances(regions)
        local = {(i.service, i.replica_id): i for i in self._local.list_instances()}
        emulated = [self._emulate_one(i, local) for i in instances]
        # Stop local processes whose instance the cloud no longer reports running.
        running = {(i.service, i.replica_id) for i in instances if i.state is InstanceState.RUNNING}
        stale = [i.instance_id for key, i in local.items() if key not in running]
        if stale:
            self._local.terminate(stale)
        return emulated

    def terminate(self, instance_ids: Sequence[str]) -> None:
        self._inner.terminate(instance_ids)

    def release_service(self, service: str) -> None:
        self._inner.release_service(service)
        self._local.release_service(service)

    def _emulate_one(self, instance: Instance, local: dict[tuple[str, int], Instance]) -> Instance:
        if instance.state is not InstanceState.RUNNING:
            return instance
        process = local.get((instance.service, instance.replica_id))
        if process is None:
            spec = self._specs.get(instance.instance_id) or self._boot_spec_of(instance)
            if spec is None:
                return dataclasses.replace(instance, state=InstanceState.PENDING, url=None)
            self._specs[instance.instance_id] = spec
            process = self._boot(instance, spec)
            if process is None:
                return dataclasses.replace(instance, state=InstanceState.EXITED, url=None,
                                           detail="emulation could not start the workload")
        state = InstanceState.RUNNING if process.state is InstanceState.RUNNING else process.state
        return dataclasses.replace(instance, url=process.url, state=state, detail=process.detail)

    def _boot(self, instance: Instance, spec: BootSpec) -> Instance | None:
        task = TaskSpec(run=spec.run, setup=spec.setup, envs=spec.envs,
                        service=ServiceSpec(readiness_probe=ReadinessProbe()))
        request = LaunchRequest(service=instance.service, replica_id=instance.replica_id, version=instance.version,
                                spec=task, launch_token=instance.instance_id, is_spot=instance.is_spot)
        (outcome,) = self._local.launch([request])
        if outcome.instance is None:
            log.warning("emulating %s failed: %s", instance.instance_id, outcome.error)
        return outcome.instance
