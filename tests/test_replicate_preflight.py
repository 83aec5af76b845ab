"""``replicate`` refuses a bad setup before its first batch: one ``error:`` line, exit 2 (4 for
a table another job replicates), within seconds, Spark never started and nothing written under
``--output`` -- for one table and for ``--tables`` alike (``tablestore_cdc.pipeline.preflight``).
And what ``--initial`` gives the job's source: the snapshot-then-stream tunnel for a new tunnel,
an existing tunnel's own type kept.

The CLI runs in-process (typer's CliRunner) against a real embedded store and its SQLite meta
store; the missing extra in a subprocess that cannot import pyiceberg; the endpoint on a port of
127.0.0.1 nothing listens on.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from connector.errors import OptionError
from connector.local import LocalTablestore
from connector.options import SourceOptions
from meta_store import open_meta_store
from tablestore_cdc.commands.app import app
from tablestore_cdc.pipeline import ApplySettings
from tablestore_cdc.pipeline.job_lock import JobLock
from tablestore_cdc.pipeline.output import JobOutput
from tablestore_cdc.pipeline.preflight import (
    NONE_WARNING,
    SNAPSHOT_LINE,
    JobPlan,
    SourceHeldError,
    check_before_start,
    initial_tunnel_type,
)
from tablestore_cdc.table_status import TableStatus, TableStatusWriter

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "store.db"
    with LocalTablestore(path) as writer:
        for name in ("t1", "t2"):
            writer.create_table(name, primary_key=[("id", "INTEGER")],
                                columns=[("v", "INTEGER")], channels=2)
            writer.put_row(name, {"id": 1}, {"v": 1})
    return path


def run(store: Path, out: Path, *flags: str) -> tuple[int, str, float]:
    """``replicate`` with ``flags``: (exit code, stderr, seconds taken)."""
    began = time.monotonic()
    result = CliRunner().invoke(app, ["replicate", "--store", str(store), "--output", str(out),
                                      *flags])
    return result.exit_code, result.stderr, time.monotonic() - began


def assert_refused(code: int, stderr: str, took: float, out: Path, says: str,
                   exit_code: int = 2) -> None:
    assert code == exit_code, stderr
    assert stderr.startswith("error: ") and stderr.count("\n") == 1, stderr
    assert says in stderr, stderr
    assert took < 30, stderr
    assert not out.exists() or not any(out.iterdir())  # nothing written, Spark not started


BAD_SETUPS = [
    (["--tables", "t*", "--target", "detla:///lake/{table}"], "unknown scheme 'detla'"),
    (["--table", "t1", "--target", "detla://lake/t1"], "unknown scheme 'detla'"),
    (["--tables", "t*", "--target", "delta://lake/{table}"],
     "target 'delta://lake/{table}': the path must be absolute"),
    (["--tables", "t*", "--target", "iceberg:///wh/{table}"], "table=NAMESPACE.TABLE is required"),
    (["--tables", "t*", "--target", "delta:///lake/one"], "names no {table}"),
    (["--tables", "nope*,none_*"], "--tables 'nope*,none_*' matches no table"),
    (["--table", "nope"], "table 'nope' does not exist"),
    (["--tables", "t*", "--schema-drift", "bogus"], "option '--schema-drift'"),
    (["--tables", "t*", "--initial", "sometimes"], "option '--initial'"),
    (["--table", "t1", "--initial", "none", "--option", "tunnel.type=BaseAndStream"],
     "option '--initial': conflicts with --option tunnel.type=BaseAndStream"),
    (["--tables", "t*", "--option", "maxOffsetsPerTrigger=lots"], "maxOffsetsPerTrigger"),
]


@pytest.mark.parametrize(("flags", "says"), BAD_SETUPS, ids=[" ".join(f) for f, _ in BAD_SETUPS])
def test_a_bad_setup_ends_in_one_line_before_anything_is_written(
        store: Path, tmp_path: Path, flags: list[str], says: str) -> None:
    out = tmp_path / "out"
    assert_refused(*run(store, out, *flags), out, says)


def test_a_bad_per_table_setting_is_refused_before_the_start(store: Path, tmp_path: Path) -> None:
    config = tmp_path / "tables.toml"
    config.write_text('[tables.t2]\ntarget = "delta://relative/t2"\n')
    out = tmp_path / "out"
    assert_refused(*run(store, out, "--tables", "t*", "--config", str(config)), out,
                   "target 'delta://relative/t2': the path must be absolute")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_endpoint_nothing_listens_on_is_a_configuration_error_with_tables(
        tmp_path: Path) -> None:
    pytest.importorskip("tablestore")
    out = tmp_path / "out"
    began = time.monotonic()
    result = CliRunner().invoke(app, [
        "replicate", "--endpoint", f"http://127.0.0.1:{free_port()}", "--tables", "t*",
        "--output", str(out), "--option", "instance.name=inst",
        "--option", "access.key.id=id", "--option", "access.key.secret=secret"])
    assert_refused(result.exit_code, result.stderr, time.monotonic() - began, out,
                   "nothing listens on 127.0.0.1:")
    assert "secret" not in result.stderr.replace("access.key.secret", "")


def _held_by_this_process(store: Path, table: str, job: str, selection: str) -> SourceOptions:
    """``table``'s lease taken by this (live) process and its status record naming ``job``
    (the output) and ``selection``, as a running job leaves them; its ``SourceOptions``."""
    source = SourceOptions.from_spark({"endpoint": f"local://{store}", "table.name": table,
                                       "tunnel.name": "replicate"})
    with open_meta_store(source.meta_store) as meta:
        assert meta.take_lease(source.source_identity, f"{socket.gethostname()}/{os.getpid()}/x",
                               120, namespace=source.source_identity) is None
    writer = TableStatusWriter(lambda _t: (source.meta_store, None, source.source_identity))
    writer.publish({table: TableStatus(table=table, job=job, selection=selection,
                                       state="streaming")})
    writer.close()
    return source


def test_a_table_another_job_replicates_is_refused_naming_that_job(
        store: Path, tmp_path: Path) -> None:
    """A job on another output holds t2's lease and has its output locked: the second job is
    refused (exit 4) with the other's host, pid and since, before it writes anything."""
    other = tmp_path / "other"
    source = _held_by_this_process(store, "t2", str(other), "t*")
    out = tmp_path / "out"
    with JobLock(other):
        since = (other / ".replicate.lock").read_text().split('"since": "')[1].split('"')[0]
        code, stderr, took = run(store, out, "--tables", "t*")
        assert_refused(code, stderr, took, out, "table 't2' is already replicated", exit_code=4)
        assert f"pid {os.getpid()}" in stderr and f"since {since}" in stderr
        assert f"host {socket.gethostname()}" in stderr and str(other) in stderr
        # one table's replicate of the other table is not held
        assert run(store, out, "--table", "t2")[0] == 4
    with open_meta_store(source.meta_store) as meta:  # a holder that died is the source's call
        meta.take_lease(source.source_identity, f"{socket.gethostname()}/999999999/y", 120,
                        namespace=source.source_identity, now=time.time() + 200)
    plan = JobPlan(f"local://{store}", JobOutput.of(out), "replicate", {},
                   lambda t: ApplySettings(f"delta://{out}/lake/{t}"), tables="t*")
    assert check_before_start(plan).tables == ["t1", "t2"]
    assert not out.exists()


def test_a_second_job_of_one_output_in_object_storage_is_refused_by_the_lease(
        store: Path, tmp_path: Path) -> None:
    """An output in S3 has no lock: a live job holding t1's lease with the same ``--output
    s3://`` is a second start (its checkpoint would make the lease take it for a restart),
    refused with exit 4; once the holder is dead on this host, the restart goes on."""
    source = _held_by_this_process(store, "t1", "s3://lake/state", "t1")
    plan = JobPlan(f"local://{store}", JobOutput.parse("s3://lake/state/"), "replicate", {},
                   lambda t: ApplySettings(f"delta://{tmp_path}/lake/{t}"), tables="t1",
                   one_table=True)
    with pytest.raises(SourceHeldError) as raised:
        check_before_start(plan)
    assert raised.value.exit_code == 4 and "output s3://lake/state" in str(raised.value)
    assert f"pid {os.getpid()}" in str(raised.value)
    with open_meta_store(source.meta_store) as meta:  # the holder died: a restart
        meta.take_lease(source.source_identity, f"{socket.gethostname()}/999999999/y", 120,
                        namespace=source.source_identity, now=time.time() + 200)
    assert check_before_start(plan).tables == ["t1"]


def test_a_missing_extra_is_named_with_its_install_line(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = ("import sys; sys.modules['pyiceberg'] = None; "
            "from tablestore_cdc.commands.app import app; app()")
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code, "replicate", "--store", str(store), "--table", "t1",
         "--output", str(out), "--target", f"iceberg://{tmp_path}/wh?table=cdc.t1"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert_refused(done.returncode, done.stderr, time.monotonic() - began, out,
                   "pip install 'tablestore-cdc[lakehouse]'")
    assert "No module named" not in done.stderr


def test_an_empty_selection_is_a_warning_with_allow_empty(store: Path, tmp_path: Path) -> None:
    plan = JobPlan(f"local://{store}", JobOutput.of(tmp_path / "out"), "replicate", {},
                   lambda t: ApplySettings(f"delta:///lake/{t}"), tables="later_*",
                   allow_empty=True)
    checked = check_before_start(plan)
    assert checked.tables == [] and checked.options["tunnel.type"] == "BaseAndStream"
    assert any(line.startswith("warning: --tables 'later_*' matches no table")
               and "--allow-empty" in line for line in checked.lines)


def plan(options: dict[str, str] | None = None, initial: str = "snapshot",
         given: bool = False, endpoint: str = "local:///s.db") -> JobPlan:
    return JobPlan(endpoint, JobOutput.of("/out"), "replicate", options or {},
                   lambda t: ApplySettings("delta:///lake/{table}"), tables="t*",
                   initial=initial, initial_given=given)


def test_initial_gives_a_new_tunnel_the_snapshot_and_an_existing_one_keeps_its_type() -> None:
    assert initial_tunnel_type(plan(), {}) == ("BaseAndStream", [SNAPSHOT_LINE])
    assert initial_tunnel_type(plan(initial="none", given=True), {}) == (
        "Stream", [NONE_WARNING])
    kept, lines = initial_tunnel_type(plan(), {"t1": "Stream", "t2": "Stream"})
    assert kept == "Stream" and "exists as Stream: kept" in lines[0] and lines[1] == NONE_WARNING
    assert initial_tunnel_type(plan(initial="none", given=True), {"t1": "BaseAndStream"}) == (
        "BaseAndStream", ["tunnel 'replicate' exists as BaseAndStream: kept, with its "
                          "checkpoints (--initial none applies to a new tunnel)"])


def test_an_explicit_tunnel_type_or_start_wins_over_the_default_initial() -> None:
    assert initial_tunnel_type(plan({"tunnel.type": "Stream"}), {})[0] == "Stream"
    assert initial_tunnel_type(plan({"startingPosition": "latest"}), {})[0] == "Stream"
    assert initial_tunnel_type(plan({"tunnel.type": "Stream"}, "none", True), {})[0] == "Stream"
    assert initial_tunnel_type(plan(endpoint="dynamodb-streams://t?region=us-east-1"), {}) == (
        "Stream", [NONE_WARNING])
    with pytest.raises(OptionError, match="no base data"):
        initial_tunnel_type(plan(initial="snapshot", given=True,
                                 endpoint="dynamodb-streams://t?region=us-east-1"), {})
    with pytest.raises(OptionError, match="already exists with type BaseAndStream"):
        initial_tunnel_type(plan({"tunnel.type": "Stream"}), {"t1": "BaseAndStream"})
    with pytest.raises(OptionError, match="exist with both types"):
        initial_tunnel_type(plan(), {"t1": "BaseAndStream", "t2": "Stream"})


@pytest.mark.slow
def test_ctrl_c_while_spark_starts_ends_in_one_line(store: Path, tmp_path: Path) -> None:
    """SIGINT once the job said where Spark's log goes (it is starting Spark then): one line,
    exit 0, no Python or Py4J traceback; Spark's JVM does not outlive the job, and the output's
    lock is free again."""
    import signal

    import psutil

    log = tmp_path / "replicate.log"
    with open(log, "w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "tablestore_cdc", "replicate", "--store", str(store),
             "--table", "t1", "--output", str(tmp_path / "out"), "--once"],
            cwd=REPO, env={**os.environ, "PYSPARK_PYTHON": sys.executable, "COLUMNS": "300"},
            stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while "Spark's log:" not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        time.sleep(0.5)  # past the print of that line; Spark takes seconds to start
        children = psutil.Process(process.pid).children(recursive=True)
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(timeout=60) == 0, log.read_text()
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, alive
    finally:
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.kill()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    from tablestore_cdc.pipeline.preflight import SNAPSHOT_LINE

    shown = [line for line in log.read_text().splitlines()  # what the start printed, left out
             if not line.startswith(("WARNING: Using", "Spark's log:")) and line != SNAPSHOT_LINE]
    assert shown == ["stopped while Spark was starting; nothing was read or written"], shown
    assert JobLock(tmp_path / "out").acquire() is not None


@pytest.mark.slow
def test_a_second_job_from_another_output_is_refused_while_the_first_runs(
        store: Path, tmp_path: Path) -> None:
    """A real first job (``--tables t*``) runs; a second one on the same tables from another
    output ends at once with exit 4 naming the first's host, pid and since (its own lock's)."""
    import signal

    from testkit.processes import kill_tree

    first_out = tmp_path / "first"
    with open(tmp_path / "first.log", "w") as sink:
        first = subprocess.Popen(
            [sys.executable, "-m", "tablestore_cdc", "replicate", "--store", str(store),
             "--tables", "t*", "--output", str(first_out)],
            cwd=REPO, env={**os.environ, "PYSPARK_PYTHON": sys.executable},
            stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240

        def published() -> bool:
            # both targets written and both tables' status records (which name the job's
            # output) published: the job prints a table's state after it publishes it
            log = (tmp_path / "first.log").read_text()
            return all((first_out / "lake" / t / "_delta_log").exists()
                       and f"table {t}: streaming" in log for t in ("t1", "t2"))

        while not published():
            assert first.poll() is None and time.monotonic() < deadline, (
                (tmp_path / "first.log").read_text()[-3000:])
            time.sleep(1)
        out = tmp_path / "second"
        code, stderr, took = run(store, out, "--tables", "t*")
        assert_refused(code, stderr, took, out, "is already replicated", exit_code=4)
        assert f"pid {first.pid}" in stderr and str(first_out) in stderr
        assert first.poll() is None  # the first goes on
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGTERM)
        try:
            first.wait(timeout=60)
        except subprocess.TimeoutExpired:
            kill_tree(first.pid)


def test_a_tunnel_type_option_in_any_case_is_the_one_the_source_gets(
        store: Path, tmp_path: Path) -> None:
    checked = check_before_start(JobPlan(
        f"local://{store}", JobOutput.of(tmp_path / "out"), "replicate",
        {"Tunnel.Type": "Stream"},
        lambda t: ApplySettings(f"delta:///lake/{t}"), tables="t1", one_table=True))
    assert checked.options == {"tunnel.type": "Stream"} and checked.lines == [NONE_WARNING]
