"""`controller up` scopes a controller VM's permissions to the controller id the VM says, which it must not
trust blindly: the id must be a store's, and the first one a VM says is pinned in the local record, so a VM
that says another (or a pattern such as ``*``) at a later `controller up` is refused and granted nothing.

A fake ``Machines`` records the grants; the record is the real ``controller.json`` in a temporary home."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from skyserve_lite.errors import ControllerError
from skyserve_lite.providers.machines import LaunchedMachine, MachineRequest
from skyserve_lite.remote import config
from skyserve_lite.remote.config import CloudMachine, ControllerRecord
from skyserve_lite.remote.hosting import apply_grant, find_controller_id, find_pinned_controller_id
from skyserve_lite.remote.ssh import SshTarget

ID = "0123456789ab"
OTHER_ID = "ba9876543210"
VM = CloudMachine(cloud="aws", region="eu-west-1", instance_id="i-0abc", machine_id="m1", address="203.0.113.5")
RECORD = ControllerRecord(target=SshTarget("203.0.113.5", 22, "ubuntu"), remote_home="/home/ubuntu/.sky-lite",
                          host_keys=("203.0.113.5 ssh-ed25519 AAAA",), fingerprint="SHA256:x", machine=VM)


class RecordingMachines:
    """A cloud's controller VMs that only record what they were asked to grant."""

    def __init__(self) -> None:
        self.grants: list[tuple[str, str, str]] = []

    def grant(self, machine_id: str, location: str, controller_id: str) -> list[str]:
        self.grants.append((machine_id, location, controller_id))
        return [f"granted {controller_id}"]

    def ensure(self, request: MachineRequest) -> LaunchedMachine:
        raise AssertionError("not called")

    def wait_running(self, machine_id: str, location: str) -> LaunchedMachine:
        raise AssertionError("not called")

    def delete(self, machine_id: str, location: str) -> list[str]:
        raise AssertionError("not called")

    def host_keys(self, instance_id: str, location: str) -> tuple[str, ...]:
        raise AssertionError("not called")


def test_the_first_id_a_vm_says_is_pinned_before_its_grant(tmp_path: Path) -> None:
    config.save_record(tmp_path, RECORD)
    machines, said = RecordingMachines(), list[str]()

    record = apply_grant(tmp_path, RECORD, ID, machines, said.append)

    assert record.controller_id == ID
    assert config.load_record(tmp_path) == record
    assert machines.grants == [("m1", "eu-west-1", ID)]
    assert said[-1] == f"granted {ID}" and any(f"pinned controller id {ID}" in line for line in said)


def test_the_same_id_again_is_granted_again_and_the_record_is_unchanged(tmp_path: Path) -> None:
    pinned = dataclasses.replace(RECORD, controller_id=ID)
    config.save_record(tmp_path, pinned)
    before = config.record_path(tmp_path).read_bytes()
    machines = RecordingMachines()

    assert apply_grant(tmp_path, pinned, ID, machines, lambda _line: None) == pinned
    assert machines.grants == [("m1", "eu-west-1", ID)]  # idempotent: a narrowed policy is put again
    assert config.record_path(tmp_path).read_bytes() == before


@pytest.mark.parametrize(("pinned", "reported", "problem"), [
    pytest.param(ID, OTHER_ID, f"says its controller id is {OTHER_ID}, but {ID} was pinned", id="changed"),
    pytest.param(ID, "*", "says its controller id is '*', which is not one a sky-lite store makes", id="star"),
    pytest.param("", "*", "says its controller id is '*', which is not one a sky-lite store makes",
                 id="star-at-the-first-up"),
    pytest.param("", "0123456789a?", "which is not one a sky-lite store makes", id="pattern"),
    pytest.param("", None, "did not say its controller id", id="none"),
])
def test_a_vm_saying_another_id_or_no_id_is_refused_and_granted_nothing(
        tmp_path: Path, pinned: str, reported: str | None, problem: str) -> None:
    record = dataclasses.replace(RECORD, controller_id=pinned)
    config.save_record(tmp_path, record)
    before = config.record_path(tmp_path).read_bytes()
    machines = RecordingMachines()

    with pytest.raises(ControllerError, match=re.escape("the controller on ssh://ubuntu@203.0.113.5:22 ")) as caught:
        apply_grant(tmp_path, record, reported, machines, lambda _line: None)

    assert problem in str(caught.value)
    assert machines.grants == []
    assert config.record_path(tmp_path).read_bytes() == before  # the pin stays what it was


def test_the_refusal_says_what_happened_and_what_to_do() -> None:
    with pytest.raises(ControllerError) as caught:
        find_controller_id(dataclasses.replace(RECORD, controller_id=ID), OTHER_ID)
    assert str(caught.value) == (
        f"the controller on ssh://ubuntu@203.0.113.5:22 says its controller id is {OTHER_ID}, but {ID} was pinned "
        "when this VM was first set up; nothing was granted: its state directory was replaced, or the VM is "
        "compromised. If you replaced it, `sky-lite controller down` and `controller up` make a new VM")


@pytest.mark.parametrize(("previous", "machine", "pinned"), [
    pytest.param(dataclasses.replace(RECORD, controller_id=ID), VM, ID, id="same-instance-keeps-its-pin"),
    pytest.param(dataclasses.replace(RECORD, controller_id=ID, target=SshTarget("198.51.100.9", 22, "ubuntu")),
                 dataclasses.replace(VM, address="198.51.100.9"), ID, id="same-instance-new-address"),
    pytest.param(dataclasses.replace(RECORD, controller_id=ID), dataclasses.replace(VM, instance_id="i-0def"), "",
                 id="a-new-instance-pins-anew"),
    pytest.param(dataclasses.replace(RECORD, controller_id=ID), dataclasses.replace(VM, cloud="gcp"), "",
                 id="another-cloud"),
    pytest.param(RECORD, VM, "", id="recorded-before-pins-existed"),
    pytest.param(None, VM, "", id="first-up"),
    pytest.param(dataclasses.replace(RECORD, controller_id=ID), None, "", id="ssh-host"),
])
def test_which_pin_a_controller_up_keeps(previous: ControllerRecord | None, machine: CloudMachine | None,
                                         pinned: str) -> None:
    assert find_pinned_controller_id(previous, machine) == pinned


def test_a_record_written_before_pins_existed_loads_with_none(tmp_path: Path) -> None:
    config.save_record(tmp_path, RECORD)
    text = config.record_path(tmp_path).read_text()
    config.record_path(tmp_path).write_text(text.replace('  "controller_id": "",\n', "").replace(
        ',\n  "controller_id": ""\n', "\n"))
    assert "controller_id" not in config.record_path(tmp_path).read_text()
    loaded = config.load_record(tmp_path)
    assert loaded is not None and loaded.controller_id == ""
