"""The replication job's restart strategy (``tablestore_cdc.pipeline``: restarts, failures,
job, job_lock), without Spark: the backoff and its flags, what a failed query's error text is
classified as, the job's loop over starts that fail, and the output directory's lock held by
another real process. ``replicate`` itself under an outage, a second start and ``--once`` run
in tests/test_job.py and integration/test_replicate_outage.py."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest

from connector.errors import DataLossError, OptionError, SourceInUseError
from meta_store.errors import TransientMetaStoreError
from tablestore_cdc.lakehouse.errors import ApplyOptionError
from tablestore_cdc.pipeline.failures import FailureKind, query_failure
from tablestore_cdc.pipeline.job import JobExit, ReplicationJob
from tablestore_cdc.pipeline.job_lock import JobAlreadyRunningError, JobLock
from tablestore_cdc.pipeline.restarts import RestartPolicy, restart_policy

# --- the restart policy ----------------------------------------------------------------------


def test_delays_double_up_to_the_cap_with_jitter() -> None:
    policy = RestartPolicy(first_s=1.0, max_s=8.0)
    rng = random.Random(1)
    for attempt, base in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 8.0)]:
        delays = [policy.delay(attempt, rng) for _ in range(50)]
        assert all(0.8 * base <= d <= 1.2 * base for d in delays), (attempt, delays)
        assert max(delays) - min(delays) > 0.1 * base  # jittered, not all the same
    assert not RestartPolicy().gives_up(10_000)  # forever by default
    bounded = RestartPolicy(max_restarts=2)
    assert not bounded.gives_up(2) and bounded.gives_up(3)


@pytest.mark.parametrize(("backoff", "first", "cap"), [("1:60", 1.0, 60.0), ("5", 5.0, 60.0),
                                                       ("90", 90.0, 90.0), ("0.5:30", 0.5, 30.0)])
def test_restart_backoff_flag(backoff: str, first: float, cap: float) -> None:
    policy = restart_policy(backoff, None)
    assert (policy.first_s, policy.max_s) == (first, cap)


@pytest.mark.parametrize("backoff", ["", "x", "0", "-1:5", "10:5", "1:inf", "nan", "1:2:3"])
def test_a_bad_restart_backoff_names_the_flag(backoff: str) -> None:
    with pytest.raises(ApplyOptionError, match="--restart-backoff"):
        restart_policy(backoff, None)
    with pytest.raises(ApplyOptionError, match="--max-restarts"):
        restart_policy("1", -1)


# --- what a failed query failed with -----------------------------------------------------------


def spark_text(error: BaseException) -> str:
    """A StreamingQueryException's text as PySpark builds it: Spark's line, then the Python
    traceback of the process that raised (here: a real traceback of ``error``)."""
    try:
        raise error
    except BaseException as raised:  # noqa: BLE001
        trace = "".join(traceback.format_exception(raised))
    return ("[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
            "org.apache.spark.api.python.PythonException: " + trace +
            "\n\tat org.apache.spark.api.python.BasePythonRunner.handle(...)\n")


def test_failures_are_classified_by_the_products_error_class() -> None:
    outage = query_failure(spark_text(TransientMetaStoreError(detail="no answer")),
                           reached_before=True)
    assert outage.kind is FailureKind.RETRYABLE and outage.error == "TransientMetaStoreError"
    assert outage.line() == "TransientMetaStoreError: meta store temporarily unavailable: " \
                            "no answer"
    option = query_failure(spark_text(OptionError(option="x", problem="bad", value=1,
                                                  allowed="y")), reached_before=True)
    assert option.kind is FailureKind.CONFIGURATION
    lost = query_failure(spark_text(DataLossError.__new__(DataLossError)), reached_before=True)
    assert lost.kind is FailureKind.FATAL
    bug = query_failure(spark_text(KeyError("k")), reached_before=True)
    assert bug.kind is FailureKind.FATAL and bug.error is None
    died = query_failure("org.apache.spark.SparkException: Python worker exited unexpectedly "
                         "(crashed)", reached_before=True)
    assert died.kind is FailureKind.RETRYABLE


# --- the job's loop ------------------------------------------------------------------------------


def test_the_job_restarts_retryable_failures_and_ends_on_a_configuration_error() -> None:
    errors = [TransientMetaStoreError(detail="down"), TransientMetaStoreError(detail="down"),
              OptionError(option="table.name", problem="no such table", value="t", allowed="-")]
    lines: list[str] = []
    statuses: list[tuple[str, str | None]] = []

    def start() -> None:
        raise errors.pop(0)

    job = ReplicationJob(start, RestartPolicy(first_s=0.01, max_s=0.02), say=lines.append,  # type: ignore[arg-type]
                         record_status=lambda s, r: statuses.append((s, r)))
    assert job.run() is JobExit.CONFIGURATION
    assert [line.split(":")[0] for line in lines] == [
        "restarting (attempt 1, next in 0.0 s)", "restarting (attempt 2, next in 0.0 s)",
        "failed"]
    assert "OptionError: option 'table.name'" in lines[-1]
    assert [s for s, _ in statuses] == ["restarting", "restarting", "failed"]


def test_the_job_gives_up_after_max_restarts_and_in_use_is_its_own_exit() -> None:
    lines: list[str] = []

    def outage() -> None:
        raise TransientMetaStoreError(detail="down")

    job = ReplicationJob(outage, RestartPolicy(0.01, 0.01, max_restarts=2), say=lines.append)  # type: ignore[arg-type]
    assert job.run() is JobExit.GAVE_UP
    assert lines[-1].startswith("gave up after 2 restart(s) in a row")

    def in_use() -> None:
        raise SourceInUseError.__new__(SourceInUseError)

    assert ReplicationJob(in_use, RestartPolicy(), say=lines.append).run() is JobExit.IN_USE  # type: ignore[arg-type]


# --- one job per output directory ---------------------------------------------------------------


def test_a_second_job_on_the_same_output_is_refused_until_the_first_dies(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from tablestore_cdc.pipeline.job_lock import JobLock; "
         "lock = JobLock(Path(sys.argv[1])).acquire(); print('held', flush=True); time.sleep(600)",
         str(tmp_path / "out")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(JobAlreadyRunningError) as refused:
            JobLock(tmp_path / "out").acquire()
        message = str(refused.value)
        assert f"pid {holder.pid}" in message and "since 20" in message
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".replicate.lock"]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    deadline = time.monotonic() + 10
    while True:  # the kernel drops a killed holder's lock
        try:
            with JobLock(tmp_path / "out"):
                break
        except JobAlreadyRunningError:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_replicate_names_its_flags_in_errors_and_creates_nothing(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from connector.local import LocalTablestore
    from tablestore_cdc.cli import app

    with LocalTablestore(tmp_path / "store.db") as store:
        store.create_table("t", primary_key=[("id", "INTEGER")], channels=2)
    base = ["replicate", "--store", str(tmp_path / "store.db"), "--table", "t",
            "--output", str(tmp_path / "out")]
    for flags, named in [(["--schema-drift", "bogus"], "'--schema-drift'"),
                         (["--scd", "2", "--soft-delete-column", "d"], "'--soft-delete-column'"),
                         (["--restart-backoff", "0"], "'--restart-backoff'"),
                         (["--max-restarts", "-1"], "'--max-restarts'")]:
        result = CliRunner().invoke(app, [*base, *flags])
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith("error: option " + named), result.stderr
        assert result.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()
