"""Load balancer settings read from the environment; no aiohttp here, so the CLI can validate them cheaply."""

from __future__ import annotations

import math
from collections.abc import Mapping

from skyserve_lite.errors import UsageError

# How long a request waits for a READY replica before it gets 503 (see DEFAULT_MAX_WAITING in server.py
# for the reasoning): long enough for a replica to start, short of common client timeouts (60 s).
DEFAULT_HOLD_SECONDS = 30.0

HOLD_SECONDS_VARIABLE = "SKY_LITE_LB_HOLD_SECONDS"


def hold_seconds_from_env(environ: Mapping[str, str]) -> float:
    """``SKY_LITE_LB_HOLD_SECONDS`` as a number of seconds (0 or more); ``DEFAULT_HOLD_SECONDS`` when unset
    or empty. Raises ``UsageError`` naming the variable for anything else ("abc", "-1", "inf")."""
    text = environ.get(HOLD_SECONDS_VARIABLE, "").strip()
    if not text:
        return DEFAULT_HOLD_SECONDS
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{HOLD_SECONDS_VARIABLE} must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{HOLD_SECONDS_VARIABLE} must be a finite number of seconds >= 0, got {text!r}")
    return value
