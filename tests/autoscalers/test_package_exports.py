"""The names importable from ``skyserve_lite.autoscalers`` itself: the documented Ray Serve compatible import
(``from skyserve_lite.autoscalers import AutoscalingConfig, BasicAutoscalingPolicy, CONTROL_LOOP_PERIOD_S``) and
the rest of what the package exported before its names moved to their modules, all loaded on first use only."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import skyserve_lite.autoscalers as package

# Each name the package exported, and the module that defines it.
EXPORTS = [
    ("CONTROL_LOOP_PERIOD_S", "ongoing_requests"),
    ("AutoscalingConfig", "ongoing_requests"),
    ("BasicAutoscalingPolicy", "ongoing_requests"),
    ("calculate_desired_num_replicas", "ongoing_requests"),
    ("Autoscaler", "base"),
    ("AutoscalerState", "base"),
    ("Decision", "base"),
    ("Metrics", "base"),
    ("make_autoscaler", "dispatch"),
    ("MarketTargets", "fallback"),
    ("plan_market_targets", "fallback"),
    ("carry_over", "target"),
    ("compute_target_replicas", "target"),
]


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize(("name", "module"), EXPORTS, ids=[name for name, _ in EXPORTS])
def test_the_package_path_and_the_module_path_give_the_same_object(name: str, module: str) -> None:
    defined = getattr(importlib.import_module(f"skyserve_lite.autoscalers.{module}"), name)
    assert getattr(package, name) is defined


def test_every_export_is_listed_and_nothing_else() -> None:
    assert sorted(package.__all__) == sorted(name for name, _ in EXPORTS)


def test_importing_the_package_loads_no_policy() -> None:
    loaded = _run("import sys, skyserve_lite.autoscalers\n"
                  "print(sorted(m for m in sys.modules if m.startswith('skyserve_lite.autoscalers.')))")
    assert loaded == "[]"


def test_listing_the_package_loads_no_policy_and_shows_the_exports() -> None:
    out = _run("import sys, skyserve_lite.autoscalers as a\n"
               "print('AutoscalingConfig' in dir(a), 'CONTROL_LOOP_PERIOD_S' in dir(a),\n"
               "      'skyserve_lite.autoscalers.ongoing_requests' in sys.modules)")
    assert out == "True True False"


@pytest.mark.parametrize(
    ("name", "loads_policies"),
    [("AutoscalerState", False), ("compute_target_replicas", False), ("AutoscalingConfig", True)],
)
def test_a_name_loads_only_its_own_module(name: str, loads_policies: bool) -> None:
    out = _run(f"import sys\nfrom skyserve_lite.autoscalers import {name}\n"
               "print('skyserve_lite.autoscalers.ongoing_requests' in sys.modules)")
    assert out == str(loads_policies)


def test_the_documented_import_from_a_fresh_interpreter() -> None:
    out = _run("from skyserve_lite.autoscalers import AutoscalingConfig, BasicAutoscalingPolicy, "
               "CONTROL_LOOP_PERIOD_S\n"
               "from skyserve_lite.autoscalers import ongoing_requests as m\n"
               "print(AutoscalingConfig is m.AutoscalingConfig, BasicAutoscalingPolicy is m.BasicAutoscalingPolicy,\n"
               "      CONTROL_LOOP_PERIOD_S == m.CONTROL_LOOP_PERIOD_S)")
    assert out == "True True True"


@pytest.mark.parametrize("name", ["AutoscalingConfg", "OngoingRequestsAutoscaler", "simulate"])
def test_an_unknown_name_is_an_attribute_error_naming_the_package(name: str) -> None:
    with pytest.raises(AttributeError, match=rf"module 'skyserve_lite\.autoscalers' has no attribute '{name}'"):
        getattr(package, name)


def test_an_unknown_name_in_a_from_import_is_an_import_error() -> None:
    with pytest.raises(ImportError, match="AutoscalingConfg"):
        exec("from skyserve_lite.autoscalers import AutoscalingConfg", {})


def test_submodules_still_import_through_the_package() -> None:
    # ``from package import submodule`` asks the package first; its AttributeError must let the import go on.
    out = _run("from skyserve_lite.autoscalers import simulator, base\nprint(simulator.__name__, base.__name__)")
    assert out == "skyserve_lite.autoscalers.simulator skyserve_lite.autoscalers.base"
