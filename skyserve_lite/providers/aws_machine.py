"""A controller VM on EC2: what `sky-lite controller up --cloud aws` launches and `controller down` removes.

Everything goes through ``AwsProvider.call``, the replicas' own API path (one client per region, retries,
every vendor error translated once), and is named and tagged after the machine id recorded in the local
state directory (``sky-lite:controller-host``), so each step finds what an earlier, interrupted run made:

- an IAM role ``sky-lite-controller-<id>`` that EC2 may assume, with an inline policy for what the
  controller does (EC2 instances, security groups and tags; S3 buckets of its snapshots; passing an instance
  profile to replicas), and an instance profile of the same name holding it: the controller's cloud access
  is the VM's own identity, never credentials copied from here;
- a key pair of the same name from a public key made in the local state directory;
- a security group of the same name in the region's default VPC that opens the load balancer port range to
  ``allow_cidr`` and SSH (22) to ``ssh_cidr``, and nothing else;
- one instance with all of that, ``RunInstances``' ``ClientToken`` derived from the machine id.

``delete`` takes them away again in the reverse order, each step tolerating what is already gone.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

from skyserve_lite.errors import ProviderError, TransientProviderError
from skyserve_lite.providers.aws import AwsPermanentError, AwsProvider
from skyserve_lite.providers.machines import LaunchedMachine, MachineRequest, wait_until_running

TAG_HOST = "sky-lite:controller-host"
GLOBAL_REGION = "us-east-1"  # IAM is global; its client is made for this region
DEFAULT_INSTANCE_TYPE = "t3.small"
_TRUST_POLICY = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}
_CONTROLLER_POLICY = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Resource": "*", "Action": [
        "ec2:RunInstances", "ec2:TerminateInstances", "ec2:CreateTags", "ec2:Describe*",
        "ec2:GetConsoleOutput", "ec2:CreateSecurityGroup", "ec2:AuthorizeSecurityGroupIngress"]},
    {"Effect": "Allow", "Resource": ["arn:aws:s3:::sky-lite-*", "arn:aws:s3:::sky-lite-*/*"], "Action": [
        "s3:CreateBucket", "s3:DeleteBucket", "s3:PutBucketTagging", "s3:PutPublicAccessBlock", "s3:ListBucket",
        "s3:PutObject", "s3:GetObject", "s3:DeleteObject"]},
    {"Effect": "Allow", "Resource": "*", "Action": "iam:PassRole",
     "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}}]}
POLICY_NAME = "sky-lite-controller"


class AwsMachines:
    """Controller VMs; the constructor makes nothing (``AwsProvider``'s clients come on first use)."""

    def __init__(self, provider: AwsProvider, sleep: Callable[[float], None] = time.sleep) -> None:
        self._aws = provider
        self._sleep = sleep

    def ensure(self, request: MachineRequest) -> LaunchedMachine:
        """Make (or find) everything of the module docstring and the instance. Idempotent. Raises
        ``ProviderError``."""
        profile = self._ensure_identity(request.name)
        key_pair = self._ensure_key_pair(request)
        group = self._ensure_group(request)
        found = self.find(request.machine_id, request.region)
        resources = (("role", request.name), ("instance-profile", profile), ("key-pair", key_pair),
                     ("security-group", group))
        if found is not None and found.state not in ("shutting-down", "terminated"):
            return LaunchedMachine(found.instance_id, found.region, found.state, found.public_ip, found.private_ip,
                                   resources)
        tags = [{"Key": "Name", "Value": request.name}, {"Key": TAG_HOST, "Value": request.machine_id}]
        params: dict[str, Any] = {
            "ImageId": request.image_id, "InstanceType": request.instance_type or DEFAULT_INSTANCE_TYPE,
            "MinCount": 1, "MaxCount": 1,
            "KeyName": key_pair, "SecurityGroupIds": [group], "IamInstanceProfile": {"Name": profile},
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}, {"ResourceType": "volume", "Tags": tags}],
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
            "ClientToken": hashlib.sha256(f"sky-lite-controller:{request.machine_id}".encode()).hexdigest()[:64],
        }
        if request.zone:
            params["Placement"] = {"AvailabilityZone": request.zone}
        # A new instance profile takes a few seconds to be usable by EC2 (IAM is eventually consistent).
        response = self._retry_while("InvalidParameterValue", lambda: self._aws.call(
            "ec2", request.region, "run_instances", **params))
        raw = response["Instances"][0]
        return _machine(raw, request.region, resources)

    def find(self, machine_id: str, region: str) -> LaunchedMachine | None:
        """The machine's newest instance that is not terminated, if any."""
        reservations = self._aws.call("ec2", region, "describe_instances", Filters=[
            {"Name": f"tag:{TAG_HOST}", "Values": [machine_id]}]).get("Reservations", [])
        raws = [i for r in reservations for i in r.get("Instances", [])
                if i.get("State", {}).get("Name") != "terminated"]
        if not raws:
            return None
        newest = max(raws, key=lambda i: str(i.get("LaunchTime", "")))
        return _machine(newest, region, ())

    def wait_running(self, machine_id: str, region: str, timeout_seconds: float = 600) -> LaunchedMachine:
        """Poll until the machine's instance runs (``machines.wait_until_running``)."""
        return wait_until_running(lambda: self.find(machine_id, region),
                                  f"the controller VM of {machine_id} in {region}", "running",
                                  ("shutting-down", "stopped", "stopping"), self._sleep, timeout_seconds)

    def delete(self, machine_id: str, region: str, timeout_seconds: float = 600, poll_seconds: float = 5) -> list[str]:
        """Terminate the machine's instances and delete what was made for them; what was deleted, one line
        each. Idempotent."""
        name = f"sky-lite-controller-{machine_id}"
        done: list[str] = []
        reservations = self._aws.call("ec2", region, "describe_instances", Filters=[
            {"Name": f"tag:{TAG_HOST}", "Values": [machine_id]}]).get("Reservations", [])
        live = [str(i["InstanceId"]) for r in reservations for i in r.get("Instances", [])
                if i.get("State", {}).get("Name") != "terminated"]
        if live:
            self._aws.call("ec2", region, "terminate_instances", InstanceIds=live)
            done += [f"terminated instance {i}" for i in live]
            deadline = time.monotonic() + timeout_seconds
            while any(m.state != "terminated" for m in self._all(machine_id, region)):
                if time.monotonic() >= deadline:
                    raise TransientProviderError(f"instances {', '.join(live)} are not terminated after "
                                                 f"{timeout_seconds:g}s; run `controller down` again")
                self._sleep(poll_seconds)
        for group in self._aws.call("ec2", region, "describe_security_groups", Filters=[
                {"Name": "group-name", "Values": [name]}]).get("SecurityGroups", []):
            group_id = str(group["GroupId"])

            def delete_group(group_id: str = group_id) -> dict[str, Any]:
                return self._aws.call("ec2", region, "delete_security_group", GroupId=group_id)

            # The terminated instance may hold the group for a little while longer.
            self._retry_while("DependencyViolation", delete_group)
            done.append(f"deleted security group {group_id}")
        # DeleteKeyPair succeeds for a missing key too: ask first, so the report says only what was there.
        if self._ignore_missing(lambda: self._aws.call("ec2", region, "describe_key_pairs", KeyNames=[name])):
            self._aws.call("ec2", region, "delete_key_pair", KeyName=name)
            done.append(f"deleted key pair {name}")
        iam = GLOBAL_REGION
        self._ignore_missing(lambda: self._aws.call("iam", iam, "remove_role_from_instance_profile",
                                                    InstanceProfileName=name, RoleName=name))
        if self._ignore_missing(lambda: self._aws.call("iam", iam, "delete_instance_profile",
                                                       InstanceProfileName=name)):
            done.append(f"deleted instance profile {name}")
        self._ignore_missing(lambda: self._aws.call("iam", iam, "delete_role_policy", RoleName=name,
                                                    PolicyName=POLICY_NAME))
        if self._ignore_missing(lambda: self._aws.call("iam", iam, "delete_role", RoleName=name)):
            done.append(f"deleted role {name}")
        return done

    # --- the pieces ------------------------------------------------------------------------------------
    def _ensure_identity(self, name: str) -> str:
        iam = GLOBAL_REGION
        self._ignore_existing(lambda: self._aws.call(
            "iam", iam, "create_role", RoleName=name, AssumeRolePolicyDocument=json.dumps(_TRUST_POLICY),
            Description="sky-lite controller VM", Tags=[{"Key": TAG_HOST, "Value": name}]))
        self._aws.call("iam", iam, "put_role_policy", RoleName=name, PolicyName=POLICY_NAME,
                       PolicyDocument=json.dumps(_CONTROLLER_POLICY))
        self._ignore_existing(lambda: self._aws.call("iam", iam, "create_instance_profile", InstanceProfileName=name))
        profile = self._aws.call("iam", iam, "get_instance_profile", InstanceProfileName=name)["InstanceProfile"]
        if name not in {r["RoleName"] for r in profile.get("Roles", [])}:
            self._aws.call("iam", iam, "add_role_to_instance_profile", InstanceProfileName=name, RoleName=name)
        return name

    def _ensure_key_pair(self, request: MachineRequest) -> str:
        self._ignore_existing(lambda: self._aws.call(
            "ec2", request.region, "import_key_pair", KeyName=request.name,
            PublicKeyMaterial=request.public_key.encode()))
        return request.name

    def _ensure_group(self, request: MachineRequest) -> str:
        region = request.region
        vpcs = self._aws.call("ec2", region, "describe_vpcs",
                              Filters=[{"Name": "isDefault", "Values": ["true"]}]).get("Vpcs", [])
        if not vpcs:
            raise AwsPermanentError(f"{region} has no default VPC to launch the controller VM into "
                                    "(aws ec2 create-default-vpc)", "NoDefaultVpc")
        vpc_id = str(vpcs[0]["VpcId"])
        filters = [{"Name": "group-name", "Values": [request.name]}, {"Name": "vpc-id", "Values": [vpc_id]}]
        found = self._aws.call("ec2", region, "describe_security_groups", Filters=filters).get("SecurityGroups", [])
        if found:
            group_id = str(found[0]["GroupId"])
            have = {(int(p.get("FromPort", -1)), int(p.get("ToPort", -1)), r["CidrIp"])
                    for p in found[0].get("IpPermissions", []) for r in p.get("IpRanges", [])}
        else:
            group_id = str(self._aws.call(
                "ec2", region, "create_security_group", GroupName=request.name, VpcId=vpc_id,
                Description="sky-lite controller VM: load balancers and SSH",
                TagSpecifications=[{"ResourceType": "security-group", "Tags": [
                    {"Key": TAG_HOST, "Value": request.machine_id}]}])["GroupId"])
            have = set()
        low, high = request.lb_ports
        wanted = {(low, high, request.allow_cidr): "sky-lite load balancers", (22, 22, request.ssh_cidr): "ssh"}
        missing = [{"IpProtocol": "tcp", "FromPort": f, "ToPort": t, "IpRanges": [{"CidrIp": c, "Description": d}]}
                   for (f, t, c), d in wanted.items() if (f, t, c) not in have]
        if missing:
            self._aws.call("ec2", region, "authorize_security_group_ingress", GroupId=group_id, IpPermissions=missing)
        return group_id

    def _all(self, machine_id: str, region: str) -> list[LaunchedMachine]:
        reservations = self._aws.call("ec2", region, "describe_instances", Filters=[
            {"Name": f"tag:{TAG_HOST}", "Values": [machine_id]}]).get("Reservations", [])
        return [_machine(i, region, ()) for r in reservations for i in r.get("Instances", [])]

    def _retry_while(self, code: str, call: Callable[[], dict[str, Any]], attempts: int = 12,
                     pause_seconds: float = 5) -> dict[str, Any]:
        for attempt in range(attempts):
            try:
                return call()
            except AwsPermanentError as exc:
                if exc.code != code or attempt == attempts - 1:
                    raise
                self._sleep(pause_seconds)
        raise AssertionError("unreachable")

    @staticmethod
    def _ignore_existing(call: Callable[[], object]) -> None:
        try:
            call()
        except AwsPermanentError as exc:
            if exc.code not in ("EntityAlreadyExists", "InvalidKeyPair.Duplicate"):
                raise

    @staticmethod
    def _ignore_missing(call: Callable[[], object]) -> bool:
        """Run ``call``; False when what it deletes was not there."""
        try:
            call()
            return True
        except ProviderError as exc:
            if getattr(exc, "code", "") in ("NoSuchEntity", "InvalidKeyPair.NotFound"):
                return False
            raise

    def host_keys(self, instance_id: str, location: str) -> tuple[str, ...]:
        """The instance's SSH host keys as its console output shows them (``host_keys_of``)."""
        return host_keys_of(self._aws, instance_id, location)


def _machine(raw: dict[str, Any], region: str, resources: tuple[tuple[str, str], ...]) -> LaunchedMachine:
    return LaunchedMachine(instance_id=str(raw["InstanceId"]), region=region,
                           state=str(raw.get("State", {}).get("Name", "pending")),
                           public_ip=raw.get("PublicIpAddress"), private_ip=raw.get("PrivateIpAddress"),
                           resources=resources)

# --- the VM's host keys, as the cloud saw them ------------------------------------------------------------
def host_keys_of(aws: AwsProvider, instance_id: str, region: str) -> tuple[str, ...]:
    """The instance's SSH host keys from its console output (``find_console_host_keys``); empty until the
    block is there. ``GetConsoleOutput`` with ``Latest`` (what the console shows now) where the instance
    type allows it (Nitro), else the output EC2 buffered after the last state change. Raises
    ``ProviderError``."""
    try:
        raw = aws.call("ec2", region, "get_console_output", InstanceId=instance_id, Latest=True)
    except AwsPermanentError as exc:
        if not exc.code.startswith(("Unsupported", "InvalidParameter")):
            raise
        raw = aws.call("ec2", region, "get_console_output", InstanceId=instance_id)
    return find_console_host_keys(_console_text(str(raw.get("Output") or "")))


_KEYS_BEGIN = "-----BEGIN SSH HOST KEY KEYS-----"
_KEYS_END = "-----END SSH HOST KEY KEYS-----"


def find_console_host_keys(console: str) -> tuple[str, ...]:
    """The host keys (``TYPE BASE64``, sorted) of the last complete ``BEGIN SSH HOST KEY KEYS`` block that
    cloud-init prints to the console at boot; empty when there is none yet (a block still being written has
    no END line). The last block: a console that saw several boots shows the keys of the latest. Within it,
    each line's ``TYPE BASE64`` pair is taken wherever it stands (a console may prefix timestamps); a blob
    that is not a key of its type is skipped, so the result holds nothing but keys. Pure."""
    from skyserve_lite.remote.ssh import parse_public_key

    lines = console.replace("\r", "").split("\n")
    ends = [i for i, line in enumerate(lines) if _KEYS_END in line]
    for end in reversed(ends):
        begins = [i for i in range(end) if _KEYS_BEGIN in lines[i]]
        if not begins:
            continue
        keys: set[str] = set()
        for line in lines[begins[-1] + 1:end]:
            tokens = line.split()
            for at in range(len(tokens) - 1):
                found = parse_public_key(tokens[at], tokens[at + 1])
                if found is not None:
                    keys.add(found)
        return tuple(sorted(keys))
    return ()


def _console_text(output: str) -> str:
    """``GetConsoleOutput``'s ``Output``: base64 on the wire; an SDK or emulator may hand it over decoded."""
    import base64
    import binascii

    try:
        return base64.b64decode(output, validate=True).decode(errors="replace")
    except (binascii.Error, ValueError):
        return output
