"""How a controller host exposes its load balancers: the address they bind and the one endpoints show; and,
on a controller VM `controller up --cloud aws` (``gcp``) launched, the instance profile (service account) made
for its replicas.

On this machine both addresses are 127.0.0.1 (nothing listens beyond loopback). `sky-lite controller up`
writes ``host.json`` in a controller host's state directory: load balancers bind the host's interface and
endpoints show the address clients reach it at.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from skyserve_lite.errors import ControllerError, UsageError

HOST_FILE = "host.json"
_PROFILE_NAME = re.compile(r"[A-Za-z0-9_+=,.@-]{1,128}")  # IAM's instance profile names
# A service account's email: ID@PROJECT.iam.gserviceaccount.com, or a Google-made one (N-compute@developer...).
_ACCOUNT_EMAIL = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}@[a-z0-9][a-z0-9.-]{0,150}")


@dataclass(frozen=True)
class HostSettings:
    lb_host: str = "127.0.0.1"  # the address load balancers listen on
    endpoint_host: str = "127.0.0.1"  # the address endpoints show
    # The instance profile AWS replicas get when SKY_LITE_AWS_INSTANCE_PROFILE names none: on a controller
    # VM, the one made for its replicas, the only role the VM's own policy may pass.
    aws_instance_profile: str | None = None
    # Likewise the service account GCP replicas run as when SKY_LITE_GCP_SERVICE_ACCOUNT names none.
    gcp_service_account: str | None = None

    def __post_init__(self) -> None:
        for name in ("lb_host", "endpoint_host"):
            value = getattr(self, name)
            if not value or len(value) > 253 or any(c.isspace() or c in "/@[]" for c in value):
                raise UsageError(f"{name.replace('_', '-')}: {value!r} is not a host name or address")
        try:
            ipaddress.ip_address(self.lb_host)
        except ValueError:
            raise UsageError(f"lb-host: {self.lb_host!r} is not an IP address (0.0.0.0: every interface)") from None
        if self.aws_instance_profile is not None and not _PROFILE_NAME.fullmatch(self.aws_instance_profile):
            raise UsageError(f"aws-instance-profile: {self.aws_instance_profile!r} is not an instance profile name")
        if self.gcp_service_account is not None and not _ACCOUNT_EMAIL.fullmatch(self.gcp_service_account):
            raise UsageError(f"gcp-service-account: {self.gcp_service_account!r} is not a service account's email")


def load_host_settings(home: Path) -> HostSettings:
    """``home``'s host settings; the defaults when it has none. Raises ``ControllerError`` for a damaged file."""
    path = home / HOST_FILE
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return HostSettings()
    except (OSError, ValueError) as exc:
        raise ControllerError(f"cannot read {path}: {exc}; write it again with `sky-lite controller up`") from exc
    try:
        profile, account = document.get("aws_instance_profile"), document.get("gcp_service_account")
        return HostSettings(lb_host=str(document["lb_host"]), endpoint_host=str(document["endpoint_host"]),
                            aws_instance_profile=None if profile is None else str(profile),
                            gcp_service_account=None if account is None else str(account))
    except (KeyError, TypeError, AttributeError, UsageError) as exc:
        raise ControllerError(f"{path} is damaged ({exc}); write it again with `sky-lite controller up`") from exc


def write_host_settings(home: Path, settings: HostSettings) -> None:
    path = home / HOST_FILE
    temporary = path.with_name(HOST_FILE + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as stream:
        document = {"lb_host": settings.lb_host, "endpoint_host": settings.endpoint_host}
        if settings.aws_instance_profile is not None:
            document["aws_instance_profile"] = settings.aws_instance_profile
        if settings.gcp_service_account is not None:
            document["gcp_service_account"] = settings.gcp_service_account
        json.dump(document, stream)
    os.replace(temporary, path)
