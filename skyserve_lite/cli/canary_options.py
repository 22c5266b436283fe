"""The canary flags of `serve update` (``--steps 10,50 --bake 2m --max-error-rate 0.02``), read over the task's
`service.canary` defaults. Pure: a bad value raises ``UsageError`` naming its flag, before anything is
planned or stored."""

from __future__ import annotations

import math
import re

from skyserve_lite.errors import UsageError
from skyserve_lite.plan.canary import CanarySettings, find_canary_settings, find_settings_problem

_FLAGS = {"steps": "--steps", "bake": "--bake", "max_error_rate": "--max-error-rate",
          "min_requests": "service.canary.min_requests", "max_extensions": "service.canary.max_extensions"}
_DURATION = re.compile(r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>s|m|h)?")
_UNIT_SECONDS = {None: 1, "s": 1, "m": 60, "h": 3600}


def parse_steps(text: str) -> tuple[int, ...]:
    """``"10,50"`` -> (10, 50)."""
    parts = [part.strip().rstrip("%") for part in text.split(",")]
    if not all(part.isdigit() for part in parts):
        raise UsageError(f"--steps: {text!r} is not a list of whole percentages, e.g. 10,50")
    return tuple(int(part) for part in parts)


def parse_duration(text: str) -> float:
    """``"2m"`` -> 120, ``"90s"`` or ``"90"`` -> 90, ``"1h"`` -> 3600."""
    found = _DURATION.fullmatch(text.strip())
    if found is None and _DURATION.fullmatch(text.strip().removeprefix("-")) is not None:
        raise UsageError(f"--bake: must be a positive duration, not {text!r}")
    if found is None:
        raise UsageError(f"--bake: {text!r} is not a duration, e.g. 2m, 90s or 120")
    return float(found["number"]) * _UNIT_SECONDS[found["unit"]]


def parse_rate(text: str) -> float:
    """``"0.02"`` or ``"2%"`` -> 0.02."""
    value = text.strip()
    try:
        rate = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise UsageError(f"--max-error-rate: {text!r} is not a rate, e.g. 0.02 or 2%") from None
    if not math.isfinite(rate):
        raise UsageError(f"--max-error-rate: {text!r} is not a rate, e.g. 0.02 or 2%")
    # Checked here rather than by ``find_settings_problem``, which would name 150% as "1.5".
    if not 0 <= rate < 1:
        raise UsageError(f"--max-error-rate: must be a fraction from 0 to below 1 (0.02 or 2%), not {text!r}")
    return rate


def compute_canary_settings(base: CanarySettings | None, steps: str | None, bake: str | None,
                            max_error_rate: str | None) -> CanarySettings:
    """The settings of a canary update: ``base`` (the task's `service.canary`, else the defaults) with each
    flag given over it (``find_canary_settings``), checked as a whole (steps that do not increase are named as
    ``--steps``)."""
    settings = find_canary_settings(
        base, steps=None if steps is None else parse_steps(steps),
        bake_seconds=None if bake is None else parse_duration(bake),
        max_error_rate=None if max_error_rate is None else parse_rate(max_error_rate))
    problem = find_settings_problem(settings)
    if problem is not None:
        field, text = problem
        raise UsageError(f"{_FLAGS[field]}: {text}")
    return settings
