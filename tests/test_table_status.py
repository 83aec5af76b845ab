"""Each replicated table's status (tablestore_cdc.table_status) through a real SQLite meta store:
written by TableStatusWriter, read back by the feed's /api/sources and /api/progress documents
and `meta tables`, the job's states over it, the last schema change kept across a restart, a
damaged record, and the metrics set from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meta_store import open_meta_store
from tablestore_cdc import table_status
from tablestore_cdc.commands.app import app as cli_app
from tablestore_cdc.feed.reading import user_namespaces
from tablestore_cdc.feed.snapshot import dashboard_snapshot, sources_summary
from tablestore_cdc.lakehouse.sink import ApplyResult
from tablestore_cdc.pipeline.metrics import TableMetrics
from tablestore_cdc.table_status import (
    TABLE_STATUS_PREFIX,
    AppliedTable,
    TableStatus,
    TableStatusWriter,
    load_table_status,
)
from testkit.feed_schema import feed_validator, load_feed_schema


def _status(table: str, **fields: object) -> TableStatus:
    return TableStatus(table=table, job="/data/out", selection="t_*", **fields)


def _writer(uri: str) -> TableStatusWriter:
    return TableStatusWriter(lambda table: (uri, None, f"local:/s.db#{table}#t"))


def _sources(uri: str) -> dict[str, dict]:
    with open_meta_store(uri) as meta:
        return {s["namespace"]: s for s in sources_summary(meta)["sources"]}


def test_written_statuses_are_what_the_feed_and_the_cli_show(tmp_path: Path) -> None:
    uri = f"sqlite://{tmp_path / 'meta.db'}"
    writer = _writer(uri)
    writer.publish({
        "t_a": _status("t_a", state="snapshotting", snapshot_percent=40.0, records_behind=12,
                       seconds_behind=0.5, rows_applied=7, rows_per_second=1.5,
                       last_commit=1.0, target_version=3),
        "t_b": _status("t_b", state="failed", reason="batch 4: new column(s) ['colour']"),
    })
    with open_meta_store(uri) as meta:  # t_c: a single-table query's
        for table in ("t_a", "t_b", "t_c"):
            meta.set_namespace_info(f"local:/s.db#{table}#t", {"table": table})
        assert len(user_namespaces(meta)) == 3  # the status records are hidden
    sources = _sources(uri)
    a, b = (sources[f"local:/s.db#{t}#t"]["table_status"] for t in ("t_a", "t_b"))
    assert a["label"] == "snapshotting 40 %" and a["records_behind"] == 12 and not a["stale"]
    assert b["label"] == "failed: batch 4: new column(s) ['colour']"
    assert sources["local:/s.db#t_c#t"]["table_status"] is None

    shown = CliRunner().invoke(cli_app, ["meta", "tables", "--meta", uri, "--json"])
    assert shown.exit_code == 0, shown.output
    rows = json.loads(shown.output)["tables"]
    assert [(r["table"], r["state"], r["target_version"]) for r in rows] == [
        ("t_a", "snapshotting", 3), ("t_b", "failed", None)]
    text = CliRunner(env={"COLUMNS": "250"}).invoke(cli_app, ["meta", "tables", "--meta", uri])
    assert text.exit_code == 0 and "snapshotting 40 %" in text.output
    assert "failed: batch 4" in text.output and "t_*" in text.output

    # the job restarts: every table but a failed one reads source unreachable, since the
    # outage began, with its attempt and the job's reason
    writer.mark_all("restarting", "attempt 1, next in 1.0 s: TransientTunnelError")
    sources = _sources(uri)
    label = sources["local:/s.db#t_a#t"]["table_status"]["label"]
    assert label.startswith("source unreachable (since ") and label.endswith(
        "UTC, attempt 1): TransientTunnelError"), label
    assert sources["local:/s.db#t_b#t"]["table_status"]["state"] == "failed"
    writer.close()


def test_the_last_schema_change_is_shown_and_kept_across_a_restart_of_the_same_target(
        tmp_path: Path) -> None:
    uri, namespace = f"sqlite://{tmp_path / 'meta.db'}", "local:/s.db#t_a#t"
    applied = AppliedTable()
    applied.record(ApplyResult(batch_id=0, committed=True, changes=5, version=1))
    applied.record(ApplyResult(batch_id=3, committed=True, changes=2, version=4,
                               schema_changes=("add column colour string",
                                               "widen column qty int -> long")))
    applied.record(ApplyResult(batch_id=4, committed=True, changes=1, version=5))
    applied.record(ApplyResult(batch_id=4, committed=False, changes=1))  # a replay: no effect
    assert (applied.rows_applied, applied.version, applied.last_batch) == (8, 5, 4)
    figures = applied.status_fields(applied.last_commit or 0.0)
    assert figures["last_schema_change"] == ("batch 3: add column colour string; widen column "
                                             "qty int -> long")
    assert figures["last_schema_change_version"] == 4
    assert figures["last_schema_change_at"] <= figures["last_commit"]
    writer = _writer(uri)
    writer.publish({"t_a": _status("t_a", state="streaming", target="delta:///lake/t_a",
                                   **figures)})
    writer.mark_all("stopped", None)
    writer.close()
    with open_meta_store(uri) as meta:
        meta.set_namespace_info(namespace, {"table": "t_a"})
        shown = dashboard_snapshot(meta, namespace, with_tunnel=False)["table_status"]
    # the feed's published schema (strict: every field documented)
    feed_validator(load_feed_schema(), "tableStatus").validate(shown)
    assert shown["state"] == "stopped" and shown["last_schema_change_version"] == 4
    assert shown["last_schema_change"].startswith("batch 3: add column colour string")
    text = CliRunner(env={"COLUMNS": "300"}).invoke(cli_app, ["meta", "tables", "--meta", uri])
    assert text.exit_code == 0, text.output
    assert "batch 3: add column colour string" in text.output and "version 4)" in text.output

    # a restart: the new process has made no schema change; the record keeps the last one
    # while the target is the same, and drops it for another target
    restarted = _writer(uri)
    restarted.publish({"t_a": _status("t_a", state="streaming", target="delta:///lake/t_a",
                                      target_version=5)})
    with open_meta_store(uri) as meta:
        kept = load_table_status(meta, namespace)
    assert kept is not None and kept.state == "streaming"
    assert (kept.last_schema_change, kept.last_schema_change_version) == (
        shown["last_schema_change"], 4)
    restarted.publish({"t_a": _status("t_a", state="streaming", target="delta:///lake/t_a",
                                      target_version=6)})  # and on every later write
    with open_meta_store(uri) as meta:
        assert load_table_status(meta, namespace).last_schema_change_version == 4
    restarted.close()
    moved = _writer(uri)
    moved.publish({"t_a": _status("t_a", state="streaming", target="delta:///other/t_a")})
    with open_meta_store(uri) as meta:
        assert load_table_status(meta, namespace).last_schema_change is None
    moved.close()


def test_an_unchanged_status_is_not_written_again_until_its_heartbeat(tmp_path: Path) -> None:
    uri = f"sqlite://{tmp_path / 'meta.db'}"
    writer = _writer(uri)
    writer.publish({"t_a": _status("t_a", state="streaming")})
    with open_meta_store(uri) as meta:
        first = load_table_status(meta, "local:/s.db#t_a#t")
    writer.publish({"t_a": _status("t_a", state="streaming")})
    with open_meta_store(uri) as meta:
        assert load_table_status(meta, "local:/s.db#t_a#t") == first
    writer.publish({"t_a": _status("t_a", state="streaming", rows_applied=1)})
    with open_meta_store(uri) as meta:
        assert load_table_status(meta, "local:/s.db#t_a#t").rows_applied == 1
    writer.close()


def test_a_damaged_record_reads_as_none_and_an_unreachable_store_is_skipped(
        tmp_path: Path) -> None:
    uri = f"sqlite://{tmp_path / 'meta.db'}"
    with open_meta_store(uri) as meta:
        meta.set_namespace_info(TABLE_STATUS_PREFIX + "ns", {"status": "{not json"})
        assert load_table_status(meta, "ns") is None
    broken = TableStatusWriter(lambda table: ("nosuch://x", None, "ns"))
    broken.publish({"t": _status("t", state="streaming")})  # logged, never raised


def test_the_metrics_are_set_from_the_same_statuses() -> None:
    metrics = TableMetrics()
    metrics.update({"t_b": _status("t_b", state="failed", reason="r", rows_applied=5,
                                   records_behind=0, seconds_behind=0.0)})
    r = metrics.registry
    assert r.get_sample_value("tablestore_cdc_table_state",
                              {"table": "t_b", "state": "failed"}) == 1.0
    assert r.get_sample_value("tablestore_cdc_table_state",
                              {"table": "t_b", "state": "streaming"}) == 0.0
    assert r.get_sample_value("tablestore_cdc_table_rows_applied_total", {"table": "t_b"}) == 5
    assert r.get_sample_value("tablestore_cdc_table_lag_records", {"table": "t_b"}) == 0


def test_an_idle_look_sets_no_series_and_asks_each_table_s_location_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At 1,000 tables the job's look every 2 s cost 0.15 core: every series set again and
    every heartbeat building each table's options. An unchanged status sets nothing, and a
    table's meta store and namespace are asked once for the job's life."""
    uri = f"sqlite://{tmp_path / 'meta.db'}"
    asked: list[str] = []
    writer = TableStatusWriter(lambda table: (asked.append(table), (uri, None, f"ns#{table}"))[1])
    metrics = TableMetrics()
    metrics.attach(writer)
    statuses = {t: _status(t, state="streaming", rows_applied=3) for t in ("t_a", "t_b")}
    writer.publish(statuses)
    set_calls: list[str] = []
    real_labels = type(metrics.table_up).labels

    def counted(self: object, *values: str) -> object:
        if values[0].startswith("t_"):  # a table's series (not the source's)
            set_calls.append(values[0])
        return real_labels(self, *values)

    monkeypatch.setattr(type(metrics.table_up), "labels", counted)
    monkeypatch.setattr(table_status, "HEARTBEAT_S", 0.0)  # every look writes every record
    writer.publish(statuses)  # nothing changed
    assert set_calls == []
    writer.publish({**statuses, "t_b": _status("t_b", state="streaming", rows_applied=7)})
    assert set(set_calls) == {"t_b"}  # the changed table's series only
    r = metrics.registry
    assert r.get_sample_value("tablestore_cdc_table_rows_applied_total", {"table": "t_b"}) == 7
    assert r.get_sample_value("tablestore_cdc_table_rows_applied_total", {"table": "t_a"}) == 3
    assert sorted(asked) == ["t_a", "t_b"]  # once each, over three publishes that wrote
    with open_meta_store(uri) as meta:
        assert load_table_status(meta, "ns#t_b").rows_applied == 7
    writer.close()
