"""Providers: one interface (``base.Provider``), a fake, and the clouds as its peers.

Cloud SDKs are imported only when their provider is built (by the controller), so `sky-lite --help` stays
fast and works without them installed.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from skyserve_lite.clock import Clock
from skyserve_lite.errors import SpecError
from skyserve_lite.providers.base import Instance, LaunchOutcome, LaunchRequest, Provider
from skyserve_lite.spec.model import Cloud, SubmittedTask


def available_clouds() -> tuple[str, ...]:
    """Clouds this installation can run; `serve up` rejects the others before storing anything."""
    clouds = ["local"]
    if importlib.util.find_spec("boto3") is not None:
        clouds.append("aws")
    return tuple(clouds)


def check_task_for_cloud(task: SubmittedTask) -> None:
    """Cloud-specific rules a task must meet before it is stored. Raises ``SpecError`` naming the field."""
    spec = task.spec
    cloud = spec.resources.cloud
    if cloud.value not in available_clouds():
        hint = ""
        if cloud is Cloud.AWS:
            hint = " (install boto3: `pip install '.[aws]'` from a checkout, or `pip install boto3`)"
        raise SpecError(task.source, "resources.cloud",
                        f"cloud {cloud.value!r} is not available here{hint}; available: "
                        + ", ".join(available_clouds()))
    if cloud is Cloud.AWS:
        if not spec.resources.image_id:
            raise SpecError(task.source, "resources.image_id", "required for cloud aws: the AMI replicas boot from")
        for destination, source in spec.file_mounts:
            if "://" in source and not source.startswith("s3://"):
                raise SpecError(task.source, f"file_mounts.{destination}",
                                f"{source!r}: cloud aws copies local paths and s3:// sources only")


def make_providers(home: Path, clock: Clock, controller_id: str,
                   environ: Mapping[str, str] | None = None) -> dict[str, Provider]:
    """The providers a controller for ``home`` uses, by cloud name.

    ``SKY_LITE_EMULATE_INSTANCES=1`` wraps cloud providers in instance emulation (see ``emulation``);
    ``SKY_LITE_AWS_INSTANCE_PROFILE`` names the instance profile AWS replicas read S3 files with.
    """
    from skyserve_lite.providers.local import LocalProvider

    env = os.environ if environ is None else environ
    providers: dict[str, Provider] = {"local": LocalProvider(home, clock)}
    if "aws" in available_clouds():
        def build_aws() -> Provider:
            from skyserve_lite.providers.aws import AwsProvider

            profile = env.get("SKY_LITE_AWS_INSTANCE_PROFILE") or None
            aws = AwsProvider(controller_id, clock, instance_profile=profile)
            return _emulated(aws, home, clock) if env.get("SKY_LITE_EMULATE_INSTANCES") == "1" else aws

        providers["aws"] = LazyProvider("aws", build_aws)
    return providers


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

    def terminate(self, instance_ids: Sequence[str]) -> None:
        self.provider.terminate(instance_ids)

    def release_service(self, service: str) -> None:
        self.provider.release_service(service)


def _emulated(aws: Provider, home: Path, clock: Clock) -> Provider:
    from skyserve_lite.providers.aws import AwsProvider
    from skyserve_lite.providers.aws_userdata import decode_emulation_header
    from skyserve_lite.providers.emulation import BootSpec, EmulatedProvider

    assert isinstance(aws, AwsProvider)

    def boot_spec_of(instance: Instance) -> BootSpec | None:
        user_data = aws.read_user_data(instance)
        header = decode_emulation_header(user_data) if user_data else None
        if header is None:
            return None
        return BootSpec(envs=tuple(header.envs), setup=header.setup, run=header.run)

    return EmulatedProvider(aws, home, clock, boot_spec_of)
