"""The replication job: run the pipeline, restart it after a retryable failure, end it with an
exit code (driver; ``tablestore-cdc replicate`` holds what ``open_job`` opens and runs a
``ReplicationJob``, in ``tablestore_cdc.commands.replicate.replicate_selection``).

The loop: start the pipeline (``start_pipeline``), watch its two queries; when one fails,
``failures.query_failure`` says what the error is. A retryable one stops the pipeline and starts
it again from its checkpoints after the restart policy's delay (``restarts.RestartPolicy``:
capped exponential backoff with jitter, forever by default): a restart replays the planned batch
from the meta table and the target's batch marker skips what it holds. Any other ends the job,
with exit code ``IN_USE``, ``CONFIGURATION`` or ``FAILED``.

Every attempt is one log line (``say``) and the query record's status (``restarting``: attempt
n, next in s; ``failed``: the reason), which the feed and the dashboard show. With ``once`` the
pipeline catches up (Trigger.AvailableNow) and the job ends with ``DONE``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from enum import IntEnum
from typing import Any, Protocol

from connector.errors import CdcError
from tablestore_cdc.pipeline.failures import FailureKind, QueryFailure, error_kind, query_failure
from tablestore_cdc.pipeline.job_lock import JobLock
from tablestore_cdc.pipeline.job_log import spark_log_to_file
from tablestore_cdc.pipeline.output import JobOutput, merge_packages
from tablestore_cdc.pipeline.relocation import MOVED_LINE, relocate
from tablestore_cdc.pipeline.restarts import RestartPolicy

#: how often the job looks at its queries (seconds)
WATCH_EVERY_S = 2.0


class RunningPipeline(Protocol):
    """What the job watches: ``multi_table.Pipeline`` (a selection of tables, one table
    included), which also has ``run_due_repairs()``, called at each look
    (``_run_due_repairs``: the re-snapshots of an idle stream)."""

    @property
    def queries(self) -> tuple[Any, Any]: ...

    def applied_batch(self) -> int | None: ...

    def stop(self) -> None: ...


class JobExit(IntEnum):
    """The exit codes of ``replicate`` (documented in docs/operations.md)."""

    DONE = 0  #: stopped by the operator (Ctrl-C, SIGTERM), or ``--once`` caught up
    FAILED = 1  #: an error no restart fixes without a look (data loss, a bug): see the log
    CONFIGURATION = 2  #: a refused flag, option or target; bad credentials; a missing table
    GAVE_UP = 3  #: ``--max-restarts`` restarts in a row failed
    IN_USE = 4  #: another job or query holds the source or the output directory


_EXIT_OF = {FailureKind.IN_USE: JobExit.IN_USE, FailureKind.CONFIGURATION:
            JobExit.CONFIGURATION, FailureKind.FATAL: JobExit.FAILED}


def open_job(output: JobOutput, master: str, say: Callable[[str], None],
             conf: dict[str, str] | None = None, *,
             short_run: bool = False) -> tuple[JobLock, Any]:
    """What a replication command holds while it runs (driver): the output directory's lock
    (``JobAlreadyRunningError`` for a second start, before anything is written), the
    change-log paths of an output moved or copied from elsewhere rewritten to it (``relocation.
    relocate``, said in one line, before Spark reads them), Spark's log
    sent to ``OUTPUT/logs/spark.log`` (its path said; ``output.JobOutput.logs_dir``), and a
    local session, with the settings its state needs (``JobOutput.spark_conf``: S3A) and ``conf``
    added (``--engine spark``: the jars and extensions, ``lakehouse.spark_merge``) and Spark's
    redaction of secrets (``connector.spark.REDACTION``: none in its UI, event log or plans);
    ``short_run`` (``--once``): the JVM options of a short run (``connector.spark.
    local_session``: C1-only JIT, serial collector), a job that runs on keeps C2. The caller
    releases the lock; on a failure here it is released before the error goes up."""
    from connector.spark import local_session

    # an output in object storage has no lock: the source's lease refuses a second job
    lock = JobLock(output.local).acquire() if output.local is not None else JobLock(None)
    try:
        if output.local is not None:  # a moved or copied output: its change-log paths, here
            moved = relocate(output.local)
            if moved is not None:
                say(MOVED_LINE.format(output=output, old=moved))
        log, settings = spark_log_to_file(output.logs_dir())
        say(f"Spark's log: {log}")
        spark = local_session("tablestore-cdc-replicate", master=master,
                              conf=merge_packages(settings, output.spark_conf(), conf or {}),
                              log_level="WARN",
                              short_run=short_run)
    except BaseException:
        lock.release()
        raise
    return lock, spark


class ReplicationJob:
    """One replication job, of one table or a selection, with its restart policy (driver).
    ``start`` starts the pipeline (raising on a failure at start); ``record_status`` writes the
    job's state where the feed reads it (over every table's status,
    ``TableStatusWriter.mark_all``); ``say`` prints
    one line."""

    def __init__(self, start: Callable[[], RunningPipeline], policy: RestartPolicy, *,
                 say: Callable[[str], None], once: bool = False,
                 record_status: Callable[[str, str | None], None] | None = None,
                 on_progress: Callable[[Any], None] | None = None) -> None:
        self._start = start
        self._policy = policy
        self._say = say
        self._once = once
        self._record_status = record_status or (lambda status, reason: None)
        self._on_progress = on_progress or (lambda pipeline: None)
        #: set by ``stop`` (another thread, or a test): the job ends at its next look
        self.stopping = threading.Event()
        self.restarts = 0  # in a row
        self._reached = False  # a pipeline has started before: an unreachable store is an outage
        #: the pipeline ``run`` stops when it ends
        self._pipeline: RunningPipeline | None = None

    def run(self) -> JobExit:
        """Run until stopped, done (``once``), or ended by a failure (module docstring).
        Ctrl-C and SIGTERM stop the pipeline at the job's next look (``_stop_on_signals``)
        and return ``DONE``; so does a KeyboardInterrupt raised in the job's thread."""
        self._pipeline = None
        try:
            with _stop_on_signals(self.stopping):
                return self._run()
        except KeyboardInterrupt:
            self._say("stopping…")
            return JobExit.DONE
        finally:
            if self._pipeline is not None:
                self._pipeline.stop()

    def _run(self) -> JobExit:
        """``run``'s loop; ``self._pipeline``: the pipeline still to stop."""
        while not self.stopping.is_set():
            failure, self._pipeline = self._run_once()
            if failure is None:
                break
            if not failure.retryable:
                self._say(f"failed: {failure.line()}")
                self._record_status("failed", failure.line())
                return _EXIT_OF[failure.kind]
            self.restarts += 1
            if self._policy.gives_up(self.restarts):
                self._say(f"gave up after {self.restarts - 1} restart(s) in a row: "
                          f"{failure.line()}")
                self._record_status("failed", f"gave up: {failure.line()}")
                return JobExit.GAVE_UP
            delay = self._policy.delay(self.restarts)
            self._say(f"restarting (attempt {self.restarts}, next in {delay:.1f} s): "
                      f"{failure.line()}")
            self._record_status("restarting", f"attempt {self.restarts}, next in "
                                f"{delay:.1f} s: {failure.line()}")
            self._pipeline = None
            self.stopping.wait(delay)
        if self.stopping.is_set():
            self._say("stopping…")
        return JobExit.DONE

    def _run_once(self) -> tuple[QueryFailure | None, RunningPipeline | None]:
        """Start the pipeline and watch it until it fails, ends (``once``) or the job stops;
        the failure (None: ended or stopped) and the pipeline still to stop."""
        try:
            pipeline = self._start()
        except CdcError as exc:
            return _failure_of(exc, self._reached), None
        except Exception as exc:  # noqa: BLE001 - Spark's error carrying the source's
            return query_failure(str(exc), reached_before=self._reached), None
        self._reached = True
        started_at = pipeline.applied_batch()
        try:
            while not self.stopping.is_set():
                text = _failure_text(pipeline)
                if text is not None:
                    pipeline.stop()
                    return query_failure(text, reached_before=True), None
                failed = _selection_failure(pipeline)
                if failed is not None:  # every table it names failed: nothing left to do
                    pipeline.stop()
                    return failed, None
                if self._once and not any(q.isActive for q in pipeline.queries):
                    _run_due_repairs(pipeline)  # a signal of a run that had no batch
                    self._on_progress(pipeline)  # the figures of the run's last batches
                    return None, pipeline
                if self.restarts and pipeline.applied_batch() != started_at:
                    self.restarts = 0  # a batch was applied: the next outage starts afresh
                    self._record_status("running", None)
                _run_due_repairs(pipeline)
                self._on_progress(pipeline)
                self.stopping.wait(WATCH_EVERY_S)
            self._on_progress(pipeline)  # stopped: the figures where it stopped
        except Exception as exc:  # noqa: BLE001 - a query's error raised while watching it
            pipeline.stop()
            return query_failure(str(exc), reached_before=True), None
        return None, pipeline


@contextlib.contextmanager
def _stop_on_signals(stopping: threading.Event) -> Iterator[None]:
    """While the job runs in the main thread: Ctrl-C and SIGTERM set ``stopping`` instead of
    raising wherever the main thread is. A KeyboardInterrupt raised inside a Py4J call broke
    the call's connection half-way (PySpark's own Ctrl-C handler even calls into the JVM from
    the signal handler), and Py4J printed its traceback and the JVM's stack on the console; the
    job instead stops the pipeline at its next look (``WATCH_EVERY_S``). A second signal raises
    KeyboardInterrupt as before, for a start that does not return (``--once`` catches up inside
    its start). The handlers in place before (PySpark's, the default) come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    def stop(*_: object) -> None:
        if stopping.is_set():  # a second signal: the operator insists (a start that hangs)
            raise KeyboardInterrupt
        stopping.set()

    handled = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, stop) for s in handled}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _failure_of(exc: CdcError, reached_before: bool) -> QueryFailure:
    first = str(exc).splitlines()[0] if str(exc) else ""
    return QueryFailure(error_kind(type(exc), reached_before=reached_before),
                        type(exc).__name__, first)


def _run_due_repairs(pipeline: RunningPipeline) -> None:
    """The pipeline's due re-snapshots when it applies no batch now (``tablestore_cdc.
    resnapshot.hook``: Spark calls the apply's ``foreachBatch`` only for a batch with data, so
    a quiet table's signal is run from here, every ``WATCH_EVERY_S``, under the lock the
    batches take). A pipeline without re-snapshots (a test's stand-in) has nothing to run."""
    run = getattr(pipeline, "run_due_repairs", None)
    if run is not None:
        run()


def _selection_failure(pipeline: RunningPipeline) -> QueryFailure | None:
    """The failure of a pipeline whose every named table failed (``multi_table.Pipeline.
    selection_failure``); None while one goes on, or for a test's stand-in without it."""
    failure = getattr(pipeline, "selection_failure", None)
    return None if failure is None else failure()


def _failure_text(pipeline: RunningPipeline) -> str | None:
    """The text of the first failed query's exception, or None while none failed."""
    for query in pipeline.queries:
        error: Any = query.exception()
        if error is not None:
            return str(error)
    return None
