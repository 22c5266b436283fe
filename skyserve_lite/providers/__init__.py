"""Providers: one interface (``base.Provider``), a fake, and the clouds as its peers.

Cloud SDKs are imported only when their provider is built (by the controller), so `sky-lite --help` stays
fast and works without them installed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from skyserve_lite.clock import Clock
from skyserve_lite.errors import SpecError
from skyserve_lite.providers.base import Instance, LaunchOutcome, LaunchRequest, Provider, ReplicaLog
from skyserve_lite.spec.model import Cloud, SubmittedTask

if TYPE_CHECKING:
    from skyserve_lite.state.models import VersionRecord


def available_clouds() -> tuple[str, ...]:
    """Clouds this installation can run; `serve up` rejects the others before storing anything."""
    clouds = ["local"]
    if _has_module("boto3"):
        clouds.append("aws")
    if _has_module("google.cloud.compute_v1"):
        clouds.append("gcp")
    return tuple(clouds)


def _has_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def check_task_for_cloud(task: SubmittedTask, *, require_available: bool = True) -> str | None:
    """Cloud-specific rules a task must meet before it is stored. Raises ``SpecError`` naming the field.
    Without ``require_available`` (a plan, which needs no cloud library) a cloud not installed here is not
    an error: the note that says so is returned instead."""
    spec = task.spec
    cloud = spec.cloud
    note = None
    if cloud.value not in available_clouds():
        hint = ""
        if cloud is Cloud.AWS:
            hint = " (install boto3: `pip install '.[aws]'` from a checkout, or `pip install boto3`)"
        if cloud is Cloud.GCP:
            hint = " (install google-cloud-compute: `pip install '.[gcp]'` from a checkout)"
        note = f"cloud {cloud.value!r} is not available here{hint}; available: " + ", ".join(available_clouds())
        if require_available:
            raise SpecError(task.source, "resources.cloud", note)
    if cloud is Cloud.AWS:
        for destination, source in spec.file_mounts:
            if "://" in source and not source.startswith("s3://"):
                raise SpecError(task.source, f"file_mounts.{destination}",
                                f"{source!r}: cloud aws copies local paths and s3:// sources only")
    if cloud is Cloud.GCP:
        for destination, source in spec.file_mounts:
            if "://" in source and not source.startswith("gs://"):
                raise SpecError(task.source, f"file_mounts.{destination}",
                                f"{source!r}: cloud gcp copies local paths and gs:// sources only")
    return note


def make_providers(home: Path, clock: Clock, controller_id: str, environ: Mapping[str, str] | None = None, *,
                   find_version: Callable[[str, int], VersionRecord | None] | None = None) -> dict[str, Provider]:
    """The providers a controller for ``home`` uses, by cloud name.

    ``SKY_LITE_EMULATE_INSTANCES=1`` wraps cloud providers in instance emulation (see ``emulation``), which
    boots each instance from its version as ``find_version`` returns it (the controller's store; None when
    it has no such version). Without ``find_version`` emulation boots nothing, and still finds the logs of
    what a controller booted. ``SKY_LITE_AWS_INSTANCE_PROFILE`` names the instance profile AWS replicas read
    S3 files with, else the host settings do (on a controller VM: the profile made for its replicas); the
    same for the service account GCP replicas run as (``SKY_LITE_GCP_SERVICE_ACCOUNT``, ``GcpProvider.from_env``).
    """
    from skyserve_lite.providers.local import LocalProvider, find_replicas_dir

    env = os.environ if environ is None else environ
    providers: dict[str, Provider] = {"local": LocalProvider(home, clock, replicas_dir=find_replicas_dir(home, env))}
    if "aws" in available_clouds():
        def build_aws() -> Provider:
            from skyserve_lite.controller.host import load_host_settings
            from skyserve_lite.files.blobs import blob_store_of
            from skyserve_lite.providers.aws import AwsProvider

            profile = env.get("SKY_LITE_AWS_INSTANCE_PROFILE") or load_host_settings(home).aws_instance_profile
            aws = AwsProvider(controller_id, clock, blobs=blob_store_of(home), instance_profile=profile)
            if env.get("SKY_LITE_EMULATE_INSTANCES") != "1":
                return aws
            from skyserve_lite.providers.emulation import EmulatedProvider

            return EmulatedProvider(aws, home, clock, find_version or _no_version)

        providers["aws"] = LazyProvider("aws", build_aws)
    if "gcp" in available_clouds():
        def build_gcp() -> Provider:
            from skyserve_lite.controller.host import load_host_settings
            from skyserve_lite.files.blobs import blob_store_of
            from skyserve_lite.providers.gcp import GcpProvider

            gcp: Provider = GcpProvider.from_env(controller_id, clock, blob_store_of(home), env,
                                                 host_service_account=load_host_settings(home).gcp_service_account)
            if env.get("SKY_LITE_EMULATE_INSTANCES") != "1":
                return gcp
            from skyserve_lite.providers.emulation import EmulatedProvider

            return EmulatedProvider(gcp, home, clock, find_version or _no_version)

        providers["gcp"] = LazyProvider("gcp", build_gcp)
    return providers


def _no_version(_service: str, _version: int) -> VersionRecord | None:
    return None


class LazyProvider:
    """Builds its provider on first use: a controller that never serves on a cloud never imports its SDK
    (boto3 adds about 45 MB to a controller's memory)."""

    def __init__(self, name: str, build: Callable[[], Provider]) -> None:
        self.name = name
        self._build = build
        self._provider: Provider | None = None

    @property
    def provider(self) -> Provider:
        if self._provider is None:
            self._provider = self._build()
        return self._provider

    def launch(self, requests: Sequence[LaunchRequest]) -> list[LaunchOutcome]:
        return self.provider.launch(requests)

    def list_instances(self, regions: Collection[str] = ()) -> list[Instance]:
        return self.provider.list_instances(regions)

    def find_instances(self, instance_ids: Sequence[str], regions: Collection[str] = ()) -> list[Instance]:
        return self.provider.find_instances(instance_ids, regions)

    def terminate(self, instance_ids: Sequence[str]) -> None:
        self.provider.terminate(instance_ids)

    def release_service(self, service: str) -> None:
        self.provider.release_service(service)

    def read_log(self, service: str, replica_id: int, instance_id: str | None,
                 region: str | None) -> ReplicaLog | None:
        return self.provider.read_log(service, replica_id, instance_id, region)

    def abandon(self) -> None:
        # A provider never built started nothing: building it now would only load its SDK.
        if self._provider is not None:
            self._provider.abandon()
