"""IAM on Google Cloud for the controller VM's service account (``gcp_machine``): its creation, and its role
bindings on the project and on the service account its replicas run as.

google-cloud-compute has no IAM calls and the few needed are two small REST resources, so they go through
google-auth's ``AuthorizedSession`` with the provider's credentials, on the provider's path: its retries and
its one translation of errors (``GcpProvider._retrying``), and its ``api_endpoint`` (a local fake) when set.

``merge_member`` is the pure part: a policy with one member's bindings replaced by those wanted, every other
member's left as they were. A policy is written back with the ``etag`` it was read with, so a change someone
made in between makes IAM refuse the write (409) and the whole read-merge-write is done again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skyserve_lite.providers.gcp import CloudPlatformApi, GcpPermanentError, GcpProvider

IAM_URL = "https://iam.googleapis.com"
CRM_URL = "https://cloudresourcemanager.googleapis.com"
POLICY_VERSION = 3  # the version that carries conditions
WRITE_ATTEMPTS = 3  # read-merge-write rounds when someone else writes the same policy meanwhile


@dataclass(frozen=True)
class Condition:
    title: str
    expression: str  # CEL, as IAM evaluates it


@dataclass(frozen=True)
class Grant:
    """One role binding: ``role`` on ``resource`` (``projects/P``, or ``projects/P/serviceAccounts/EMAIL``),
    under ``condition`` when there is one."""

    resource: str
    role: str
    condition: Condition | None = None


def merge_member(policy: Mapping[str, Any], member: str, grants: Iterable[Grant]) -> dict[str, Any]:
    """``policy`` (an IAM policy document) with ``member`` in exactly the bindings of ``grants``: taken out of
    every binding it is in, a binding left without members dropped, then added to each grant's binding (one
    of the same role and condition, else a new one). Other members and fields are kept; a policy with a
    condition is version 3. Pure."""
    bindings: list[dict[str, Any]] = []
    for binding in policy.get("bindings", []):
        members = [m for m in binding.get("members", []) if m != member]
        if members:
            bindings.append({**binding, "members": members})
    for grant in grants:
        condition = None if grant.condition is None else {"title": grant.condition.title,
                                                          "expression": grant.condition.expression}
        same = next((b for b in bindings if b.get("role") == grant.role and _condition_of(b) == condition), None)
        if same is None:
            bindings.append({"role": grant.role, "members": [member], **({"condition": condition} if condition
                                                                            else {})})
        elif member not in same["members"]:
            same["members"] = [*same["members"], member]
    merged = {**policy, "bindings": bindings}
    if any("condition" in b for b in bindings):
        merged["version"] = POLICY_VERSION
    return merged


def is_same_policy(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two policies bind the same members to the same roles under the same conditions, in any order."""
    return _canonical(a) == _canonical(b)


def _condition_of(binding: Mapping[str, Any]) -> dict[str, str] | None:
    condition = binding.get("condition")
    if not condition:
        return None
    return {"title": str(condition.get("title", "")), "expression": str(condition.get("expression", ""))}


def _canonical(policy: Mapping[str, Any]) -> list[tuple[str, str, tuple[str, ...]]]:
    return sorted((str(b.get("role")), json.dumps(_condition_of(b), sort_keys=True),
                   tuple(sorted(b.get("members", [])))) for b in policy.get("bindings", []) if b.get("members"))


class GcpIam:
    """The IAM calls ``gcp_machine`` makes; builds nothing in its constructor. Every method raises only
    ``ProviderError`` (``GcpTransientError``, ``GcpPermanentError``)."""

    def __init__(self, provider: GcpProvider) -> None:
        self._gcp = provider
        self._api = CloudPlatformApi(provider)

    def project_number(self, project: str) -> str:
        return str(self._request("GET", f"{self._crm}/v1/projects/{project}", None, "projects.get")["projectNumber"])

    def find_service_account(self, project: str, email: str) -> dict[str, Any] | None:
        """The service account, or None when there is none of that email."""
        try:
            return self._request("GET", f"{self._iam}/v1/projects/{project}/serviceAccounts/{email}", None,
                                 "serviceAccounts.get")
        except GcpPermanentError as exc:
            if _is_not_found(exc):
                return None
            raise

    def create_service_account(self, project: str, account_id: str, display_name: str) -> dict[str, Any]:
        """Create the service account ``account_id`` (or find it: idempotent); it, with its ``email``."""
        email = f"{account_id}@{project}.iam.gserviceaccount.com"
        found = self.find_service_account(project, email)
        if found is not None:
            return found
        try:
            return self._request("POST", f"{self._iam}/v1/projects/{project}/serviceAccounts", {
                "accountId": account_id, "serviceAccount": {"displayName": display_name}}, "serviceAccounts.create")
        except GcpPermanentError as exc:
            if not _is_conflict(exc):  # created meanwhile
                raise
        found = self.find_service_account(project, email)
        if found is None:
            raise GcpPermanentError(f"service account {email} exists and cannot be read", "notFound")
        return found

    def delete_service_account(self, project: str, email: str) -> bool:
        """Delete it; False when there was none."""
        try:
            self._request("DELETE", f"{self._iam}/v1/projects/{project}/serviceAccounts/{email}", None,
                          "serviceAccounts.delete")
            return True
        except GcpPermanentError as exc:
            if _is_not_found(exc):
                return False
            raise

    def bind(self, resource: str, member: str, grants: Sequence[Grant]) -> bool:
        """Make ``member``'s bindings on ``resource`` exactly ``grants`` (``merge_member``); False when they were
        already. A grant for another resource is a programming error."""
        assert all(g.resource == resource for g in grants), "grants of another resource"
        for attempt in range(WRITE_ATTEMPTS):
            policy = self._get_policy(resource)
            merged = merge_member(policy, member, grants)
            if is_same_policy(policy, merged):
                return False
            try:
                self._set_policy(resource, merged)
                return True
            except GcpPermanentError as exc:
                if not _is_conflict(exc) or attempt == WRITE_ATTEMPTS - 1:  # written meanwhile: read again
                    raise
        raise AssertionError("unreachable")

    # --- REST ----------------------------------------------------------------------------------------------
    @property
    def _iam(self) -> str:
        return self._gcp._endpoint or IAM_URL

    @property
    def _crm(self) -> str:
        return self._gcp._endpoint or CRM_URL

    def _policy_url(self, resource: str) -> str:
        return f"{self._iam if '/serviceAccounts/' in resource else self._crm}/v1/{resource}"

    def _get_policy(self, resource: str) -> dict[str, Any]:
        return self._request("POST", f"{self._policy_url(resource)}:getIamPolicy",
                             {"options": {"requestedPolicyVersion": POLICY_VERSION}}, "getIamPolicy")

    def _set_policy(self, resource: str, policy: Mapping[str, Any]) -> None:
        self._request("POST", f"{self._policy_url(resource)}:setIamPolicy", {"policy": dict(policy)}, "setIamPolicy")

    def _request(self, method: str, url: str, body: Mapping[str, Any] | None, what: str) -> dict[str, Any]:
        return self._api.request(what, method, url, body=body)


def _is_not_found(exc: GcpPermanentError) -> bool:
    from google.api_core import exceptions as core

    return exc.code == "notFound" or isinstance(exc.__cause__, core.NotFound)


def _is_conflict(exc: GcpPermanentError) -> bool:
    from google.api_core import exceptions as core

    return isinstance(exc.__cause__, core.Conflict)
