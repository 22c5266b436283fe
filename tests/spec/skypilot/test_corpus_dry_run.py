"""SkyPilot-style service YAMLs (``corpus/``) through the real `sky-lite serve up FILE --dry-run`.

The corpus is laid out as SkyPilot's repository is (``examples/serve/...``, ``llm/...``) and holds the habits
of its examples and LLM recipes, old and new: workdirs and mounts relative to the repository root,
accelerator sets, ``$VAR`` in probes, envs and secrets left to the command line, spot fallback, clouds and
fields sky-lite refuses. The files are ours, written in those shapes; the corpus holds only YAMLs and the
test lays out the rest (the workdirs' sources, mounted files, TLS pairs made here) in a temporary copy of
the tree, which is the working directory while each file runs, as `sky serve up llm/vllm/service.yaml` is
run from the repository root.

Every file runs through the CLI in this process (click's ``CliRunner``, ``SKY_LITE_HOME`` a temporary
folder), with ``--infra`` from its row when it names no cloud, ``--env NAME=...`` for each env the file
leaves null and ``--secret NAME=...`` for each secret. For every file: exit 0 or 2 and nothing else, no
traceback, a refusal is exactly one line ``Error: FILE: FIELD: why`` naming the field of its row, and no
secret value (given or written in the file) shows in the output. After the corpus no service is stored and
no process was left. The count accepted is printed in the terminal summary (``conftest.py``).

``EXPECTED`` pins today's outcome of each file, so a change in what is accepted shows as a failure. A refused
file that should be accepted later (once sky-lite reads that SkyPilot habit, or its catalog prices that
instance type) says why in ``flips``; the rest of the refusals are meant. After a parser or catalog change,
regenerate the table and read its diff::

    /work/venv/bin/python tests/spec/skypilot/test_corpus_dry_run.py --regenerate          # print it
    /work/venv/bin/python tests/spec/skypilot/test_corpus_dry_run.py --regenerate --write  # rewrite it here

Regeneration keeps each known file's ``infra``, and its ``flips`` while it is refused; a new file gets
``--infra aws`` unless it names a cloud. A row that breaks a rule above comes out with a ``FIXME`` comment.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from skyserve_lite.cli.main import main as cli_main

CORPUS = Path(__file__).parent / "corpus"


@dataclasses.dataclass(frozen=True)
class Expect:
    """One file's row: ``infra`` given with ``--infra`` (the file names no cloud), ``refused`` the field path
    its refusal names (None: accepted), ``flips`` why a refused file should be accepted later (None: it is
    accepted, or meant to stay refused)."""

    infra: str | None = None
    refused: str | None = None
    flips: str | None = None


def accepted(infra: str | None = None) -> Expect:
    return Expect(infra)


def refused(field: str, infra: str | None = None, *, flips: str | None = None) -> Expect:
    return Expect(infra, field, flips)


# --- expectations (regenerate: see the module docstring) ---
EXPECTED: dict[str, Expect] = {
    "examples/serve/auth/service.yaml": accepted("gcp"),
    "examples/serve/cancel/service.yaml": accepted("aws"),
    "examples/serve/http_server/autoscale.yaml": accepted("gcp"),
    "examples/serve/http_server/task.yaml": accepted("aws"),
    "examples/serve/https/env_paths.yaml": accepted(),
    "examples/serve/https/legacy_https.yaml": refused("service.https", "aws"),
    "examples/serve/https/service.yaml": accepted("aws"),
    "examples/serve/load_balancing/instance_aware.yaml": accepted("gcp"),
    "examples/serve/load_balancing/instance_aware_names.yaml": refused("resources.accelerators",
        flips="refused today: the aws catalog has no price for p5.4xlarge (H100:1) or g6e (L40S)"),
    "examples/serve/load_balancing/round_robin.yaml": accepted("gcp"),
    "examples/serve/minimal.yaml": accepted("aws"),
    "examples/serve/misc/autostop.yaml": refused("resources.autostop", "aws"),
    "examples/serve/misc/both_replica_forms.yaml": refused("service.replicas", "aws"),
    "examples/serve/misc/controller_resources.yaml": refused("service.controller_resources", "aws"),
    "examples/serve/misc/decision_interval.yaml": refused(
        "service.replica_policy.autoscaling_decision_interval", "aws"),
    "examples/serve/misc/gs_mount_on_aws.yaml": refused("file_mounts./data"),
    "examples/serve/misc/inline_secret.yaml": accepted(),
    "examples/serve/misc/multi_node.yaml": refused("num_nodes", "aws"),
    "examples/serve/misc/pool.yaml": refused("pool", "aws"),
    "examples/serve/misc/port_range.yaml": accepted(),
    "examples/serve/misc/s3_mount.yaml": accepted(),
    "examples/serve/misc/service_port.yaml": accepted(),
    "examples/serve/misc/task_config.yaml": refused("config"),
    "examples/serve/misc/volumes.yaml": refused("volumes"),
    "examples/serve/misc/workdir_env.yaml": accepted("aws"),
    "examples/serve/ray_serve/service.yaml": accepted("aws"),
    "examples/serve/scale_to_zero.yaml": accepted("gcp"),
    "examples/serve/spot_policy/base_fallback.yaml": accepted("aws"),
    "examples/serve/spot_policy/dynamic_fallback.yaml": accepted("gcp"),
    "examples/serve/spot_policy/ordered_gpus.yaml": accepted("gcp"),
    "examples/serve/spot_policy/spot_hedge.yaml": accepted(),
    "examples/serve/spot_policy/spot_or_ondemand.yaml": refused("resources.any_of[0].use_spot", "aws"),
    "examples/serve/stable_diffusion/service.yaml": accepted("aws"),
    "llm/clouds/any_cloud.yaml": refused("resources.any_of"),
    "llm/clouds/azure.yaml": refused("resources.cloud"),
    "llm/clouds/gcp_image.yaml": accepted(),
    "llm/clouds/gcp_zone_cpus.yaml": accepted(),
    "llm/clouds/kubernetes.yaml": refused("resources.infra"),
    "llm/clouds/lambda.yaml": refused("resources.infra"),
    "llm/clouds/oci.yaml": refused("resources.infra"),
    "llm/codellama/endpoint.yaml": accepted("aws"),
    "llm/codellama/tabby.yaml": accepted("aws"),
    "llm/dbrx/dbrx.yaml": accepted("gcp"),
    "llm/deepseek-r1-distilled/qwen-7b.yaml": accepted("gcp"),
    "llm/deepseek-r1/r1-671b.yaml": refused("num_nodes", "aws"),
    "llm/deepseek-r1/r1-vllm.yaml": accepted("aws"),
    "llm/falcon/falcon.yaml": accepted("aws"),
    "llm/gemma/gemma3.yaml": accepted("aws"),
    "llm/gemma/serve.yaml": accepted("gcp"),
    "llm/gpt-oss/vllm.yaml": refused("resources.accelerators", "aws",
        flips="refused today: the aws catalog has no price for p5.4xlarge (H100:1) or g6e (L40S)"),
    "llm/kimi-k2/kimi.yaml": refused("resources.memory",
        flips="refused today: the aws catalog has no price for p5e/p5en (H200:8)"),
    "llm/llama-3/llama3.yaml": accepted("aws"),
    "llm/llama-3_1-finetuning/serve.yaml": refused("file_mounts./checkpoints", "aws"),
    "llm/llama-3_1-finetuning/serve_bucket_name.yaml": refused("file_mounts./artifacts", "aws"),
    "llm/llama-3_1/llama-3_1.yaml": accepted("aws"),
    "llm/llama-3_1/spot_regions.yaml": accepted(),
    "llm/llama-4/llama4.yaml": accepted("aws"),
    "llm/llama-4/scout_aws.yaml": accepted(),
    "llm/llama-cpp/gpu.yaml": accepted(),
    "llm/llama-cpp/server.yaml": accepted("aws"),
    "llm/lorax/lorax.yaml": refused("resources.image_id", "aws"),
    "llm/lorax/lorax_vm.yaml": accepted(),
    "llm/mistral/spot.yaml": accepted("aws"),
    "llm/mixtral/any_region.yaml": accepted(),
    "llm/mixtral/serve.yaml": accepted("aws"),
    "llm/ollama/gpu_zone.yaml": accepted(),
    "llm/ollama/serve.yaml": accepted("gcp"),
    "llm/pixtral/pixtral.yaml": refused("resources.memory",
        flips="refused today: the aws catalog has no price for g6e (L40S)"),
    "llm/qwen/qwen25-72b.yaml": accepted("gcp"),
    "llm/qwen/qwen3.yaml": accepted(),
    "llm/sglang/deepseek-v3.yaml": refused("num_nodes", "aws"),
    "llm/sglang/llama2.yaml": accepted("aws"),
    "llm/sglang/llava.yaml": accepted("gcp"),
    "llm/tgi/coder.yaml": accepted("gcp"),
    "llm/tgi/serve.yaml": accepted(),
    "llm/tpu/fractional.yaml": refused("resources.accelerators", "aws"),
    "llm/tpu/gemma_tpu.yaml": refused("resources.accelerator_args", "aws"),
    "llm/vllm/auth.yaml": accepted(),
    "llm/vllm/docker.yaml": refused("resources.image_id", "aws"),
    "llm/vllm/probe_json_string.yaml": accepted(),
    "llm/vllm/serve.yaml": accepted("aws"),
    "llm/vllm/service.yaml": accepted("gcp"),
    "llm/vllm/workdir_root.yaml": accepted("aws"),
    "secure.yaml": accepted(),
    "serve-http.yaml": accepted(),
}
# --- end of expectations ---

# Files the corpus's workdirs, mounts and env values name, written in the laid-out repository.
SOURCES = {
    "examples/serve/http_server/server.py": "import http.server\nhttp.server.test(port=8080)\n",
    "examples/serve/https/server.py": "import http.server\nhttp.server.test(port=8443)\n",
    "examples/serve/ray_serve/serve.py": "app = None  # a Ray Serve deployment\n",
    "examples/serve/cancel/server.py": "import asyncio\n",
    "examples/serve/stable_diffusion/docker-compose.yml": "services: {}\n",
    "examples/serve/misc/reranker.json": '{"top_k": 8}\n',
    "llm/llama-cpp/models/tiny.gguf": "GGUF",
    "apps/greeter/server.py": "print('hello')\n",
}
# Where TLS pairs are made: (certificate, key), each relative to the repository root.
TLS_PAIRS = (
    ("examples/serve/https/cert.pem", "examples/serve/https/key.pem"),
    ("certs/server.crt", "certs/server.key"),
    ("tls/cert.pem", "tls/key.pem"),
)
# Values of `envs: {NAME: null}` that must mean something (a folder); the rest get ``corpus-<name>``.
ENV_VALUES = {
    "APP_DIR": "apps/greeter",
    "CERT_DIR": "tls",
    "MODEL_NAME": "Qwen/Qwen2.5-7B-Instruct",
    "ENDPOINT": "127.0.0.1:8000",  # a dry run contacts nothing; loopback all the same
}


def secret_value(name: str) -> str:
    """What ``--secret NAME=...`` gives: distinct per name, so finding it in the output means a leak."""
    return f"sk-corpus-{name.lower()}-51d3e9"


def env_value(name: str) -> str:
    return ENV_VALUES.get(name, f"corpus-{name.lower().replace('_', '-')}")


# --- laying out the repository ---------------------------------------------------------------------------


def lay_out_repo(root: Path) -> bool:
    """Copy the corpus to ``root`` with the sources its files name; whether TLS pairs could be made (they
    need the ``cryptography`` package, which the test dependencies bring)."""
    shutil.copytree(CORPUS, root)
    for relative, text in SOURCES.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    try:
        for cert, key in TLS_PAIRS:
            write_tls_pair(root / cert, root / key)
    except ImportError:
        return False
    return True


def write_tls_pair(cert: Path, key: Path) -> None:
    """A fresh EC key and a self-signed certificate for it, as PEM files."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "corpus.example")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("corpus.example")]), critical=False)
        .sign(private, hashes.SHA256())
    )
    cert.parent.mkdir(parents=True, exist_ok=True)
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    key.chmod(0o600)
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))


def corpus_files() -> list[str]:
    """Every YAML of the corpus, as a path relative to its root."""
    return sorted(path.relative_to(CORPUS).as_posix() for path in CORPUS.rglob("*.yaml"))


# --- running one file ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What a file leaves to the command line, and the secret values it writes itself."""

    unset_envs: tuple[str, ...]
    secrets: tuple[str, ...]  # given with --secret
    written_secrets: tuple[str, ...]  # values in the file

    @classmethod
    def of(cls, text: str) -> Inputs:
        """Read as plain YAML, not by the parser under test: a file it refuses still gets its values."""
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError:
            document = None  # the run will say what is wrong with it
        document = document if isinstance(document, dict) else {}
        envs, secrets = (_mapping(document.get(key)) for key in ("envs", "secrets"))
        return cls(unset_envs=tuple(name for name, value in envs.items() if value is None),
                   secrets=tuple(name for name, value in secrets.items() if value is None),
                   written_secrets=tuple(str(value) for value in secrets.values() if value is not None))

    def arguments(self) -> list[str]:
        arguments: list[str] = []
        for name in self.unset_envs:
            arguments += ["--env", f"{name}={env_value(name)}"]
        for name in self.secrets:
            arguments += ["--secret", f"{name}={secret_value(name)}"]
        return arguments

    def hidden_values(self) -> tuple[str, ...]:
        """Every secret value that must not show: those given and those written in the file."""
        return (*(secret_value(name) for name in self.secrets), *self.written_secrets)


def _mapping(value: object) -> Mapping[str, Any]:
    return {str(key): item for key, item in value.items()} if isinstance(value, dict) else {}


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What `serve up FILE --dry-run` did: exit code, output, and the exception that escaped click, if any
    (a ``SystemExit`` is how a command exits, not one)."""

    code: int
    stdout: str
    stderr: str
    exception: str | None
    source: str  # the file as its errors name it
    hidden: tuple[str, ...]  # secret values that must not show

    @property
    def refused_field(self) -> str | None:
        """The field path a one-line refusal of the file names; None for anything else."""
        prefix = f"Error: {self.source}: "
        if self.code != 2 or not self.stderr.startswith(prefix) or self.stderr.count("\n") != 1:
            return None
        field = self.stderr[len(prefix):].split(": ", 1)[0]
        return field if re.fullmatch(r"\S+", field) else None  # not the problem of a whole-file refusal


def _environment(home: Path) -> dict[str, str | None]:
    """The variables each run sees: its own home, this machine's controller, no region chosen by the
    environment (the plan must not depend on who runs the test)."""
    return {"SKY_LITE_HOME": str(home), "SKY_LITE_CONTROLLER": "local", "AWS_DEFAULT_REGION": None,
            "AWS_REGION": None, "SKY_LITE_GCP_REGION": None}


def run_dry(relative: str, infra: str | None, home: Path) -> Outcome:
    """`sky-lite serve up RELATIVE --dry-run` from the current folder (the laid-out repository root)."""
    path = Path.cwd() / relative
    inputs = Inputs.of(path.read_text(encoding="utf-8"))
    arguments = ["serve", "up", relative, "--dry-run", *(["--infra", infra] if infra else []), *inputs.arguments()]
    result = CliRunner(env=_environment(home)).invoke(cli_main, arguments)
    escaped = result.exception if not isinstance(result.exception, SystemExit) else None
    return Outcome(result.exit_code, result.stdout, result.stderr, None if escaped is None else repr(escaped),
                   str(path.resolve()), inputs.hidden_values())


def find_problems(outcome: Outcome) -> list[str]:
    """What is wrong with an outcome whatever the file: the rules every file keeps, accepted or refused."""
    problems = []
    output = outcome.stdout + outcome.stderr
    if outcome.code not in (0, 2):
        problems.append(f"exit code {outcome.code}, expected 0 (accepted) or 2 (refused)")
    if outcome.exception is not None or "Traceback" in output:
        problems.append(f"an exception escaped: {outcome.exception}")
    if outcome.code == 2 and outcome.refused_field is None:
        problems.append(f"the refusal is not one line `Error: FILE: FIELD: why` naming a field: {outcome.stderr!r}")
    if outcome.code == 0 and "Dry run: nothing was stored or launched." not in outcome.stdout:
        problems.append("accepted, but no plan was printed")
    problems.extend(f"a secret value shows in the output: {value[:6]}..." for value in outcome.hidden
                    if value in output)
    return problems


# --- after the corpus: nothing stored, nothing left running ----------------------------------------------


def find_children() -> set[int]:
    """The processes whose parent is this one (Linux's /proc); empty where there is no /proc."""
    children = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone since listed
        if int(fields[1]) == os.getpid():
            children.add(int(stat.parent.name))
    return children


def find_processes_of(home: Path) -> list[int]:
    """The processes (of this user; others cannot be read) whose environment names ``home`` as theirs."""
    needle = f"SKY_LITE_HOME={home}\0".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if needle in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found


def find_stored_services(home: Path) -> list[str]:
    if not (home / "state.db").exists():
        return []
    from skyserve_lite.state.store import Store

    store = Store.open(home)
    try:
        return [service.name for service in store.list_services()]
    finally:
        store.close()


@contextmanager
def inside(folder: Path) -> Iterator[None]:
    previous = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(previous)


@dataclasses.dataclass(frozen=True)
class CorpusRun:
    outcomes: dict[str, Outcome]
    tls_made: bool
    seconds: float
    home: Path
    new_children: set[int]


def run_corpus(workspace: Path, rows: Mapping[str, Expect]) -> CorpusRun:
    """Lay out the repository in ``workspace`` and dry-run every corpus file from its root."""
    root, home = workspace / "repo", workspace / "home"
    tls_made = lay_out_repo(root)
    children = find_children()
    started = time.monotonic()
    with inside(root):
        outcomes = {relative: run_dry(relative, rows.get(relative, guess_row(root / relative)).infra, home)
                    for relative in corpus_files()}
    return CorpusRun(outcomes, tls_made, time.monotonic() - started, home, find_children() - children)


def guess_row(path: Path) -> Expect:
    """The row of a file the table lacks: ``--infra aws`` unless it names a cloud itself."""
    names_cloud = re.search(r"^\s*-?\s*(infra|cloud):", path.read_text(encoding="utf-8"), re.MULTILINE)
    return Expect(infra=None if names_cloud else "aws")


def describe(run: CorpusRun) -> str:
    """The summary line: how many files were accepted, and of the refused ones how many should flip."""
    refusals = [relative for relative, outcome in run.outcomes.items() if outcome.code != 0]
    flipping = sum(1 for relative in refusals if EXPECTED.get(relative, Expect()).flips)
    return (f"corpus: {len(run.outcomes) - len(refusals)} of {len(run.outcomes)} SkyPilot-style service YAMLs "
            f"accepted by `serve up --dry-run`; {len(refusals)} refused ({flipping} of them expected to be accepted "
            f"later, {len(refusals) - flipping} to stay refused); {run.seconds:.1f} s")


# --- the tests -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, report_corpus: Callable[[str], None]) -> CorpusRun:
    run = run_corpus(tmp_path_factory.mktemp("corpus"), EXPECTED)
    report_corpus(describe(run))
    return run


def test_every_corpus_file_has_a_row() -> None:
    assert sorted(EXPECTED) == corpus_files()
    for relative, row in EXPECTED.items():
        assert row.flips is None or row.refused is not None, f"{relative}: only a refused file can flip"


@pytest.mark.parametrize("relative", corpus_files())
def test_dry_run_outcome(relative: str, corpus: CorpusRun) -> None:
    outcome, row = corpus.outcomes[relative], EXPECTED.get(relative)
    assert row is not None, f"{relative} has no row in EXPECTED: regenerate the table (see the module docstring)"
    if not corpus.tls_made and "tls:" in (CORPUS / relative).read_text(encoding="utf-8"):
        pytest.skip("no TLS pair could be made: the cryptography package is missing")
    assert find_problems(outcome) == []
    if row.refused is None:
        assert outcome.code == 0, outcome.stderr
    else:
        assert (outcome.code, outcome.refused_field) == (2, row.refused), outcome.stderr
        assert outcome.stdout == ""


def test_the_dry_runs_store_nothing_and_leave_no_process(corpus: CorpusRun) -> None:
    assert find_stored_services(corpus.home) == []
    assert find_processes_of(corpus.home) == []
    assert corpus.new_children == set()
    if corpus.home.exists():  # nothing secret in whatever a dry run wrote
        hidden = {value for outcome in corpus.outcomes.values() for value in outcome.hidden}
        assert [path for path in corpus.home.rglob("*") if path.is_file()
                and any(value.encode() in path.read_bytes() for value in hidden)] == []


_PLAN = "Launch svc on aws: 1 replica\nDry run: nothing was stored or launched.\n"
_REFUSAL = "Error: /repo/svc.yaml: resources.cloud: cloud 'oci' is not offered by sky-lite\n"


@pytest.mark.parametrize(("code", "stdout", "stderr", "exception", "problem"), [
    (0, _PLAN, "", None, None),
    (2, "", _REFUSAL, None, None),
    (1, "", "Error: the controller could not be reached\n", None, "exit code 1"),
    (1, "", "", "KeyError('cloud')", "an exception escaped"),
    (0, _PLAN, "Traceback (most recent call last):\n", None, "an exception escaped"),
    (2, "", _REFUSAL + "  and a second line\n", None, "not one line"),
    (2, "", "Error: --secret X: not a valid environment variable name\n", None, "not one line"),
    (0, "", "", None, "no plan was printed"),
    (0, _PLAN + "HF_TOKEN=sk-corpus-hf_token-51d3e9\n", "", None, "a secret value shows"),
    (2, "", _REFUSAL.replace("oci", "wandb-inline-value"), None, "a secret value shows"),
])
def test_the_rules_catch_what_they_name(code: int, stdout: str, stderr: str, exception: str | None,
                                        problem: str | None) -> None:
    outcome = Outcome(code, stdout, stderr, exception, "/repo/svc.yaml",
                      (secret_value("HF_TOKEN"), "wandb-inline-value"))
    problems = find_problems(outcome)
    if problem is None:
        assert problems == []
    else:
        assert any(problem in found for found in problems), problems
    if code == 2 and problem is None:
        assert outcome.refused_field == "resources.cloud"


def test_the_process_check_sees_a_process_of_the_home(tmp_path: Path) -> None:
    import subprocess

    process = subprocess.Popen(["sleep", "30"], env={**os.environ, "SKY_LITE_HOME": str(tmp_path)})
    try:
        # Until the child has exec'd, /proc shows the environment it was forked with: wait for the new one.
        deadline = time.monotonic() + 10
        while not find_processes_of(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert find_processes_of(tmp_path) == [process.pid]
        assert process.pid in find_children()
    finally:
        process.kill()
        process.wait()
    assert find_processes_of(tmp_path) == []


# --- regenerating the table ------------------------------------------------------------------------------


def render_table(run: CorpusRun) -> str:
    """``EXPECTED`` as Python source for the outcomes of ``run``; problems show as comments."""
    lines = ["EXPECTED: dict[str, Expect] = {"]
    for relative, outcome in run.outcomes.items():
        old = EXPECTED.get(relative)
        infra = old.infra if old is not None else guess_row(CORPUS / relative).infra
        for problem in find_problems(outcome):
            lines.append(f"    # FIXME {relative}: {problem}")
        field = outcome.refused_field
        if outcome.code == 0 or field is None:
            lines.append(f"    {_quote(relative)}: accepted({_quote(infra) if infra else ''}),")
            continue
        flips = old.flips if old is not None else None
        arguments = [_quote(field), *([_quote(infra)] if infra else []), *([f"flips={_quote(flips)}"] if flips else [])]
        lines.append(f"    {_quote(relative)}: refused({', '.join(arguments)}),")
    lines.append("}")
    return "\n".join(line if len(line) <= 120 else _wrap(line) for line in lines)


def _quote(text: str) -> str:
    return json.dumps(text)  # a Python string literal too, in double quotes as the code around it


def _wrap(line: str) -> str:
    """A row longer than the line limit: its ``flips`` note on a line of its own, then its arguments."""
    head, _, note = line.partition(" flips=")
    if len(head) > 120:
        head = head.replace("refused(", "refused(\n        ", 1)
    return f"{head}\n        flips={note}" if note else head


def regenerate(write: bool) -> None:
    with tempfile.TemporaryDirectory() as workspace:
        run = run_corpus(Path(workspace), EXPECTED)
    table = render_table(run)
    print(describe(run), file=sys.stderr)
    if not write:
        print(table)
        return
    module = Path(__file__)
    text = module.read_text(encoding="utf-8")
    start = text.index("EXPECTED: dict[str, Expect] = {")
    end = text.index("}\n# --- end of expectations ---", start) + 1
    module.write_text(text[:start] + table + text[end:], encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:2] != ["--regenerate"] or sys.argv[2:] not in ([], ["--write"]):
        sys.exit(f"usage: {sys.argv[0]} --regenerate [--write]")
    regenerate(write=sys.argv[2:] == ["--write"])


def test_the_docs_give_the_pinned_count() -> None:
    """docs/yaml.md states how many corpus files are accepted: the count the table pins (which the dry runs
    above hold to), so a change that moves it moves the docs in the same change."""
    docs = (Path(__file__).resolve().parents[3] / "docs" / "yaml.md").read_text(encoding="utf-8")
    total = len(EXPECTED)
    taken = sum(1 for expect in EXPECTED.values() if expect.refused is None)
    assert f"holds {total} service YAMLs" in docs
    assert f"{taken} of the {total} are accepted" in " ".join(docs.split())
