"""Knobs of the controller that are not part of a task YAML, and the values the controller pass reads."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from skyserve_lite.errors import UsageError


@dataclass(frozen=True)
class ControllerSettings:
    # A READY replica whose probe keeps failing this long is replaced. SkyServe uses 180 s: long enough to
    # ride out a garbage-collection pause or a slow request storm, short enough not to serve errors for long.
    probe_failure_grace_seconds: float = 180.0
    # A launch that has not produced a running instance after this long is given up (FAILED_PROVISION).
    provision_timeout_seconds: float = 600.0
    # A cloud's inventory may not list an instance for a while after it was launched (EC2 documents seconds,
    # sometimes longer). Until a replica's launch is this old, an instance missing from the inventory is
    # "not visible yet", not gone: it is neither failed nor forgotten (a replica shut down meanwhile keeps
    # its row, and its termination is asked again, until this has passed).
    instance_visibility_grace_seconds: float = 120.0
    # After this many replicas of the current version fail before any became ready, the service is
    # FAILED and launching stops until an update: a broken `run` must not relaunch forever.
    failure_limit: int = 3
    # Terminal replica rows kept per service, newest first, so `serve status` can show what failed.
    keep_terminal_replicas: int = 10
    # A replica taken out of traffic (scale-down, rollout) is terminated this long after: the load balancer
    # stops choosing it within a second, and requests it already has get the rest of the time to finish.
    drain_seconds: float = 10.0
    # Seconds between passes of `controller run`.
    interval_seconds: float = 2.0
    # Overrides every autoscaling policy's decision period (20 s for request rate, CONTROL_LOOP_PERIOD_S
    # for in-flight requests); for tests and demos that want to see scaling within seconds.
    autoscaler_period_seconds: float | None = None
    # The request-rate window: qps = requests in the last this-many seconds / this. SkyServe uses 60 s;
    # shorter windows only make sense for tests and demos.
    autoscaler_window_seconds: float = 60.0
    # A version's workdir and file mounts are captured when it is submitted; a larger snapshot is refused.
    snapshot_limit_bytes: int = 1 << 30
    # How many of a service's newest versions keep their snapshot (0: all). An older version's files are
    # dropped, and it can no longer be rolled back to; one that a replica still runs is always kept.
    keep_snapshot_versions: int = 0
    # Several controllers on one database (controller.leases): a service whose lease is not renewed for this
    # long is taken over by another controller, and each controller renews its leases this often (a third of
    # the TTL: two renewals may fail before a live controller's lease lapses).
    lease_ttl_seconds: float = 30.0
    lease_renew_seconds: float = 10.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ControllerSettings:
        """Read ``SKY_LITE_<FIELD>`` variables (``SKY_LITE_DRAIN_SECONDS``...); unset ones keep their default.

        Raises ``UsageError`` naming the variable for a value that is not a number of the right kind.
        """
        env = os.environ if environ is None else environ
        values: dict[str, float | int] = {}
        for field in dataclasses.fields(cls):
            name = _ENV_NAME.get(field.name, f"SKY_LITE_{field.name.upper()}")
            text = env.get(name, "").strip()
            if not text:
                continue
            minimum = _MINIMUM[field.name]
            try:
                value: float | int = int(text) if field.type == "int" else float(text)
            except ValueError:
                kind = "a whole number" if field.type == "int" else "a number"
                raise UsageError(f"{name} must be {kind}, got {text!r}") from None
            if not math.isfinite(value) or value < minimum:
                raise UsageError(f"{name} must be at least {minimum}, got {text!r}")
            values[field.name] = value
        settings = cls(**values)  # type: ignore[arg-type]
        if settings.lease_renew_seconds >= settings.lease_ttl_seconds:
            raise UsageError(f"SKY_LITE_LEASE_RENEW_SECONDS ({settings.lease_renew_seconds:g}) must be less than "
                             f"SKY_LITE_LEASE_TTL_SECONDS ({settings.lease_ttl_seconds:g}): leases would lapse "
                             "between renewals")
        return settings


_ENV_NAME = {"interval_seconds": "SKY_LITE_CONTROLLER_INTERVAL_SECONDS"}
_MINIMUM: dict[str, float] = {
    "probe_failure_grace_seconds": 0, "provision_timeout_seconds": 1, "instance_visibility_grace_seconds": 0,
    "failure_limit": 1,
    "keep_terminal_replicas": 0, "drain_seconds": 0, "interval_seconds": 0.1,
    "autoscaler_period_seconds": 0.1, "autoscaler_window_seconds": 1, "snapshot_limit_bytes": 1,
    "keep_snapshot_versions": 0, "lease_ttl_seconds": 1, "lease_renew_seconds": 0.1,
}
