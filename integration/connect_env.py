"""Spark Connect test parts: a Connect server from the installed PySpark, a thin client venv.

- ``connect_server`` starts ``$SPARK_HOME/sbin/start-connect-server.sh --wait`` from the PySpark
  package of this interpreter, bound to 127.0.0.1 on a port the server picks (port 0; read back
  from its log), with ``PYSPARK_PYTHON`` = this interpreter so that the server's Python workers
  import ``connector``. It yields the ``sc://`` URL and always stops the whole process tree (the
  launcher's pid, the JVM and its Python workers) on exit.
- ``client_python`` returns the interpreter of a separate virtual environment holding a PySpark
  Connect client. That client needs protobuf >= 6, which cannot share an environment with the
  ``tablestore`` SDK (protobuf < 6) installed here (docs/connect.md). The environment is created
  once and cached under ``~/.cache/tablestore-cdc/`` (keyed by Python and client version).

Used by integration/test_spark_connect.py, in the test's (project venv) process.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from testkit.waiting import wait_until

REPO = Path(__file__).resolve().parent.parent
STARTED = re.compile(r"Spark Connect server started at: [^\s:]+:(\d+)")
#: ``TABLESTORE_CDC_CONNECT_CLIENT`` overrides the client requirement (e.g. another version)
CLIENT_ENV = "TABLESTORE_CDC_CONNECT_CLIENT"
#: what the client path needs besides PySpark: ``connector`` imports pydantic and tenacity;
#: PySpark's Connect client itself requires pandas (``pyspark.sql.connect.utils``), which
#: ``pyspark-client`` may not bring (pyarrow comes with it)
CLIENT_EXTRAS = ("pydantic>=2.6", "tenacity>=8", "pandas>=2,<3")


class ClientUnavailable(Exception):
    """No Connect client could be installed (the package registry is unreachable?)."""


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def client_requirements() -> list[str]:
    """Candidates, first that installs wins: the thin ``pyspark-client`` of the server's version,
    else ``pyspark[connect]`` of that version (the full package; its wheel is usually in pip's
    cache already, since the project's environment installed the same PySpark)."""
    import pyspark

    if os.environ.get(CLIENT_ENV):
        return [os.environ[CLIENT_ENV]]
    return [f"pyspark-client=={pyspark.__version__}", f"pyspark[connect]=={pyspark.__version__}"]


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tablestore-cdc"


def client_python(timeout: float = 1200) -> tuple[Path, str]:
    """``(python, requirement)`` of the cached client environment, creating it if needed.

    A candidate the registry does not have (``pyspark-client`` of a version not published) is
    remembered as unavailable once a later candidate installed, so later runs skip it at once;
    with no registry at all nothing is remembered. Raises ``ClientUnavailable`` with pip's last
    lines when no candidate installs.
    """
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    missing: list[tuple[Path, str]] = []  # (marker, pip's output) of candidates not found
    for requirement in client_requirements():
        spec = " ".join([requirement, *CLIENT_EXTRAS, sys.version.split()[0]])
        venv = root / f"connect-client-{hashlib.sha256(spec.encode()).hexdigest()[:12]}"
        python = venv / "bin" / "python"
        ready = venv / ".ready"
        marker = root / f"{venv.name}.unavailable"
        with open(root / f"{venv.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one creator at a time; others wait and reuse
            if not (ready.exists() and python.exists()):
                if marker.exists():
                    failures.append(f"{requirement}: not in the registry ({marker})")
                    continue
                shutil.rmtree(venv, ignore_errors=True)
                subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
                result = subprocess.run(
                    [str(python), "-m", "pip", "install", "--quiet", requirement,
                     *CLIENT_EXTRAS], capture_output=True, text=True, timeout=timeout)
                if result.returncode != 0:
                    shutil.rmtree(venv, ignore_errors=True)
                    if "No matching distribution" in result.stderr:
                        missing.append((marker, result.stderr))
                    tail = " | ".join(line for line in result.stderr.splitlines()[-4:]
                                      if not line.startswith("WARNING: Location"))
                    failures.append(f"{requirement}: {tail}")
                    continue
                ready.write_text(spec + "\n")
        for earlier, output in missing:  # the registry answered: those do not exist
            earlier.write_text(output)
        return python, requirement
    raise ClientUnavailable("; ".join(failures))


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def stop_tree(pid: int, grace: float = 15) -> list[int]:
    """SIGTERM ``pid`` and its descendants (the JVM stops Spark in its shutdown hook), SIGKILL
    what is left after ``grace`` seconds. Returns the pids still alive afterwards (none)."""
    processes = _tree(pid)  # collected first: Python workers leave the process group
    for process in processes:
        try:
            process.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(processes, timeout=grace)
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(alive, timeout=10)
    return [p.pid for p in alive]


@contextmanager
def connect_server(work_dir: Path, conf: dict[str, str] | None = None,
                   python: str | os.PathLike[str] | None = None,
                   timeout: float = 180) -> Iterator[str]:
    """A Spark Connect server (``local[2]``) on 127.0.0.1; yields ``sc://127.0.0.1:PORT``.

    ``python`` is the server's Python for its workers (default: this interpreter).

    Its output goes to ``work_dir/connect-server.log``; startup failures include its tail.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    home = spark_home()
    log_path = work_dir / "connect-server.log"
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "PYSPARK_PYTHON": str(python or sys.executable),  # the server's workers run the source
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(work_dir),  # not inside the installed package
        "SPARK_PID_DIR": str(work_dir),
    }
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    args = ["bash", str(home / "sbin" / "start-connect-server.sh"), "--wait",
            "--master", "local[2]"]
    settings = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": "0",  # the server picks; its log says which
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        **(conf or {}),
    }
    for key, value in settings.items():
        args += ["--conf", f"{key}={value}"]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(args, cwd=work_dir, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    try:
        port = _wait_started(process, log_path, timeout)
        yield f"sc://127.0.0.1:{port}"
    finally:
        left = stop_tree(process.pid)
        process.wait(timeout=10)
        if left:
            raise RuntimeError(f"Connect server processes survived SIGKILL: {left}")


def _wait_started(process: subprocess.Popen, log_path: Path, timeout: float) -> int:
    """The port the server's log says it listens on; its last log lines if it exits first."""

    def port_in_log() -> int | None:
        text = log_path.read_text(errors="replace")
        match = STARTED.search(text)
        if match:
            return int(match.group(1))
        if process.poll() is not None:
            raise RuntimeError(f"Connect server exited with {process.returncode}:\n"
                               + "\n".join(text.splitlines()[-20:]))
        return None

    port = wait_until(f"the Connect server to start (log: {log_path})", port_in_log,
                      lambda found: found is not None, timeout=timeout, interval=0.5)
    assert port is not None
    return port
