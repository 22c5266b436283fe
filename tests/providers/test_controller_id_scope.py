"""A controller VM's permissions are scoped to its controller id, which the VM itself reports: only the form a
store makes is accepted (``check_controller_id``), by the AWS and GCP scopes themselves, and a secret's
prefix never holds a pattern or a quote whatever id it is given."""

from __future__ import annotations

from pathlib import Path

import pytest

from skyserve_lite.providers.cloud_secrets import check_controller_id, compute_secret_prefix
from skyserve_lite.state.store import Store

VALID = "0123456789ab"
# What a compromised VM could answer: patterns of an IAM policy, a CEL quote, other lengths and cases.
NOT_IDS = [
    pytest.param("*", id="star"),
    pytest.param("?", id="question-mark"),
    pytest.param("", id="empty"),
    pytest.param("0123456789a*", id="star-at-the-end"),
    pytest.param("0123456789a", id="11-digits"),
    pytest.param("0123456789abc", id="13-digits"),
    pytest.param("0123456789AB", id="uppercase"),
    pytest.param("0123456789ag", id="not-hex"),
    pytest.param("0123456789ab\n", id="trailing-newline"),
    pytest.param('") || true || ("', id="cel-injection"),
    pytest.param("01234_6789ab", id="separator"),
]


def test_a_stores_own_id_has_the_form(tmp_path: Path) -> None:
    store = Store.open_sqlite(tmp_path / "home")
    try:
        assert check_controller_id(store.controller_id) == store.controller_id
    finally:
        store.close()


@pytest.mark.parametrize("controller_id", NOT_IDS)
def test_anything_else_is_refused(controller_id: str) -> None:
    with pytest.raises(ValueError, match="not one a sky-lite store makes"):
        check_controller_id(controller_id)


@pytest.mark.parametrize(("controller_id", "service"), [
    ("*", None), ("?", None), ("a_b", None), ('"', None), ("", None), ("c" * 65, None),
    (VALID, "*"), (VALID, "web_2"), (VALID, ""),
])
def test_a_secret_prefix_holds_no_pattern_separator_or_quote(controller_id: str, service: str | None) -> None:
    with pytest.raises(ValueError, match="a secret's name takes only letters, digits and '-'"):
        compute_secret_prefix(controller_id, service)


def test_a_well_formed_prefix_is_unchanged() -> None:
    assert compute_secret_prefix(VALID) == f"sky-lite_{VALID}_"
    assert compute_secret_prefix(VALID, "web-2") == f"sky-lite_{VALID}_web-2_"


@pytest.mark.parametrize("controller_id", NOT_IDS)
def test_the_aws_scope_refuses_what_is_not_a_controller_id(controller_id: str) -> None:
    pytest.importorskip("boto3")
    from skyserve_lite.providers.aws_machine import AwsScope

    with pytest.raises(ValueError, match="not one a sky-lite store makes"):
        AwsScope(partition="aws", account="123456789012", controller_id=controller_id, replica_role="r")
    assert AwsScope(partition="aws", account="1", controller_id=VALID, replica_role="r").controller_id == VALID


@pytest.mark.parametrize("controller_id", NOT_IDS)
def test_the_gcp_scope_refuses_what_is_not_a_controller_id(controller_id: str) -> None:
    pytest.importorskip("google.cloud.compute_v1")
    from skyserve_lite.providers.gcp_machine import GcpScope

    with pytest.raises(ValueError, match="not one a sky-lite store makes"):
        GcpScope(project="p", project_number="1", controller_id=controller_id, replica_account="r@p")
    assert GcpScope(project="p", project_number="1", controller_id=VALID, replica_account="r@p").controller_id == VALID
