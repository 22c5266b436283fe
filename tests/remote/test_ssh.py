"""Targets, ssh options, pinned host keys, the controller record and the wheel: the pure parts of reaching a host."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import subprocess
import zipfile
from pathlib import Path

import pytest

from skyserve_lite import __version__
from skyserve_lite.errors import ControllerError, UsageError
from skyserve_lite.remote.config import (
    ControllerRecord,
    choose_controller,
    known_hosts_path,
    load_record,
    record_path,
    remove_record,
    save_record,
)
from skyserve_lite.remote.ssh import (
    SshTarget,
    control_dir,
    fingerprint,
    is_loopback_address,
    known_hosts_text,
    parse_ssh_target,
    remote_env_command,
    ssh_options,
)
from skyserve_lite.remote.wheel import build_wheel, iter_package_files, package_digest
from tests.remote.sshd import make_key


@pytest.mark.parametrize(("text", "expected"), [
    ("ubuntu@203.0.113.5", SshTarget("203.0.113.5", 22, "ubuntu")),
    ("ubuntu@203.0.113.5:2222", SshTarget("203.0.113.5", 2222, "ubuntu")),
    ("controller.example.com", SshTarget("controller.example.com", 22, None)),
    ("ssh://ec2-user@10.0.0.4:22", SshTarget("10.0.0.4", 22, "ec2-user")),
    ("root@[::1]:2200", SshTarget("::1", 2200, "root")),
])
def test_targets_parse(text: str, expected: SshTarget) -> None:
    assert parse_ssh_target(text) == expected


@pytest.mark.parametrize(("host", "address", "ipv4_address", "this_machine"), [
    ("127.0.0.1", True, True, True),
    ("127.0.0.2", True, True, True),  # one of several controllers on one machine
    ("::1", True, False, True),
    ("localhost", False, False, True),  # a name, not an address: this machine all the same
    ("controller.example.com", False, False, False),
    ("10.0.0.1", False, False, False),
])
def test_loopback_hosts(host: str, address: bool, ipv4_address: bool, this_machine: bool) -> None:
    from skyserve_lite.remote import hosting

    assert is_loopback_address(host) is address
    assert is_loopback_address(host, ipv6=False) is ipv4_address
    assert SshTarget(host).is_loopback is this_machine
    assert hosting.is_loopback_address is is_loopback_address  # one definition, under both names


@pytest.mark.parametrize(("text", "message"), [
    ("-oProxyCommand=touch /tmp/x", "not a host name"),  # would be read as an ssh option
    ("-l@host", "not a valid user name"),
    ("user@host:0", "not a port number"),
    ("user@host:ssh", "not a port number"),
    ("user@host name", "not a host name"),
    ("us er@host", "not a valid user name"),
    ("user@", "not a host name"),
    ("user@host;reboot", "not a host name"),
])
def test_bad_targets_are_refused_naming_the_option(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=f"--ssh: .*{message}"):
        parse_ssh_target(text)


def test_options_check_the_pinned_key_strictly_and_share_the_connection(tmp_path: Path) -> None:
    target = SshTarget("203.0.113.5", 2222, "ubuntu", key_file=Path("/keys/id"))
    options = ssh_options(target, tmp_path / "known_hosts", tmp_path / "cm")
    pairs = dict(zip(options[::2], options[1::2], strict=True))
    joined = " ".join(options)
    assert "StrictHostKeyChecking=yes" in joined and "BatchMode=yes" in joined
    assert f"UserKnownHostsFile={tmp_path / 'known_hosts'}" in joined and "GlobalKnownHostsFile=/dev/null" in joined
    assert "ControlMaster=auto" in joined and f"ControlPath={tmp_path / 'cm'}/cm-%C" in joined
    assert "UpdateHostKeys=no" in joined  # the pinned file changes at `controller up` only, never behind the record
    assert "UpdateHostKeys" not in " ".join(ssh_options(target, None, None))  # your own known_hosts: your config
    assert pairs["-p"] == "2222" and pairs["-i"] == "/keys/id" and "-F" not in pairs  # ~/.ssh/config honoured


def test_remote_commands_are_quoted() -> None:
    command = remote_env_command({"SKY_LITE_HOME": "/srv/my home"}, ["/srv/my home/venv/bin/sky-lite", "x;y"])
    assert command == "SKY_LITE_HOME='/srv/my home' exec '/srv/my home/venv/bin/sky-lite' 'x;y'"


def test_control_sockets_move_to_a_private_short_folder_for_a_long_home(tmp_path: Path) -> None:
    short = control_dir(tmp_path / "h")
    assert short == tmp_path / "h" / "ssh" or str(short).startswith("/tmp/sky-lite-ssh-")
    long = control_dir(tmp_path / ("x" * 80))
    assert str(long) == f"/tmp/sky-lite-ssh-{os.getuid()}"
    assert stat.S_IMODE(long.stat().st_mode) == 0o700


def test_fingerprints_match_ssh_keygen(tmp_path: Path) -> None:
    key = make_key(tmp_path / "key")
    public = key.with_suffix(".pub").read_text().split()
    listed = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(key.with_suffix(".pub"))],
                            capture_output=True, text=True, check=True).stdout.split()[1]
    assert fingerprint(f"[127.0.0.1]:2222 {public[0]} {public[1]}") == listed


def _line(seed: str) -> str:
    blob = base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519" + hashlib.sha256(seed.encode()).digest()).decode()
    return f"[127.0.0.1]:2222 ssh-ed25519 {blob}"


TARGET = SshTarget("127.0.0.1", 2222)


def test_known_hosts_lines_name_the_host_as_ssh_looks_it_up() -> None:
    assert known_hosts_text(SshTarget("h.example", 22), [_line("a")]).startswith("h.example ssh-ed25519 ")
    assert known_hosts_text(TARGET, [_line("a")]).startswith("[127.0.0.1]:2222 ssh-ed25519 ")


RECORD = ControllerRecord(target=SshTarget("203.0.113.5", 22, "ubuntu", Path("/k/id")),
                          remote_home="/home/ubuntu/.sky-lite", host_keys=(_line("a"),),
                          fingerprint=fingerprint(_line("a")))


def test_the_record_round_trips_privately(tmp_path: Path) -> None:
    save_record(tmp_path, RECORD)
    assert load_record(tmp_path) == RECORD
    for path in (record_path(tmp_path), known_hosts_path(tmp_path)):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "ssh-ed25519" in known_hosts_path(tmp_path).read_text()
    remove_record(tmp_path)
    assert load_record(tmp_path) is None and not known_hosts_path(tmp_path).exists()


def test_a_damaged_record_is_named(tmp_path: Path) -> None:
    record_path(tmp_path).write_text(json.dumps({"target": {"host": "h"}}))
    with pytest.raises(ControllerError, match=r"controller\.json is damaged .*missing field 'remote_home'"):
        load_record(tmp_path)


@pytest.mark.parametrize(("setting", "recorded", "local", "host"), [
    ("", False, True, None),
    ("", True, False, "203.0.113.5"),
    ("local", True, True, None),
    ("ssh://ubuntu@203.0.113.5:22", True, False, "203.0.113.5"),
    ("ssh://admin@198.51.100.7:2222", True, False, "198.51.100.7"),  # not the recorded host: no record used
])
def test_which_controller(tmp_path: Path, setting: str, recorded: bool, local: bool, host: str | None) -> None:
    if recorded:
        save_record(tmp_path, RECORD)
    choice = choose_controller(tmp_path, {"SKY_LITE_CONTROLLER": setting} if setting else {})
    assert choice.is_local is local
    if host == "203.0.113.5":
        assert choice.record == RECORD
    if host == "198.51.100.7":
        assert choice.record is None and choice.target == SshTarget("198.51.100.7", 2222, "admin")


@pytest.mark.parametrize("setting", ["remote", "http://h", "ssh://-oProxyCommand=x"])
def test_a_bad_choice_names_the_setting(tmp_path: Path, setting: str) -> None:
    with pytest.raises(UsageError, match="SKY_LITE_CONTROLLER"):
        choose_controller(tmp_path, {"SKY_LITE_CONTROLLER": setting})


def test_the_wheel_holds_the_running_package(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    assert wheel.name == f"skyserve_lite-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert {name for name, _ in iter_package_files()} <= names
        assert not any("__pycache__" in name for name in names)
        info = f"skyserve_lite-{__version__}.dist-info"
        assert "sky-lite = skyserve_lite.cli.entry:main" in archive.read(f"{info}/entry_points.txt").decode()
        assert f"Version: {__version__}" in archive.read(f"{info}/METADATA").decode()
        for row in archive.read(f"{info}/RECORD").decode().splitlines():
            name, digest, _size = row.split(",")
            if digest:
                data = archive.read(name)
                assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(
                    b"=").decode()
    assert build_wheel(tmp_path).read_bytes() == wheel.read_bytes()  # the same files make the same wheel


def test_compiled_modules_stay_out_of_the_wheel_and_its_digest(tmp_path: Path) -> None:
    root = tmp_path / "skyserve_lite"
    (root / "lb").mkdir(parents=True)
    (root / "lb" / "proxy.py").write_text("x = 1\n")
    first = package_digest(root)
    (root / "lb" / "proxy.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    (root / "lb" / "proxy.cp311-win_amd64.pyd").write_bytes(b"MZ")
    assert [name for name, _ in iter_package_files(root)] == ["skyserve_lite/lb/proxy.py"]
    assert package_digest(root) == first


def test_the_package_digest_follows_the_files(tmp_path: Path) -> None:
    root = tmp_path / "skyserve_lite"
    root.mkdir()
    (root / "a.py").write_text("x = 1\n")
    first = package_digest(root)
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"compiled")
    assert package_digest.__wrapped__(root) == first
    (root / "a.py").write_text("x = 2\n")
    assert package_digest.__wrapped__(root) != first
