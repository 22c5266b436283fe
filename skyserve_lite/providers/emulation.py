"""Instance emulation: boot what a cloud API reports running as local processes.

For testing a cloud provider end to end against an API emulator (moto) whose instances do not exist:
switched on by ``SKY_LITE_EMULATE_INSTANCES=1``. Each instance the cloud reports RUNNING is booted here by
running its workload on a free 127.0.0.1 port, and its url is replaced by that local one, so probes and the
load balancer never contact the instance's private address. When the cloud reports the instance gone, the
local process is stopped.

What an instance runs comes from the controller's own records, not from the instance: its tags name its
service, version and replica id (they are on every ``Instance``), and ``find_version`` returns that
version's task as the controller stored it. The instance is launched on a ``LocalProvider`` with the
task's full spec and the directory of its task file, so ``envs``, ``setup``, ``run``, ``workdir`` and local
``file_mounts`` all work as they do for local replicas, with the same bare environment (the controller's
cloud credentials stay out of it; ``SKY_LITE_REPLICA_ENV_PASSTHROUGH`` adds to it) and the same tags:
``SKY_LITE_HOME`` names the state directory, so `serve down --force` finds emulated processes too. Nothing
of this reaches the cloud: the user data an instance is launched with is exactly what a real instance needs.

The wrapper is a ``Provider`` itself: the controller cannot tell it apart from the cloud it wraps.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from skyserve_lite.clock import Clock
from skyserve_lite.errors import PermanentProviderError, StateConflictError
from skyserve_lite.files.blobs import blob_store_of
from skyserve_lite.providers.base import (
    Instance,
    InstanceState,
    LaunchOutcome,
    LaunchRequest,
    Provider,
    ReplicaLog,
)
from skyserve_lite.providers.local import LocalProvider
from skyserve_lite.spec.model import Secret
from skyserve_lite.state.models import VersionRecord
from skyserve_lite.state.secrets import SecretStore

log = logging.getLogger(__name__)

ENV_SWITCH = "SKY_LITE_EMULATE_INSTANCES"

# (service, version) -> the stored task of that version; None when the controller has no such version.
FindVersion = Callable[[str, int], VersionRecord | None]


def compute_boot_request(instance: Instance, version: VersionRecord,
                         secrets: tuple[tuple[str, Secret], ...] = ()) -> LaunchRequest:
    """The local launch that plays ``instance``: its own replica, the version's task, snapshot and secrets
    (what the instance's boot script would export). The instance id is the launch token: one local process
    per cloud instance."""
    return LaunchRequest(service=instance.service, replica_id=instance.replica_id, version=instance.version,
                         spec=version.spec, launch_token=instance.instance_id, is_spot=instance.is_spot,
                         secrets=secrets)


class EmulatedProvider:
    """Wraps a cloud provider; see the module docstring. Emulated processes live under ``home/emulated/NAME/``.

    A running instance whose version ``find_version`` does not know (an orphan whose service is gone) is
    reported PENDING without a url: nothing is booted for it, and the controller terminates it.
    """

    def __init__(self, inner: Provider, home: Path, clock: Clock, find_version: FindVersion) -> None:
        self.name = inner.name
        self._inner = inner
        self._find_version = find_version
        # The instances' files come from the state directory's own blob store, as a real instance's come
        # from what the controller uploaded.
        self._local = LocalProvider(home / "emulated" / inner.name, clock, grace_seconds=2.0,
                                    blobs=blob_store_of(home), state_home=home)
        self._secrets = SecretStore(home)

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

    def find_instances(self, instance_ids: Sequence[str], regions: Collection[str] = ()) -> list[Instance]:
        local = {(i.service, i.replica_id): i for i in self._local.list_instances()}
        return [self._emulate_one(i, local) for i in self._inner.find_instances(instance_ids, regions)]

    def terminate(self, instance_ids: Sequence[str]) -> None:
        self._inner.terminate(instance_ids)

    def release_service(self, service: str) -> None:
        self._inner.release_service(service)
        self._local.release_service(service)

    def read_log(self, service: str, replica_id: int, instance_id: str | None,
                 region: str | None) -> ReplicaLog | None:
        """The emulated process's log (it grows like a local replica's), else what the cloud keeps."""
        emulated = self._local.read_log(service, replica_id, None, None)
        return emulated if emulated is not None else self._inner.read_log(service, replica_id, instance_id, region)

    def abandon(self) -> None:
        self._inner.abandon()
        self._local.abandon()

    def _emulate_one(self, instance: Instance, local: dict[tuple[str, int], Instance]) -> Instance:
        if instance.state is not InstanceState.RUNNING:
            return instance
        process = local.get((instance.service, instance.replica_id))
        if process is None:
            version = self._find_version(instance.service, instance.version)
            if version is None:
                return dataclasses.replace(instance, state=InstanceState.PENDING, url=None)
            try:
                secrets = tuple((name, self._secrets.get(digest)) for name, digest in version.spec.secrets)
            except StateConflictError as exc:
                raise PermanentProviderError(str(exc)) from exc
            (outcome,) = self._local.launch([compute_boot_request(instance, version, secrets)])
            if outcome.instance is None:
                log.warning("emulating %s failed: %s", instance.instance_id, outcome.error)
                return dataclasses.replace(instance, state=InstanceState.EXITED, url=None,
                                           detail=f"emulation could not start the workload: {outcome.error}")
            process = outcome.instance
        return dataclasses.replace(instance, url=process.url, state=process.state, detail=process.detail)
