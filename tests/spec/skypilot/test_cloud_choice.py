"""Which cloud a task runs on when nothing names one (no cloud in the file, no ``--infra``, no default): a task
`local` can run stays local; one with accelerators, an instance type, an image, a region or a zone runs on the
cheapest cloud installed that can run it, the plan listing every cloud considered, and that choice is stored
as the version's infra. ``plan.clouds.choose_cloud`` is pure (a fake ``resolve`` here); ``api.bind_submission``
runs it with the real catalog."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from skyserve_lite.api import bind_submission
from skyserve_lite.errors import SpecError
from skyserve_lite.plan.clouds import CloudChoice, choose_cloud, find_local_blocker
from skyserve_lite.spec.inputs import with_inputs
from skyserve_lite.spec.model import Cloud, TaskSpec
from skyserve_lite.spec.parse import Infra, parse_task, read_task
from skyserve_lite.spec.placement import Placement, Resolution
from skyserve_lite.state.secrets import SecretStore


def task(resources: str = "") -> str:
    """A task with ``resources`` (YAML lines; none for "")."""
    return "run: python -m http.server $PORT\nservice:\n  replicas: 1\n" + (f"resources:\n{resources}" if resources
                                                                             else "")


# resources -> the field that keeps the task off `local` (None: local runs it)
BLOCKERS = [
    pytest.param("", None, id="nothing"),
    pytest.param("  cpus: 4+\n  memory: 16+\n", None, id="cpus-and-memory"),
    pytest.param("  ports: 8080\n  disk_size: 100\n", None, id="ports-and-disk"),
    pytest.param("  infra: '*'\n", None, id="any-cloud"),
    pytest.param("  accelerators: L4\n", "resources.accelerators", id="accelerator"),
    pytest.param("  accelerators: {L4, A10g}\n", "resources.accelerators", id="accelerator-set"),
    pytest.param("  instance_type: m6i.large\n", "resources.instance_type", id="instance-type"),
    pytest.param("  image_id: ami-0123456789abcdef0\n", "resources.image_id", id="image"),
    pytest.param("  region: us-east-1\n", "resources.region", id="region"),
    pytest.param("  infra: '*/us-east-1'\n", "resources.region", id="any-cloud-region"),
    pytest.param("  zone: us-central1-a\n", "resources.zone", id="zone"),
    pytest.param("  any_of:\n    - cpus: 2+\n    - accelerators: L4\n", "resources.accelerators", id="one-candidate"),
]


@pytest.mark.parametrize(("resources", "blocker"), BLOCKERS)
def test_what_keeps_a_task_off_local(resources: str, blocker: str | None) -> None:
    assert find_local_blocker(parse_task(task(resources))) == blocker


def fake_resolve(offers: Mapping[Cloud, tuple[str, float | None] | str],
                 calls: list[TaskSpec]) -> Callable[[TaskSpec], Resolution]:
    """``resolve`` as ``choose_cloud`` calls it: each cloud's first placement (type, price) or the problem of
    the ``SpecError`` it raises; every spec asked about is recorded in ``calls``."""
    def resolve(spec: TaskSpec) -> Resolution:
        calls.append(spec)
        offer = offers[spec.cloud]
        if isinstance(offer, str):
            raise SpecError("svc.yaml", "resources.accelerators", offer)
        return Resolution(ondemand=(Placement(cloud=spec.cloud.value, instance_type=offer[0],
                                              price_per_hour=offer[1]),))
    return resolve


AWS, GCP = Cloud.AWS, Cloud.GCP

# offers per cloud, the clouds in the order offered -> the choice
CHOICES = [
    pytest.param({AWS: ("g6.xlarge", 0.8048), GCP: ("g2-standard-4", 0.70683)}, (AWS, GCP),
                 CloudChoice(GCP, ("aws: g6.xlarge ($0.80/h)", "gcp: g2-standard-4 ($0.71/h)")), id="gcp-cheaper"),
    pytest.param({AWS: ("m6i.large", 0.096), GCP: ("n2-standard-2", 0.0971)}, (AWS, GCP),
                 CloudChoice(AWS, ("aws: m6i.large ($0.10/h)", "gcp: n2-standard-2 ($0.10/h)")), id="aws-cheaper"),
    pytest.param({AWS: ("a", 1.0), GCP: ("b", 1.0)}, (AWS, GCP),
                 CloudChoice(AWS, ("aws: a ($1.00/h)", "gcp: b ($1.00/h)")), id="tie-first-offered"),
    pytest.param({AWS: ("a", 1.0), GCP: ("b", 1.0)}, (GCP, AWS),
                 CloudChoice(GCP, ("gcp: b ($1.00/h)", "aws: a ($1.00/h)")), id="tie-in-the-order-offered"),
    pytest.param({AWS: "no aws instance type has A10G", GCP: ("g2-standard-4", 0.71)}, (AWS, GCP),
                 CloudChoice(GCP, ("aws: no aws instance type has A10G", "gcp: g2-standard-4 ($0.71/h)")),
                 id="a-cloud-that-cannot-is-passed-over"),
    # a price the catalog lacks is no bargain
    pytest.param({AWS: ("x1", None), GCP: ("n2-standard-8", 0.39)}, (AWS, GCP),
                 CloudChoice(GCP, ("aws: x1 (price not in catalog)", "gcp: n2-standard-8 ($0.39/h)")),
                 id="unpriced-loses"),
    pytest.param({AWS: ("x1", None), GCP: ("x2", None)}, (AWS, GCP),
                 CloudChoice(AWS, ("aws: x1 (price not in catalog)", "gcp: x2 (price not in catalog)")),
                 id="all-unpriced-first-offered"),
    pytest.param({AWS: ("g6.xlarge", 0.8)}, (AWS,), CloudChoice(AWS, ("aws: g6.xlarge ($0.80/h)",)), id="one-offered"),
]


@pytest.mark.parametrize(("offers", "offered", "choice"), CHOICES)
def test_the_cheapest_cloud_that_can_run_the_task_is_chosen(offers: Mapping[Cloud, tuple[str, float | None] | str],
                                                            offered: tuple[Cloud, ...], choice: CloudChoice) -> None:
    calls: list[TaskSpec] = []
    spec = parse_task(task("  accelerators: L4\n"))
    assert choose_cloud(spec, "svc.yaml", offered, fake_resolve(offers, calls)) == choice
    assert [call.cloud for call in calls] == list(offered)  # each cloud tried once, in order
    assert choice.describe() == (f"chose {choice.cloud.value}, the cheapest of the clouds considered: "
                                 + "; ".join(choice.considered))


def test_each_cloud_is_tried_with_the_infra_asked_for() -> None:
    calls: list[TaskSpec] = []
    spec = parse_task(task("  accelerators: L4\n"))
    choose_cloud(spec, "svc.yaml", (AWS, GCP), fake_resolve({AWS: ("a", 1.0), GCP: ("b", 2.0)}, calls),
                 Infra(None, "us-east-1"))
    assert [(c.cloud, c.region, c.zone) for call in calls for c in call.resource_candidates] == [
        (AWS, "us-east-1", None), (GCP, "us-east-1", None)]


# resources, offered, offers -> the field refused and what it says
NONE_CAN = [
    pytest.param("  accelerators: Bogus:1\n", (AWS, GCP), {AWS: "no aws type", GCP: "no gcp type"},
                 "resources.accelerators",
                 "no cloud sky-lite offers can run this task (clouds considered: aws: no aws type; gcp: no gcp type)",
                 id="no-cloud-can"),
    pytest.param("  instance_type: m6i.large\n", (), {}, "resources.instance_type",
                 "no other cloud is installed here", id="none-installed"),
    # `--infra */us-east-1` for a task local could run: the blocker is the resources as a whole
    pytest.param("", (AWS,), {AWS: "no region us-east-1"}, "resources", "clouds considered: aws: no region us-east-1",
                 id="no-blocker-field"),
]


@pytest.mark.parametrize(("resources", "offered", "offers", "path", "problem"), NONE_CAN)
def test_when_no_cloud_can_run_the_task_the_blocking_field_is_refused(
        resources: str, offered: tuple[Cloud, ...], offers: Mapping[Cloud, tuple[str, float | None] | str], path: str,
        problem: str) -> None:
    calls: list[TaskSpec] = []
    with pytest.raises(SpecError) as caught:
        choose_cloud(parse_task(task(resources)), "svc.yaml", offered, fake_resolve(offers, calls))
    assert caught.value.path == path
    assert problem in caught.value.problem


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Callable[[tuple[str, ...]], None]:
    """Sets which clouds count as installed (``providers.available_clouds``); all three unless a row says."""
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "SKY_LITE_GCP_REGION"):
        monkeypatch.delenv(name, raising=False)

    def install(clouds: tuple[str, ...]) -> None:
        monkeypatch.setattr("skyserve_lite.providers.available_clouds", lambda: ("local", *clouds))

    install(("aws", "gcp"))
    return install


_ALL = ("aws", "gcp")


def submit(resources: str, infra: str | None, default_infra: str | None, home: Path,
           notes: list[str]) -> tuple[str | None, Placement]:
    """Bind a task as `serve up --dry-run` does: the stored infra and the first placement."""
    submitted = with_inputs(read_task(task(resources), "svc.yaml"), (), [], infra, default_infra)
    bound, inputs = bind_submission(submitted, None, SecretStore(home), keep_secrets=False, notes=notes)
    assert bound.spec.resolution is not None
    return inputs.infra, bound.spec.resolution.ondemand[0]


_CHOSE = "chose {}, the cheapest of the clouds considered: "

# resources, --infra, default infra, clouds installed -> (infra stored, placement's cloud and type, the note)
SUBMITTED = [
    pytest.param("", None, None, _ALL, (None, "local", None, None), id="nothing-stays-local"),
    pytest.param("  cpus: 4+\n  memory: 16+\n", None, None, _ALL, (None, "local", None, None), id="cpus-stay-local"),
    pytest.param("", "*", None, _ALL, (None, "local", None, None), id="any-infra-stays-local"),
    pytest.param("  accelerators: L4\n", None, None, _ALL,
                 ("gcp", "gcp", "g2-standard-4", _CHOSE.format("gcp") + "aws: g6.xlarge ($0.80/h); "
                  "gcp: g2-standard-4 ($0.71/h)"), id="L4-on-gcp"),
    pytest.param("  accelerators: L4\n", None, None, ("aws",),
                 ("aws", "aws", "g6.xlarge", _CHOSE.format("aws") + "aws: g6.xlarge ($0.80/h)"), id="L4-only-aws"),
    pytest.param("  accelerators: {L4:1, A10G:1}\n", None, None, _ALL,
                 ("gcp", "gcp", "g2-standard-4", _CHOSE.format("gcp") + "aws: g6.xlarge ($0.80/h); "
                  "gcp: g2-standard-4 ($0.71/h)"), id="set-on-the-cheapest"),
    pytest.param("  accelerators: A10G\n", None, None, _ALL,
                 ("aws", "aws", "g5.xlarge", "gcp: no gcp instance type has A10G"), id="A10G-gcp-passed-over"),
    pytest.param("  instance_type: m6i.large\n", None, None, _ALL,
                 ("aws", "aws", "m6i.large", "gcp: the gcp catalog has no instance type 'm6i.large'"),
                 id="aws-type"),
    pytest.param("  instance_type: n2-standard-8\n", None, None, _ALL,
                 ("gcp", "gcp", "n2-standard-8", "aws: the aws catalog has no instance type 'n2-standard-8'"),
                 id="gcp-type"),
    pytest.param("  region: us-east-1\n", None, None, _ALL,
                 ("aws", "aws", "m6i.2xlarge", "gcp: the gcp catalog has no region 'us-east-1'"), id="aws-region"),
    pytest.param("  zone: us-central1-a\n", None, None, _ALL,
                 ("gcp", "gcp", "n2-standard-8", "aws: 'us-central1-a' is not named like a"), id="gcp-zone"),
    pytest.param("  infra: '*/*/us-central1-a'\n", None, None, _ALL,
                 ("gcp", "gcp", "n2-standard-8", "aws: 'us-central1-a' is not named like a"), id="any-cloud-gcp-zone"),
    pytest.param("", "*/*/us-central1-a", None, _ALL,
                 ("gcp/*/us-central1-a", "gcp", "n2-standard-8", _CHOSE.format("gcp")), id="infra-option-zone"),
    pytest.param("", "*/us-east-1", None, _ALL, ("aws/us-east-1", "aws", "m6i.2xlarge", _CHOSE.format("aws")),
                 id="infra-option-region"),
    pytest.param("  accelerators: L4\n", "*", None, _ALL, ("gcp", "gcp", "g2-standard-4", _CHOSE.format("gcp")),
                 id="infra-option-any"),
    # an image is of one cloud: the other cannot boot it, however cheap
    pytest.param("  image_id: ami-0123456789abcdef0\n  accelerators: L4\n", None, None, _ALL,
                 ("aws", "aws", "g6.xlarge", _CHOSE.format("aws")), id="ami-runs-on-aws"),
    pytest.param("  image_id: projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts\n", None, None, _ALL,
                 ("gcp", "gcp", "n2-standard-8", _CHOSE.format("gcp")), id="gce-image-runs-on-gcp"),
    # whoever names a cloud decides: nothing is chosen, nothing noted
    pytest.param("  accelerators: L4\n", "aws", None, _ALL, ("aws", "aws", "g6.xlarge", None), id="infra-option"),
    pytest.param("  accelerators: L4\n", None, "aws", _ALL, ("aws", "aws", "g6.xlarge", None), id="default-infra"),
    pytest.param("  infra: aws\n  accelerators: L4\n", None, None, _ALL, (None, "aws", "g6.xlarge", None),
                 id="cloud-in-the-file"),
]


@pytest.mark.parametrize(("resources", "infra", "default_infra", "clouds", "expected"), SUBMITTED)
def test_a_submission_chooses_the_cheapest_installed_cloud(
        resources: str, infra: str | None, default_infra: str | None, clouds: tuple[str, ...],
        expected: tuple[str | None, str, str | None, str | None], tmp_path: Path,
        installed: Callable[[tuple[str, ...]], None]) -> None:
    installed(clouds)
    notes: list[str] = []
    stored, first = submit(resources, infra, default_infra, tmp_path, notes)
    stored_infra, cloud, instance_type, note = expected
    assert (stored, first.cloud, first.instance_type) == (stored_infra, cloud, instance_type)
    if note is None:
        assert notes == []
    else:
        assert len(notes) == 1 and notes[0].startswith(_CHOSE.format(cloud)) and note in notes[0], notes


# resources, --infra, clouds installed -> the field refused and what it says
SUBMISSION_REFUSED = [
    pytest.param("  accelerators: Bogus:1\n", None, _ALL, "resources.accelerators",
                 "no cloud sky-lite offers can run this task (clouds considered: aws: no aws instance type has Bogus",
                 id="unknown-accelerator"),
    pytest.param("  instance_type: nope.xlarge\n", None, _ALL, "resources.instance_type",
                 "gcp: the gcp catalog has no instance type 'nope.xlarge'", id="unknown-type"),
    pytest.param("  zone: mars-1a\n", None, _ALL, "resources.zone", "no cloud sky-lite offers can run this task",
                 id="unknown-zone"),
    pytest.param("  accelerators: A10G\n", "*/us-central1", _ALL, "resources.accelerators",
                 "aws: the aws catalog has no region 'us-central1'", id="region-no-cloud-has"),
    pytest.param("  accelerators: L4\n", None, (), "resources.accelerators", "no other cloud is installed here",
                 id="no-cloud-installed"),
]


@pytest.mark.parametrize(("resources", "infra", "clouds", "path", "problem"), SUBMISSION_REFUSED)
def test_a_submission_no_cloud_can_run_is_refused_on_the_blocking_field(
        resources: str, infra: str | None, clouds: tuple[str, ...], path: str, problem: str, tmp_path: Path,
        installed: Callable[[tuple[str, ...]], None]) -> None:
    installed(clouds)
    with pytest.raises(SpecError) as caught:
        submit(resources, infra, None, tmp_path, [])
    assert caught.value.path == path
    assert problem in caught.value.problem


@pytest.mark.parametrize(("value", "refused"), [
    pytest.param("", "is empty", id="empty"),
    pytest.param("x" * 65_537, "is 65,537 bytes", id="too-large"),
    pytest.param("x" * 65_536, None, id="largest"),
])
def test_a_cloud_secret_fits_the_clouds_secret_store(tmp_path: Path, value: str, refused: str | None) -> None:
    from skyserve_lite.spec.inputs import with_inputs
    from skyserve_lite.spec.model import Secret

    task = read_task("resources:\n  infra: aws\nsecrets:\n  HF_TOKEN: null\nservice:\n  replicas: 1\nrun: x\n",
                     "/t/svc.yaml")
    submitted = with_inputs(task, (), [("HF_TOKEN", Secret(value))], None)
    if refused is None:
        bind_submission(submitted, None, SecretStore(tmp_path), keep_secrets=False)
        return
    with pytest.raises(SpecError) as caught:
        bind_submission(submitted, None, SecretStore(tmp_path), keep_secrets=False)
    assert caught.value.path == "secrets.HF_TOKEN" and refused in caught.value.problem
    assert value[:20] not in str(caught.value) or value == ""


@pytest.mark.parametrize(("text", "noted"), [
    pytest.param("resources:\n  infra: aws\nsetup: sudo apt-get install -y git\nrun: x\n", ["setup"], id="setup"),
    pytest.param("resources:\n  infra: aws\nrun: cd app && sudo ./serve\n", ["run"], id="run"),
    pytest.param("resources:\n  infra: aws\n  run_as_root: true\nsetup: sudo true\nrun: x\n", [], id="as-root"),
    pytest.param("setup: sudo true\nrun: x\n", [], id="local-runs-as-the-caller"),
    pytest.param("resources:\n  infra: aws\nrun: echo pseudosudo\n", [], id="not-a-sudo-call"),
])
def test_a_plan_notes_sudo_where_replicas_have_none(tmp_path: Path, text: str, noted: list[str]) -> None:
    notes: list[str] = []
    bind_submission(read_task(text + "service:\n  replicas: 1\n", "/t/svc.yaml"), None, SecretStore(tmp_path),
                    keep_secrets=False, notes=notes)
    assert [n.split(":")[0] for n in notes if "sudo" in n] == noted
