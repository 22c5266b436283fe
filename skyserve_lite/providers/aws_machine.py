"""A controller VM on EC2: what `sky-lite controller up --cloud aws` launches and `controller down` removes.

Everything goes through ``AwsProvider.call``, the replicas' own API path (one client per region, retries,
every vendor error translated once), and is named and tagged after the machine id recorded in the local
state directory (``sky-lite:controller-host``), so each step finds what an earlier, interrupted run made:

- an IAM role ``sky-lite-controller-<id>`` that EC2 may assume and an instance profile of the same name
  holding it: the controller's cloud access is the VM's own identity, never credentials copied from here;
- an IAM role and instance profile ``sky-lite-replica-<id>`` for the replicas that controller launches (they
  read their files from S3 with it), the only role the controller may pass;
- a key pair of the same name as the first from a public key made in the local state directory;
- a security group of that name in the region's default VPC that opens the load balancer port range to
  ``allow_cidr`` and SSH (22) to ``ssh_cidr``, and nothing else (a block an earlier run opened those ports
  to is revoked);
- one instance with all of that, ``RunInstances``' ``ClientToken`` derived from the machine id.

The roles get their permissions afterwards, from ``grant``, once the VM's controller has said its controller
id: the value of the ``sky-lite:controller`` tag on everything it launches, and the prefix of its buckets
(``staging.compute_bucket_prefix``). ``compute_controller_policy`` and ``compute_replica_policy`` are pure
functions of that ``AwsScope``, so the policy documents are values tests read statement by statement: instance
actions only on instances carrying the controller's tag, buckets only its own, ``iam:PassRole`` only for the
replicas' role. Each kind of resource is one small function of the scope in ``CONTROLLER_STATEMENTS`` (or
``REPLICA_STATEMENTS``); granting a new kind of resource adds a function there.

``delete`` takes everything away again in the reverse order, each step tolerating what is already gone.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from skyserve_lite.errors import ProviderError, TransientProviderError
from skyserve_lite.providers.aws import TAG_CONTROLLER, AwsPermanentError, AwsProvider
from skyserve_lite.providers.cloud_secrets import check_controller_id, compute_secret_prefix
from skyserve_lite.providers.machines import LaunchedMachine, MachineRequest, wait_until_running
from skyserve_lite.providers.staging import compute_bucket_prefix

TAG_HOST = "sky-lite:controller-host"
GLOBAL_REGION = "us-east-1"  # IAM is global; its client is made for this region
DEFAULT_INSTANCE_TYPE = "t3.small"
_TRUST_POLICY = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}
POLICY_NAME = "sky-lite-controller"
REPLICA_POLICY_NAME = "sky-lite-replica"
SSH_PORT = 22

Statement = dict[str, Any]
Rule = tuple[int, int, str]  # an ingress rule: from port, to port, IPv4 block


def controller_name(machine_id: str) -> str:
    """The name of the VM's role, instance profile, key pair and security group."""
    return f"sky-lite-controller-{machine_id}"


def replica_name(machine_id: str) -> str:
    """The name of the role and instance profile the VM's controller gives its replicas."""
    return f"sky-lite-replica-{machine_id}"


@dataclass(frozen=True)
class AwsScope:
    """What a controller VM's policies are about. ``partition`` and ``account`` come from its role's ARN."""

    partition: str  # "aws" ("aws-cn", "aws-us-gov")
    account: str
    controller_id: str  # of the VM's own state directory: its ``sky-lite:controller`` tag, its buckets' prefix
    replica_role: str  # the role its replicas get: the only one it may pass

    def __post_init__(self) -> None:
        # The id lands in resource ARNs, where "*" would grant every controller's buckets and secrets.
        check_controller_id(self.controller_id)

    def arn(self, service: str, resource: str, *, region: str = "*", account: str | None = None) -> str:
        return f"arn:{self.partition}:{service}:{region}:{self.account if account is None else account}:{resource}"

    @property
    def buckets(self) -> str:
        return f"arn:{self.partition}:s3:::{compute_bucket_prefix(self.controller_id)}*"


def _allow(sid: str, actions: Sequence[str], resources: Sequence[str],
           condition: dict[str, dict[str, Any]] | None = None) -> Statement:
    statement: Statement = {"Sid": sid, "Effect": "Allow", "Action": list(actions), "Resource": list(resources)}
    if condition is not None:
        statement["Condition"] = condition
    return statement


def _instance_statements(scope: AwsScope) -> list[Statement]:
    """EC2, for ``aws.AwsProvider``: launch instances that carry the controller's tag, and terminate or read
    only those; security groups likewise."""
    def ec2(resource: str, account: str | None = None) -> str:
        return scope.arn("ec2", resource, account=account)

    tagged = {"StringEquals": {f"aws:ResourceTag/{TAG_CONTROLLER}": scope.controller_id}}
    tagging = {"StringEquals": {f"aws:RequestTag/{TAG_CONTROLLER}": scope.controller_id}}
    return [
        # The Describe calls take no resource-level permission: "*" is the only resource they accept.
        _allow("Describe", ["ec2:DescribeInstances", "ec2:DescribeAvailabilityZones", "ec2:DescribeImages",
                            "ec2:DescribeVpcs", "ec2:DescribeSecurityGroups"], ["*"]),
        # RunInstances is authorized once per resource it touches: what it creates must carry the tag (its
        # TagSpecifications tag the instance and its volumes), what it only uses may be anybody's (a public AMI
        # has no account in its ARN).
        _allow("LaunchTagged", ["ec2:RunInstances"], [ec2("instance/*"), ec2("volume/*")], tagging),
        _allow("LaunchUsing", ["ec2:RunInstances"], [
            ec2("image/*", account=""), ec2("snapshot/*", account=""), ec2("subnet/*"), ec2("network-interface/*"),
            ec2("security-group/*"), ec2("key-pair/*"), ec2("spot-instances-request/*")]),
        # Tags only as part of the call that creates what they tag: nothing else can be retagged into reach.
        _allow("TagOnCreate", ["ec2:CreateTags"], [ec2("instance/*"), ec2("volume/*"), ec2("security-group/*")],
               {"StringEquals": {"ec2:CreateAction": ["RunInstances", "CreateSecurityGroup"]}}),
        _allow("ActOnTagged", ["ec2:TerminateInstances", "ec2:GetConsoleOutput"], [ec2("instance/*")], tagged),
        _allow("GroupCreate", ["ec2:CreateSecurityGroup"], [ec2("security-group/*")], tagging),
        _allow("GroupInVpc", ["ec2:CreateSecurityGroup"], [ec2("vpc/*")]),
        _allow("GroupIngress", ["ec2:AuthorizeSecurityGroupIngress"], [ec2("security-group/*")], tagged),
    ]


def _image_statements(scope: AwsScope) -> list[Statement]:
    """A task without ``image_id`` boots the AMI a public SSM parameter names (``aws._find_image``); public
    parameters have no account in their ARN."""
    return [_allow("PublicImages", ["ssm:GetParameter"], [scope.arn("ssm", "parameter/aws/service/*", account="")])]


def _bucket_statements(scope: AwsScope) -> list[Statement]:
    """S3, for ``staging.SnapshotStager``: its own buckets (one per service), created, listed once per start,
    written and deleted; it never reads an object back."""
    return [_allow("Buckets", ["s3:CreateBucket", "s3:ListBucket", "s3:DeleteBucket"], [scope.buckets]),
            _allow("Objects", ["s3:PutObject", "s3:DeleteObject"], [f"{scope.buckets}/*"])]


def _pass_role_statements(scope: AwsScope) -> list[Statement]:
    """Launching with an instance profile passes its role: only the replicas' role, only to EC2."""
    return [_allow("PassReplicaRole", ["iam:PassRole"], [scope.arn("iam", f"role/{scope.replica_role}", region="")],
                   {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}})]


def _secret_arns(scope: AwsScope) -> str:
    """Every secret the controller keeps for its tasks, in any region (``cloud_secrets.compute_secret_name``)."""
    return scope.arn("secretsmanager", f"secret:{compute_secret_prefix(scope.controller_id)}*")


def _secret_statements(scope: AwsScope) -> list[Statement]:
    """Secrets Manager, for ``aws._SecretsManager``: the controller's own secrets, created (with their tags),
    looked up and deleted; a value is never read back. ListSecrets takes no resource: "*" is all it accepts."""
    return [_allow("Secrets", ["secretsmanager:CreateSecret", "secretsmanager:DescribeSecret",
                               "secretsmanager:DeleteSecret", "secretsmanager:TagResource"], [_secret_arns(scope)]),
            _allow("ListSecrets", ["secretsmanager:ListSecrets"], ["*"])]


def _replica_secret_statements(scope: AwsScope) -> list[Statement]:
    """The boot script reads the task's secrets (`aws secretsmanager get-secret-value`, by ARN)."""
    return [_allow("ReadSecrets", ["secretsmanager:GetSecretValue"], [_secret_arns(scope)])]


def _replica_file_statements(scope: AwsScope) -> list[Statement]:
    """The boot script copies the snapshot's file list and blobs from the service's bucket (`aws s3 cp` of
    one key each: GetObject, never a listing)."""
    return [_allow("ReadSnapshots", ["s3:GetObject"], [f"{scope.buckets}/*"])]


StatementGroup = Callable[[AwsScope], list[Statement]]
CONTROLLER_STATEMENTS: tuple[StatementGroup, ...] = (
    _instance_statements, _image_statements, _bucket_statements, _pass_role_statements, _secret_statements)
REPLICA_STATEMENTS: tuple[StatementGroup, ...] = (_replica_file_statements, _replica_secret_statements)


def compute_controller_policy(scope: AwsScope) -> dict[str, Any]:
    """The inline policy of the VM's role: every statement of ``CONTROLLER_STATEMENTS``."""
    return {"Version": "2012-10-17", "Statement": [s for group in CONTROLLER_STATEMENTS for s in group(scope)]}


def compute_replica_policy(scope: AwsScope) -> dict[str, Any]:
    """The inline policy of the replicas' role: every statement of ``REPLICA_STATEMENTS``."""
    return {"Version": "2012-10-17", "Statement": [s for group in REPLICA_STATEMENTS for s in group(scope)]}


def parse_role_arn(arn: str) -> tuple[str, str]:
    """The partition and account of an IAM role ARN (``arn:aws:iam::123456789012:role/NAME``). Raises
    ``AwsPermanentError`` for anything else."""
    parts = arn.split(":")
    if len(parts) != 6 or parts[0] != "arn" or parts[2] != "iam" or not parts[4] or not parts[5].startswith("role/"):
        raise AwsPermanentError(f"IAM answered {arn!r} for a role's ARN", "UnexpectedArn")
    return parts[1], parts[4]


def plan_ingress(have: Collection[Rule], wanted: Collection[Rule]) -> tuple[list[Rule], list[Rule]]:
    """The rules to authorize and to revoke so the group holds ``wanted``: those missing, and those on a port
    range of ``wanted`` for another block (an earlier run's ``--ssh-cidr``, say). Rules on other ports are
    somebody else's and stay."""
    ranges = {(low, high) for low, high, _ in wanted}
    return (sorted(set(wanted) - set(have)),
            sorted(rule for rule in set(have) - set(wanted) if (rule[0], rule[1]) in ranges))


class AwsMachines:
    """Controller VMs; the constructor makes nothing (``AwsProvider``'s clients come on first use)."""

    def __init__(self, provider: AwsProvider, sleep: Callable[[float], None] = time.sleep) -> None:
        self._aws = provider
        self._sleep = sleep

    def ensure(self, request: MachineRequest) -> LaunchedMachine:
        """Make (or find) everything of the module docstring and the instance; the roles' permissions are
        ``grant``'s. Idempotent. Raises ``ProviderError``."""
        profile = self._ensure_identity(request.name, request.machine_id, "sky-lite controller VM")
        replicas = self._ensure_identity(replica_name(request.machine_id), request.machine_id,
                                         f"replicas of sky-lite controller VM {request.machine_id}")
        key_pair = self._ensure_key_pair(request)
        group = self._ensure_group(request)
        found = self.find(request.machine_id, request.region)
        resources = (("role", request.name), ("instance-profile", profile), ("replica-role", replicas),
                     ("replica-instance-profile", replicas), ("key-pair", key_pair), ("security-group", group))
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

    def grant(self, machine_id: str, location: str, controller_id: str) -> list[str]:
        """Put the policies of the VM's role and its replicas' role for ``controller_id``, the id of the VM's
        own state directory (``compute_controller_policy``, ``compute_replica_policy``); what was granted, one
        line each. Idempotent: each policy is replaced whole, so this also narrows an older VM's broader one.
        ``location`` is unused (IAM is global). Raises ``ProviderError``."""
        name, replicas = controller_name(machine_id), replica_name(machine_id)
        arn = str(self._aws.call("iam", GLOBAL_REGION, "get_role", RoleName=name)["Role"]["Arn"])
        partition, account = parse_role_arn(arn)
        scope = AwsScope(partition=partition, account=account, controller_id=controller_id, replica_role=replicas)
        for role, policy_name, policy in ((name, POLICY_NAME, compute_controller_policy(scope)),
                                          (replicas, REPLICA_POLICY_NAME, compute_replica_policy(scope))):
            self._aws.call("iam", GLOBAL_REGION, "put_role_policy", RoleName=role, PolicyName=policy_name,
                           PolicyDocument=json.dumps(policy))
        buckets = f"{compute_bucket_prefix(controller_id)}*"
        return [f"granted role {name} the instances and security groups tagged {TAG_CONTROLLER}={controller_id}, "
                f"the buckets {buckets} and passing role {replicas}",
                f"granted role {replicas} reading the objects of {buckets}"]

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
        name = controller_name(machine_id)
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
        return done + self._delete_identity(name) + self._delete_identity(replica_name(machine_id))

    # --- the pieces ------------------------------------------------------------------------------------
    def _ensure_identity(self, name: str, machine_id: str, description: str) -> str:
        """A role EC2 may assume and an instance profile holding it, both ``name``; no policy yet."""
        iam = GLOBAL_REGION
        self._ignore_existing(lambda: self._aws.call(
            "iam", iam, "create_role", RoleName=name, AssumeRolePolicyDocument=json.dumps(_TRUST_POLICY),
            Description=description, Tags=[{"Key": TAG_HOST, "Value": machine_id}]))
        self._ignore_existing(lambda: self._aws.call("iam", iam, "create_instance_profile", InstanceProfileName=name))
        profile = self._aws.call("iam", iam, "get_instance_profile", InstanceProfileName=name)["InstanceProfile"]
        if name not in {r["RoleName"] for r in profile.get("Roles", [])}:
            self._aws.call("iam", iam, "add_role_to_instance_profile", InstanceProfileName=name, RoleName=name)
        return name

    def _delete_identity(self, name: str) -> list[str]:
        """Delete the instance profile and role ``name``, the role's policies first (ours inline, and any the
        owner attached to it: the role goes, the managed policies themselves stay)."""
        iam = GLOBAL_REGION
        done = []
        self._ignore_missing(lambda: self._aws.call("iam", iam, "remove_role_from_instance_profile",
                                                    InstanceProfileName=name, RoleName=name))
        if self._ignore_missing(lambda: self._aws.call("iam", iam, "delete_instance_profile",
                                                       InstanceProfileName=name)):
            done.append(f"deleted instance profile {name}")
        try:
            inline = self._aws.call("iam", iam, "list_role_policies", RoleName=name).get("PolicyNames", [])
            attached = self._aws.call("iam", iam, "list_attached_role_policies",
                                      RoleName=name).get("AttachedPolicies", [])
        except AwsPermanentError as exc:
            if exc.code != "NoSuchEntity":
                raise
            return done
        for policy_name in inline:
            self._aws.call("iam", iam, "delete_role_policy", RoleName=name, PolicyName=policy_name)
        for policy in attached:
            self._aws.call("iam", iam, "detach_role_policy", RoleName=name, PolicyArn=policy["PolicyArn"])
        if self._ignore_missing(lambda: self._aws.call("iam", iam, "delete_role", RoleName=name)):
            done.append(f"deleted role {name}")
        return done

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
            have = {(int(p.get("FromPort", -1)), int(p.get("ToPort", -1)), str(r["CidrIp"]))
                    for p in found[0].get("IpPermissions", []) if p.get("IpProtocol") == "tcp"
                    for r in p.get("IpRanges", [])}
        else:
            group_id = str(self._aws.call(
                "ec2", region, "create_security_group", GroupName=request.name, VpcId=vpc_id,
                Description="sky-lite controller VM: load balancers and SSH",
                TagSpecifications=[{"ResourceType": "security-group", "Tags": [
                    {"Key": TAG_HOST, "Value": request.machine_id}]}])["GroupId"])
            have = set()
        low, high = request.lb_ports
        wanted = {(low, high, request.allow_cidr): "sky-lite load balancers",
                  (SSH_PORT, SSH_PORT, request.ssh_cidr): "ssh"}
        add, remove = plan_ingress(have, wanted)
        if add:
            self._aws.call("ec2", region, "authorize_security_group_ingress", GroupId=group_id, IpPermissions=[
                {"IpProtocol": "tcp", "FromPort": f, "ToPort": t, "IpRanges": [{"CidrIp": c, "Description": wanted[
                    (f, t, c)]}]} for f, t, c in add])
        if remove:
            self._aws.call("ec2", region, "revoke_security_group_ingress", GroupId=group_id, IpPermissions=[
                {"IpProtocol": "tcp", "FromPort": f, "ToPort": t, "IpRanges": [{"CidrIp": c}]} for f, t, c in remove])
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
