"""`sky-lite`: parse arguments, call the api, render. No decisions and no state access live here.

Every start of the command imports this module and builds every command's options (`sky-lite --help`
included), so at module level it imports only click and light modules (``cli.params``, ``defaults``,
``errors``); each command imports what it needs when it runs: the api (and with it the state store and the
spec parser), rich, the renderers. ``tests/cli/test_cli.py`` holds `--help` to that.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from skyserve_lite import __version__
from skyserve_lite.cli import host_commands
from skyserve_lite.cli.common import NO_SERVICES as _NO_SERVICES
from skyserve_lite.cli.common import errors as _errors
from skyserve_lite.cli.common import get_controller as _controller
from skyserve_lite.cli.common import has_nothing_to_show as _has_nothing_to_show
from skyserve_lite.cli.common import home_dir
from skyserve_lite.cli.common import one_shot_collection as _one_shot_collection
from skyserve_lite.cli.common import stderr as _stderr
from skyserve_lite.cli.completion import complete_replica_ids, complete_service_names
from skyserve_lite.cli.params import FiniteFloatRange
from skyserve_lite.defaults import DEFAULT_EVENTS, UPDATE_MODES
from skyserve_lite.errors import NotFoundError, StateConflictError, UsageError

if TYPE_CHECKING:
    from rich.console import Console

    from skyserve_lite import api, waits
    from skyserve_lite.host_endpoints import EndpointView
    from skyserve_lite.plan.canary import CanarySettings, Command
    from skyserve_lite.plan.rollout import UpdateMode
    from skyserve_lite.spec.model import SubmittedTask
    from skyserve_lite.state.models import ReplicaRecord

F = TypeVar("F", bound=Callable[..., Any])


def _stdout() -> Console:
    import os

    from rich.console import Console

    if sys.stdout.isatty():
        return Console()  # the terminal's width, or COLUMNS when set (rich reads it)
    # Piped output is read by people in logs and by grep: not squeezed into rich's 80 columns for a pipe,
    # but as wide as COLUMNS says when it is set (`COLUMNS=100 sky-lite serve status | less`).
    columns = os.environ.get("COLUMNS", "").strip()
    return Console(width=int(columns) if columns.isdecimal() and int(columns) > 0 else 200)


def _load_task(task_file: Path) -> SubmittedTask:
    from skyserve_lite.spec.parse import load_task_file

    return load_task_file(task_file.resolve())


def _dump(document: object) -> str:
    """JSON as every ``-o json`` prints it."""
    import json

    return json.dumps(document, indent=2)


def _reuse_files_option(func: F) -> F:
    return click.option("--reuse-identical-files", is_flag=True,
                        help="Reuse replicas whose whole config is equal, workdir and file_mounts contents "
                        "included (by default a non-empty workdir or file_mounts replaces every replica).")(func)


def _yes_option(func: F) -> F:
    return click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")(func)


def _inputs_options(func: F) -> F:
    """``--infra``, ``--env``, ``--env-file`` and ``--secret``: what a submission adds to the task's YAML."""
    for option in reversed([
        click.option("--infra", default=None, metavar="CLOUD[/REGION[/ZONE]]",
                     help="Where to run when the task names no cloud (default: the previous version's, then "
                     "`sky-lite config set default_infra`, then local)."),
        click.option("--env", "envs", multiple=True, metavar="NAME[=VALUE]",
                     help="Set an env var of the replicas (NAME alone: its value here); repeatable; over the "
                     "task's envs."),
        click.option("--env-file", "env_files", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
                     help="A dotenv file of NAME=VALUE lines to set as --env does; repeatable."),
        click.option("--secret", "secrets", multiple=True, metavar="NAME[=VALUE]",
                     help="Set a secret env var (NAME alone: its value here); never stored with the task, "
                     "shown or logged; repeatable."),
    ]):
        func = option(func)
    return func


def _with_inputs(task: SubmittedTask, infra: str | None, envs: tuple[str, ...], env_files: tuple[Path, ...],
                 secrets: tuple[str, ...]) -> SubmittedTask:
    """``task`` with the command line's inputs, checked (every value the file leaves open is given)."""
    import os

    from skyserve_lite.errors import SpecError
    from skyserve_lite.spec.inputs import read_assignments, read_env_file, with_inputs
    from skyserve_lite.spec.model import Secret
    from skyserve_lite.spec.parse import parse_infra
    from skyserve_lite.userconfig import load_config

    if infra is not None:
        try:
            infra = parse_infra(infra, "--infra", "the command line").describe()
        except SpecError as exc:  # an option, not a file's field: named once, as every usage error is
            raise UsageError(f"--infra: {exc.problem}") from None
    values: dict[str, str] = {}
    for env_file in env_files:
        values.update(read_env_file(env_file))
    values.update(read_assignments("--env", envs, os.environ))
    secret_values = read_assignments("--secret", secrets, os.environ)
    default_infra = load_config(home_dir()).get("default_infra")
    return with_inputs(task, tuple(sorted(values.items())),
                       [(name, Secret(value)) for name, value in sorted(secret_values.items())], infra, default_infra)


def _rollout_wait_options(func: F) -> F:
    """``--wait/--no-wait`` and ``--timeout`` of the commands that start a rollout."""
    func = click.option("--timeout", type=FiniteFloatRange(min=0), default=None,
                        help="Seconds to wait for the rollout [default: 600; a canary: 600 plus its steps x "
                        "(1 + extensions) x bake].")(func)
    return click.option("--wait/--no-wait", default=True, show_default=True,
                        help="Wait until the new version is rolled out (a live view on stderr); exit 1 when it "
                        "fails or the timeout passes.")(func)


def _output_option(func: F) -> F:
    return click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table",
                        show_default=True, help="Output format; json prints only JSON on stdout.")(func)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sky-lite")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Serve an HTTP workload on replicas behind one endpoint."""


@main.group()
def serve() -> None:
    """Start, inspect and stop services."""


@serve.command("up")
@click.argument("task_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-n", "--name", help="Service name (default: the YAML's name, else the file's stem).")
@click.option("-y", "--yes", is_flag=True, help="Accepted for symmetry with the other commands; `serve up` asks "
              "nothing.")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait until the service is READY.")
@click.option("--timeout", type=FiniteFloatRange(min=0), default=600.0, show_default=True,
              help="Seconds to wait for READY.")
@click.option("--endpoint-port", type=click.IntRange(1, 65535), default=None,
              help="Pin the load balancer's port: refused at once if taken, never moved later (default: the first "
              "free port from 30001).")
@click.option("--dry-run", is_flag=True, help="Validate, resolve resources and print what would be launched "
              "(cloud, region, instance type, price, image, market per replica); store and launch nothing.")
@_output_option
@_inputs_options
def serve_up(task_file: Path, name: str | None, yes: bool, wait: bool, timeout: float, endpoint_port: int | None,
             dry_run: bool, output: str, infra: str | None, envs: tuple[str, ...], env_files: tuple[Path, ...],
             secrets: tuple[str, ...]) -> None:
    """Start a service from TASK_FILE."""
    from rich.live import Live

    from skyserve_lite import api, waits
    from skyserve_lite.cli.render import launch_plan_renderable, status_renderable
    from skyserve_lite.spec.inputs import check_given
    from skyserve_lite.state.models import ServiceStatus

    del yes  # `serve up` asks nothing; accepted so that scripts can pass -y to every command
    with _errors():
        task = _with_inputs(_load_task(task_file), infra, envs, env_files, secrets)
        name = name or api.default_service_name(task)
        api.check_service_name(name)
        check_given(task)
        controller = _controller()
        if dry_run:
            plan = controller.plan_create(name, task)
            if output == "json":
                click.echo(_dump(plan.to_json()))
            else:
                _stdout().print(launch_plan_renderable(plan))
            return
        service = controller.create_service(name, task, endpoint_port=endpoint_port)
        if not wait:
            click.echo(f"Service {name} submitted; it will answer at {service.endpoint} once a replica is "
                       f"READY (see `sky-lite serve status {name}`).")
            return
        console = _stderr()
        try:
            with Live(console=console, transient=True, refresh_per_second=4) as live:
                def progress(view: api.ServiceView) -> None:
                    live.update(status_renderable([view]))

                view = waits.wait_until_ready(controller, name, timeout, on_progress=progress)
        except KeyboardInterrupt:
            click.echo(f"Stopped waiting; the controller keeps starting {name} (`sky-lite serve status {name}`); "
                       f"`sky-lite serve down {name}` cancels it.", err=True)
            sys.exit(130)
        if view.service.status is ServiceStatus.NO_REPLICA:
            click.echo(f"Service {name} is scaled to zero at {view.service.endpoint}; the first request starts "
                       "a replica")
        else:
            click.echo(f"Service {name} is READY at {view.service.endpoint}")


@serve.command("update")
@click.argument("name", shell_complete=complete_service_names)
@click.argument("task_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--mode", type=click.Choice(UPDATE_MODES), default=UPDATE_MODES[0],
              show_default=True, help="rolling: replace as new replicas become READY; blue_green: switch all "
              "traffic once the new version has min_replicas READY; canary: a share of the traffic in steps, "
              "judged on its errors, then promoted or rolled back.")
@click.option("--steps", default=None, metavar="PCT,PCT",
              help="canary: the new version's share of the requests at each step (default: the task's "
              "service.canary, else 10,50).")
@click.option("--bake", default=None, metavar="DURATION",
              help="canary: how long each step runs before it is judged (2m, 90s; default 2m).")
@click.option("--max-error-rate", default=None, metavar="RATE",
              help="canary: 5xx and failed attempts over the new version's requests above which it is rolled "
              "back (0.02 or 2%; default 0.02).")
@click.option("--auto-rollback", is_flag=True,
              help="rolling, blue_green: roll back when the new version's replicas keep failing before READY "
              "or its error rate over --bake after taking traffic is above --max-error-rate.")
@click.option("--dry-run", is_flag=True, help="Print the plan and change nothing.")
@click.option("--expect-version", type=int, default=None,
              help="Refuse unless the service is at this version (guards against concurrent updates).")
@_reuse_files_option
@_yes_option
@_output_option
@_rollout_wait_options
@_inputs_options
def serve_update(name: str, task_file: Path, mode: str, steps: str | None, bake: str | None,
                 max_error_rate: str | None, auto_rollback: bool, dry_run: bool, expect_version: int | None,
                 reuse_identical_files: bool, yes: bool, output: str, wait: bool, timeout: float | None,
                 infra: str | None,
                 envs: tuple[str, ...], env_files: tuple[Path, ...], secrets: tuple[str, ...]) -> None:
    """Update service NAME to TASK_FILE, reusing replicas whose config is unchanged.

    Values of envs and secrets the file declares without a value are kept from the current version unless
    given again."""
    from skyserve_lite import waits
    from skyserve_lite.cli.canary_options import compute_canary_settings
    from skyserve_lite.plan.rollout import UpdateMode

    with _errors():
        update_mode = UpdateMode(mode)
        is_canary = update_mode is UpdateMode.CANARY
        if auto_rollback and is_canary:
            raise UsageError("--auto-rollback goes with --mode rolling or blue_green (a canary rolls back itself)")
        allowed = {"--steps", "--bake", "--max-error-rate"} if is_canary else (
            {"--bake", "--max-error-rate"} if auto_rollback else set())
        given = [flag for flag, value in (("--steps", steps), ("--bake", bake), ("--max-error-rate", max_error_rate))
                 if value is not None and flag not in allowed]
        if given:
            raise UsageError(f"{given[0]} goes with --mode canary" + ("" if given[0] == "--steps" else
                                                                      " or --auto-rollback"))
        task = _with_inputs(_load_task(task_file), infra, envs, env_files, secrets)
        canary = (compute_canary_settings(task.spec.service.canary, steps, bake, max_error_rate)
                  if is_canary or auto_rollback else None)
        if timeout is None:  # a canary's bake windows alone may be longer than the 600 s a rollout gets
            timeout = waits.compute_rollout_wait_seconds(canary, watch=not is_canary)
        _update(name, task, update_mode, dry_run, expect_version, yes, output,
                reuse_identical_files=reuse_identical_files, wait_timeout=timeout if wait else None, canary=canary)


@serve.command("rollout")
@click.argument("name", shell_complete=complete_service_names)
@click.argument("action", type=click.Choice(["promote", "abort", "pause", "resume"]))
def serve_rollout(name: str, action: str) -> None:
    """Decide on service NAME's canary rollout: promote it to 100% now, abort it (roll back now), pause it
    where it is, or resume it (with a fresh bake window)."""
    from skyserve_lite.plan.canary import Command

    with _errors():
        controller = _controller()
        command = Command(action)
        # A command the controller has not acted on yet is replaced by this one: an `abort` followed within a
        # pass (2 s) by a `pause` is never carried out, so the person is told which one was dropped.
        pending = _pending_rollout_command(controller, name)
        controller.request_rollout(name, command)
        follow = f"`sky-lite serve wait {name}` follows it."
        if pending is command:
            click.echo(f"The controller was asked to {action} the canary rollout of {name} already and has not "
                       f"done it yet; {follow}")
        elif pending is not None:
            click.echo(f"Asked the controller to {action} the canary rollout of {name} instead of the "
                       f"`{pending.value}` asked before, which it had not done yet and now will not; {follow}")
        else:
            click.echo(f"Asked the controller to {action} the canary rollout of {name}; {follow}")


def _pending_rollout_command(controller: api.Controller, name: str) -> Command | None:
    """The `serve rollout` command of ``name``'s canary not acted on yet; None when there is none, or no such
    service (``request_rollout`` then says what is wrong)."""
    try:
        (view,) = controller.get_status([name], events=0)
    except NotFoundError:
        return None
    return view.canary.command if view.canary is not None else None


@serve.command("rollback")
@click.argument("name", shell_complete=complete_service_names)
@click.option("--to", "to_version", type=click.IntRange(min=1), default=None,
              help="The version to go back to (default: the one before the current).")
@click.option("--mode", type=click.Choice(UPDATE_MODES), default=UPDATE_MODES[0],
              show_default=True)
@click.option("--dry-run", is_flag=True, help="Print the plan and change nothing.")
@click.option("--expect-version", type=int, default=None, help="Refuse unless the service is at this version.")
@_reuse_files_option
@_yes_option
@_output_option
@_rollout_wait_options
def serve_rollback(name: str, to_version: int | None, mode: str, dry_run: bool, expect_version: int | None,
                   reuse_identical_files: bool, yes: bool, output: str, wait: bool, timeout: float | None) -> None:
    """Update service NAME to an earlier version's stored task and files, with the same reuse rules."""
    from skyserve_lite import api, waits
    from skyserve_lite.plan.canary import find_canary_settings
    from skyserve_lite.plan.rollout import UpdateMode

    with _errors():
        state = _controller().get_rollout_state(name)
        task, target = api.rollback_task(state, to_version)
        update_mode = UpdateMode(mode)
        if timeout is None:  # a canary rollback bakes as the task's `service.canary` (or the defaults) say
            timeout = waits.compute_rollout_wait_seconds(
                find_canary_settings(task.spec.service.canary) if update_mode is UpdateMode.CANARY else None)
        _update(name, task, update_mode, dry_run, expect_version, yes, output, rollback_to=target,
                reuse_identical_files=reuse_identical_files, wait_timeout=timeout if wait else None)


@serve.command("wait")
@click.argument("name", shell_complete=complete_service_names)
@click.option("--version", "version", type=click.IntRange(min=1), default=None,
              help="The version to wait for (default: the service's current one).")
@click.option("--timeout", type=FiniteFloatRange(min=0), default=None,
              help="Seconds to wait [default: 600; a canary: 600 plus its steps x (1 + extensions) x bake].")
def serve_wait(name: str, version: int | None, timeout: float | None) -> None:
    """Wait until service NAME's rollout (of its current version, or --version N) is done, as
    `update --wait` does: a live view on stderr, exit 1 naming what is stuck when it fails or times out."""
    with _errors():
        # Killed or never restarted (after a reboot), no controller moves the rollout: say so rather than wait
        # the whole --timeout (10 minutes by default) in silence. `update --wait` has just started one. Not
        # `get_status_report`: that also asks every endpoint (up to 1 s each), which a wait has no use for.
        controller = _controller()
        (view,) = controller.get_status([name], events=0)  # an unknown name is refused before any warning
        if not controller.controller_status().running:
            click.echo("Warning: no controller is running, so the rollout does not move while this waits. Start "
                       "it with `sky-lite controller start`.", err=True)
        if timeout is None:  # a canary's bake windows alone may be longer than the 600 s a rollout gets
            from skyserve_lite import waits

            timeout = waits.find_rollout_wait_seconds(view, version)
        _wait_for_rollout(name, version, timeout)


def _wait_for_rollout(name: str, version: int | None, timeout: float) -> None:
    """Follow a rollout on stderr until it is done (one line on stdout), or raise ``WaitTimeoutError``;
    Ctrl-C stops only the waiting (exit 130)."""
    from rich.console import Group
    from rich.live import Live

    from skyserve_lite import waits
    from skyserve_lite.cli.render import status_renderable
    from skyserve_lite.cli.rollout_view import rollout_renderable

    controller = _controller()
    started = time.monotonic()
    following = version
    try:
        with Live(console=_stderr(), transient=True, refresh_per_second=4) as live:
            def progress(state: waits.RolloutProgress, view: api.ServiceView) -> None:
                nonlocal following
                following = state.version
                live.update(Group(rollout_renderable(state, time.monotonic() - started), status_renderable([view])))

            done = waits.wait_for_rollout(controller, name, version, timeout, on_progress=progress)
    except KeyboardInterrupt:
        which = f"version {following}" if following is not None else "the current version"
        click.echo(f"Stopped waiting; the controller keeps rolling out {which} of {name} "
                   f"(`sky-lite serve wait {name}` follows it again); `sky-lite serve down {name}` cancels it.",
                   err=True)
        sys.exit(130)
    click.echo(done.summary(time.monotonic() - started))


# A concurrent update between our plan and our submit makes us plan again; three in a row is a fight.
_REPLAN_ATTEMPTS = 3


def _update(name: str, task: SubmittedTask, mode: UpdateMode, dry_run: bool, expect_version: int | None,
            yes: bool, output: str, *, rollback_to: int | None = None, reuse_identical_files: bool = False,
            wait_timeout: float | None = None, canary: CanarySettings | None = None) -> None:
    """Plan, show, confirm and submit; then, with ``wait_timeout``, follow the rollout of the stored version.
    ``rollback_to``: the earlier version whose task this is (`serve rollback`)."""
    from skyserve_lite import api
    from skyserve_lite.cli.render import plan_renderable

    note = None if rollback_to is None else f"rollback to version {rollback_to}"
    api.check_submission(task)  # before the plan and the question, so a "yes" is never answered with an error
    controller = _controller()
    for attempt in range(_REPLAN_ATTEMPTS):
        plan = controller.plan_update(name, task, mode, reuse_identical_files=reuse_identical_files, canary=canary)
        if expect_version is not None and plan.from_version != expect_version:
            raise StateConflictError(f"service {name!r} is at version {plan.from_version}, not "
                                     f"{expect_version}; nothing was changed")
        if output == "json":
            click.echo(_dump(plan.to_json()))
        else:
            _stdout().print(plan_renderable(plan, rollback_to))
        if dry_run:
            return
        if not yes:
            click.confirm("Apply this update?" if rollback_to is None else "Apply this rollback?", abort=True,
                          err=True)
        try:
            # The plan shown is the plan of updating from_version: store it only on top of that version.
            version = controller.submit_update(name, task, mode, expect_version=plan.from_version, note=note,
                                               reuse_identical_files=reuse_identical_files, canary=canary)
        except StateConflictError:
            if expect_version is not None or attempt == _REPLAN_ATTEMPTS - 1:
                raise
            click.echo(f"Service {name} was updated by someone else meanwhile; planning again.", err=True)
            continue
        stored = f"Service {name} is rolling out version {version.version} ({mode.value})"
        if rollback_to is not None:
            stored += f", version {rollback_to}'s task"
        if wait_timeout is None:
            click.echo(f"{stored}; follow it with `sky-lite serve wait {name}`.", err=output == "json")
            return
        # Followed here and now (the live view on stderr): pointing at `serve wait` would say it is not.
        click.echo(f"{stored}.", err=output == "json")
        _wait_for_rollout(name, version.version, wait_timeout)
        return


@serve.command("history")
@click.argument("name", shell_complete=complete_service_names)
@_output_option
def serve_history(name: str, output: str) -> None:
    """List every version of service NAME and what each changed."""
    from skyserve_lite import api
    from skyserve_lite.cli.render import history_table

    with _errors():
        state = _controller().get_rollout_state(name)
        entries = api.describe_history(state.versions)
        if output == "json":
            click.echo(_dump({"service": name, "current_version": state.service.current_version,
                              "versions": [e.to_json() for e in entries]}))
        else:
            _stdout().print(history_table(name, entries))


@serve.command("simulate")
@click.argument("task_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--trace", "trace_file", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="CSV with a header: time_s,qps[,ongoing_requests]; each row holds until the next.")
@click.option("--period", type=FiniteFloatRange(min=0.1), default=None,
              help="Decision period in seconds (default: the policy's own, 20 s for request rate).")
@_output_option
@click.option("--plot", is_flag=True, help="Also draw qps and the replica target over time as a text chart on "
              "stderr, marking where the upscale and downscale delays held a change back.")
@click.option("--plot-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also draw that chart into this PNG file (needs matplotlib: the `plot` extra).")
@click.option("--plot-size", default=None, metavar="WxH",
              help="Pixel size of the --plot-file image (default 1200x600).")
def serve_simulate(task_file: Path, trace_file: Path, period: float | None, output: str, plot: bool,
                   plot_file: Path | None, plot_size: str | None) -> None:
    """Run TASK_FILE's autoscaling policy against a load trace offline and print the target over time."""
    from skyserve_lite.autoscalers.simulator import parse_trace, simulate
    from skyserve_lite.cli.chart import DEFAULT_HEIGHT, MIN_CHART_WIDTH, render_chart
    from skyserve_lite.cli.plot_file import DEFAULT_SIZE, parse_plot_size, write_plot_png
    from skyserve_lite.cli.render import simulation_table

    with _errors():
        if plot_size is not None and plot_file is None:
            raise UsageError("--plot-size goes with --plot-file")
        size = DEFAULT_SIZE if plot_size is None else parse_plot_size(plot_size)
        task = _load_task(task_file)
        try:
            text = trace_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--trace: cannot read {trace_file}: {exc}") from exc
        decisions = simulate(task.spec.service.replica_policy, parse_trace(text, str(trace_file)), period)
        policy = task.spec.service.replica_policy.describe()
        if plot_file is not None:  # first: a missing matplotlib fails before anything is printed
            write_plot_png(decisions, plot_file, size, title=f"Simulated: {policy}")
        if output == "json":
            click.echo(_dump({"decisions": [d.to_json() for d in decisions]}))
        else:
            _stdout().print(simulation_table(policy, decisions))
        if plot:
            width = max(MIN_CHART_WIDTH, _stderr().width)
            click.echo("\n".join(render_chart(decisions, width, DEFAULT_HEIGHT)), err=True)


@serve.command("status")
@click.argument("names", nargs=-1, shell_complete=complete_service_names)
@_output_option
@click.option("--endpoint", "endpoint_only", is_flag=True,
              help="Print only the endpoint URL of the one service named: curl $(sky-lite serve status NAME "
              "--endpoint).")
@click.option("--events", "events", type=click.IntRange(min=0), default=DEFAULT_EVENTS, show_default=True,
              help="How many of the newest events to show per service named (and in the JSON).")
@click.option("--replica-id", "replica_id", type=click.IntRange(min=1), default=None, metavar="ID",
              shell_complete=complete_replica_ids, help="With --pid: which replica of the one service named.")
@click.option("--pid", "pid_only", is_flag=True,
              help="Print only the pid of local replica --replica-id while it runs on this machine: the leader "
              "of its process group (kill -- -PID). Exit 1 when it has no running process here.")
def serve_status(names: tuple[str, ...], output: str, endpoint_only: bool, events: int, replica_id: int | None,
                 pid_only: bool) -> None:
    """Show services and their replicas (all services when no NAME is given)."""
    with _errors(), _one_shot_collection():
        if pid_only or replica_id is not None:
            click.echo(_replica_pid(names, replica_id, pid_only, endpoint_only))
            return
        if not names and not endpoint_only and output == "table" and _has_nothing_to_show():
            # Said without loading the store, the api and rich: they were most of the command's time.
            click.echo(_NO_SERVICES)
            return
        if endpoint_only:
            if len(names) != 1:
                raise UsageError("--endpoint prints one service's URL: name exactly one service")
            [view] = _controller().get_status(names)
            click.echo(view.service.endpoint)
            return
        # The table shows events only of services named: for the whole fleet they are not read.
        shown_events = events if output == "json" or names else 0
        report = _controller().get_status_report(names, events=shown_events)
        views, state = list(report.services), report.controller
        unverified = state.unverified_for
        endpoints = _endpoints_of(views)
        if output == "json":  # without the renderers: scripts polling a fleet's JSON do not import rich
            click.echo(_dump({"services": [view.to_json() | {"endpoints": [e.to_json() for e in
                                                                           endpoints[view.service.name]]}
                                           for view in views], "controller": state.to_json()}))
        else:
            from skyserve_lite.cli.render import status_renderable

            # Not cropped: every line fits the console already (``cli.fit``), and rich's crop measures each
            # line again, a third of printing 10,000 replicas.
            _stdout().print(status_renderable(views, events=bool(names), unverified_for=unverified), crop=False)
            from skyserve_lite.cli.render import endpoint_lines

            for line in endpoint_lines([(view.service.name, [(e.url, e.live) for e in endpoints[view.service.name]])
                                        for view in views]):
                click.echo(line)
            if names:
                from skyserve_lite.cli.sparkline import history_lines

                for line in history_lines(views):
                    click.echo(line)
        for view in views:  # its endpoint answers as something else (``api.check_endpoints``)
            if view.endpoint_problem is not None and output != "json":
                click.echo(f"Warning: {view.service.name}: {view.endpoint_problem}.", err=True)
        if views and not state.running:
            click.echo("Warning: no controller is running, so nothing above is being kept up to date or acted "
                       "on. Start it with `sky-lite controller start`.", err=True)
        elif views and unverified is not None:
            name = views[0].service.name
            click.echo(f"Warning: the controller (pid {state.pid}) has not completed a pass for {unverified:.0f}s, "
                       "so nothing above has been checked since (is the disk full?); see "
                       f"`sky-lite serve logs {name} --controller`.", err=True)


def _endpoints_of(views: Sequence[api.ServiceView]) -> Mapping[str, Sequence[EndpointView]]:
    """Each service's endpoint on every controller host sharing the database, and whether it is live: as the
    status asked them (``host_endpoints``), or for a host of an older sky-lite, which does not, as its
    controllers are listed (the service's own endpoint alone where they cannot be)."""
    from skyserve_lite.host_endpoints import find_endpoint_views

    if not views:
        return {}
    if all(view.endpoints for view in views):
        return {view.service.name: view.endpoints for view in views}
    from skyserve_lite.api import LocalController
    from skyserve_lite.controller.fleet import ControllerView
    from skyserve_lite.errors import ControllerVersionError

    controller = _controller()
    controllers: list[ControllerView] = []
    if not isinstance(controller, LocalController):
        from skyserve_lite.remote.client import RemoteController  # not for a local controller: ~20 ms

        if isinstance(controller, RemoteController):
            try:
                controllers = controller.list_controllers()
            except (ControllerVersionError, UsageError):
                controllers = []  # a host of an older sky-lite still: its endpoint alone
    return find_endpoint_views(views, controllers)


def _replica_pid(names: tuple[str, ...], replica_id: int | None, pid_only: bool, endpoint_only: bool) -> int:
    """`serve status NAME --replica-id N --pid`: the pid of that local replica's running process group
    leader, checked to be that process still (a pid file of a replica that ended names no one)."""
    from skyserve_lite.errors import NotFoundError
    from skyserve_lite.providers.local import find_live_replica, find_replicas_dir
    from skyserve_lite.spec.parse import is_valid_service_name

    if endpoint_only:
        raise UsageError("pass at most one of --endpoint and --pid")
    if replica_id is None or not pid_only:
        raise UsageError("--pid and --replica-id go together: serve status NAME --replica-id N --pid")
    if len(names) != 1:
        raise UsageError("--pid prints one replica's pid: name exactly one service")
    [name] = names
    home = home_dir()
    # The name is a path component below the state directory: one that is no service name has no replica.
    import os

    replicas_dir = find_replicas_dir(home, os.environ)
    found = find_live_replica(replicas_dir, name, replica_id) if is_valid_service_name(name) else None
    if found is None:
        raise NotFoundError(f"replica {replica_id} of {name} has no running process on this machine (--pid "
                            f"reads the local replicas in {replicas_dir})")
    return found.pid


@serve.command("down")
@click.argument("names", nargs=-1, shell_complete=complete_service_names)
@click.option("-a", "--all", "all_services", is_flag=True, help="Take down every service.")
@_yes_option
@click.option("--timeout", type=FiniteFloatRange(min=0), default=300.0, show_default=True,
              help="Seconds to wait for everything to stop.")
@click.option("--force", is_flag=True,
              help="With --all: stop everything this state directory started (controller, load balancers, "
              "replica processes, cloud instances by the controller tag) without reading its database, "
              "e.g. when state.db is damaged. Changes no file.")
@click.option("--region", "regions", multiple=True,
              help="With --force: also search this cloud region for instances (repeatable; the default "
              "region and those state.db still names are searched anyway).")
@click.option("--replica-id", "replica_ids", type=click.IntRange(min=1), multiple=True, metavar="ID",
              shell_complete=complete_replica_ids,
              help="Terminate only this replica of the one service named (repeatable); the controller "
              "launches a replacement when the policy still wants it.")
def serve_down(names: tuple[str, ...], all_services: bool, yes: bool, timeout: float, force: bool,
               regions: tuple[str, ...], replica_ids: tuple[int, ...]) -> None:
    """Stop services: every replica, the load balancer, and the controller when none is left.

    NAMES may be shell-style patterns ('dev-*', 'web-?'), matched against the services' names; quote them."""
    from skyserve_lite import api

    with _errors():
        if replica_ids:
            _down_replicas(names, all_services, force, yes, timeout, replica_ids)
            return
        if all_services == bool(names):
            raise click.UsageError("name the services to take down, or pass --all (not both)")
        if force or regions:
            _force_down(all_services, yes, force, regions)
            return
        controller = _controller()
        targets = api.match_service_names(names, [v.service.name for v in controller.get_status()]) if names \
            else [view.service.name for view in controller.get_status()]
        if not targets:
            click.echo("No service to take down.")
            return
        if not yes:
            whose = "Its replicas" if len(targets) == 1 else "Their replicas"
            click.confirm(f"Take down {', '.join(targets)}? {whose} will be terminated.", abort=True)
        controller.request_down(targets)
        with _stderr().status(f"Taking down {', '.join(targets)}..."):
            controller.finish_down(targets, timeout)
        for target in targets:
            click.echo(f"Service {target} is down.")


def _down_replicas(names: tuple[str, ...], all_services: bool, force: bool, yes: bool, timeout: float,
                   replica_ids: tuple[int, ...]) -> None:
    """`serve down NAME --replica-id N`: drain and terminate those replicas, and wait until they are gone."""
    from skyserve_lite import api, waits

    if all_services or force or len(names) != 1 or any(c in names[0] for c in "*?["):
        raise click.UsageError("--replica-id terminates replicas of one service: name exactly one service "
                               "(no pattern, --all or --force)")
    (name,) = names
    ids = sorted(set(replica_ids))
    which = f"replica {ids[0]}" if len(ids) == 1 else "replicas " + ", ".join(map(str, ids))
    controller = _controller()
    (view,) = controller.get_status([name], events=0)
    api.check_replica_termination(view.service, view.replicas, ids)  # before the question, as the request does
    if not yes:
        click.confirm(f"Terminate {which} of {name}? The controller launches a replacement when the policy "
                      "still wants one.", abort=True)
    controller.request_replica_termination(name, ids)
    console = _stderr()
    said: dict[int, str] = {}

    def progress(left: Sequence[ReplicaRecord]) -> None:
        # A line each time a replica's phase changes, not a spinner alone: the drain takes a while (12 to
        # 16 s by default), and a spinner shows nothing at all when stderr is not a terminal.
        for replica in left:
            line = waits.describe_termination(name, replica)
            if said.get(replica.replica_id) != line:
                said[replica.replica_id] = line
                console.print(line, markup=False, highlight=False, soft_wrap=True)

    with console.status(f"Terminating {which} of {name}..."):
        waits.wait_until_replicas_gone(controller, name, ids, timeout, on_progress=progress)
    click.echo(f"{which[0].upper()}{which[1:]} of {name} terminated.")


def _force_down(all_services: bool, yes: bool, force: bool, regions: tuple[str, ...]) -> None:
    """`serve down --all --force`: what the controller found and stopped, one line each; exit 1 when
    something could not be stopped."""
    if not force:
        raise click.UsageError("--region goes with --force")
    if not all_services:
        raise click.UsageError("--force takes down everything this state directory started: pass --all")
    if not yes:
        click.confirm("Stop every process and cloud instance this state directory started, without reading "
                      "its database?", abort=True)
    report = _controller().force_down(regions)
    for line in report.lines():
        click.echo(line)
    for error in report.errors:
        click.echo(f"Error: {error}", err=True)
    if report.errors:
        sys.exit(1)


@serve.command("logs")
@click.argument("name", shell_complete=complete_service_names)
@click.argument("replica_id", type=int, required=False, shell_complete=complete_replica_ids)
@click.option("--controller", "controller_log", is_flag=True, help="Show the controller's log.")
@click.option("--load-balancer", "lb_log", is_flag=True, help="Show the service's load balancer log.")
@click.option("--follow/--no-follow", default=True, show_default=True,
              help="Keep printing new output until Ctrl-C; --no-follow prints what there is and exits.")
@click.option("--tail", type=click.IntRange(min=0), default=None, metavar="N",
              help="Start with only the last N lines.")
@click.option("--since", default=None, metavar="DURATION",
              help="Start with only the lines at most DURATION old (30s, 5m, 2h, 1d), by their time prefix.")
def serve_logs(name: str, replica_id: int | None, controller_log: bool, lb_log: bool, follow: bool,
               tail: int | None, since: str | None) -> None:
    """Print the output of replica REPLICA_ID of service NAME (or the controller's, or the load balancer's),
    then follow it. Ctrl-C stops following and exits 0."""
    from skyserve_lite.logview import parse_duration

    with _errors():
        if controller_log and lb_log:
            raise click.UsageError("pass at most one of --controller and --load-balancer")
        since_seconds = None if since is None else parse_duration(since, "--since")
        chunks = _controller().stream_log(name, replica_id, controller=controller_log, load_balancer=lb_log,
                                          follow=follow, tail=tail, since_seconds=since_seconds)
        # Said on stderr when nothing of what was asked for is there, rather than an empty screen that
        # reads as a hang (following) or a broken command (`--since 10m` on a quiet log). Not for `--tail 0`,
        # which asks for none of it.
        nothing = None if tail == 0 else _nothing_in_log(name, replica_id, controller_log, lb_log, since)
        shown = False
        out = sys.stdout.buffer
        try:
            for chunk in chunks:
                out.write(chunk)
                shown = shown or bool(chunk)
                if follow and not chunk and not shown and nothing is not None:
                    # A follow's first idle poll: what the log held is all read (a remote follow has no
                    # idle polls, so there this is said only when the log ends).
                    click.echo(f"{nothing}; following it for new lines (Ctrl-C stops).", err=True)
                    nothing = None
                if follow:  # show each chunk as it comes: a remote follow has no idle (empty) chunks to flush on
                    out.flush()
        except KeyboardInterrupt:
            nothing = None  # Ctrl-C is how a follow ends: quietly, exit 0, as `sky serve logs` does
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        out.flush()
        if not shown and nothing is not None:
            click.echo(f"{nothing}.", err=True)


def _nothing_in_log(name: str, replica_id: int | None, controller_log: bool, lb_log: bool, since: str | None) -> str:
    """``No line of the last 10m (--since) in the log of replica 1 of web``, or ``The controller's log is empty``."""
    if controller_log:
        which = "the controller's log"
    elif lb_log:
        which = f"the load balancer log of {name}"
    else:
        which = f"the log of replica {replica_id} of {name}"
    if since is not None:
        return f"No line of the last {since.strip()} (--since) in {which}"
    return f"{which[0].upper()}{which[1:]} is empty"


@main.group("config")
def config_group() -> None:
    """Settings of this state directory ($SKY_LITE_HOME/config.json)."""


@config_group.command("set")
@click.argument("key")
@click.argument("value")
def config_set(key: str, value: str) -> None:
    """Set KEY to VALUE (- reads VALUE from standard input). Keys: default_infra (CLOUD[/REGION[/ZONE]] for
    tasks that name no cloud), db_url (postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE: the state in
    PostgreSQL; a password is kept in $SKY_LITE_HOME/pgpass, mode 0600, and shown as ***)."""
    from skyserve_lite.userconfig import DB_URL, set_config

    with _errors():
        if value == "-":  # keeps a password off the command line, where `ps` and shell histories show it
            value = sys.stdin.readline().strip()
        elif key == DB_URL and _has_password(value):
            click.echo("Note: a password on the command line can be seen by other users of this machine and "
                       "in your shell's history; `sky-lite config set db_url -` reads the URL from standard "
                       "input.", err=True)
        click.echo(f"{key} = {set_config(home_dir(), key, value)}")


def _has_password(url: str) -> bool:
    """Whether ``url``'s authority holds ``user:password@`` (no parsing errors: the setting reports those)."""
    authority = url.partition("://")[2].partition("/")[0]
    return ":" in authority.rpartition("@")[0]


@config_group.command("unset")
@click.argument("key")
def config_unset(key: str) -> None:
    """Remove KEY (back to its default)."""
    from skyserve_lite.userconfig import set_config

    with _errors():
        set_config(home_dir(), key, None)
        click.echo(f"{key} unset")


@config_group.command("list")
def config_list() -> None:
    """Print every setting: KEY = VALUE (or its default), with what it means."""
    from skyserve_lite.userconfig import KEYS, show_config

    with _errors():
        config = show_config(home_dir())
        for key, (meaning, _) in KEYS.items():
            click.echo(f"{key} = {config.get(key, '(unset)')}    # {meaning}")


@main.group()
def controller() -> None:
    """Run the controller (normally started for you by `serve up`)."""


@controller.command("start")
def controller_start() -> None:
    """Start the background controller of this state directory if it is not running."""
    with _errors():
        controller = _controller()
        before = controller.controller_status()
        state = before if before.running else controller.start_controller()
        said = "was already running" if before.running else "started"
        click.echo(f"Controller {said} (pid {state.pid}).")


@controller.command("stop")
@click.option("--load-balancers", "load_balancers", is_flag=True,
              help="Also stop this host's load balancers (the host leaves the endpoints; `controller down HOST`).")
def controller_stop(load_balancers: bool) -> None:
    """Stop this state directory's controller loop (replicas and load balancers keep running, unless
    --load-balancers). The loop hands its services over as it stops."""
    from skyserve_lite.controller.daemon import stop_controller

    with _errors():
        said = "Stopped the controller." if stop_controller(home_dir()) else "No controller was running."
        click.echo(said)
        if load_balancers:
            from skyserve_lite.controller.lb_runner import stop_host_lbs

            stopped = stop_host_lbs(home_dir())
            click.echo(f"Stopped {len(stopped)} load balancer(s).")


@controller.command("rpc", hidden=True)
def controller_rpc() -> None:
    """Serve one request of the controller protocol on stdin/stdout (what a remote client runs over ssh)."""
    from skyserve_lite.remote.server import serve_stdio

    sys.exit(serve_stdio(home_dir()))


@controller.command("host-settings", hidden=True)
@click.option("--lb-host", required=True, help="The address load balancers listen on.")
@click.option("--endpoint-host", required=True, help="The address endpoints show.")
@click.option("--aws-instance-profile", default=None, help="The instance profile AWS replicas get.")
@click.option("--gcp-service-account", default=None, help="The service account GCP replicas run as (an email).")
def controller_host_settings(lb_host: str, endpoint_host: str, aws_instance_profile: str | None,
                             gcp_service_account: str | None) -> None:
    """Record where this host's load balancers listen, what address endpoints show, which instance profile
    AWS replicas get and which service account GCP replicas run as."""
    from skyserve_lite.controller.host import HostSettings, write_host_settings
    from skyserve_lite.state.store import prepare_home

    with _errors():
        write_host_settings(prepare_home(home_dir()), HostSettings(
            lb_host=lb_host, endpoint_host=endpoint_host, aws_instance_profile=aws_instance_profile,
            gcp_service_account=gcp_service_account))


@controller.command("tick")
def controller_tick() -> None:
    """Run one reconcile pass and exit."""
    from skyserve_lite.controller.loop import run_tick
    from skyserve_lite.controller.settings import ControllerSettings

    with _errors():
        _configure_logging()
        run_tick(home_dir(), ControllerSettings.from_env())


@controller.command("run")
@click.option("--interval", type=FiniteFloatRange(min=0.1), default=None,
              help="Seconds between passes (default 2, or $SKY_LITE_CONTROLLER_INTERVAL_SECONDS).")
def controller_run(interval: float | None) -> None:
    """Reconcile on an interval until stopped (SIGTERM or Ctrl-C)."""
    import dataclasses

    from skyserve_lite.controller.loop import run_loop
    from skyserve_lite.controller.settings import ControllerSettings

    with _errors():
        _configure_logging()
        settings = ControllerSettings.from_env()
        if interval is not None:
            settings = dataclasses.replace(settings, interval_seconds=interval)
        run_loop(home_dir(), settings)


@controller.command("ensure")
def controller_ensure() -> None:
    """Start the background controller if it is not running; silent when it is (what cron runs)."""
    from skyserve_lite.controller.cron import ensure_supervised

    with _errors():
        home = home_dir()
        pid = ensure_supervised(home)
        if pid is not None:  # one line for the controller's log, where cron appends it
            now = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
            click.echo(f"{now}.000Z controller ensure: started the controller (pid {pid}) for {home}")


@controller.group("cron")
def controller_cron() -> None:
    """Install or remove the crontab lines that keep the controller running."""


@controller_cron.command("install")
def controller_cron_install() -> None:
    """Add (or update) this state directory's `controller ensure` lines in your crontab."""
    from skyserve_lite.controller.cron import CronChange, install_cron

    with _errors():
        home = home_dir()
        change, lines = install_cron(home)
        said = {CronChange.ADDED: f"Added the cron lines for {home} to your crontab:",
                CronChange.REPLACED: f"Updated the cron lines for {home} in your crontab:",
                CronChange.UNCHANGED: f"The cron lines for {home} were installed already:"}[change]
        click.echo(said)
        for line in lines:
            click.echo(f"  {line}")


@controller_cron.command("remove")
def controller_cron_remove() -> None:
    """Remove this state directory's `controller ensure` lines from your crontab, and nothing else."""
    from skyserve_lite.controller.cron import CronChange, uninstall_cron

    with _errors():
        home = home_dir()
        if uninstall_cron(home) is CronChange.REMOVED:
            click.echo(f"Removed the cron lines for {home} from your crontab.")
        else:
            click.echo(f"No cron lines for {home} in your crontab; nothing to remove.")


for _command in host_commands.COMMANDS:
    controller.add_command(_command)


def _configure_logging() -> None:
    """The controller's log lines start with their UTC time as replica log lines do
    (``2026-12-01T17:30:05.123Z INFO ...``), so `serve logs --since` reads both the same way."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s: %(message)s",
                        datefmt="%Y-%m-%dT%H:%M:%S")
    for handler in logging.getLogger().handlers:
        if handler.formatter is not None:
            handler.formatter.converter = time.gmtime
