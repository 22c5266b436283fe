"""Which cloud a task runs on when it names none: SkyPilot's optimizer considers every cloud it can use, and
so does a submission here, for tasks that the `local` cloud cannot run.

The rule, decided once when a version is submitted (``api.bind_submission``) and stored with it:

- a task (or ``--infra``, or the home's ``default_infra``) that names its cloud runs there;
- a task that `local` can run (no accelerators, instance type, image, region or zone asked for) runs on
  `local`, the default that needs no cloud account;
- otherwise every cloud sky-lite offers whose library is installed is tried, and the one whose first
  placement is cheapest wins (ties in the order the clouds are offered: aws, then gcp). A cloud that cannot
  run the task, or whose prices are unknown, is passed over, and so is one that cannot boot the task's
  ``image_id`` (an AMI is aws's, a ``projects/...`` image gcp's; an image whose name does not say is
  refused: name the cloud); the plan lists every cloud considered.

Pure: resolving a cloud's placements comes in as a function.

Worked example: ``accelerators: {L4:1, A10G:1}`` with boto3 and google-cloud-compute installed. aws's first
placement is g6.xlarge at $0.80/h, gcp's g2-standard-4 at $0.71/h: gcp is chosen, and the plan says
"aws: g6.xlarge ($0.80/h); gcp: g2-standard-4 ($0.71/h)".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from skyserve_lite.errors import SpecError
from skyserve_lite.spec.inputs import place_task
from skyserve_lite.spec.model import Cloud, TaskSpec
from skyserve_lite.spec.parse import Infra
from skyserve_lite.spec.placement import Resolution

_ANY = Infra(None)


@dataclass(frozen=True)
class CloudChoice:
    """The cloud chosen for a task that names none, and one line per cloud considered (for the plan)."""

    cloud: Cloud
    considered: tuple[str, ...]

    def describe(self) -> str:
        return f"chose {self.cloud.value}, the cheapest of the clouds considered: " + "; ".join(self.considered)


# How each cloud names its images: an AMI id (or the SSM parameter that names one), a Compute Engine image or
# family path.
_IMAGE_PREFIXES = ((Cloud.AWS, ("ami-", "ssm:", "resolve:ssm:")),
                   (Cloud.GCP, ("projects/", "global/images/")))


def find_image_cloud(image_id: str) -> Cloud | None:
    """The cloud whose image ``image_id`` names, by its form; None when the form does not say."""
    for cloud, prefixes in _IMAGE_PREFIXES:
        if image_id.startswith(prefixes):
            return cloud
    return None


def find_local_blocker(spec: TaskSpec) -> str | None:
    """The field that keeps ``spec`` off the `local` cloud (it runs processes on this machine: no
    accelerators, machine types, images, regions or zones), or None when `local` can run it."""
    for resources in spec.resource_candidates:
        for field, value in (("accelerators", resources.accelerator), ("instance_type", resources.instance_type),
                             ("image_id", resources.image_id), ("region", resources.region),
                             ("zone", resources.zone)):
            if value is not None:
                return f"resources.{field}"
    return None


def choose_cloud(spec: TaskSpec, source: str, offered: Sequence[Cloud],
                 resolve: Callable[[TaskSpec], Resolution], infra: Infra = _ANY) -> CloudChoice:
    """The cheapest of ``offered`` clouds for ``spec``, whose candidates name no cloud (see the module
    docstring), each tried with ``infra``'s region and zone (``--infra */us-east-1``). ``resolve`` is
    ``api.resolve_task``: placements or a ``SpecError``. Raises ``SpecError`` on the field that keeps the task
    off `local` when no offered cloud can run it."""
    blocker = find_local_blocker(spec) or "resources"
    if not offered:
        raise SpecError(source, blocker, "the local cloud cannot run this task and no other cloud is installed "
                                         "here: install boto3 (aws) or google-cloud-compute (gcp), or name a cloud")
    considered: list[str] = []
    best: tuple[float, int, Cloud] | None = None
    images = {c.image_id for c in spec.resource_candidates if c.image_id is not None}
    for image in sorted(images):
        if find_image_cloud(image) is None:
            raise SpecError(source, "resources.image_id", f"{image!r} does not say whose image it is (an AMI is "
                                                          "ami-..., a Compute Engine image projects/...): name the "
                                                          "cloud (infra: aws or infra: gcp)")
    for order, cloud in enumerate(offered):
        foreign = sorted(image for image in images if find_image_cloud(image) not in (None, cloud))
        if foreign:
            considered.append(f"{cloud.value}: image {foreign[0]} is not a {cloud.value} image")
            continue
        try:
            resolution = resolve(place_task(spec, dataclasses.replace(infra, cloud=cloud), source))
        except SpecError as exc:
            considered.append(f"{cloud.value}: {exc.problem}")
            continue
        first = resolution.ondemand[0]
        price = math.inf if first.price_per_hour is None else first.price_per_hour
        shown = "price not in catalog" if first.price_per_hour is None else f"${first.price_per_hour:.2f}/h"
        considered.append(f"{cloud.value}: {first.instance_type or 'default type'} ({shown})")
        if best is None or (price, order) < best[:2]:
            best = (price, order, cloud)
    if best is None:
        raise SpecError(source, blocker, "no cloud sky-lite offers can run this task (clouds considered: "
                                         + "; ".join(considered) + ")")
    return CloudChoice(best[2], tuple(considered))
