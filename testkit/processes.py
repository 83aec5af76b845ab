"""Process-tree tools for the kill tests: start a Spark driver, SIGKILL it with every child.

PySpark's daemon workers leave the driver's process group, so killing the group is not enough:
``kill_tree`` collects the whole tree (psutil) first, then SIGKILLs all of it at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent


def start_runner(args: list[str], log_path: Path, env: dict[str, str] | None = None
                 ) -> subprocess.Popen:
    """Start ``python -m integration.runner ARGS`` as a new session, output to ``log_path``."""
    full_env = {**os.environ, "PYSPARK_PYTHON": sys.executable, **(env or {})}
    log = open(log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
    return subprocess.Popen([sys.executable, "-m", "integration.runner", *args], cwd=REPO,
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


def wait_for(condition: Callable[[], bool], timeout: float, what: str,
             process: subprocess.Popen | None = None, interval: float = 0.2) -> None:
    """Poll ``condition`` until true; fail with ``what`` on timeout or if ``process`` died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if process is not None and process.poll() is not None:
            raise AssertionError(f"process exited with {process.returncode} while waiting: {what}")
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting: {what}")
