"""A multi-table query through an outage of its services, without Spark (connector.multiplex,
tablestore_cdc.pipeline.multi_table): the source and the meta store stop answering at one exact
step of a batch (planning, opening a table's protocol, reading, committing, applying), writers
go on meanwhile, and once the services answer again every table streams from where it stopped
and every change is read exactly once.

The outage is a fault hook on the client seam (``connector.clients.ClientHooks``): every call of
every client opened through it raises the client's retryable error while the outage lasts. A
restarting table's next try is timed on the seam's clock, a ``FakeClock`` moved by the test.
"""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import connector.clients as clients_module
import connector.retry as retry_module
from connector.clients import ClientHooks, Clients, ExecutorClients
from connector.errors import (
    CdcError,
    EndpointUnreachableError,
    OptionError,
    TransientMetaStoreError,
    TransientTunnelError,
)
from connector.local import LocalTablestore
from connector.multiplex import MultiTableStreamReader
from connector.proxy import ClientProxy
from connector.table_selection import MultiTableOptions
from connector.table_state import State, TableState
from connector.tunnel import TunnelService
from tablestore_cdc.pipeline import ApplySettings
from tablestore_cdc.pipeline.metrics import TableMetrics
from tablestore_cdc.pipeline.multi_table import (
    MultiTableApply,
    Pipeline,
    retry_options,
)
from tablestore_cdc.pipeline.restarts import RestartPolicy, restart_policy
from testkit.clock import FakeClock

TABLES = ("a", "b")


class Outage:
    """A fault hook: while ``down``, every call of a client it wrapped raises that client's
    retryable error (``TransientTunnelError``, ``TransientMetaStoreError``), as a stopped
    emulator answers nothing."""

    def __init__(self, error: Callable[[str], CdcError] | None = None) -> None:
        self.down = False
        self.refused = 0
        #: the error every refused call raises (None: the client's retryable one)
        self.error = error

    def __call__(self, client: Any) -> Any:
        return _Unanswered(client, self)


class _Unanswered(ClientProxy):
    def __init__(self, target: Any, outage: Outage) -> None:
        super().__init__(target)
        self._outage = outage

    def _call(self, name: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        if self._outage.down:
            self._outage.refused += 1
            if self._outage.error is not None:
                raise self._outage.error(name)
            error = (TransientTunnelError if isinstance(self._target, TunnelService)
                     else TransientMetaStoreError)
            raise error(detail=f"{name}: connection refused")
        return method(*args, **kwargs)


class Run:
    """One query's planning process (a ``MultiTableStreamReader`` over the outage's seam)
    and its executors (the process's client pool, over the same seam), driven in Spark's
    order; every row read is kept."""

    def __init__(self, path: Path, outage: Outage, clock: FakeClock | None = None) -> None:
        self.path, self.outage = path, outage
        self.clock = clock or FakeClock(start=time.time())
        self.rows: list[dict[str, Any]] = []
        self.reader = self.restart()

    def restart(self) -> MultiTableStreamReader:
        """A new planning process (Spark restarted the query after it failed)."""
        self.reader = MultiTableStreamReader(MultiTableOptions.from_spark({
            "endpoint": f"local://{self.path}", "tables": "*", "tunnel.name": "t",
            "tables.refreshIntervalMs": "3600000"}),
            Clients(ClientHooks(clock=self.clock.monotonic, fault_hook=self.outage)))
        return self.reader

    def read(self, start: dict, end: dict) -> None:
        """``partitions`` on the driver, each partition read as an executor reads it."""
        executor = pickle.loads(pickle.dumps(self.reader))
        for partition in self.reader.partitions(start, end):
            for batch in executor.read(pickle.loads(pickle.dumps(partition))):
                self.rows += batch.to_pylist()

    def batch(self, start: dict) -> dict:
        """One micro-batch (latestOffset, partitions, read, commit; none when nothing moved)."""
        end = self.reader.latestOffset(start, None)
        if end != start:
            self.read(start, end)
            self.reader.commit(end)
        return end

    def catch_up(self, end: dict) -> dict:
        """Micro-batches from ``end`` until one moves nothing; where they ended."""
        while (moved := self.batch(end)) != end:
            end = moved
        return end

    def states(self) -> dict[str, TableState]:
        """Each table's state as Spark's progress report carries it, read back."""
        return {table: TableState.from_text(text)
                for table, text in self.reader.reportLatestOffset()["tables"].items()}

    def wait_out(self) -> None:
        """Let the seam's clock pass every restarting table's next try."""
        self.clock.sleep(120.0)


@pytest.fixture
def outage(monkeypatch: pytest.MonkeyPatch) -> Iterator[Outage]:
    """The outage's hook on the seam of the planning process and of the executors' pool; the
    per-call retries (``connector.retry``) give up at once instead of over 5 s."""
    monkeypatch.setattr(retry_module, "DEADLINE_S", 0.0)
    monkeypatch.setattr(retry_module, "BACKOFF_INITIAL_S", 0.0)
    monkeypatch.setattr(retry_module, "BACKOFF_JITTER_S", 0.0)
    hook = Outage()
    pool = ExecutorClients(clients=Clients(ClientHooks(fault_hook=hook)))
    monkeypatch.setattr(clients_module, "_POOL", pool)
    yield hook
    hook.down = False
    pool.close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LocalTablestore]:
    with LocalTablestore(tmp_path / "s.db") as opened:
        for table in TABLES:
            opened.create_table(table, [("id", "INTEGER")], [("v", "STRING")], channels=1)
        yield opened


def write(store: LocalTablestore, first: int, count: int = 3) -> None:
    """Writers on both tables: new rows, an update and a delete of earlier ones."""
    for table in TABLES:
        for i in range(first, first + count):
            store.put_row(table, {"id": i}, {"v": f"{table}{i}"})
        if first:
            store.update_row(table, {"id": first - 1}, {"v": f"{table}{first - 1}'"})
            store.delete_row(table, {"id": 0})


def assert_exact(store: LocalTablestore, rows: list[dict[str, Any]]) -> None:
    """Every change of every table read exactly once (none lost, none twice), and the rows,
    applied in order, equal the source table."""
    for table in TABLES:
        mine = [r for r in rows if r["_table"] == table]
        read = sorted(r["_sequence"] for r in mine)
        assert len(read) == len(set(read)), f"{table}: a change read twice"
        assert len(read) == len(store.change_log(table)), f"{table}: a change lost"
        copy: dict[str, Any] = {}
        for r in mine:
            key = json.loads(r["_key"])["id"]
            if r["_op"] == "DELETE":
                copy.pop(key, None)
            else:
                copy[key] = {**copy.get(key, {}), **json.loads(r["_row"])}["v"]
        assert copy == {k["id"]: c["v"] for k, c in store.scan(table)}, table


def first_batch_planned(store: LocalTablestore, outage: Outage) -> tuple[Run, dict, dict]:
    """A run over the first writes of both tables, its first batch planned (``latestOffset``)
    and not read yet: the run, where the batch starts and where it ends."""
    run = Run(store.path, outage)
    write(store, 0)
    start = run.reader.initialOffset()
    return run, start, run.reader.latestOffset(start, None)


def assert_recovered(store: LocalTablestore, run: Run, end: dict) -> None:
    """Once the outage is over: ``run`` caught up from ``end``, every table streaming and
    every change read exactly once (``assert_exact``)."""
    run.catch_up(end)
    assert run.states() == {"a": TableState(State.STREAMING), "b": TableState(State.STREAMING)}
    assert_exact(store, run.rows)


def test_a_table_caught_by_an_outage_while_planning_restarts_and_streams_again(
        tmp_path: Path, store: LocalTablestore, outage: Outage) -> None:
    run = Run(store.path, outage)
    write(store, 0)
    start = run.reader.initialOffset()
    end = run.batch(start)
    outage.down = True
    write(store, 10)
    # latestOffset: each table's protocol fails; the query goes on, nothing moves
    assert run.batch(end) == end
    states = run.states()
    assert all(s.state is State.RESTARTING and s.attempt == 1 and s.next_in_s is not None
               for s in states.values()), states
    run.wait_out()
    # tried again while still down: now opening the protocol (table_schema) fails
    assert run.batch(end) == end
    assert all(s.attempt == 2 for s in run.states().values()), run.states()
    run.batch(end)  # before its next try: not asked, not failed
    outage.down = False
    write(store, 20)
    run.wait_out()
    assert_recovered(store, run, end)


def test_a_table_whose_commit_meets_an_outage_restarts_and_commits_on_its_next_try(
        store: LocalTablestore, outage: Outage) -> None:
    run, start, end = first_batch_planned(store, outage)
    run.read(start, end)
    outage.down = True
    run.reader.commit(end)  # both tables' commits refused: restarting, the query goes on
    assert all(s.state is State.RESTARTING for s in run.states().values()), run.states()
    write(store, 10)
    assert run.batch(end) == end  # frozen meanwhile
    outage.down = False
    run.wait_out()
    # the lost commit caught up first
    assert_recovered(store, run, end)


def test_an_outage_while_reading_fails_the_query_and_its_restart_replays_the_batch_exactly(
        store: LocalTablestore, outage: Outage) -> None:
    run, start, end = first_batch_planned(store, outage)
    outage.down = True
    with pytest.raises(CdcError) as raised:  # an executor's read: the query fails
        run.read(start, end)
    assert raised.value.retryable  # the job restarts it
    outage.down = False
    run.rows.clear()  # the failed batch's rows never reached the sink
    run.restart()
    run.read(start, end)  # Spark replays the logged batch
    run.reader.commit(end)
    write(store, 10)
    assert_recovered(store, run, end)


def test_a_logged_batch_of_a_restarting_table_is_read_or_fails_the_query_retryably(
        store: LocalTablestore, outage: Outage) -> None:
    """A restart replays a logged batch: a table restarting then is tried at once, and while
    the outage lasts the retryable error fails the query (never an OptionError, which ends
    the job)."""
    run, start, end = first_batch_planned(store, outage)
    run.restart()  # the planning process restarted with the batch logged
    run.reader.listed_tables()
    outage.down = True
    run.reader.latestOffset(start, None)  # while down: the tables go restarting
    with pytest.raises(CdcError) as raised:
        run.reader.partitions(start, end)
    assert raised.value.retryable and not isinstance(raised.value, OptionError)
    outage.down = False
    run.read(start, end)  # before the tables' next try: opened at once for the logged batch
    run.reader.commit(end)
    assert_exact(store, run.rows)


def test_an_endpoint_that_stops_answering_after_the_query_reached_it_is_an_outage(
        store: LocalTablestore, outage: Outage) -> None:
    """A table's protocol opened again binds inside the query's first-contact rule, where an
    endpoint giving no answer at all is a configuration error (a wrong URL); once the query
    has reached its services it is an outage, as the job counts it."""
    run = Run(store.path, outage)
    write(store, 0)
    end = run.batch(run.reader.initialOffset())
    outage.error = lambda name: EndpointUnreachableError(
        problem=f"{name}: connection refused by 127.0.0.1 (check the endpoint)")
    outage.down = True
    assert run.batch(end) == end
    assert all(s.state is State.RESTARTING for s in run.states().values()), run.states()
    outage.down = False
    run.wait_out()
    write(store, 10)
    assert_recovered(store, run, end)


def test_a_table_gives_up_after_max_retries_and_the_query_fails_retryably(
        store: LocalTablestore, outage: Outage) -> None:
    run = Run(store.path, outage)
    run.reader = MultiTableStreamReader(MultiTableOptions.from_spark({
        "endpoint": f"local://{store.path}", "tables": "a", "tunnel.name": "t",
        "tables.refreshIntervalMs": "3600000", "tables.maxRetries": "1",
        "tables.retryBackoff": "2:4"}),
        Clients(ClientHooks(clock=run.clock.monotonic, fault_hook=outage)))
    start = run.reader.initialOffset()
    outage.down = True
    run.reader.latestOffset(start, None)
    assert run.states()["a"].state is State.RESTARTING
    assert run.states()["a"].next_in_s is not None
    run.clock.sleep(5.0)
    with pytest.raises(CdcError) as raised:  # the second failure in a row: the job's turn
        run.reader.latestOffset(start, None)
    assert raised.value.retryable


@pytest.mark.parametrize(("options", "option"), [
    ({"tables.retryBackoff": "0"}, "tables.retryBackoff"),
    ({"tables.retryBackoff": "5:1"}, "tables.retryBackoff"),
    ({"tables.retryBackoff": "soon"}, "tables.retryBackoff"),
    ({"tables.maxRetries": "-1"}, "tables.maxRetries"),
    ({"tables.maxRetries": "many"}, "tables.maxRetries"),
])
def test_a_bad_retry_option_is_refused_naming_it(tmp_path: Path, options: dict,
                                                 option: str) -> None:
    base = {"endpoint": f"local://{tmp_path}/s.db", "tunnel.name": "t", "tables": "*"}
    with pytest.raises(OptionError) as raised:
        MultiTableOptions.from_spark({**base, **options})
    assert raised.value.fields["option"] == option


@pytest.mark.parametrize("policy", [RestartPolicy(), restart_policy("0.5:30", 4),
                                    restart_policy("5", 0)])
def test_the_job_s_restart_policy_is_the_one_a_table_is_retried_on(
        tmp_path: Path, policy: RestartPolicy) -> None:
    options = MultiTableOptions.from_spark({
        "endpoint": f"local://{tmp_path}/s.db", "tunnel.name": "t", "tables": "*",
        **retry_options(policy)})
    assert options.retry == policy


class _Progress:
    """Spark's query as ``Pipeline`` reads it: its last progress, with the source's
    report (``reportLatestOffset``) as Spark puts it there."""

    def __init__(self, report: dict | None = None) -> None:
        self.lastProgress = ({"batchId": 0, "sources": [{"latestOffset": json.dumps(report)}]}
                             if report is not None else None)


def test_the_table_status_and_the_metrics_show_restarting_then_streaming_again(
        tmp_path: Path, store: LocalTablestore, outage: Outage) -> None:
    run = Run(store.path, outage)
    write(store, 0)
    end = run.batch(run.reader.initialOffset())
    apply = MultiTableApply(ApplySettings(target=f"delta://{tmp_path}/lake/{{table}}"),
                            "local://store", tmp_path / "out")
    metrics = TableMetrics()

    def statuses() -> dict[str, tuple[str, str | None, int | None]]:
        pipeline = Pipeline(_Progress(run.reader.reportLatestOffset()), _Progress(),
                                      apply)
        shown = pipeline.table_statuses(str(tmp_path / "out"), "*")
        metrics.update(shown)
        return {t: (s.state, s.reason, s.attempt) for t, s in shown.items()}

    def gauge(table: str, state: str) -> float | None:
        return metrics.registry.get_sample_value("tablestore_cdc_table_state",
                                                 {"table": table, "state": state})

    outage.down = True
    run.batch(end)
    during = statuses()
    assert {state for state, _, _ in during.values()} == {"restarting"}
    assert {attempt for _, _, attempt in during.values()} == {1}, during
    assert gauge("a", "restarting") == 1 and gauge("a", "failed") == 0
    outage.down = False
    run.wait_out()
    run.batch(end)
    assert statuses() == {"a": ("streaming", None, None), "b": ("streaming", None, None)}
    assert gauge("a", "streaming") == 1 and gauge("a", "restarting") == 0


class _FlakySink:
    """A real target's sink whose ``apply`` raises a retryable error while the outage lasts
    (the object store or the meta store not answering)."""

    def __init__(self, sink: Any, outage: Outage) -> None:
        self._sink, self._outage = sink, outage

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        if self._outage.down:
            raise TransientMetaStoreError(detail="object store: 503 Slow Down")
        return self._sink.apply(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)


def test_a_retryable_error_of_a_table_s_apply_fails_the_batch_not_the_table(
        tmp_path: Path, store: LocalTablestore, outage: Outage) -> None:
    """The batch fails (the job restarts the query, which replays it); the table is never
    marked failed, and the replay leaves every target equal to its source."""
    from deltalake import DeltaTable

    from tablestore_cdc.lakehouse import open_apply_sink

    run = Run(store.path, outage)
    write(store, 0)
    start = run.reader.initialOffset()
    run.batch(start)
    changes = pa.Table.from_pylist(run.rows)
    out = tmp_path / "out"
    settings = ApplySettings(target=f"delta://{tmp_path}/lake/{{table}}")
    flaky_b = Outage()

    def open_sink(target: str, **kwargs: Any) -> Any:
        sink = open_apply_sink(target, **kwargs)
        return _FlakySink(sink, flaky_b) if target.endswith("/b") else sink

    apply = MultiTableApply(settings, "local://store", out, open_sink=open_sink)
    flaky_b.down = True
    with pytest.raises(CdcError) as raised:
        apply.apply_batch(changes, "app", 0)  # "a" is applied, then "b" is refused
    assert raised.value.retryable
    assert apply.tables["b"].state != "failed"
    assert not (out / "_tables" / "b.failed").exists()
    flaky_b.down = False
    replay = MultiTableApply(settings, "local://store", out, open_sink=open_sink)
    replay.resume_held("app")
    replay.apply_batch(changes, "app", 0)  # the job's restart replays the batch
    for table in TABLES:
        target = DeltaTable(str(tmp_path / "lake" / table)).to_pyarrow_table().to_pylist()
        assert sorted((r["id"], r["v"]) for r in target) == sorted(
            (k["id"], c["v"]) for k, c in store.scan(table)), table


class _Collected:
    """What ``foreachBatch`` is given, as far as the embedded engine reads it (``toArrow``)."""

    def __init__(self, rows: pa.Table) -> None:
        self.rows = rows

    def toArrow(self) -> pa.Table:  # noqa: N802 - PySpark's name
        return self.rows


def test_a_change_log_write_that_fails_while_the_tables_apply_fails_the_batch(
        tmp_path: Path, store: LocalTablestore, outage: Outage) -> None:
    """The one-cycle batch writes its change-log file while the tables are applied: a write
    that fails fails the batch even though every target committed it, and the replay writes
    the file and changes no target (each holds the batch)."""
    from deltalake import DeltaTable

    run = Run(store.path, outage)
    write(store, 0)
    run.batch(run.reader.initialOffset())
    changes = pa.Table.from_pylist(run.rows)
    out = tmp_path / "out"
    settings = ApplySettings(target=f"delta://{tmp_path}/lake/{{table}}")
    out.mkdir()
    (out / "changelog").write_text("a file where the change log's folder goes")
    apply = MultiTableApply(settings, "local://store", out, writes_changelog=True)
    with pytest.raises(OSError):
        apply._apply_frame(_Collected(changes), "app", 0)
    versions = {t: DeltaTable(str(tmp_path / "lake" / t)).version() for t in TABLES}
    (out / "changelog").unlink()
    replay = MultiTableApply(settings, "local://store", out, writes_changelog=True)
    replay._apply_frame(_Collected(changes), "app", 0)
    logged = pq.read_table(out / "changelog" / f"batch-{0:012d}.parquet")
    assert logged.num_rows == changes.num_rows
    for table in TABLES:
        target = DeltaTable(str(tmp_path / "lake" / table))
        assert target.version() == versions[table]  # the replay was skipped
        assert sorted((r["id"], r["v"]) for r in target.to_pyarrow_table().to_pylist()) == sorted(
            (k["id"], c["v"]) for k, c in store.scan(table)), table


class _RefusingSink(_FlakySink):
    """A real target's sink that refuses every batch (a configuration error) while
    ``refusal`` is down, and raises a retryable error while the outage lasts."""

    def __init__(self, sink: Any, outage: Outage, refusal: Outage) -> None:
        super().__init__(sink, outage)
        self._refusal = refusal

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        if self._refusal.down:
            raise OptionError(option="--schema-drift", value="exception",
                              problem="refuses a new attribute", allowed="lenient")
        return super().apply(*args, **kwargs)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_an_outage_while_held_batches_are_resumed_keeps_the_table_failed_and_its_batches_held(
        tmp_path: Path, store: LocalTablestore, outage: Outage, where: str,
        request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The failed tables' reasons and held batches are kept in the job's output, a local
    directory or a prefix in S3 (``replicate --output s3://``, moto's server here)."""
    from deltalake import DeltaTable

    from tablestore_cdc.lakehouse import open_apply_sink
    from tablestore_cdc.pipeline.output import JobOutput
    from testkit.aws import new_s3_bucket

    run = Run(store.path, outage)
    write(store, 0)
    run.batch(run.reader.initialOffset())
    changes = pa.Table.from_pylist(run.rows)
    if where == "s3":
        bucket = new_s3_bucket(request.getfixturevalue("moto_endpoint"), monkeypatch)
        out = JobOutput.parse(f"s3://{bucket}/state")
    else:
        out = JobOutput.parse(str(tmp_path / "out"))
    settings = ApplySettings(target=f"delta://{tmp_path}/lake/{{table}}")
    down, refusal = Outage(), Outage()
    refusal.down = True

    def open_sink(target: str, **kwargs: Any) -> Any:
        return _RefusingSink(open_apply_sink(target, **kwargs), down, refusal)

    first = MultiTableApply(settings, "local://store", out, open_sink=open_sink)
    first.apply_batch(changes, "app", 0)  # refused: both tables failed, their rows held
    assert {t: s.state for t, s in first.tables.items()} == {"a": "failed", "b": "failed"}
    refusal.down = False  # the setting fixed; the job restarts during an outage
    down.down = True
    restarted = MultiTableApply(settings, "local://store", out, open_sink=open_sink)
    with pytest.raises(CdcError) as raised:
        restarted.resume_held("app")
    assert raised.value.retryable  # the job's start fails retryably, and is tried again
    assert restarted.tables["a"].state == "failed"
    assert out.read_bytes("_tables", "a.failed") is not None
    assert out.names("_held", "a", suffix=".parquet") == ["000000000000.parquet"]
    down.down = False
    again = MultiTableApply(settings, "local://store", out, open_sink=open_sink)
    again.resume_held("app")
    assert {t: s.state for t, s in again.tables.items()} == {"a": "streaming", "b": "streaming"}
    assert out.names("_tables", suffix=".failed") == []
    assert out.names("_held", "a", suffix=".parquet") == []
    for table in TABLES:
        target = DeltaTable(str(tmp_path / "lake" / table)).to_pyarrow_table().to_pylist()
        assert sorted((r["id"], r["v"]) for r in target) == sorted(
            (k["id"], c["v"]) for k, c in store.scan(table)), table
