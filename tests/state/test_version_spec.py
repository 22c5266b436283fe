"""A stored version's service section: read from what was parsed when it was accepted (no YAML parsed), the
same value the text parses to, and parsed from the text whenever the stored form is not this sky-lite's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import skyserve_lite
from skyserve_lite.errors import SpecError
from skyserve_lite.spec.model import TaskSpec
from skyserve_lite.spec.parse import load_task_file, parse_task, read_task
from skyserve_lite.state import models
from skyserve_lite.state.models import VersionRecord
from skyserve_lite.state.store import Store

ROOT = Path(__file__).parents[2]
# Every field of the service section given, each away from its default.
EVERY_SERVICE_FIELD = """\
resources:
  use_spot: true
  accelerators: {L4: 1, A10G: 1}
service:
  readiness_probe:
    path: /v1/models
    post_data: {model: m}
    initial_delay_seconds: 90
    timeout_seconds: 2.5
    headers: {Authorization: Bearer x}
  ports: 8443
  load_balancing_policy: instance_aware_least_load
  replica_policy:
    min_replicas: 2
    max_replicas: 7
    target_qps_per_replica: {L4: 2.5, A10G: 4}
    upscale_delay_seconds: 30
    downscale_delay_seconds: 45.5
    num_overprovision: 1
    spot_placer: dynamic_fallback
    base_ondemand_fallback_replicas: 1
    dynamic_ondemand_fallback: true
  tls:
    keyfile: /certs/key.pem
    certfile: /certs/cert.pem
run: serve --port 8443
"""


def _texts() -> list[tuple[str, str]]:
    files = sorted([*(ROOT / "examples").rglob("*.yaml"), *(ROOT / "tests" / "spec" / "skypilot").glob("*.yaml")])
    accepted = []
    for path in files:
        try:
            load_task_file(path)
        except SpecError:
            continue  # the corpus's refused files
        accepted.append((path.name, path.read_text(encoding="utf-8")))
    return [*accepted, ("every service field", EVERY_SERVICE_FIELD)]


def count_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sources of the texts ``VersionRecord`` parses from now on (it parses them still)."""
    parses: list[str] = []

    def counting(text: str, source: str = "<string>", *, strict: bool = True) -> TaskSpec:
        parses.append(source)
        return parse_task(text, source, strict=strict)

    monkeypatch.setattr(models, "parse_task", counting)
    return parses


def _stored(tmp_path: Path, text: str) -> VersionRecord:
    store = Store.open(tmp_path / "home")
    try:
        store.create_service("svc", read_task(text, "/svc.yaml"), 30001, 0.0)
        return store.get_version("svc", 1)
    finally:
        store.close()


def test_the_corpus_covers_files_and_every_field() -> None:
    names = [name for name, _ in _texts()]
    assert "tls_https.yaml" in names and "minimal.yaml" in names and len(names) >= 8


@pytest.mark.parametrize(("name", "text"), _texts(), ids=[name for name, _ in _texts()])
def test_the_stored_service_section_is_the_parsed_one_without_parsing(
        name: str, text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = _stored(tmp_path, text)
    parsed = record.spec.service  # parsed from the text, as the controller does
    fresh = _with_spec_json(record, record.spec_json)  # nothing cached yet
    parses = count_parses(monkeypatch)
    assert fresh.service_spec == parsed
    assert parses == []


def _with_spec_json(record: VersionRecord, spec_json: str | None) -> VersionRecord:
    values = {f: getattr(record, f) for f in record.__dataclass_fields__}
    return VersionRecord(**{**values, "spec_json": spec_json})


def _edited(spec_json: str | None, edit: str) -> str:
    assert spec_json is not None
    document = json.loads(spec_json)
    service = document["spec"]["service"]
    if edit == "written by another sky-lite":
        document["parsed_by"] = "0.0.1"
    elif edit == "a field removed since":
        service["replica_policy"]["surge"] = 1
    elif edit == "a field added since":
        del service["readiness_probe"]["timeout_seconds"]
    elif edit == "a value of another type":
        service["replica_policy"]["min_replicas"] = "two"
    elif edit == "the form before the parsed_by key":
        document = document["spec"]
    return json.dumps(document)


@pytest.mark.parametrize("edit", ["written by another sky-lite", "a field removed since", "a field added since",
                                  "a value of another type", "the form before the parsed_by key"])
def test_a_stored_form_not_of_this_sky_lite_is_not_trusted(edit: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    record = _stored(tmp_path, EVERY_SERVICE_FIELD)
    expected = record.spec.service
    parses = count_parses(monkeypatch)
    edited = _with_spec_json(record, _edited(record.spec_json, edit))
    assert edited.service_spec == expected
    assert len(parses) == 1  # from the text
    for broken in (None, "not json", "[]"):
        parses.clear()
        assert _with_spec_json(record, broken).service_spec == expected
        assert len(parses) == 1


def test_the_stored_form_has_no_secret_value(tmp_path: Path) -> None:
    text = "service:\n  replicas: 1\nsecrets:\n  HF_TOKEN: hf_supersecretvalue\nrun: serve\n"
    record = _stored(tmp_path, text)
    assert record.spec_json is not None and "hf_supersecretvalue" not in record.spec_json
    assert "HF_TOKEN" in record.spec_json


def test_the_parser_stamp_moves_with_any_of_the_parsers_sources(tmp_path: Path) -> None:
    from skyserve_lite.spec import parse

    real = Path(parse.__file__).parent
    assert models.parser_stamp() == models.stamp_of_sources(real)
    assert str(models.parser_stamp()).startswith(f"{skyserve_lite.__version__}+")
    for name in ("parse.py", "model.py", "yaml_doc.py"):
        copy = tmp_path / name
        for source in ("parse.py", "model.py", "yaml_doc.py"):
            (copy / source).parent.mkdir(parents=True, exist_ok=True)
            (copy / source).write_bytes((real / source).read_bytes())
        assert models.stamp_of_sources(copy) == models.parser_stamp()
        (copy / name).write_bytes((real / name).read_bytes() + b"\n# a default changed\n")
        assert models.stamp_of_sources(copy) not in (None, models.parser_stamp())
        (copy / name).unlink()
        assert models.stamp_of_sources(copy) is None  # unreadable: nothing stored is trusted


@pytest.mark.parametrize("stamp", ["0.1.0+another-parser", None])
def test_a_form_stored_by_another_parser_is_parsed_again(stamp: str | None, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    record = _stored(tmp_path, EVERY_SERVICE_FIELD)
    expected = record.spec.service
    parses = count_parses(monkeypatch)
    monkeypatch.setattr(models, "parser_stamp", lambda: stamp)
    assert _with_spec_json(record, record.spec_json).service_spec == expected
    assert len(parses) == 1
