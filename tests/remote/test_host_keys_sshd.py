"""Pinning host keys against real OpenSSH servers on the loopback, with a man in the middle.

The controller host is an sshd on 127.0.0.1 with an ed25519 and an RSA key; clients reach it through a
relay on 127.0.0.2 that stands for the network between. The relay is the man in the middle: it can pass a
connection through untouched, or hand it to its own sshd, which has an ECDSA key of its own (the key type
the host lacks) and knows no key of the host. Like a real one it chooses per connection after reading the
client's first key exchange message, so it answers `ssh-keyscan -t ecdsa` itself and lets everything else
through: a scan then shows the host's keys plus the intruder's, which is what a pin trusting a scan
would take in."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from skyserve_lite.errors import HostKeyError
from skyserve_lite.remote.hosting import establish_host_keys
from skyserve_lite.remote.ssh import SshTarget, fingerprint, host_lines, scan_host_keys
from tests.remote.sshd import SSHD, make_key

pytestmark = pytest.mark.skipif(SSHD is None, reason="needs OpenSSH's sshd (.ci/run installs it)")

Route = Callable[[list[str]], str]  # the client's host key algorithms -> "host" or "intruder"


@dataclass
class Daemon:
    """One ``sshd -D`` on 127.0.0.1 with host keys of the given types."""

    folder: Path
    port: int
    public_keys: list[str]  # "TYPE BASE64"
    process: subprocess.Popen[bytes]


def _start_sshd(folder: Path, key_types: tuple[str, ...], authorized: Path) -> Daemon:
    folder.mkdir(parents=True)
    keys = []
    for key_type in key_types:
        path = folder / f"host_{key_type}"
        subprocess.run(["ssh-keygen", "-q", "-t", key_type, "-N", "", "-f", str(path)], check=True,
                       capture_output=True)
        keys.append(" ".join(path.with_suffix(".pub").read_text().split()[:2]))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (folder / "sshd_config").write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", *(f"HostKey {folder / f'host_{t}'}" for t in key_types),
        f"PidFile {folder / 'sshd.pid'}", f"AuthorizedKeysFile {authorized}", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no", "PermitRootLogin prohibit-password",
        "LogLevel ERROR", ""]))
    if os.getuid() == 0:
        os.makedirs("/run/sshd", exist_ok=True)  # its privilege separation directory
    assert SSHD is not None
    process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(folder / "sshd_config")], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=(folder / "sshd.log").open("wb"))
    for _ in range(200):
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return Daemon(folder, port, keys, process)
        if process.poll() is not None:
            break
        time.sleep(0.05)
    process.kill()
    raise AssertionError(f"sshd did not start: {(folder / 'sshd.log').read_text()}")


@dataclass
class Relay:
    """A TCP relay on 127.0.0.2 to the host's sshd or the intruder's, chosen per connection by ``route``."""

    host: Daemon
    intruder: Daemon
    route: Route
    listener: socket.socket = field(default_factory=socket.socket)
    routed: list[str] = field(default_factory=list)

    def start(self) -> int:
        self.listener.bind(("127.0.0.2", 0))
        self.listener.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()
        return int(self.listener.getsockname()[1])

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        """Both servers are the same sshd binary, so they greet with the same line: the relay greets the
        client with the host's, reads the client's greeting and key exchange offer, then hands both to the
        server it chose and relays the rest untouched."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(client)
            upstream = stack.enter_context(socket.create_connection(("127.0.0.1", self.host.port)))
            greeting = _read_line(upstream)
            client.sendall(greeting)
            offer = _read_line(client) + _read_packet(client)
            chosen = self.route(_host_key_algorithms(offer))
            self.routed.append(chosen)
            if chosen == "intruder":
                upstream = stack.enter_context(socket.create_connection(("127.0.0.1", self.intruder.port)))
                assert _read_line(upstream) == greeting
            upstream.sendall(offer)
            back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
            back.start()
            _pump(client, upstream)
            back.join(timeout=30)


def _read_line(sock: socket.socket) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        byte = sock.recv(1)
        if not byte:
            raise ConnectionError("closed before a whole line")
        line += byte
    return line


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed mid-packet")
        data += chunk
    return data


def _read_packet(sock: socket.socket) -> bytes:
    head = _read_exactly(sock, 4)
    return head + _read_exactly(sock, int.from_bytes(head, "big"))


def _host_key_algorithms(offer: bytes) -> list[str]:
    """The server host key algorithms of an SSH_MSG_KEXINIT (RFC 4253 7.1) after the greeting line:
    length, padding length, message 20, a 16-byte cookie, the kex algorithms, then these."""
    packet = offer[offer.index(b"\n") + 1:]
    payload = packet[5:]
    assert payload[0] == 20, "not a KEXINIT"
    at = 17
    for _ in range(2):
        size = int.from_bytes(payload[at:at + 4], "big")
        names, at = payload[at + 4:at + 4 + size], at + 4 + size
    return names.decode().split(",")


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def only_ecdsa_to_the_intruder(algorithms: list[str]) -> str:
    """A scan of ECDSA keys (all `ssh-keyscan -t ecdsa` asks for) is answered by the intruder."""
    return "intruder" if all(a.startswith("ecdsa-sha2-") for a in algorithms) else "host"


@dataclass
class World:
    host: Daemon
    intruder: Daemon
    relay: Relay
    target: SshTarget

    def host_lines(self, daemon: Daemon | None = None) -> list[str]:
        return host_lines(self.target, (daemon or self.host).public_keys)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    client_key = make_key(tmp_path / "client_key")
    authorized = tmp_path / "authorized_keys"
    authorized.write_text(client_key.with_suffix(".pub").read_text())
    host = _start_sshd(tmp_path / "host", ("ed25519", "rsa"), authorized)
    intruder = _start_sshd(tmp_path / "intruder", ("ecdsa",), authorized)
    relay = Relay(host, intruder, only_ecdsa_to_the_intruder)
    try:
        port = relay.start()
        user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
        yield World(host, intruder, relay, SshTarget("127.0.0.2", port, user, client_key))
    finally:
        relay.stop()
        for daemon in (host, intruder):
            daemon.process.kill()
            daemon.process.wait(timeout=10)


def _pin(world: World, home: Path, *, pinned: list[str] | None = None, cloud: list[str] | None = None,
         expected: str | None = None) -> list[str]:
    said: list[str] = []
    keys = establish_host_keys(home, world.target, pinned=pinned or [], cloud=cloud, expected=expected,
                               say=said.append)
    assert len(said) == 1 and said[0].startswith("checking the host key against ")
    return keys


def test_a_scan_through_the_man_in_the_middle_holds_his_key(world: World) -> None:
    scanned = scan_host_keys(world.target)
    assert {fingerprint(line) for line in scanned} == {
        fingerprint(line) for line in world.host_lines() + world.host_lines(world.intruder)}
    assert "intruder" in world.relay.routed and "host" in world.relay.routed


def test_a_rerun_pins_only_the_keys_the_host_proves(world: World, tmp_path: Path) -> None:
    (ed25519,) = [line for line in world.host_lines() if " ssh-ed25519 " in line]
    keys = _pin(world, tmp_path / "home", pinned=[ed25519])
    # The RSA key is learned (the host signed for it on the connection its pinned key authenticated); the
    # intruder's ECDSA key, which a scan shows beside them, is not.
    assert keys == world.host_lines()
    assert not set(keys) & set(world.host_lines(world.intruder))
    assert not any(p.name.startswith("host-keys-") for p in (tmp_path / "home" / "ssh").iterdir())


def test_first_contact_pins_the_hosts_own_keys(world: World, tmp_path: Path) -> None:
    assert _pin(world, tmp_path / "home") == world.host_lines()


def test_a_named_key_is_the_only_one_taken_from_a_scan(world: World, tmp_path: Path) -> None:
    rsa = next(line for line in world.host_lines() if " ssh-rsa " in line)
    assert _pin(world, tmp_path / "home", expected=fingerprint(rsa)) == world.host_lines()
    # A key the intruder answered a scan with is refused even when named: the host cannot prove it.
    intruders = world.host_lines(world.intruder)[0]
    with pytest.raises(HostKeyError, match="changed: the host presents none of the key you named"):
        _pin(world, tmp_path / "home", expected=fingerprint(intruders))


def test_the_clouds_keys_decide(world: World, tmp_path: Path) -> None:
    ed25519 = next(key for key in world.host.public_keys if key.startswith("ssh-ed25519 "))
    assert _pin(world, tmp_path / "home", cloud=[ed25519]) == world.host_lines()
    with pytest.raises(HostKeyError, match="none of the keys the cloud reports"):
        _pin(world, tmp_path / "home", pinned=world.host_lines(), cloud=world.intruder.public_keys)


def test_a_man_in_the_middle_of_every_connection_is_refused(world: World, tmp_path: Path) -> None:
    world.relay.route = lambda _algorithms: "intruder"
    with pytest.raises(HostKeyError, match=r"host key of ssh://\S+@127\.0\.0\.2:\d+ changed: .*none of the pinned"):
        _pin(world, tmp_path / "home", pinned=world.host_lines())
    assert set(world.relay.routed) == {"intruder"}
