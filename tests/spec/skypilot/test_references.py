"""``$VAR`` and ``${VAR}`` in the fields SkyPilot fills them into: the readiness probe's path, post_data strings
(keys and values) and headers (names and values), `workdir`, `file_mounts` (destinations and sources) and
`service.tls`.

- an env's value is filled in when the task is bound (``spec.inputs.bind``);
- a secret's is not: the probe keeps ``$NAME`` in its headers and post_data and names the secret's digest
  (``ReadinessProbe.secrets``), and the prober fills the value into one request (``controller.probe``'s
  ``read_probe_secrets`` and ``fill_probe_secrets``); a secret named in a path, the probe's included, or in a
  header name is refused;
- any other name is kept as written, and ``find_unfilled_references`` says where.

No secret value shows in a bound spec's repr, in the text a version stores or in its stored inputs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from skyserve_lite.api import bind_submission
from skyserve_lite.controller.probe import fill_probe_secrets, read_probe_secrets
from skyserve_lite.errors import SpecError, StateConflictError
from skyserve_lite.spec.inputs import BoundInputs, bind, find_unfilled_references, with_inputs
from skyserve_lite.spec.model import ReadinessProbe, Secret, TaskSpec, TlsFiles
from skyserve_lite.spec.parse import parse_task, read_task
from skyserve_lite.state.secrets import SecretStore

ENVS = (("MODEL", "llama"), ("ROOT", "/srv"), ("HEALTH", "/healthz"), ("QUOTED", 'say "hi"'))
DIGEST = "0123456789abcdef0123456789abcdef"
OTHER_DIGEST = "fedcba9876543210fedcba9876543210"


def task(service: dict[str, Any] | None = None, **fields: Any) -> str:
    """A task declaring the envs of ``ENVS`` (values left to the submission) and the secrets API_KEY and
    OTHER_KEY, with ``service`` (one replica) and ``fields``."""
    doc: dict[str, Any] = {"run": "python -m http.server $PORT", "envs": {name: None for name, _ in ENVS},
                           "secrets": {"API_KEY": None, "OTHER_KEY": None},
                           "service": {"replicas": 1, **(service or {})}}
    doc.update(fields)
    return yaml.safe_dump(doc, sort_keys=False)


def probe(**fields: Any) -> dict[str, Any]:
    return {"readiness_probe": {"path": "/", **fields}}


def bound(text: str, envs: tuple[tuple[str, str], ...] = ENVS) -> TaskSpec:
    return bind(parse_task(text), BoundInputs(envs=envs, secrets=(("API_KEY", DIGEST), ("OTHER_KEY", OTHER_DIGEST))),
                "svc.yaml")


def getter(name: str) -> Any:
    """What a row reads of a bound spec."""
    def read(spec: TaskSpec) -> Any:
        probe_ = spec.service.readiness_probe
        return {"path": probe_.path, "post_data": probe_.post_data, "headers": probe_.headers,
                "secrets": probe_.secrets, "workdir": spec.workdir, "file_mounts": spec.file_mounts,
                "tls": spec.service.tls}[name]
    return read


# task -> what is read -> its value once bound
FILLED = [
    # --- envs: filled in -----------------------------------------------------------------------------------
    pytest.param(task(probe(path="/v1/$MODEL/health")), "path", "/v1/llama/health", id="probe-path-bare"),
    pytest.param(task(probe(path="/v1/${MODEL}x")), "path", "/v1/llamax", id="probe-path-braced"),
    pytest.param(task(probe(path="$HEALTH")), "path", "/healthz", id="probe-path-all-of-it"),
    pytest.param(task({"readiness_probe": "/$MODEL"}), "path", "/llama", id="probe-as-string"),
    pytest.param(task(probe(post_data={"model": "$MODEL", "n": 1, "tags": ["${MODEL}-7b"]})), "post_data",
                 '{"model":"llama","n":1,"tags":["llama-7b"]}', id="post-data-values"),
    pytest.param(task(probe(post_data={"${MODEL}_id": {"$MODEL": True}})), "post_data",
                 '{"llama_id":{"llama":true}}', id="post-data-keys"),
    pytest.param(task(probe(post_data='{"model": "$MODEL"}')), "post_data", '{"model":"llama"}',
                 id="post-data-json-string"),
    # a value with quotes stays one string: the document keeps its shape
    pytest.param(task(probe(post_data={"text": "$QUOTED"})), "post_data", '{"text":"say \\"hi\\""}',
                 id="post-data-quotes-stay-in-the-string"),
    pytest.param(task(probe(headers={"X-Model": "$MODEL", "X-Both": "${MODEL}/$ROOT"})), "headers",
                 (("X-Both", "llama//srv"), ("X-Model", "llama")), id="header-values"),
    pytest.param(task(probe(headers={"X-$MODEL": "on"})), "headers", (("X-llama", "on"),), id="header-name"),
    pytest.param(task(workdir="$ROOT/app"), "workdir", "/srv/app", id="workdir"),
    pytest.param(task(file_mounts={"/data/${MODEL}": "${ROOT}/models/$MODEL", "/cfg": "s3://b/$MODEL"}), "file_mounts",
                 (("/cfg", "s3://b/llama"), ("/data/llama", "/srv/models/llama")), id="file-mounts-both-sides"),
    pytest.param(task({"tls": {"keyfile": "$ROOT/key.pem", "certfile": "${ROOT}/cert.pem"}}), "tls",
                 TlsFiles(keyfile="/srv/key.pem", certfile="/srv/cert.pem"), id="tls"),
    # --- a name that is neither: kept as written -----------------------------------------------------------
    pytest.param(task(workdir="$NOPE/app"), "workdir", "$NOPE/app", id="unknown-kept-in-workdir"),
    pytest.param(task(probe(headers={"X-A": "$MODELS"})), "headers", (("X-A", "$MODELS"),),
                 id="a-longer-name-is-another-name"),
    pytest.param(task(probe(path="/v1/$NOPE")), "path", "/v1/$NOPE", id="unknown-kept-in-probe-path"),
    # --- secrets: the probe keeps the reference and names the digest ---------------------------------------
    pytest.param(task(probe(headers={"Authorization": "Bearer $API_KEY"})), "headers",
                 (("Authorization", "Bearer $API_KEY"),), id="secret-header-kept"),
    pytest.param(task(probe(headers={"Authorization": "Bearer $API_KEY"})), "secrets", (("API_KEY", DIGEST),),
                 id="secret-header-digest"),
    pytest.param(task(probe(post_data={"auth": "$API_KEY", "model": "$MODEL"})), "post_data",
                 '{"auth":"$API_KEY","model":"llama"}', id="secret-post-data-kept"),
    pytest.param(task(probe(post_data={"auth": "$API_KEY", "other": "$OTHER_KEY"})), "secrets",
                 (("API_KEY", DIGEST), ("OTHER_KEY", OTHER_DIGEST)), id="two-secrets-two-digests"),
    pytest.param(task(probe(headers={"X-Model": "$MODEL"})), "secrets", (), id="no-secret-referenced-none-named"),
]


@pytest.mark.parametrize(("text", "what", "value"), FILLED)
def test_references_are_filled_from_envs_and_secrets_stay_references(text: str, what: str, value: object) -> None:
    assert getter(what)(bound(text)) == value


_PROBE = "service.readiness_probe"
_NOT_INTO_PATHS = "a secret is not filled into paths"

REFUSED = [
    pytest.param(task(workdir="$API_KEY/app"), "workdir", _NOT_INTO_PATHS, id="secret-in-workdir"),
    pytest.param(task(workdir="/srv/${OTHER_KEY}"), "workdir", "refers to the secret OTHER_KEY",
                 id="secret-braced-in-workdir"),
    pytest.param(task(file_mounts={"/data": "/srv/$API_KEY"}), "file_mounts./data", _NOT_INTO_PATHS,
                 id="secret-in-mount-source"),
    pytest.param(task(file_mounts={"/data/$API_KEY": "/srv/data"}), "file_mounts./data/$API_KEY", _NOT_INTO_PATHS,
                 id="secret-in-mount-destination"),
    pytest.param(task({"tls": {"keyfile": "$API_KEY.pem", "certfile": "c.pem"}}), "service.tls.keyfile",
                 _NOT_INTO_PATHS, id="secret-in-tls-keyfile"),
    pytest.param(task({"tls": {"keyfile": "k.pem", "certfile": "${API_KEY}"}}), "service.tls.certfile",
                 _NOT_INTO_PATHS, id="secret-in-tls-certfile"),
    pytest.param(task(probe(headers={"X-$API_KEY": "on"})), f"{_PROBE}.headers.X-$API_KEY", "refers to the secret",
                 id="secret-in-header-name"),
    pytest.param(task(probe(path="$MODEL/health")), f"{_PROBE}.path", "must start with '/', got 'llama/health'",
                 id="probe-path-no-slash-once-filled"),
    pytest.param(task(probe(path="$NOPE")), f"{_PROBE}.path", "must start with '/'", id="probe-path-unknown-name"),
    # a request line is what access logs repeat: no secret in the probe's path either
    pytest.param(task(probe(path="/h?key=${API_KEY}&m=$MODEL")), f"{_PROBE}.path", _NOT_INTO_PATHS,
                 id="secret-in-probe-path"),
    pytest.param(task(probe(path="$API_KEY")), f"{_PROBE}.path", "refers to the secret API_KEY",
                 id="probe-path-only-a-secret"),
    pytest.param(task(probe(headers={"X-A": "$BREAK"})), f"{_PROBE}.headers.X-A", "no longer valid",
                 id="header-value-with-crlf"),
    pytest.param(task(probe(headers={"X-A": "v$NUL"})), f"{_PROBE}.headers.X-A", "no longer valid",
                 id="header-value-with-lf"),
    pytest.param(task(probe(headers={"$SPACED": "v"})), f"{_PROBE}.headers.$SPACED", "no longer valid",
                 id="header-name-not-a-token"),
    pytest.param(task(file_mounts={"/data/$UP": "/srv"}), "file_mounts./data/$UP", "may not contain '..'",
                 id="mount-destination-climbs-once-filled"),
    pytest.param(task(file_mounts={"/data/$MODEL": "/a", "/data/llama": "/b"}), "file_mounts./data/llama",
                 "the destination of another mount", id="two-mounts-become-one"),
]
_REFUSAL_ENVS = (*ENVS, ("BREAK", "a\r\nX-Injected: 1"), ("NUL", "\n"), ("SPACED", "X Bad"), ("UP", ".."))


@pytest.mark.parametrize(("text", "path", "problem"), REFUSED)
def test_a_filled_field_is_refused_naming_it(text: str, path: str, problem: str) -> None:
    with pytest.raises(SpecError) as caught:
        bound(text, _REFUSAL_ENVS)
    assert caught.value.path == path
    assert problem in caught.value.problem


# task -> the lines find_unfilled_references gives for it once bound (field, then the reference)
UNFILLED = [
    pytest.param(task(probe(path="/$MODEL"), workdir="$ROOT/app"), [], id="all-filled"),
    pytest.param(task(workdir="$NOPE/app"), [("workdir", "$NOPE")], id="workdir"),
    pytest.param(task(probe(path="/v1/${NOPE}", post_data={"k": "$GONE"}, headers={"X-A": "$MISSING"})),
                 [(f"{_PROBE}.path", "${NOPE}"), (f"{_PROBE}.post_data", "$GONE"),
                  (f"{_PROBE}.headers.X-A", "$MISSING")], id="probe"),
    pytest.param(task(file_mounts={"/d": "s3://b/$BUCKET"}), [("file_mounts./d", "$BUCKET")], id="mount"),
    pytest.param(task({"tls": {"keyfile": "$CERTS/k.pem", "certfile": "$ROOT/c.pem"}}),
                 [("service.tls.keyfile", "$CERTS")], id="tls"),
    # a secret is known: it is filled in at the request, not "used as written"
    pytest.param(task(probe(headers={"Authorization": "Bearer $API_KEY"})), [], id="secret-is-not-unfilled"),
]


@pytest.mark.parametrize(("text", "lines"), UNFILLED)
def test_unfilled_references_are_listed_where_they_are(text: str, lines: list[tuple[str, str]]) -> None:
    notes = find_unfilled_references(bound(text))
    assert [note.split(": ", 1)[0] for note in notes] == [field for field, _ in lines]
    for note, (_, reference) in zip(notes, lines, strict=True):
        assert f"{reference} is neither in envs nor in secrets, so it is used as written" in note


VALUES = {DIGEST: "sk-live-51d3", OTHER_DIGEST: 'o"th\\er'}

# probe as bound -> what the request sends (path, post_data, headers)
PROBES = [
    pytest.param(ReadinessProbe(path="/h", headers=(("Authorization", "Bearer $API_KEY"),),
                                secrets=(("API_KEY", DIGEST),)),
                 ("/h", None, (("Authorization", "Bearer sk-live-51d3"),)), id="header"),
    pytest.param(ReadinessProbe(path="/h", post_data='{"auth":"$API_KEY","n":1,"o":["${OTHER_KEY}"]}',
                                secrets=(("API_KEY", DIGEST), ("OTHER_KEY", OTHER_DIGEST))),
                 ("/h", json.dumps({"auth": "sk-live-51d3", "n": 1, "o": ['o"th\\er']}, sort_keys=True,
                                   separators=(",", ":")), ()), id="post-data-quotes-escaped"),
    pytest.param(ReadinessProbe(path="/h", post_data='{"$API_KEY":"k"}', secrets=(("API_KEY", DIGEST),)),
                 ("/h", '{"sk-live-51d3":"k"}', ()), id="post-data-key"),
    # a name the probe names no digest for is left as it is
    pytest.param(ReadinessProbe(path="/h", headers=(("X-A", "$API_KEY $NOPE"),), secrets=(("API_KEY", DIGEST),)),
                 ("/h", None, (("X-A", "sk-live-51d3 $NOPE"),)), id="only-named-secrets"),
    # never into the path (bind refuses one there; a probe made otherwise keeps its reference)
    pytest.param(ReadinessProbe(path="/h/$API_KEY", secrets=(("API_KEY", DIGEST),)), ("/h/$API_KEY", None, ()),
                 id="never-into-the-path"),
    pytest.param(ReadinessProbe(path="/h", headers=(("X-A", "$API_KEY"),)), ("/h", None, (("X-A", "$API_KEY"),)),
                 id="no-secrets-nothing-read"),
]


@pytest.mark.parametrize(("probe_", "sent"), PROBES)
def test_the_prober_fills_secrets_into_the_request_only(
        probe_: ReadinessProbe, sent: tuple[str, str | None, tuple[tuple[str, str], ...]]) -> None:
    read: list[str] = []

    def read_secret(digest: str) -> str:
        read.append(digest)
        return VALUES[digest]

    filled = fill_probe_secrets(probe_, read_probe_secrets(probe_, read_secret))
    assert (filled.path, filled.post_data, filled.headers) == sent
    assert sorted(read) == sorted(digest for _, digest in probe_.secrets)
    assert filled.secrets == probe_.secrets


def test_a_probe_whose_secret_cannot_be_read_is_not_sent() -> None:
    probe_ = ReadinessProbe(headers=(("X-A", "$API_KEY"),), secrets=(("API_KEY", DIGEST),))
    with pytest.raises(StateConflictError, match="refers to the secret API_KEY, and this controller has no secret"):
        read_probe_secrets(probe_, None)


def test_a_secret_with_a_line_break_is_not_sent_and_not_shown() -> None:
    probe_ = ReadinessProbe(headers=(("X-A", "$API_KEY"),), secrets=(("API_KEY", DIGEST),))
    with pytest.raises(StateConflictError) as caught:
        fill_probe_secrets(probe_, {"API_KEY": "v\r\nX-Injected: 1"})
    assert "the probe header X-A holds a line break" in str(caught.value)
    assert "X-Injected" not in str(caught.value)


SECRET_TASK = """\
run: python -m http.server $PORT
envs: {MODEL: llama}
secrets:
  API_KEY: null
  INLINE_KEY: sk-inline-77aa
service:
  replicas: 1
  readiness_probe:
    path: /v1/$MODEL/health
    post_data: {"model": "$MODEL", "token": "${API_KEY}"}
    headers:
      Authorization: Bearer $API_KEY
      X-Inline: $INLINE_KEY
"""


def test_a_submitted_secret_reaches_the_probe_request_and_nothing_stored(tmp_path: Path) -> None:
    given = "sk-given-93f0"
    store = SecretStore(tmp_path)
    task_ = with_inputs(read_task(SECRET_TASK, str(tmp_path / "svc.yaml")), (), [("API_KEY", Secret(given))], "local")
    submitted, inputs = bind_submission(task_, None, store, keep_secrets=True)
    probe_ = submitted.spec.service.readiness_probe
    assert probe_.path == "/v1/llama/health"
    assert probe_.post_data == '{"model":"llama","token":"${API_KEY}"}'
    assert probe_.headers == (("Authorization", "Bearer $API_KEY"), ("X-Inline", "$INLINE_KEY"))
    assert probe_.secrets == tuple(sorted(inputs.secrets))
    assert [name for name, _ in probe_.secrets] == ["API_KEY", "INLINE_KEY"]
    for value in (given, "sk-inline-77aa"):  # nothing a version stores or shows holds a value
        assert value not in submitted.text
        assert value not in inputs.to_json()
        assert value not in repr(submitted)
        assert value not in repr(submitted.spec)
    request = fill_probe_secrets(probe_, read_probe_secrets(probe_, lambda digest: store.get(digest).value))
    assert json.loads(request.post_data or "") == {"model": "llama", "token": given}
    assert request.headers == (("Authorization", f"Bearer {given}"), ("X-Inline", "sk-inline-77aa"))
    assert given not in repr(probe_)  # the bound probe itself is unchanged


def test_a_plan_notes_the_references_nothing_fills(tmp_path: Path) -> None:
    text = task(probe(headers={"X-A": "$MISSING"}), workdir="/srv/$NOPE")
    given = tuple((name, value) for name, value in ENVS)
    task_ = with_inputs(read_task(text), given, [("API_KEY", Secret("a")), ("OTHER_KEY", Secret("b"))], "local")
    notes: list[str] = []
    bind_submission(task_, None, SecretStore(tmp_path), keep_secrets=False, notes=notes)
    assert [note.split(": ", 1)[0] for note in notes] == ["workdir", f"{_PROBE}.headers.X-A"]
    assert not (tmp_path / "secrets").exists()  # a plan keeps no value
