"""Knobs of the controller that are not part of a task YAML, and the values the controller pass reads."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ControllerSettings:
    # A READY replica whose probe keeps failing this long is replaced. SkyServe uses 180 s: long enough to
    # ride out a garbage-collection pause or a slow request storm, short enough not to serve errors for long.
    probe_failure_grace_seconds: float = 180.0
    # A launch that has not produced a running instance after this long is given up (FAILED_PROVISION).
    provision_timeout_seconds: float = 600.0
    # After this many replicas of the current version fail before any became ready, the service is
    # FAILED and launching stops until an update: a broken `run` must not relaunch forever.
    failure_limit: int = 3
    # Terminal replica rows kept per service, newest first, so `serve status` can show what failed.
    keep_terminal_replicas: int = 10
    # Seconds between passes of `controller run`.
    interval_seconds: float = 2.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ControllerSettings:
        """Read ``SKY_LITE_PROBE_FAILURE_GRACE_SECONDS`` and friends; unset ones keep their default."""
        env = os.environ if environ is None else environ
        defaults = cls()

        def number(name: str, default: float) -> float:
            text = env.get(f"SKY_LITE_{name}")
            return float(text) if text else default

        return cls(
            probe_failure_grace_seconds=number("PROBE_FAILURE_GRACE_SECONDS",
                                               defaults.probe_failure_grace_seconds),
            provision_timeout_seconds=number("PROVISION_TIMEOUT_SECONDS", defaults.provision_timeout_seconds),
            failure_limit=int(number("FAILURE_LIMIT", defaults.failure_limit)),
            keep_terminal_replicas=int(number("KEEP_TERMINAL_REPLICAS", defaults.keep_terminal_replicas)),
            interval_seconds=number("CONTROLLER_INTERVAL_SECONDS", defaults.interval_seconds),
        )
