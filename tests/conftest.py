"""Settings every test runs with."""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # No test may reach a cloud: without credentials boto3 and google-auth would ask the instance metadata
    # address (169.254.169.254) for some. AWS is moto and GCP a fake server on 127.0.0.1; a test that
    # reached for a real cloud fails on missing credentials instead.
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    os.environ.setdefault("NO_GCE_CHECK", "True")
