"""Host keys without a network: what counts as a key, where a VM's keys come from (its console output on EC2,
its guest attributes on GCE), and which keys `controller up` trusts for its first strict login."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, cast

import pytest

from skyserve_lite.errors import HostKeyError
from skyserve_lite.providers.aws import AwsPermanentError, AwsProvider
from skyserve_lite.providers.aws_machine import AwsMachines, find_console_host_keys
from skyserve_lite.remote.hosting import HOST_KEYS_POLL_SECONDS, Machines, wait_for_cloud_host_keys
from skyserve_lite.remote.ssh import (
    HostKeyPlan,
    SshTarget,
    fingerprint,
    host_lines,
    parse_public_key,
    pick_expected,
    plan_host_keys,
)

gcp_machine = pytest.importorskip("skyserve_lite.providers.gcp_machine")


def _blob(key_type: str, seed: str) -> str:
    """A key blob as OpenSSH encodes one: the type as a length-prefixed string, then the key's numbers."""
    name = key_type.encode()
    body = hashlib.sha256(seed.encode()).digest()
    return base64.b64encode(len(name).to_bytes(4, "big") + name + len(body).to_bytes(4, "big") + body).decode()


ED = f"ssh-ed25519 {_blob('ssh-ed25519', 'host')}"
ECDSA = f"ecdsa-sha2-nistp256 {_blob('ecdsa-sha2-nistp256', 'host')}"
RSA = f"ssh-rsa {_blob('ssh-rsa', 'host')}"
OTHER = f"ssh-ed25519 {_blob('ssh-ed25519', 'someone else')}"
TARGET = SshTarget("203.0.113.5", 22, "ubuntu")


def _pinned(*keys: str) -> list[str]:
    return [f"203.0.113.5 {key}" for key in keys]


@pytest.mark.parametrize(("key_type", "blob", "expected"), [
    ("ssh-ed25519", ED.split()[1], ED),
    ("ecdsa-sha2-nistp256", ECDSA.split()[1], ECDSA),
    ("ssh-rsa", ED.split()[1], None),  # the blob says it is an ed25519 key
    ("ssh-dss", _blob("ssh-dss", "x"), None),  # a type no pin holds
    ("ssh-ed25519", "not base64!", None),
    ("ssh-ed25519", base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519").decode(), None),  # no key after the type
    ("@cert-authority", ED.split()[1], None),
    ("ssh-ed25519", ED.split()[1] + "\n@revoked", None),
])
def test_a_public_key_is_its_type_and_a_blob_of_that_type(key_type: str, blob: str, expected: str | None) -> None:
    assert parse_public_key(key_type, blob) == expected


def _console(*lines: str) -> str:
    return "\n".join(lines) + "\n"


BOOT = "Linux version 6.8.0-1012-aws (buildd@lcy02-amd64-005) #13-Ubuntu SMP"
FINGERPRINTS = ("-----BEGIN SSH HOST KEY FINGERPRINTS-----", "256 SHA256:Y06C5pWq root@ip-172-31-5-9 (ECDSA)",
                "-----END SSH HOST KEY FINGERPRINTS-----")
BEGIN, END = "-----BEGIN SSH HOST KEY KEYS-----", "-----END SSH HOST KEY KEYS-----"


@pytest.mark.parametrize(("console", "expected"), [
    (_console(BOOT, *FINGERPRINTS, BEGIN, f"{ECDSA} root@ip-172-31-5-9", f"{ED} root@ip-172-31-5-9", END,
              "Cloud-init v. 24.1 finished"), (ECDSA, ED)),
    (_console(BEGIN, f"{ED} root@h", END).replace("\n", "\r\n"), (ED,)),  # a serial console's line ends
    (_console(BEGIN, f"[   25.123456] cloud-init[987]: {ED} root@h", END), (ED,)),  # a prefixed line
    (_console(BEGIN, f"{OTHER} root@h", END, "reboot", BEGIN, f"{ED} root@h", f"{RSA} root@h", END), (ED, RSA)),
    (_console(BEGIN, f"{ED} root@h"), ()),  # still being written: no END yet
    (_console(BOOT, *FINGERPRINTS), ()),  # no keys block (moto's console has none either)
    ("", ()),
    (_console(f"{OTHER} root@h", BEGIN, f"{ED} root@h", END, f"{RSA} root@h"), (ED,)),  # keys outside the block
    (_console(BEGIN, f"ssh-rsa {ED.split()[1]} root@h", f"{ED} root@h", END), (ED,)),  # a blob of another type
    (_console(BEGIN, "ssh-ed25519 AAAA root@h", f"{RSA} x", END), (RSA,)),  # a cut-off blob
    (_console(BEGIN, END), ()),
    (_console(BEGIN, f"{ED} root@h", END, BEGIN, f"{RSA} root@h"), (ED,)),  # the last complete block
])
def test_the_console_keys_block(console: str, expected: tuple[str, ...]) -> None:
    assert find_console_host_keys(console) == tuple(sorted(expected))


@pytest.mark.parametrize(("items", "expected"), [
    ([{"namespace": "hostkeys", "key": "ssh-ed25519", "value": ED.split()[1]},
      {"namespace": "hostkeys", "key": "ssh-rsa", "value": RSA.split()[1]}], (ED, RSA)),
    ([{"namespace": "guestInventory", "key": "ssh-ed25519", "value": ED.split()[1]}], ()),
    ([{"namespace": "hostkeys", "key": "ssh-rsa", "value": RSA.split()[1] + "\ncompute.1234 ssh-rsa AAAA"}], (RSA,)),
    ([{"namespace": "hostkeys", "key": "ssh-rsa", "value": ED.split()[1]}], ()),  # the blob of another type
    ([{"namespace": "hostkeys", "key": "ssh-ed25519", "value": ""}], ()),
    ([{"namespace": "hostkeys", "key": "ssh-dss", "value": _blob("ssh-dss", "x")}], ()),
    ([], ()),
])
def test_the_guest_attribute_keys(items: list[dict[str, str]], expected: tuple[str, ...]) -> None:
    assert gcp_machine.find_guest_attribute_host_keys(items) == tuple(sorted(expected))


@pytest.mark.parametrize(("pinned", "cloud", "expected", "plan"), [
    # A VM sky-lite launched: the cloud's word, whatever was pinned or a scan would say.
    ((), (ED, RSA), None, HostKeyPlan(trust=tuple(_pinned(ED, RSA)), source="the keys the cloud reports")),
    (_pinned(OTHER), (ED,), None, HostKeyPlan(trust=tuple(_pinned(ED)), source="the keys the cloud reports")),
    ((), (ED, RSA), fingerprint(f"h {RSA}"), HostKeyPlan(trust=tuple(_pinned(ED, RSA)),
                                                         source="the keys the cloud reports")),
    # The key the user named: picked out of a scan, nothing else of it.
    (_pinned(ED), None, fingerprint(f"h {OTHER}"),
     HostKeyPlan(scan_for=fingerprint(f"h {OTHER}"), source=f"the key you named ({fingerprint(f'h {OTHER}')})")),
    ((), (), fingerprint(f"h {ED}"),
     HostKeyPlan(scan_for=fingerprint(f"h {ED}"), source=f"the key you named ({fingerprint(f'h {ED}')})")),
    # A rerun: only the pinned keys.
    (_pinned(ED, RSA), None, None, HostKeyPlan(trust=tuple(_pinned(ED, RSA)), source="the pinned keys")),
    (_pinned(ED), (), None, HostKeyPlan(trust=tuple(_pinned(ED)), source="the pinned keys")),  # console rotated
    # First contact with an --ssh host: what it presents on the one login.
    ((), None, None, HostKeyPlan(first_use=True, source="the key it presented a moment before")),
])
def test_where_the_trust_comes_from(pinned: Sequence[str], cloud: Sequence[str] | None, expected: str | None,
                                    plan: HostKeyPlan) -> None:
    assert plan_host_keys(TARGET, pinned=pinned, cloud=cloud, expected=expected) == plan


@pytest.mark.parametrize(("pinned", "cloud", "expected", "message"), [
    ((), (ED,), fingerprint(f"h {OTHER}"), "the cloud reports the host keys .* not the expected"),
    ((), (), None, "the cloud has not reported the SSH host keys .*--host-key-fingerprint"),  # no first use
])
def test_trust_refused(pinned: Sequence[str], cloud: Sequence[str] | None, expected: str | None,
                       message: str) -> None:
    with pytest.raises(HostKeyError, match=message):
        plan_host_keys(TARGET, pinned=pinned, cloud=cloud, expected=expected)


def test_only_the_named_key_is_picked_out_of_a_scan() -> None:
    scanned = [f"203.0.113.5 {ED}", f"203.0.113.5 {ECDSA}", f"203.0.113.5 {RSA}"]
    assert pick_expected(scanned, fingerprint(scanned[1]), TARGET) == _pinned(ECDSA)
    with pytest.raises(HostKeyError, match="not the expected"):
        pick_expected(scanned, fingerprint(f"h {OTHER}"), TARGET)


def test_host_lines_name_the_target_and_hold_only_keys() -> None:
    port = SshTarget("127.0.0.2", 2222)
    assert host_lines(port, [ED, f"elsewhere {RSA} comment", ED]) == sorted(
        [f"[127.0.0.2]:2222 {ED}", f"[127.0.0.2]:2222 {RSA}"])
    with pytest.raises(ValueError, match="not a public host key"):
        host_lines(port, ["@cert-authority * ssh-rsa AAAA"])


# --- the clouds' calls, with fakes -----------------------------------------------------------------------
class FakeEc2:
    """``AwsProvider.call`` for GetConsoleOutput: the console text (base64 on the wire), recording calls."""

    def __init__(self, console: str, *, latest_supported: bool = True, encode: bool = True) -> None:
        self.console, self.latest_supported, self.encode = console, latest_supported, encode
        self.calls: list[dict[str, Any]] = []

    def call(self, service: str, region: str, method: str, **params: Any) -> dict[str, Any]:
        assert (service, method) == ("ec2", "get_console_output")
        self.calls.append({"region": region, **params})
        if params.get("Latest") and not self.latest_supported:
            raise AwsPermanentError("This instance type does not support retrieving the latest console output",
                                    "UnsupportedOperation")
        text = base64.b64encode(self.console.encode()).decode() if self.encode else self.console
        return {"InstanceId": params["InstanceId"], "Output": text}


@pytest.mark.parametrize(("latest_supported", "encode", "calls"), [
    (True, True, [{"region": "us-east-1", "InstanceId": "i-0abc", "Latest": True}]),
    (False, True, [{"region": "us-east-1", "InstanceId": "i-0abc", "Latest": True},
                   {"region": "us-east-1", "InstanceId": "i-0abc"}]),  # an instance type before Nitro
    (True, False, [{"region": "us-east-1", "InstanceId": "i-0abc", "Latest": True}]),  # handed over decoded
])
def test_aws_reads_the_keys_from_the_console_output(latest_supported: bool, encode: bool,
                                                    calls: list[dict[str, Any]]) -> None:
    ec2 = FakeEc2(_console(BOOT, BEGIN, f"{ED} root@h", f"{RSA} root@h", END), latest_supported=latest_supported,
                  encode=encode)
    machines = AwsMachines(cast(AwsProvider, ec2))
    assert machines.host_keys("i-0abc", "us-east-1") == (ED, RSA)
    assert ec2.calls == calls


def test_another_console_error_is_not_swallowed() -> None:
    class Denied(FakeEc2):
        def call(self, service: str, region: str, method: str, **params: Any) -> dict[str, Any]:
            raise AwsPermanentError("not authorized to perform ec2:GetConsoleOutput", "UnauthorizedOperation")

    with pytest.raises(AwsPermanentError, match="GetConsoleOutput"):
        AwsMachines(cast(AwsProvider, Denied(""))).host_keys("i-0abc", "us-east-1")


class FakeGce:
    """``GcpProvider._call`` for instances.getGuestAttributes, recording each request."""

    def __init__(self, items: list[dict[str, str]] | None) -> None:
        self.items = items  # None: nothing published under hostkeys/ (the API answers 404)
        self.requests: list[Mapping[str, Any]] = []

    def _get_project(self) -> str:
        return "p"

    def _call(self, kind: str, method: str, **params: Any) -> dict[str, Any]:
        assert (kind, method) == ("instances", "get_guest_attributes")
        self.requests.append(params["request"])
        if self.items is None:
            raise gcp_machine.GcpPermanentError("The resource 'hostkeys/' of type 'Guest Attribute' was not found.",
                                                "notFound")
        return {"queryPath": "hostkeys/", "queryValue": {"items": self.items}}


@pytest.mark.parametrize(("items", "expected"), [
    ([{"namespace": "hostkeys", "key": "ssh-ed25519", "value": ED.split()[1]}], (ED,)),
    (None, ()),
])
def test_gcp_reads_the_keys_from_the_guest_attributes(items: list[dict[str, str]] | None,
                                                      expected: tuple[str, ...]) -> None:
    gce = FakeGce(items)
    assert gcp_machine.GcpMachines(gce).host_keys("us-central1-a/sky-lite-controller-ab12", "us-central1-a") == expected
    assert gce.requests == [{"project": "p", "zone": "us-central1-a", "instance": "sky-lite-controller-ab12",
                             "query_path": "hostkeys/"}]


def test_a_gcp_vm_is_launched_with_guest_attributes_on() -> None:
    assert {"key": "enable-guest-attributes", "value": "TRUE"} in gcp_machine.HOST_KEY_METADATA


class SlowCloud:
    """Machines whose cloud reports the host keys only from the ``ready_after``-th question on."""

    def __init__(self, ready_after: int) -> None:
        self.ready_after = ready_after
        self.asked: list[tuple[str, str]] = []

    def host_keys(self, instance_id: str, location: str) -> tuple[str, ...]:
        self.asked.append((instance_id, location))
        return (ED,) if len(self.asked) >= self.ready_after else ()


@pytest.mark.parametrize(("ready_after", "timeout", "keys", "asked"), [
    (3, 600.0, (ED,), 3),  # the console shows them on the third look
    (1, 0.0, (ED,), 1),
    (3, 0.0, (), 1),  # keys pinned for this instance: asked once, the pin is checked instead
    (1000, 25.0, (), 4),  # never: asked at 0, 10, 20 and at 30 s, past the deadline
])
def test_the_cloud_is_asked_until_it_reports_keys(ready_after: int, timeout: float, keys: tuple[str, ...],
                                                  asked: int) -> None:
    cloud = SlowCloud(ready_after)
    clock = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    found = wait_for_cloud_host_keys(cast(Machines, cloud), "i-0abc", "us-east-1", timeout_seconds=timeout,
                                     sleep=sleep, now=lambda: clock[0])
    assert found == keys and len(cloud.asked) == asked and set(cloud.asked) == {("i-0abc", "us-east-1")}
    assert slept == [HOST_KEYS_POLL_SECONDS] * (asked - 1)
