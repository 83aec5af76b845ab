"""Process-tree tools for the kill tests: start a Spark driver, SIGKILL it with every child.

``start_runner`` starts ``python -m testkit.runner`` (one streaming query in its own process,
``testkit/runner.py``); ``kill_tree`` SIGKILLs it with all its descendants, and
``kill_marked`` any straggler left, found by a marker in its environment. PySpark's daemon
workers leave the driver's process group, so killing the group is not enough: ``kill_tree``
collects the whole tree (psutil) first, then SIGKILLs all of it at once;
``arm_crash_point`` arms a crash point of ``testkit/crash_points.py`` and ``kill_at_crash_point``
kills a runner parked there. Used by the
restart and fault tests (``integration/``), the job tests and the recovery benchmark.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil

from testkit.crash_points import POINTS
from testkit.waiting import wait_until

#: the repository root: child processes run there, so they import the checkout
REPO = Path(__file__).resolve().parent.parent


def start_runner(args: list[str], log_path: Path, env: dict[str, str] | None = None
                 ) -> subprocess.Popen:
    """Start ``python -m testkit.runner ARGS`` as a new session, output to ``log_path``."""
    full_env = {**os.environ, "PYSPARK_PYTHON": sys.executable, **(env or {})}
    log = open(log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
    return subprocess.Popen([sys.executable, "-m", "testkit.runner", *args], cwd=REPO,
                            stdout=log, stderr=subprocess.STDOUT, env=full_env,
                            start_new_session=True)


def kill_tree(pid: int) -> int:
    """SIGKILL ``pid`` and all its descendants; returns how many processes were killed."""
    try:
        root = psutil.Process(pid)
        victims = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    for process in victims:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(victims, timeout=10)
    return len(victims)


def kill_marked(variable: str, value: str) -> int:
    """SIGKILL every process (by pid) whose environment has ``variable`` = ``value``: the
    stragglers of a killed tree (a worker forked while ``kill_tree`` collected it). Only the
    processes a harness started with that unique value have it. Returns how many were killed."""
    victims = []
    for process in psutil.process_iter(["pid"]):
        if process.pid == os.getpid():
            continue
        try:
            if process.environ().get(variable) == value:
                process.kill()
                victims.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    psutil.wait_procs(victims, timeout=10)
    return len(victims)


def arm_crash_point(faults: Path, point: str, mode: str = "park") -> None:
    """Arm crash point ``point`` (``testkit.crash_points``) in the processes whose fault directory
    is ``faults``: ``park`` (wait there to be killed), ``raise`` (fail the task once) or ``hold``
    (wait for ``release-<point>``). Stale files of an earlier arming are removed first."""
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}; known: {', '.join(POINTS)}")
    for stale in (f"fired-{point}", f"hit-{point}", f"hit-{point}.pkl", f"release-{point}"):
        (faults / stale).unlink(missing_ok=True)
    tmp = faults / f".arm-{point}"
    tmp.write_text(mode)
    tmp.rename(faults / f"arm-{point}")


def kill_at_crash_point(args: list[str], log_path: Path, env: dict[str, str], fault_dir: Path,
                        point: str, timeout: float) -> int:
    """Arm ``point`` in ``fault_dir`` (``testkit/crash_points.py``: ``env`` must hold its
    ``environment(fault_dir)``), start the runner, wait until one of its processes parks there,
    SIGKILL the whole tree; returns how many processes were killed. ``hit-<point>`` is left for
    the caller."""
    (fault_dir / f"arm-{point}").touch()
    runner = start_runner(args, log_path, env)
    try:
        wait_until(f"a process to reach crash point {point}", (fault_dir / f"hit-{point}").exists,
                   timeout=timeout, process=runner)
    finally:
        killed = kill_tree(runner.pid)
    return killed
