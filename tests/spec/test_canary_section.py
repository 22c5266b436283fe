"""`service.canary`: the defaults of `serve update --mode canary`, each field checked with its path named."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from skyserve_lite.errors import SpecError
from skyserve_lite.plan.canary import CanarySettings
from skyserve_lite.spec.config import is_same_replica_config
from skyserve_lite.spec.parse import parse_task


def _task(canary: Any) -> str:
    return yaml.safe_dump({"service": {"replicas": 2, "canary": canary}, "run": "serve"}, sort_keys=False)


@pytest.mark.parametrize(
    ("canary", "expected"),
    [
        ({}, CanarySettings()),
        ({"steps": [5, 25, 60]}, CanarySettings(steps=(5, 25, 60))),
        ({"steps": [10], "bake_seconds": 30, "max_error_rate": 0.05, "min_requests": 20, "max_extensions": 0},
         CanarySettings(steps=(10,), bake_seconds=30, max_error_rate=0.05, min_requests=20, max_extensions=0)),
    ],
)
def test_canary_section_is_read(canary: Any, expected: CanarySettings) -> None:
    assert parse_task(_task(canary)).service.canary == expected


def test_without_the_section_there_are_no_canary_defaults() -> None:
    assert parse_task("service: {replicas: 1}\nrun: serve\n").service.canary is None


@pytest.mark.parametrize(
    ("canary", "message"),
    [
        ({"steps": [50, 10]}, "service.canary.steps: steps must increase"),
        ({"steps": [10, 100]}, "service.canary.steps: each step is a percentage above 0 and below 100"),
        ({"steps": 10}, "service.canary.steps: must be a list of percentages"),
        ({"steps": ["ten"]}, r"service.canary.steps\[0\]: must be an integer"),
        ({"bake_seconds": 0}, "service.canary.bake_seconds: must be greater than 0"),
        ({"max_error_rate": 1.5}, "service.canary.max_error_rate: must be a fraction from 0 to below 1"),
        ({"min_requests": 0}, "service.canary.min_requests: must be at least 1"),
        ({"max_extensions": -1}, "service.canary.max_extensions: must be at least 0"),
        ({"bake": 30}, "service.canary.bake: unknown field"),
        ("yes", "service.canary: this field must be a mapping"),
    ],
)
def test_bad_canary_fields_are_named(canary: Any, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_task(_task(canary))


def test_the_canary_section_does_not_change_the_replica_config() -> None:
    before = parse_task(_task({"steps": [10]}))
    after = parse_task(_task({"steps": [20, 40], "bake_seconds": 10}))
    assert is_same_replica_config(before, after)
