"""`controller up --cloud` never opens SSH by default: who may reach sshd is given (`--ssh-cidr`, or an
`--allow-cidr` written out), the whole Internet only when written out and then with a warning. Every run here
stops before any cloud is called (no `--image-id`, or a usage error first)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from skyserve_lite.cli.host_commands import choose_ssh_cidr
from skyserve_lite.cli.main import main
from skyserve_lite.errors import UsageError

pytest.importorskip("boto3")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SKY_LITE_HOME", str(tmp_path / "home"))
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "home"


def up(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["controller", "up", *args])
    return result.exit_code, result.stdout, result.stderr


def test_without_a_block_for_ssh_it_is_a_usage_error_and_nothing_is_made(home: Path) -> None:
    code, out, err = up("--cloud", "aws", "--region", "us-east-1", "--image-id", "ami-0123456789abcdef0")
    assert (code, out) == (2, "")
    assert err.startswith("Error: --ssh-cidr: say who may reach the controller VM's sshd, e.g. --ssh-cidr "
                          "203.0.113.7/32")
    assert not home.exists()  # no key made, nothing recorded


def test_ssh_open_to_everyone_only_when_written_out_and_with_a_warning(home: Path) -> None:
    # No --image-id: the run stops at that usage error, after the warning and before any cloud call.
    code, _, err = up("--cloud", "aws", "--region", "us-east-1", "--ssh-cidr", "0.0.0.0/0")
    assert code == 2
    warning, error = err.splitlines()[0], err.splitlines()[-1]
    assert warning == ("Warning: --ssh-cidr 0.0.0.0/0 opens SSH (port 22) of the controller VM to every address; "
                       "give your own block (e.g. 203.0.113.7/32) to narrow it.")
    assert error.startswith("Error: --image-id:")


def test_a_narrow_block_gives_no_warning(home: Path) -> None:
    code, _, err = up("--cloud", "aws", "--region", "us-east-1", "--ssh-cidr", "203.0.113.7/32")
    assert code == 2 and "Warning" not in err and err.startswith("Error: --image-id:")


def test_allow_cidr_goes_with_cloud(home: Path) -> None:
    code, _, err = up("--ssh", "ubuntu@203.0.113.5", "--allow-cidr", "198.51.100.0/24")
    assert code == 2 and err == "Error: --allow-cidr goes with --cloud\n"


@pytest.mark.parametrize(("ssh_cidr", "allow_cidr", "chosen"), [
    ("203.0.113.7/32", None, "203.0.113.7/32"),
    ("203.0.113.7/32", "198.51.100.0/24", "203.0.113.7/32"),
    (None, "198.51.100.0/24", "198.51.100.0/24"),  # an --allow-cidr written out covers SSH too
    (None, "0.0.0.0/0", "0.0.0.0/0"),
    ("0.0.0.0/0", None, "0.0.0.0/0"),
])
def test_choose_ssh_cidr(ssh_cidr: str | None, allow_cidr: str | None, chosen: str) -> None:
    assert choose_ssh_cidr(ssh_cidr, allow_cidr) == chosen


def test_choose_ssh_cidr_has_no_default() -> None:
    with pytest.raises(UsageError, match=r"^--ssh-cidr: "):
        choose_ssh_cidr(None, None)
