"""One walker of /proc (``procs.read_process_table``) serves the process table of the local provider and
`serve down --force` (``procs.list_processes``) and the cron daemon check (``cron.list_processes``): over one
made-up /proc both list the same processes, by pid, and leave out the same ones."""

from __future__ import annotations

from pathlib import Path

from skyserve_lite import procs
from skyserve_lite.controller import cron
from skyserve_lite.controller.cron import ProcessName
from skyserve_lite.procs import ProcessInfo


def _stat(pid: int, comm: str, state: str, ppid: int, pgid: int, start: int) -> str:
    # Fields after the name: state, ppid, pgrp, 16 more, then the start time (field 22 of proc(5)).
    return f"{pid} ({comm}) {state} {ppid} {pgid} " + " ".join(["0"] * 16) + f" {start} 0 0\n"


def make_proc(root: Path) -> Path:
    """pids 1, 12, 40 (a zombie) and 300, a pid whose files are gone (it ended while it was read), and
    entries that are not pids. Made in an order that is not the pids'."""
    processes = [(300, "cron", "S", 1, 300, b"/usr/sbin/cron\0-f\0", 9), (12, "sshd", "S", 1, 12, b"sshd\0", 5),
                 (1, "init", "S", 0, 1, b"/sbin/init\0", 1), (40, "worker", "Z", 12, 12, b"", 7)]
    for pid, comm, state, ppid, pgid, cmdline, start in processes:
        entry = root / str(pid)
        entry.mkdir(parents=True)
        (entry / "stat").write_text(_stat(pid, f"{comm} (x)", state, ppid, pgid, start))
        (entry / "comm").write_text(comm + "\n")
        (entry / "cmdline").write_bytes(cmdline)
    (root / "77").mkdir()  # ended: its files are gone
    (root / "self").mkdir()
    (root / "meminfo").write_text("")
    return root


def test_the_process_table_lists_live_processes_by_pid(tmp_path: Path) -> None:
    assert procs.list_processes(make_proc(tmp_path)) == [ProcessInfo(1, 0, 1, 1), ProcessInfo(12, 1, 12, 5),
                                                         ProcessInfo(300, 1, 300, 9)]


def test_the_cron_check_lists_the_same_walk_by_name(tmp_path: Path) -> None:
    # A zombie keeps its name (the table of live processes leaves it out); the ended one is out of both.
    assert cron.list_processes(make_proc(tmp_path)) == [
        ProcessName(1, "init", ("/sbin/init",)), ProcessName(12, "sshd", ("sshd",)), ProcessName(40, "worker"),
        ProcessName(300, "cron", ("/usr/sbin/cron", "-f"))]


def test_the_walker_reads_each_process_in_pid_order_and_keeps_what_the_reader_gives(tmp_path: Path) -> None:
    seen: list[str] = []

    def read(entry: Path) -> str | None:
        seen.append(entry.name)
        return None if entry.name == "12" else entry.name

    assert procs.read_process_table(read, make_proc(tmp_path)) == ["1", "40", "77", "300"]
    assert seen == ["1", "12", "40", "77", "300"]


def test_without_a_proc_there_is_no_table(tmp_path: Path) -> None:
    assert procs.read_process_table(lambda entry: entry.name, tmp_path / "missing") is None
    assert procs.list_processes(tmp_path / "missing") == []
    assert cron.list_processes(tmp_path / "missing") is None
