"""The IAM and Resource Manager calls of a controller VM's service account (``providers/gcp_iam.py``), faked
for ``gce_fake``'s server: service accounts (create, get, delete), a project's number, and the IAM policies of
the project and of each service account (get, set with ``etag``), answered as Google answers them.
``conflicts`` makes the next policy writes fail with 409 as if someone else had written in between."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

PROJECT_NUMBER = "123456789012"
_PROJECT = r"/v1/projects/(?P<project>[^/:]+)"
_ACCOUNT = _PROJECT + r"/serviceAccounts/(?P<email>[^/:]+)"


@dataclass
class FakeIam:
    accounts: dict[str, dict[str, Any]] = field(default_factory=dict)  # email -> service account
    policies: dict[str, dict[str, Any]] = field(default_factory=dict)  # resource -> policy
    calls: Counter[str] = field(default_factory=Counter)
    conflicts: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def members_of(self, resource: str) -> dict[str, list[str]]:
        """Role (with its condition's title) -> members, of the policy of ``resource``."""
        found: dict[str, list[str]] = {}
        for binding in self.policies.get(resource, {}).get("bindings", []):
            title = (binding.get("condition") or {}).get("title")
            found[binding["role"] + (f" if {title}" if title else "")] = sorted(binding["members"])
        return found

    def answer(self, verb: str, path: str, raw: bytes) -> tuple[int, Any] | None:
        """The answer to a request for one of these endpoints; None for any other path."""
        with self._lock:
            for route_verb, pattern, method in _ROUTES:
                match = re.fullmatch(pattern, path)
                if match and route_verb == verb:
                    self.calls[method] += 1
                    body = json.loads(raw) if raw.strip() else {}  # only ours: an upload's body is no JSON
                    handler = getattr(self, "_" + method.replace(".", "_"))
                    answered: tuple[int, Any] = handler(body, **match.groupdict())
                    return answered
        return None

    def _projects_get(self, body: dict[str, Any], project: str) -> tuple[int, Any]:
        return 200, {"projectId": project, "projectNumber": PROJECT_NUMBER, "lifecycleState": "ACTIVE"}

    def _serviceAccounts_create(self, body: dict[str, Any], project: str) -> tuple[int, Any]:
        email = f"{body['accountId']}@{project}.iam.gserviceaccount.com"
        if email in self.accounts:
            return 409, _error(409, "ALREADY_EXISTS", f"Service account {body['accountId']} already exists")
        self.accounts[email] = {"name": f"projects/{project}/serviceAccounts/{email}", "projectId": project,
                                "email": email, "displayName": body.get("serviceAccount", {}).get("displayName", "")}
        return 200, self.accounts[email]

    def _serviceAccounts_get(self, body: dict[str, Any], project: str, email: str) -> tuple[int, Any]:
        found = self.accounts.get(email)
        return (200, found) if found else (404, _error(404, "NOT_FOUND", f"Unknown service account {email}"))

    def _serviceAccounts_delete(self, body: dict[str, Any], project: str, email: str) -> tuple[int, Any]:
        if self.accounts.pop(email, None) is None:
            return 404, _error(404, "NOT_FOUND", f"Unknown service account {email}")
        self.policies.pop(f"projects/{project}/serviceAccounts/{email}", None)  # its policy goes with it
        return 200, {}

    def _getIamPolicy(self, resource: str) -> tuple[int, Any]:
        policy = self.policies.setdefault(resource, {"version": 1, "etag": "BwA=", "bindings": []})
        return 200, json.loads(json.dumps(policy))

    def _setIamPolicy(self, resource: str, body: dict[str, Any]) -> tuple[int, Any]:
        policy = body["policy"]
        current = self.policies.get(resource, {"etag": "BwA="})
        if self.conflicts > 0 or policy.get("etag") != current.get("etag"):
            self.conflicts = max(0, self.conflicts - 1)
            self.policies[resource] = {**current, "etag": current["etag"] + "x"}  # someone else's write
            return 409, _error(409, "ABORTED", "There were concurrent policy changes.")
        self.policies[resource] = {**policy, "etag": current["etag"] + "1"}
        return 200, self.policies[resource]

    def _projects_getIamPolicy(self, body: dict[str, Any], project: str) -> tuple[int, Any]:
        return self._getIamPolicy(f"projects/{project}")

    def _projects_setIamPolicy(self, body: dict[str, Any], project: str) -> tuple[int, Any]:
        return self._setIamPolicy(f"projects/{project}", body)

    def _serviceAccounts_getIamPolicy(self, body: dict[str, Any], project: str, email: str) -> tuple[int, Any]:
        return self._getIamPolicy(f"projects/{project}/serviceAccounts/{email}")

    def _serviceAccounts_setIamPolicy(self, body: dict[str, Any], project: str, email: str) -> tuple[int, Any]:
        return self._setIamPolicy(f"projects/{project}/serviceAccounts/{email}", body)


_ROUTES = [
    ("GET", _PROJECT, "projects.get"),
    ("POST", _PROJECT + ":getIamPolicy", "projects.getIamPolicy"),
    ("POST", _PROJECT + ":setIamPolicy", "projects.setIamPolicy"),
    ("POST", _PROJECT + "/serviceAccounts", "serviceAccounts.create"),
    ("GET", _ACCOUNT, "serviceAccounts.get"),
    ("DELETE", _ACCOUNT, "serviceAccounts.delete"),
    ("POST", _ACCOUNT + ":getIamPolicy", "serviceAccounts.getIamPolicy"),
    ("POST", _ACCOUNT + ":setIamPolicy", "serviceAccounts.setIamPolicy"),
]


def _error(status: int, state: str, message: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "status": state}}
