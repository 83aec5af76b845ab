"""The replication job's restart strategy (``tablestore_cdc.pipeline``: restarts, failures,
job, job_lock), without Spark: the backoff and its flags, what a failed query's error text is
classified as, the job's loop over starts that fail, and the output directory's lock held by
another real process. ``replicate`` itself under an outage, a second start and ``--once`` run
in tests/test_job.py and integration/test_replicate_outage.py."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest

from connector.errors import DataLossError, OptionError, SourceInUseError
from meta_store.errors import TransientMetaStoreError
from tablestore_cdc.lakehouse.errors import ApplyOptionError
from tablestore_cdc.pipeline.failures import FailureKind, query_failure, table_failure
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


def test_a_failed_tables_reason_is_classified_by_its_error_class() -> None:
    """Every table of a named selection failed: the job ends as the reason's error would end
    it (``multi_table.Pipeline.selection_failure``), the source's reason and the apply's."""
    refused = table_failure("batch 3: ApplyOptionError: option 'scd': got 3\nmore")
    assert (refused.kind, refused.error) == (FailureKind.CONFIGURATION, "ApplyOptionError")
    assert refused.line() == "ApplyOptionError: option 'scd': got 3"
    lost = table_failure("DataLossError: records trimmed")
    assert (lost.kind, lost.error) == (FailureKind.FATAL, "DataLossError")
    unknown = table_failure("batch 1: KeyError: 'k'")
    assert unknown.kind is FailureKind.FATAL and unknown.error is None


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


class _SlowQuery:
    """A query whose every call takes a while, as a Py4J call into the JVM does; it records a
    call a signal broke into."""

    def __init__(self, broken: list[str]) -> None:
        self.broken = broken

    def _call(self, name: str) -> None:
        try:
            time.sleep(0.2)
        except KeyboardInterrupt:
            self.broken.append(name)
            raise

    def exception(self) -> None:
        self._call("exception")

    @property
    def isActive(self) -> bool:  # noqa: N802 - PySpark's name
        self._call("isActive")
        return True


class _SlowPipeline:
    def __init__(self) -> None:
        self.broken: list[str] = []
        self.queries = (_SlowQuery(self.broken), _SlowQuery(self.broken))
        self.stops = 0

    def applied_batch(self) -> int:
        self.queries[0]._call("applied_batch")
        return 0

    def stop(self) -> None:
        self.stops += 1


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "term"])
def test_a_stop_signal_ends_the_job_at_its_next_look_not_inside_a_call(
        stop_signal: signal.Signals) -> None:
    """Ctrl-C and SIGTERM set the job's stop flag: no call into the queries is broken half-way
    (a KeyboardInterrupt inside a Py4J call broke its connection and printed Py4J's traceback
    and the JVM's stack), the pipeline is stopped once, the job ends with DONE, and the
    handlers in place before come back."""
    pipeline = _SlowPipeline()
    lines: list[str] = []
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    timer = threading.Timer(0.5, os.kill, (os.getpid(), stop_signal))
    timer.start()
    try:
        code = ReplicationJob(lambda: pipeline, RestartPolicy(), say=lines.append).run()
    finally:
        timer.cancel()
    assert code is JobExit.DONE
    assert lines == ["stopping…"]
    assert pipeline.broken == [] and pipeline.stops == 1
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_stopped_job_takes_a_last_look_before_it_stops_the_pipeline() -> None:
    """The job stopping (Ctrl-C, SIGTERM: its stop flag) looks at its pipeline once more
    before it stops it, so the command prints the figures where it stopped (its summary line)
    even when the stop comes before the interval's next one."""
    pipeline = _SlowPipeline()
    looks: list[tuple[bool, int]] = []  # each look: stopping yet, pipeline stops so far

    def look(_pipeline: object) -> None:
        looks.append((job.stopping.is_set(), pipeline.stops))
        job.stopping.set()  # the stop arrives between this look and the next

    job = ReplicationJob(lambda: pipeline, RestartPolicy(), say=lambda _line: None,
                         on_progress=look)
    assert job.run() is JobExit.DONE
    assert looks == [(False, 0), (True, 0)] and pipeline.stops == 1


def test_a_second_stop_signal_interrupts_a_start_that_does_not_return() -> None:
    """A start that hangs (``--once`` catches up inside its start): the first Ctrl-C only asks
    the job to stop, a second one interrupts it, and the job still ends with DONE."""
    lines: list[str] = []

    def hanging_start() -> None:
        time.sleep(30)

    timers = [threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT)) for delay in (0.3, 0.8)]
    for timer in timers:
        timer.start()
    began = time.monotonic()
    try:
        code = ReplicationJob(hanging_start, RestartPolicy(), say=lines.append).run()  # type: ignore[arg-type]
    finally:
        for timer in timers:
            timer.cancel()
    assert code is JobExit.DONE and lines == ["stopping…"]
    assert time.monotonic() - began < 10


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
    from tablestore_cdc.commands.app import app

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


@pytest.mark.parametrize("latest, report", [
    ('{"tables": {"a": "streaming"}}', {"tables": {"a": "streaming"}}),
    ({"lag": {}}, {"lag": {}}),
    ("{'uuid': 'not JSON'}", {}),  # what an older PySpark may show: no report, not a failure
    (None, {}),
])
def test_source_report_reads_what_spark_shows_as_latest_offset(latest: object,
                                                               report: dict) -> None:
    from types import SimpleNamespace

    from tablestore_cdc.pipeline.multi_table import Pipeline

    changelog = SimpleNamespace(lastProgress={"sources": [{"latestOffset": latest}]})
    assert Pipeline(changelog, state_query=None, apply=None).source_report() == report
