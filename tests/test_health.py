"""Health that alerts: a source that stops answering shows as ``source unreachable`` in the
meta store's record (the feed, the dashboard, ``meta tables``) and in the Prometheus metrics
(scraped over HTTP) while the job restarts, and as up again once it reads; per-operation
counters; ``idle`` for a caught-up job that is alive, ``stale`` for one whose record ages;
the console's summary instead of a line per table per batch."""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cdc_common.backoff import RestartPolicy
from meta_store import open_meta_store
from meta_store.errors import TransientMetaStoreError
from tablestore_cdc.feed.snapshot import activity, sources_summary
from tablestore_cdc.lakehouse.sink import ApplyResult, op_counts
from tablestore_cdc.pipeline import job as job_module
from tablestore_cdc.pipeline.job import JobExit, ReplicationJob
from tablestore_cdc.pipeline.metrics import TableMetrics
from tablestore_cdc.table_status import (
    STALE_AFTER_S,
    AppliedTable,
    StatusSummary,
    TableStatus,
    TableStatusWriter,
)
from testkit.feed_schema import feed_validator, load_feed_schema

NS = "local:/s.db#orders#t"


class _Query:
    def __init__(self, outage: threading.Event) -> None:
        self.outage = outage
        self.isActive = True

    def exception(self) -> str | None:
        if self.outage.is_set():  # as Spark hands over the source's error
            return ("pyspark.errors.StreamingQueryException: ...\n"
                    "meta_store.errors.TransientMetaStoreError: the meta store does not answer")
        return None


class _Pipeline:
    """A running pipeline whose query fails while ``outage`` is set; it applies a batch per
    look."""

    def __init__(self, outage: threading.Event) -> None:
        self._queries = (_Query(outage), _Query(outage))
        self.batch = 0

    @property
    def queries(self) -> tuple[Any, Any]:
        return self._queries

    def applied_batch(self) -> int:
        self.batch += 1
        return self.batch

    def stop(self) -> None:
        pass


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return answer.read().decode()


def _value(text: str, series: str) -> float | None:
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return None if found is None else float(found.group(1))


def _wait_for(check: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.05)


def test_an_outage_shows_the_source_down_and_up_again_over_http(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_module, "WATCH_EVERY_S", 0.05)
    uri = f"sqlite://{tmp_path / 'meta.db'}"
    with open_meta_store(uri) as meta:
        meta.set_namespace_info(NS, {"table": "orders"})
    writer = TableStatusWriter(lambda table: (uri, None, NS))
    metrics = TableMetrics(source="http://127.0.0.1:9/instance")
    writer.observe(metrics.update)
    port = metrics.serve(0)
    outage = threading.Event()

    def start() -> _Pipeline:
        if outage.is_set():
            raise TransientMetaStoreError(detail="the meta store does not answer")
        return _Pipeline(outage)

    def progress(_pipeline: Any) -> None:
        writer.publish({"orders": TableStatus(table="orders", job="/out", selection="orders",
                                              state="streaming", records_behind=0)})

    job = ReplicationJob(start, RestartPolicy(0.05, 0.2), say=lambda line: None,
                         record_status=writer.mark_all, on_progress=progress)
    ended: list[JobExit] = []
    thread = threading.Thread(target=lambda: ended.append(job.run()), daemon=True)
    thread.start()
    up = 'tablestore_cdc_source_up{source="http://127.0.0.1:9/instance"}'
    table_up = 'tablestore_cdc_table_up{table="orders"}'
    try:
        _wait_for(lambda: _value(_scrape(port), up) == 1.0)
        began = time.time()
        outage.set()
        _wait_for(lambda: _value(_scrape(port), up) == 0.0, seconds=5)
        text = _scrape(port)
        assert _value(text, table_up) == 0.0
        assert _value(text, 'tablestore_cdc_table_state{state="unreachable",table="orders"}') \
            == 1.0
        since = _value(text, 'tablestore_cdc_table_unreachable_since_timestamp_seconds'
                       '{table="orders"}')
        assert since is not None and began - 1 <= since <= time.time()
        # several attempts: the outage keeps the time it began
        _wait_for(lambda: job.restarts >= 3)
        with open_meta_store(uri) as meta:
            source = sources_summary(meta)["sources"][0]
        shown = source["table_status"]
        assert shown["state"] == "unreachable" and shown["unreachable_since"] == since
        assert re.match(r"source unreachable \(since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, "
                        r"attempt \d+\): TransientMetaStoreError", shown["label"]), shown
        assert not shown["stale"]
        feed_validator(load_feed_schema(), "tableStatus").validate(shown)
        outage.clear()
        _wait_for(lambda: _value(_scrape(port), up) == 1.0, seconds=5)
        assert _value(_scrape(port), table_up) == 1.0
        with open_meta_store(uri) as meta:
            assert sources_summary(meta)["sources"][0]["table_status"]["state"] == "streaming"
    finally:
        job.stopping.set()
        thread.join(10)
        metrics.close()
        writer.close()
    assert not thread.is_alive() and ended == [JobExit.DONE]


def test_a_restarting_multi_table_table_is_unreachable_until_it_reads_again() -> None:
    writer = TableStatusWriter(lambda table: ("sqlite:///nonexistent/dir/meta.db", None, NS))
    metrics = TableMetrics(source="src")
    writer.observe(metrics.update)
    reason = "TransientTunnelError: no answer (attempt 2, next in 4.0 s)"
    shown = writer.publish({"a": TableStatus(table="a", job="j", selection="*",
                                             state="restarting", reason=reason),
                            "b": TableStatus(table="b", job="j", selection="*",
                                             state="streaming")})
    assert shown["a"].state == "unreachable" and shown["a"].attempt == 2
    assert shown["a"].reason == "TransientTunnelError: no answer"
    assert shown["a"].next_attempt_at is not None and shown["b"].state == "streaming"
    first_since = shown["a"].unreachable_since
    again = writer.publish({"a": TableStatus(table="a", job="j", selection="*",
                                             state="restarting", reason=reason.replace(
                                                 "attempt 2", "attempt 3"))})
    assert again["a"].unreachable_since == first_since and again["a"].attempt == 3
    sample = metrics.registry.get_sample_value
    assert sample("tablestore_cdc_source_up", {"source": "src"}) == 0
    writer.publish({"a": TableStatus(table="a", job="j", selection="*", state="streaming")})
    assert sample("tablestore_cdc_source_up", {"source": "src"}) == 1
    assert sample("tablestore_cdc_table_up", {"table": "a"}) == 1


def test_changes_are_counted_by_operation() -> None:
    batch = pa.table({"_op": ["PUT", "PUT", "UPDATE", "DELETE", "READ", "READ", "READ"],
                      "id": list(range(7))})
    assert op_counts(batch) == (("DELETE", 1), ("PUT", 2), ("READ", 3), ("UPDATE", 1))
    applied = AppliedTable()
    applied.record(ApplyResult(batch_id=0, committed=True, changes=7, ops=op_counts(batch)))
    applied.record(ApplyResult(batch_id=1, committed=False, changes=7, ops=op_counts(batch)))
    fields = applied.status_fields(time.time())
    assert fields["ops"] == {"inserts": 2, "updates": 1, "deletes": 1, "snapshot_reads": 3}
    metrics = TableMetrics()
    status = TableStatus(table="t", job="j", selection="t", state="streaming", **fields)
    metrics.update({"t": status})
    metrics.update({"t": status})  # the same totals again count nothing twice
    port = metrics.serve(0)
    try:
        text = _scrape(port)
    finally:
        metrics.close()
    for op, n in (("inserts", 2), ("updates", 1), ("deletes", 1), ("snapshot_reads", 3)):
        assert _value(text, f'tablestore_cdc_table_changes_applied_total{{op="{op}",table="t"}}'
                      ) == n


def test_a_caught_up_job_that_is_alive_is_idle_and_one_whose_record_ages_is_stale() -> None:
    now = time.time()
    records = [{"times": {"committed": now - 600}, "initial": False}]
    alive = TableStatus(table="t", job="j", selection="t", state="streaming",
                        records_behind=0, at=now - 5)
    unmeasured = alive.model_copy(update={"records_behind": None})
    gone = alive.model_copy(update={"at": now - STALE_AFTER_S - 5})
    behind = alive.model_copy(update={"records_behind": 40})
    # the tunnel was not asked (/api/sources): the job's own record decides
    assert activity(records, None, None, now, alive)["state"] == "idle"
    assert activity(records, None, None, now, unmeasured)["state"] == "idle"
    assert activity(records, None, None, now, gone)["state"] == "stale"
    assert activity(records, None, None, now, behind)["state"] == "stale"
    down = alive.model_copy(update={"state": "unreachable", "unreachable_since": now - 64,
                                    "attempt": 4, "next_attempt_at": now + 50,
                                    "at": now - 40})
    shown = activity(records, {"status": "restarting", "at": now - 40, "reason": "x"}, None,
                     now, down)
    assert shown["state"] == "unreachable" and shown["unreachable_since"] == now - 64
    assert shown["reason"].startswith("source unreachable (since ")
    feed_validator(load_feed_schema(), "activity").validate(shown)
    # waiting for an attempt due in 50 s is not stale, even past the usual threshold
    assert not down.model_copy(update={"at": now - STALE_AFTER_S - 10}).is_stale(now)


def test_the_console_summarises_instead_of_a_line_per_table_per_batch() -> None:
    summary = StatusSummary(every_s=30)

    def status(table: str, state: str = "streaming", **fields: Any) -> TableStatus:
        return TableStatus(table=table, job="j", selection="*", state=state, **fields)

    t0 = time.time()
    first = summary.lines({"a": status("a"), "b": status("b", "snapshotting",
                                                          snapshot_percent=10.0)}, now=t0)
    assert first == ["table a: streaming", "table b: snapshotting 10 %",
                     "tables: 1 snapshotting, 1 streaming; 0 change(s) applied, 0.0 rows/s"]
    # batches applied, the snapshot going on: nothing until the interval is over
    for i in range(1, 20):
        assert summary.lines({"a": status("a", rows_applied=i * 10),
                              "b": status("b", "snapshotting", snapshot_percent=10.0 + i)},
                             now=t0 + i) == []
    changed = summary.lines({"a": status("a", rows_applied=300, last_schema_change=(
        "batch 9: add column colour string"), last_schema_change_at=time.time() + 1,
        last_schema_change_version=5), "b": status("b", "failed", reason="batch 4: no")},
        now=t0 + 25)
    assert changed == ["table a: schema change of the target: batch 9: add column colour "
                       "string (target version 5)", "table b: failed: batch 4: no"]
    later = summary.lines({"a": status("a", rows_applied=400, last_schema_change=(
        "batch 9: add column colour string"))}, now=t0 + 31)
    assert later == ["tables: 1 streaming; 400 change(s) applied, 0.0 rows/s"]
    # the last look of a --once run says the run's figures, whatever the interval
    assert summary.lines({"a": status("a", rows_applied=410)}, now=t0 + 32) == []
    assert summary.lines({"a": status("a", rows_applied=410)}, now=t0 + 32, final=True) == [
        "tables: 1 streaming; 410 change(s) applied, 0.0 rows/s"]
