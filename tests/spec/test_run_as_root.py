"""`resources.run_as_root`: the opt-in that runs a cloud replica's `setup` and `run` as root instead of the
unprivileged `sky` user; a section field (shared by every candidate) and part of the replica config."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from skyserve_lite.errors import SpecError
from skyserve_lite.spec.config import compute_config_fingerprint, find_config_changes
from skyserve_lite.spec.parse import parse_task


def task(**resources: Any) -> str:
    return yaml.safe_dump({"run": "serve", "service": {"replicas": 1},
                           "resources": {"cloud": "aws", "image_id": "ami-1", **resources}})


@pytest.mark.parametrize(("resources", "expected"), [
    pytest.param({}, False, id="unset"),
    pytest.param({"run_as_root": False}, False, id="false"),
    pytest.param({"run_as_root": True}, True, id="true"),
])
def test_run_as_root_is_read_from_the_resources_section(resources: dict[str, Any], expected: bool) -> None:
    assert parse_task(task(**resources)).resources.run_as_root is expected


def test_every_candidate_shares_the_sections_run_as_root() -> None:
    spec = parse_task(task(run_as_root=True, any_of=[{"instance_type": "m5.large"}, {"instance_type": "c5.large"}]))
    assert [c.run_as_root for c in spec.candidates] == [True, True]


@pytest.mark.parametrize(("resources", "path", "problem"), [
    pytest.param({"run_as_root": "yes"}, "resources.run_as_root", "must be true or false", id="not-a-boolean"),
    pytest.param({"any_of": [{"run_as_root": True}]}, "resources.any_of[0].run_as_root", "unknown field",
                 id="per-candidate"),
])
def test_a_bad_run_as_root_is_refused_naming_the_field(resources: dict[str, Any], path: str, problem: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_task(task(**resources))
    assert caught.value.path == path and problem in str(caught.value)


def test_turning_run_as_root_on_or_off_replaces_replicas() -> None:
    # A replica that runs as `sky` is not one that runs as root: its files and home belong to another user.
    plain, root = parse_task(task()), parse_task(task(run_as_root=True))
    assert [c.describe() for c in find_config_changes(plain, root)] == ["resources.run_as_root: (unset) -> true"]
    assert [c.describe() for c in find_config_changes(root, plain)] == ["resources.run_as_root: true -> (unset)"]


def test_a_task_that_does_not_name_it_keeps_its_fingerprint() -> None:
    # Versions stored before the field existed compare equal to the same task submitted now.
    assert compute_config_fingerprint(parse_task(task(run_as_root=False))) == \
        compute_config_fingerprint(parse_task(task()))
