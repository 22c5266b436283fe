"""`service.auth`: bearer API keys named among the task's `secrets`.

The keys are the load balancer's: once bound they leave `TaskSpec.secrets` for `service.auth.api_keys`
(name, digest), so no replica gets them as a variable, the replica config does not see them, and a key
rotated with `serve update --secret` is a service change that reuses replicas. Nothing stored or shown holds
a value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from skyserve_lite.api import bind_submission, summarize_change
from skyserve_lite.clock import FakeClock
from skyserve_lite.controller.lb_runner import FakeLoadBalancerRunner
from skyserve_lite.controller.probe import FakeProber
from skyserve_lite.controller.reconcile import Reconciler
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.errors import SpecError, UsageError
from skyserve_lite.providers.base import LaunchOutcome, LaunchRequest
from skyserve_lite.providers.fake import FakeProvider
from skyserve_lite.spec.config import compute_replica_config, find_config_changes, find_service_changes
from skyserve_lite.spec.inputs import (
    MIN_API_KEY_LENGTH,
    BoundInputs,
    bind,
    find_api_key_problem,
    find_missing,
    with_inputs,
)
from skyserve_lite.spec.model import AuthType, Secret, ServiceAuth, TaskSpec
from skyserve_lite.spec.parse import parse_task, read_task
from skyserve_lite.state.secrets import SecretStore
from skyserve_lite.state.store import Store

SOURCE = "svc.yaml"
KEY = "k" * 32
HF = "0123456789abcdef0123456789abcdef"
DIGEST_A = "a" * 32
DIGEST_B = "b" * 32


def task(auth: Any = None, probe: Any = None, **service: Any) -> str:
    """A task with the secrets API_KEY, OTHER_KEY and HF_TOKEN, the env MODEL, and ``auth`` (left out when
    None) in its service."""
    section: dict[str, Any] = {"replicas": 1, **service}
    if auth is not None:
        section["auth"] = auth
    if probe is not None:
        section["readiness_probe"] = {"path": "/", **probe}
    doc = {"envs": {"MODEL": "llama"}, "secrets": {"API_KEY": None, "OTHER_KEY": None, "HF_TOKEN": None},
           "service": section, "run": "serve --port $PORT"}
    return yaml.safe_dump(doc, sort_keys=False)


ACCEPTED = [
    pytest.param({"api_keys": ["API_KEY"]}, ServiceAuth((("API_KEY", ""),)), id="one-key"),
    pytest.param({"api_keys": ["OTHER_KEY", "API_KEY"]}, ServiceAuth((("API_KEY", ""), ("OTHER_KEY", ""))),
                 id="two-keys-sorted"),
    pytest.param({"type": "bearer", "api_keys": ["API_KEY"]}, ServiceAuth((("API_KEY", ""),), AuthType.BEARER),
                 id="type-written"),
    pytest.param({"type": "Bearer", "api_keys": ["API_KEY"]}, ServiceAuth((("API_KEY", ""),)), id="type-any-case"),
    pytest.param(False, None, id="dstack-auth-false-is-open"),
]


@pytest.mark.parametrize(("auth", "expected"), ACCEPTED)
def test_auth_is_read(auth: Any, expected: ServiceAuth | None) -> None:
    assert parse_task(task(auth), SOURCE).service.auth == expected


def test_no_auth_is_an_open_endpoint() -> None:
    assert parse_task(task(), SOURCE).service.auth is None


_A = "service.auth"
REFUSED = [
    pytest.param(task(True), _A, "name the keys the endpoint accepts: auth: {api_keys: [API_KEY]}", id="true"),
    pytest.param(task(["API_KEY"]), _A, "this field must be a mapping, got a list", id="list"),
    pytest.param(task({}), f"{_A}.api_keys", "missing; name the secrets that hold the keys", id="no-keys"),
    pytest.param(task({"api_keys": "API_KEY"}), f"{_A}.api_keys", "got a string ('API_KEY'): write [API_KEY]",
                 id="keys-string"),
    pytest.param(task({"api_keys": []}), f"{_A}.api_keys", "must be a non-empty list of secret names",
                 id="keys-empty"),
    pytest.param(task({"api_keys": [1]}), f"{_A}.api_keys[0]", "must be a string, got a number (1)",
                 id="key-number"),
    pytest.param(task({"api_keys": ["API-KEY"]}), f"{_A}.api_keys[0]", "not a valid environment variable name",
                 id="key-bad-name"),
    pytest.param(task({"api_keys": ["API_KEY", "API_KEY"]}), f"{_A}.api_keys[1]", "API_KEY is named twice",
                 id="key-twice"),
    pytest.param(task({"api_keys": ["NOPE"]}), f"{_A}.api_keys[0]",
                 "NOPE is not a secret of the task: declare it (secrets: {NOPE: null}) and give it with --secret "
                 "NOPE", id="key-not-a-secret"),
    pytest.param(task({"api_keys": ["MODEL"]}), f"{_A}.api_keys[0]", "MODEL is not a secret of the task",
                 id="key-is-an-env"),
    pytest.param(task({"type": "basic", "api_keys": ["API_KEY"]}), f"{_A}.type",
                 "unknown value 'basic'; expected one of: bearer", id="type-unknown"),
    pytest.param(task({"keys": ["API_KEY"]}), f"{_A}.keys", "unknown field; expected one of: type, api_keys",
                 id="unknown-field"),
    pytest.param(task({"api_keys": ["API_KEY"]}, probe={"headers": {"Authorization": "Bearer $API_KEY"}}),
                 "service.readiness_probe.headers.Authorization",
                 "refers to API_KEY, a key of service.auth: the probe goes to the replicas directly",
                 id="probe-header"),
    pytest.param(task({"api_keys": ["API_KEY"]}, probe={"post_data": {"key": "${API_KEY}"}}),
                 "service.readiness_probe.post_data", "refers to API_KEY, a key of service.auth", id="probe-body"),
]


@pytest.mark.parametrize(("text", "path", "problem"), REFUSED)
def test_auth_is_refused_naming_the_field(text: str, path: str, problem: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_task(text, SOURCE)
    assert (caught.value.path, caught.value.source) == (path, SOURCE)
    assert problem in caught.value.problem
    assert "\n" not in str(caught.value)


def test_the_probe_may_send_another_secret_of_the_task() -> None:
    spec = parse_task(task({"api_keys": ["API_KEY"]}, probe={"headers": {"Authorization": "Bearer $OTHER_KEY"}}))
    assert spec.service.readiness_probe.headers == (("Authorization", "Bearer $OTHER_KEY"),)


def bound(text: str, api_key: str = DIGEST_A, other_key: str = DIGEST_B, hf: str = HF) -> TaskSpec:
    inputs = BoundInputs(secrets=(("API_KEY", api_key), ("OTHER_KEY", other_key), ("HF_TOKEN", hf)))
    return bind(parse_task(text, SOURCE), inputs, SOURCE)


def test_binding_moves_the_keys_out_of_the_replicas_secrets() -> None:
    spec = bound(task({"api_keys": ["API_KEY"]}))
    assert spec.secrets == (("HF_TOKEN", HF), ("OTHER_KEY", DIGEST_B))  # what replicas get
    assert spec.service.auth == ServiceAuth((("API_KEY", DIGEST_A),))
    assert bind(spec, BoundInputs(), SOURCE) == spec  # binding a bound spec again changes nothing


def test_a_key_without_a_value_is_missing_like_any_secret() -> None:
    spec = bind(parse_task(task({"api_keys": ["API_KEY"]})), BoundInputs(secrets=(("OTHER_KEY", DIGEST_B),
                                                                                     ("HF_TOKEN", HF))), SOURCE)
    missing = find_missing(spec, SOURCE)
    assert missing is not None and missing.path == "secrets.API_KEY"
    assert "--secret API_KEY=VALUE" in missing.problem


def describe(changes: Sequence[Any]) -> list[str]:
    return [change.describe() for change in changes]


CHANGES = [
    pytest.param(bound(task({"api_keys": ["API_KEY"]})), bound(task({"api_keys": ["API_KEY"]}), api_key="c" * 32),
                 [], ["service.auth.api_keys.API_KEY: changed"], id="key-rotated"),
    pytest.param(bound(task({"api_keys": ["API_KEY"]})), bound(task({"api_keys": ["API_KEY", "OTHER_KEY"]})),
                 ["secrets.OTHER_KEY: removed"], ["service.auth.api_keys.OTHER_KEY: added"],
                 id="a-replica-secret-becomes-a-key"),
    pytest.param(bound(task()), bound(task({"api_keys": ["API_KEY"]})),
                 ["secrets.API_KEY: removed"], ["service.auth.api_keys.API_KEY: added", "service.auth.type: (unset) "
                                                "-> bearer"], id="auth-added"),
    pytest.param(bound(task({"api_keys": ["API_KEY"]})), bound(task({"api_keys": ["API_KEY"]}), hf="d" * 32),
                 ["secrets.HF_TOKEN: changed"], [], id="a-replica-secret-still-replaces"),
]


@pytest.mark.parametrize(("old", "new", "replica_changes", "service_changes"), CHANGES)
def test_keys_are_service_settings_shown_without_digests(old: TaskSpec, new: TaskSpec, replica_changes: list[str],
                                                         service_changes: list[str]) -> None:
    assert describe(find_config_changes(old, new)) == replica_changes
    assert describe(find_service_changes(old, new)) == service_changes
    for text in describe((*find_config_changes(old, new), *find_service_changes(old, new))):
        assert not any(digest in text for digest in (DIGEST_A, DIGEST_B, HF, "c" * 32, "d" * 32))


def test_a_spec_whose_secrets_still_list_the_keys_leaves_them_out_of_the_replica_config() -> None:
    spec = parse_task(task({"api_keys": ["API_KEY"]}))
    spec = dataclasses.replace(spec, secrets=(("API_KEY", DIGEST_A), ("HF_TOKEN", HF), ("OTHER_KEY", DIGEST_B)))
    config = compute_replica_config(spec)
    assert {key for key in config if key.startswith("secrets.")} == {"secrets.OTHER_KEY", "secrets.HF_TOKEN"}


@pytest.mark.parametrize(("value", "problem"), [
    pytest.param("x" * MIN_API_KEY_LENGTH, None, id="shortest"),
    pytest.param("sk-" + "A1b2_.~+/=" * 3, None, id="token-characters"),
    pytest.param("x" * (MIN_API_KEY_LENGTH - 1), "must be at least 16 characters", id="too-short"),
    pytest.param("", "must be at least 16 characters", id="empty"),
    pytest.param("two words are not one key", "visible ASCII characters only", id="space"),
    pytest.param("k" * 20 + "\n", "visible ASCII characters only", id="line-break"),
    pytest.param("schlüssel-" + "k" * 10, "visible ASCII characters only", id="non-ascii"),
])
def test_what_a_key_may_hold(value: str, problem: str | None) -> None:
    found = find_api_key_problem(value)
    assert (found is None) if problem is None else (found is not None and problem in found)
    if found is not None and value:
        assert value not in found


def test_a_bad_key_is_refused_when_submitted_without_showing_it() -> None:
    submitted = read_task(task({"api_keys": ["API_KEY"]}), SOURCE)
    secrets = (("API_KEY", Secret("short-key")), ("OTHER_KEY", Secret("x")), ("HF_TOKEN", Secret("hf")))
    with pytest.raises(UsageError) as caught:
        with_inputs(submitted, (), secrets, None)
    assert str(caught.value).startswith("--secret API_KEY: a key of service.auth must be at least 16 characters")
    assert "short-key" not in str(caught.value)
    # Only the keys: OTHER_KEY and HF_TOKEN are replica secrets, whatever their length.
    good = (("API_KEY", Secret(KEY)), *secrets[1:])
    assert with_inputs(submitted, (), good, None).inputs.secrets == tuple(sorted(good))


class RecordingProvider(FakeProvider):
    """The fake provider, also keeping the variables of each launch by replica id."""

    def __init__(self) -> None:
        super().__init__(name="local")
        self.envs: dict[int, dict[str, str]] = {}

    def launch(self, requests: Sequence[LaunchRequest]) -> list[LaunchOutcome]:
        self.envs.update({request.replica_id: dict(request.envs) for request in requests})
        return super().launch(requests)


def test_replicas_never_get_the_keys_and_a_rotated_key_reuses_them(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store, secrets, clock = Store.open(home), SecretStore(home), FakeClock()
    provider = RecordingProvider()
    reconciler = Reconciler(store, {"local": provider}, FakeProber(), FakeLoadBalancerRunner(), clock,
                            ControllerSettings(), secrets=secrets)
    text = task({"api_keys": ["API_KEY"]}, replicas=2)

    def submit(api_key: str, previous: bool) -> None:
        given = (("API_KEY", Secret(api_key)), ("OTHER_KEY", Secret("other")), ("HF_TOKEN", Secret("hf-token")))
        submitted = with_inputs(read_task(text, SOURCE), (), given, None)
        before = store.get_version("svc", store.get_service("svc").current_version) if previous else None
        bound_task, inputs = bind_submission(submitted, before, secrets, keep_secrets=True)
        if previous:
            store.add_version("svc", bound_task, "rolling", clock.now(), inputs=inputs)
        else:
            store.create_service("svc", bound_task, 30001, clock.now(), inputs=inputs)

    submit(KEY, previous=False)
    clock.advance(1)
    reconciler.reconcile_once()
    assert sorted(provider.envs) == [1, 2]
    for env in provider.envs.values():
        assert env == {"MODEL": "llama", "OTHER_KEY": "other", "HF_TOKEN": "hf-token"}  # no API_KEY

    rotated = "r" * 40
    submit(rotated, previous=True)
    v1, v2 = store.get_version("svc", 1), store.get_version("svc", 2)
    assert find_config_changes(v1.spec, v2.spec) == ()
    assert summarize_change(v1, v2) == "reuses replicas: service.auth.api_keys.API_KEY: changed"
    for _ in range(3):
        clock.advance(1)
        reconciler.reconcile_once()
    live = [r for r in store.list_replicas("svc") if r.status.is_live]
    assert {r.replica_id: r.version for r in live} == {1: 2, 2: 2}  # moved to version 2 in place
    assert sorted(provider.envs) == [1, 2]  # nothing launched again

    # The values are kept by digest for the load balancer, and stored nowhere else.
    auth = v2.spec.service.auth
    assert auth is not None and [secrets.get(digest).value for _, digest in auth.api_keys] == [rotated]
    assert {digest for _, digest in auth.api_keys} <= store.find_needed_secrets()
    store.close()
    state = b"".join(path.read_bytes() for path in home.glob("state.db*"))
    assert KEY.encode() not in state and rotated.encode() not in state

