"""The meta-table inspection CLI, the progress feed and the dashboard's HTTP API.

- Slow tests share ONE real run (module fixture ``real_run``): a local store with a 3-channel
  table, writes, a split (lineage), a real streaming query (the session ``spark`` fixture,
  foreachBatch sink, ``ProgressListener`` attached), then, with the query stopped, more writes
  (lag) and a second split (children waiting for their parent). Every ``tablestore-cdc meta``
  command runs against it in both output modes; ``progress`` is validated against
  ``docs/progress-feed.schema.json``; ``/api/progress`` is fetched over real HTTP.
- Fast tests build a small meta store through the ``MetaStore`` API (no Spark) for the error
  paths (missing store, foreign store, unknown namespace/UUID), ``--follow`` in a real
  subprocess, and the listener's parsing and failure isolation.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from typer.testing import CliRunner

from connector.local import LocalTablestore
from meta_store import BatchState, ChannelStart, EndCheckpoint, Manifest, open_meta_store
from tablestore_cdc.commands.app import app as root_app
from tablestore_cdc.dashboard import DashboardApp, make_server
from tablestore_cdc.feed.polling import follow_feed
from tablestore_cdc.feed.reading import user_namespaces
from tablestore_cdc.listener import ProgressListener, spark_metrics
from tablestore_cdc.query_record import load_spark_metrics, record_spark_metrics
from testkit.emulator import INSTANCE, KEY_ID, SECRET
from testkit.feed_schema import feed_validator as validator
from testkit.feed_schema import load_feed_schema
from testkit.waiting import wait_until

REPO = Path(__file__).resolve().parent.parent
TABLE, TUNNEL = "orders", "cli-tunnel"


# --- helpers ------------------------------------------------------------------------------------


def cli(*args: Any) -> Any:
    """Run ``tablestore-cdc ARGS`` in-process (wide console so UUIDs are not cut)."""
    return CliRunner().invoke(root_app, [str(a) for a in args], env={"COLUMNS": "220"})


def cli_json(*args: Any) -> Any:
    result = cli(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return load_feed_schema()


def copy_sqlite(src: Path, dst: Path) -> Path:
    """A consistent copy of a (WAL-mode) SQLite file through the backup API."""
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)
    a.close()
    b.close()
    return dst


# --- the real run (slow, once per module) ---------------------------------------------------------


@dataclass
class RealRun:
    base: Path
    store_path: Path
    meta_path: Path
    namespace: str
    delivered: dict[int, int]
    split_children: tuple[str, str]
    waiting_children: tuple[str, str]
    rows_after_stop: int
    listener_errors: int
    channels_before: list[str] = field(default_factory=list)

    @property
    def meta(self) -> str:
        return f"sqlite://{self.meta_path}"


def _write(store: LocalTablestore, ids: range, tag: str) -> None:
    store.batch_write(TABLE, [("put", {"id": i}, {"v": f"{tag}{i}"}) for i in ids])


def _drain(query: Any, delivered: dict[int, int], expected: int, timeout: float = 120) -> None:
    """processAllAvailable until the sink has seen ``expected`` rows (a split's children join
    only after the parent's FINISHED push, one batch later)."""

    def rows_after_processing() -> int:
        if sum(delivered.values()) < expected:
            query.processAllAvailable()
        return sum(delivered.values())

    wait_until(f"{expected} rows in the sink", rows_after_processing,
               lambda rows: rows >= expected, timeout=timeout, interval=0.3, query=query)


@pytest.fixture(scope="module")
def real_run(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealRun]:
    base = tmp_path_factory.mktemp("meta_cli_run")
    store_path, meta_path = base / "store.db", base / "meta.db"
    store = LocalTablestore(store_path)
    store.create_table(TABLE, [("id", "INTEGER")], [("v", "STRING")], channels=3)
    channels_before = [c.channel_id for c in store.list_channels(TABLE)]
    _write(store, range(0, 30), "a")

    meta_uri = f"sqlite://{meta_path}"
    listener = ProgressListener(meta_uri)
    spark.streams.addListener(listener)
    delivered: dict[int, int] = {}

    def sink(df: Any, batch_id: int) -> None:
        delivered[batch_id] = df.count()

    query = (spark.readStream.format("tablestore")
             .option("endpoint", f"local://{store_path}").option("table.name", TABLE)
             .option("tunnel.name", TUNNEL).option("meta.store", meta_uri)
             .load().writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(base / "checkpoint")).start())
    try:
        _drain(query, delivered, 30)
        children = store.split_channel(TABLE, channels_before[0])
        _write(store, range(30, 70), "b")
        _drain(query, delivered, 70)
        _write(store, range(70, 90), "c")
        _drain(query, delivered, 90)
    finally:
        query.stop()
    try:
        meta = open_meta_store(meta_uri)
        namespace = user_namespaces(meta)[0]
        wait_until(f"the listener's progress of batches {sorted(delivered)}",
                   lambda: {e["batch_id"] for e in load_spark_metrics(meta, namespace).values()},
                   lambda recorded: recorded >= set(delivered), timeout=30)
        meta.close()
    finally:
        spark.streams.removeListener(listener)
        listener.close()
    # the query is stopped: 5 more rows are lag; a split leaves two children in WAIT
    _write(store, range(90, 95), "d")
    waiting = store.split_channel(TABLE, channels_before[1])
    store.close()
    yield RealRun(base, store_path, meta_path, namespace, dict(delivered), children, waiting,
                  5, listener.errors, channels_before)


# --- every command against the real run ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.xdist_group("meta_cli_real_run")  # one worker builds the module's `real_run`
def test_namespaces_lists_the_source(real_run: RealRun) -> None:
    data = cli_json("meta", "namespaces", "--meta", real_run.meta)
    assert [n["namespace"] for n in data["namespaces"]] == [real_run.namespace]
    row = data["namespaces"][0]
    assert (row["table"], row["tunnel"], row["query_progress"]) == (TABLE, TUNNEL, True)
    assert row["batches"] >= len(real_run.delivered) + 1
    rich = cli("meta", "namespaces", "--meta", real_run.meta)
    assert rich.exit_code == 0
    assert real_run.namespace in rich.stdout and row["latest_committed"][:8] in rich.stdout
    assert "query-progress#" not in rich.stdout  # the listener's companion record is hidden


@pytest.mark.slow
@pytest.mark.xdist_group("meta_cli_real_run")  # one worker builds the module's `real_run`
def test_batches_in_chain_order_with_spark_ids_and_records(real_run: RealRun) -> None:
    data = cli_json("meta", "batches", "--meta", real_run.meta)
    rows = data["batches"]
    assert rows[0]["initial"] and rows[0]["records"] == 0
    used = [r for r in rows[1:] if not r["unused"]]
    chain = [rows[0], *used]  # each batch starts where the previous one ended
    assert all(b["prev_uuid"] == a["uuid"] for a, b in zip(chain, chain[1:], strict=False))
    assert [r["spark_batch_id"] for r in used] == sorted(real_run.delivered)
    assert {r["spark_batch_id"]: r["records"] for r in used} == real_run.delivered
    assert sum(r["records"] for r in rows) == 90
    assert all(r["state"] in ("committed", "pushed") for r in used)
    added = [c for r in used for c in r["children_added"]]
    assert sorted(added) == sorted(real_run.split_children)
    assert real_run.listener_errors == 0

    rich = cli("meta", "batches", "--meta", real_run.meta)
    assert rich.exit_code == 0
    for r in rows:
        assert r["uuid"] in rich.stdout
    assert "initial" in rich.stdout and "90 record(s)" in rich.stdout
    newest = cli_json("meta", "batches", "--meta", real_run.meta, "--limit", 2)["batches"]
    assert [r["uuid"] for r in newest] == [r["uuid"] for r in rows[-2:]]


def _batches(run: RealRun) -> list[dict[str, Any]]:
    return [r for r in cli_json("meta", "batches", "--meta", run.meta)["batches"]
            if not r["unused"]]


@pytest.mark.slow
@pytest.mark.xdist_group("meta_cli_real_run")  # one worker builds the module's `real_run`
def test_show_gives_per_channel_start_end_and_attempt(real_run: RealRun) -> None:
    rows = _batches(real_run)
    with_children = next(r for r in rows if r["children_added"])
    record = cli_json("meta", "show", with_children["uuid"], "--meta", real_run.meta)
    assert record["uuid"] == with_children["uuid"]
    assert record["spark_batch_id"] == with_children["spark_batch_id"]
    assert record["query"]["num_input_rows"] == record["records"]
    by_id = {c["channel_id"]: c for c in record["channels"]}
    for child in real_run.split_children:
        assert by_id[child]["parent_ids"] == [real_run.channels_before[0]]
        assert by_id[child]["start"]["sequence_number"] == 0
    assert sum(c["records"] or 0 for c in record["channels"]) == record["records"]
    for c in record["channels"]:
        assert c["end"]["sequence_number"] - c["start"]["sequence_number"] == c["records"]
        assert c["attempt"] and c["written_at"] >= record["times"]["planned"]

    # a unique prefix works too; rich output shows channels, parents and the writing attempt
    rich = cli("meta", "show", with_children["uuid"][:8], "--meta", real_run.meta)
    assert rich.exit_code == 0, rich.output
    assert with_children["uuid"] in rich.stdout
    for c in record["channels"]:
        assert c["channel_id"] in rich.stdout and c["attempt"] in rich.stdout


@pytest.mark.slow
@pytest.mark.xdist_group("meta_cli_real_run")  # one worker builds the module's `real_run`
def test_show_unknown_uuid_is_a_clear_error(real_run: RealRun) -> None:
    for args in (("--json",), ()):
        result = cli("meta", "show", "0000dead-beef", "--meta", real_run.meta, *args)
        assert result.exit_code == 2
        assert result.stderr.strip() == (
            f"error: no batch '0000dead-beef' in meta-store namespace '{real_run.namespace}'")
        assert "Traceback" not in result.output and result.stdout == ""


@pytest.mark.slow
@pytest.mark.xdist_group("meta_cli_real_run")  # one worker builds the module's `real_run`
def test_diff_counts_records_and_sequence_progress(real_run: RealRun) -> None:
    rows = _batches(real_run)
    first, last = rows[1], rows[-1]
    data = cli_json("meta", "diff", first["uuid"], last["uuid"], "--meta", real_run.meta)
    assert data["batches_between"] == len(rows) - 2
    assert data["records"] == 90 - first["records"]
    by_id = {c["channel_id"]: c for c in data["channels"]}
    parent = real_run.channels_before[0]
    assert by_id[parent]["only_in"] == "from"  # finished, then left the manifests
    for child in real_run.split_children:
        assert by_id[child]["only_in"] == "to" and by_id[child]["from"] is None
    for c in data["channels"]:
        if c["only_in"] is None:
            assert c["sequence_delta"] == c["records"] > 0
    assert sum(c["records"] for c in data["channels"]) == data["records"]

    rich = cli("meta", "diff", first["uuid"], last["uuid"], "--meta", real_run.meta)
    assert rich.exit_code == 0
    assert f"{data['records']} record(s)" in rich.stdout
    assert "only in UUID2 (new channel)" in rich.stdout
    backwards = cli_json("meta", "diff", last["uuid"], first["uuid"], "--meta", real_run.meta)
    assert backwards["batches_between"] is None


@pytest.mark.slow
@pytest.mark.xdist_group("meta_cli_real_run")  # one worker builds the module's `real_run`
def test_channels_tree_status_lineage_and_waiting(real_run: RealRun) -> None:
    data = cli_json("meta", "channels", "--meta", real_run.meta)
    by_id = {c["channel_id"]: c for c in data["channels"]}
    first, second, third = real_run.channels_before
    assert by_id[first]["status"] == "TERMINATED" and by_id[first]["pushed"]["finished"]
    assert by_id[first]["children"] == sorted(real_run.split_children)
    for child in real_run.split_children:
        assert by_id[child]["status"] == "OPEN" and by_id[child]["parent_ids"] == [first]
        assert by_id[child]["pushed"]["sequence_number"] == by_id[child]["consumed"]
    for child in real_run.waiting_children:
        assert by_id[child]["status"] == "WAIT" and by_id[child]["waiting_for"] == [second]
    assert by_id[second]["status"] == "OPEN" and by_id[third]["waiting_for"] == []
    roots = {n["channel_id"]: n for n in data["tree"]}
    assert set(roots) == {first, second, third}
    assert sorted(n["channel_id"] for n in roots[first]["children"]) == sorted(
        real_run.split_children)
    assert sorted(n["channel_id"] for n in roots[second]["children"]) == sorted(
        real_run.waiting_children)

    rich = cli("meta", "channels", "--meta", real_run.meta)
    assert rich.exit_code == 0, rich.output
    lines = rich.stdout.splitlines()
    assert f"tunnel {TUNNEL}" in lines[0]
    child_line = next(line for line in lines if real_run.waiting_children[0] in line)
    assert "WAIT" in child_line and f"waiting for {second}" in child_line
    assert "└──" in rich.stdout or "├──" in rich.stdout  # a rendered tree, not a table


@pytest.mark.slow
@pytest.mark.xdist_group("meta_cli_real_run")  # one worker builds the module's `real_run`
def test_lag_from_the_latest_committed_batch(real_run: RealRun) -> None:
    data = cli_json("meta", "lag", "--meta", real_run.meta)
    latest = _batches(real_run)[-1]
    assert (data["batch"], data["spark_batch_id"]) == (latest["uuid"], max(real_run.delivered))
    assert data["records_behind"] == real_run.rows_after_stop
    behind = [r for r in data["lag"] if r["records_behind"]]
    assert behind and all(r["seconds_behind"] > 0 for r in behind)
    ids = {r["channel_id"] for r in data["lag"]}
    assert real_run.channels_before[0] not in ids  # terminated: nothing left to read
    assert set(real_run.waiting_children) <= ids
    rich = cli("meta", "lag", "--meta", real_run.meta)
    assert rich.exit_code == 0
    assert f"total records behind: {real_run.rows_after_stop}" in rich.stdout
    # retention headroom: the embedded store keeps 7 days, like Tablestore
    week = 7 * 24 * 3600.0
    assert all(r["retention_s"] == week and not r["retention_warning"] for r in data["lag"])
    assert all(r["headroom_s"] == pytest.approx(week - r["seconds_behind"]) for r in behind)
    short = cli_json("meta", "lag", "--meta", real_run.meta, "--retention", "1ms")
    assert all(r["retention_warning"] and r["headroom_s"] < 0 for r in short["lag"]
               if r["records_behind"])
    warned = cli("meta", "lag", "--meta", real_run.meta, "--retention", "1ms")
    assert "warning: channel" in warned.stdout and "before the service's retention" in \
        warned.stdout
    bad = cli("meta", "lag", "--meta", real_run.meta, "--retention", "soon")
    assert bad.exit_code == 2 and bad.output.startswith("error: --retention 'soon'")


@pytest.mark.slow
@pytest.mark.xdist_group("meta_cli_real_run")  # one worker builds the module's `real_run`
def test_gc_dry_run_then_delete_on_a_copy(real_run: RealRun, tmp_path: Path) -> None:
    meta = f"sqlite://{copy_sqlite(real_run.meta_path, tmp_path / 'copy.db')}"
    before = [r["uuid"] for r in cli_json("meta", "batches", "--meta", meta)["batches"]]
    dry = cli_json("meta", "gc", "--keep", 2, "--meta", meta)
    victims = [v["uuid"] for v in dry["victims"]]
    assert dry["dry_run"] and dry["deleted"] == []
    assert victims == before[: len(victims)] and len(victims) == len(before) - 2
    rich = cli("meta", "gc", "--keep", 2, "--meta", meta)
    assert rich.exit_code == 0 and "dry run" in rich.stdout
    assert all(v in rich.stdout for v in victims)
    assert [r["uuid"] for r in cli_json("meta", "batches", "--meta", meta)["batches"]] == before

    done = cli_json("meta", "gc", "--keep", 2, "--meta", meta, "--yes")
    assert done["deleted"] == victims and not done["dry_run"]
    after = [r["uuid"] for r in cli_json("meta", "batches", "--meta", meta)["batches"]]
    assert after == before[-2:]
    again = cli("meta", "gc", "--keep", 2, "--meta", meta, "--yes")
    assert again.exit_code == 0 and "0 batch(es) deleted" in again.stdout


@pytest.mark.slow
@pytest.mark.xdist_group("meta_cli_real_run")  # one worker builds the module's `real_run`
def test_export_is_the_whole_namespace(real_run: RealRun, tmp_path: Path) -> None:
    data = cli_json("meta", "export", "--meta", real_run.meta)
    assert data["format"] == "tablestore-cdc-meta-export" and data["version"] == 1
    assert data["namespace"] == real_run.namespace
    assert data["namespace_info"]["table"] == TABLE
    batches = cli_json("meta", "batches", "--meta", real_run.meta)["batches"]
    assert [b["uuid"] for b in data["batches"]] == [b["uuid"] for b in batches]
    assert sum(e["records"] for b in data["batches"] for e in b["end_checkpoints"]) == 90
    assert all(b["manifest"]["channels"] for b in data["batches"] if b["state"] != "minted")
    assert {e["batch_id"] for e in data["query_progress"]} == set(real_run.delivered)
    plain = cli("meta", "export", "--meta", real_run.meta)  # export is JSON either way
    assert json.loads(plain.stdout)["batches"] == data["batches"]
    # a path longer than the console is wide: the sentence is still one line, the path whole
    out = tmp_path / f"export-{'x' * 220}.json"
    summary = cli("meta", "export", "--meta", real_run.meta, "-o", out)
    assert summary.exit_code == 0 and f"to {out}\n" in summary.stdout
    assert json.loads(out.read_text())["batches"] == data["batches"]


@pytest.mark.slow
@pytest.mark.xdist_group("meta_cli_real_run")  # one worker builds the module's `real_run`
def test_progress_feed_validates_against_the_schema(real_run: RealRun,
                                                    schema: dict[str, Any]) -> None:
    result = cli("progress", "--meta", real_run.meta)
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    check = validator(schema)
    for record in records:
        check.validate(record)
    batches = cli_json("meta", "batches", "--meta", real_run.meta)["batches"]
    assert [r["uuid"] for r in records] == [b["uuid"] for b in batches]
    used = [r for r in records if not r["initial"] and r["channel_count"]]
    assert [r["spark_batch_id"] for r in used] == sorted(real_run.delivered)
    assert all(r["query"]["batch_id"] == r["spark_batch_id"] for r in used)
    assert all(r["push_state"] == "pushed" for r in used[:-1])
    # lag and waiting channels are the tunnel's view now: on the newest batch only
    newest = used[-1]
    assert newest["waiting_for_parent"] == [
        {"channel_id": c, "waiting_for": [real_run.channels_before[1]]}
        for c in sorted(real_run.waiting_children)]
    assert sum(c["lag"]["records_behind"] for c in newest["channels"]) == 5
    assert all(r["waiting_for_parent"] is None for r in records[:-1])
    # a record with an undocumented field does not validate (the strict check has teeth)
    bad = copy.deepcopy(newest)
    bad["channels"][0]["surprise"] = 1
    with pytest.raises(jsonschema.ValidationError):
        check.validate(bad)


@pytest.fixture
def dashboard_url(real_run: RealRun) -> Iterator[str]:
    app = DashboardApp.open(real_run.meta, cache_s=0)
    server = make_server(app, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        app.close()


def _get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


@pytest.mark.slow
@pytest.mark.xdist_group("meta_cli_real_run")  # one worker builds the module's `real_run`
def test_dashboard_api_progress_over_http(real_run: RealRun, dashboard_url: str,
                                          schema: dict[str, Any]) -> None:
    status, content_type, body = _get(dashboard_url + "/api/progress")
    assert status == 200 and content_type == "application/json"
    snap = json.loads(body)
    validator(schema, "snapshot").validate(snap)
    assert snap["namespace"] == real_run.namespace and snap["tunnel_error"] is None
    assert snap["batch_count"] == len(cli_json("meta", "batches", "--meta",
                                               real_run.meta)["batches"])
    by_id = {c["channel_id"]: c for c in snap["channels"]}
    assert by_id[real_run.waiting_children[0]]["waiting_for"] == [real_run.channels_before[1]]
    assert sum((c["lag"] or {}).get("records_behind") or 0 for c in snap["channels"]) == 5
    # consumed per channel adds up to every row delivered (finished channels included)
    assert sum(c["consumed"] or 0 for c in snap["channels"]) == 90
    assert {n["channel_id"] for n in snap["tree"]} == set(real_run.channels_before)
    assert snap["throughput"]["rows_per_second"] > 0
    assert snap["throughput"]["records"] == 90
    assert [p["spark_batch_id"] for p in snap["throughput"]["series"]] == sorted(
        real_run.delivered)
    assert snap["query"]["batch_id"] == max(real_run.delivered)

    status, content_type, page = _get(dashboard_url + "/")
    assert status == 200 and content_type.startswith("text/html")
    assert b'src="dashboard.js"' in page and b'href="dashboard.css"' in page
    assert b"http://" not in page and b"https://" not in page  # nothing from a CDN
    for asset, kind in (("/dashboard.js", "text/javascript"), ("/dashboard.css", "text/css")):
        status, content_type, _ = _get(dashboard_url + asset)
        assert status == 200 and content_type.startswith(kind)
    assert _get(dashboard_url + "/../pyproject.toml")[0] == 404
    assert _get(dashboard_url + "/healthz")[2] == b"ok\n"


# --- fast tests: a meta store built through the API -----------------------------------------------


NS = "local:/nowhere/store.db#t#n"


def build_meta(path: Path | str, namespaces: tuple[str, ...] = (NS,), batches: int = 2) -> str:
    """A meta store (a SQLite path, or any meta-store URI) shaped like a run's: initial offset +
    ``batches`` read batches of 2 channels, 5 records per channel each, committed and pushed."""
    uri = path if isinstance(path, str) else f"sqlite://{path}"
    with open_meta_store(uri) as meta:
        for ns in namespaces:
            meta.set_namespace_info(ns, {"endpoint": "local:/nowhere/store.db", "table": "t",
                                         "tunnel": "n", "tunnel_id": "tid"})
            starts = tuple(ChannelStart(channel_id=ch, token=f"{ch}@0", sequence_number=0,
                                        max_records=100) for ch in ("ch-a", "ch-b"))
            prev = meta.create_batch(ns, "batch-init", None, state=BatchState.PUSHED,
                                     manifest=Manifest(channels=starts, planned_at=time.time()))
            for i in range(batches):
                prev = add_batch(meta, ns, prev.uuid, f"batch-{i}", 5 * i)
    return uri


def add_batch(meta: Any, ns: str, prev: str, uuid: str, seq: int) -> Any:
    """One read batch after ``prev``: both channels from ``seq`` to ``seq + 5``, pushed."""
    meta.create_batch(ns, uuid, prev)
    starts = tuple(ChannelStart(channel_id=ch, token=f"{ch}@{seq}", sequence_number=seq,
                                max_records=100) for ch in ("ch-a", "ch-b"))
    meta.put_manifest(ns, uuid, prev, Manifest(channels=starts, planned_at=time.time()))
    for ch in ("ch-a", "ch-b"):
        meta.put_end_checkpoint(ns, uuid, EndCheckpoint(
            channel_id=ch, start_token=f"{ch}@{seq}", token=f"{ch}@{seq + 5}",
            sequence_number=seq + 5, records=5, attempt="test/1/task", written_at=time.time()))
    meta.mark_committed(ns, uuid)
    meta.mark_pushed(ns, [uuid])
    return meta.get_batch(ns, uuid)


def test_missing_store_is_an_error_and_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    for command in (("meta", "batches"), ("meta", "namespaces"), ("progress",),
                    ("dashboard", "--port", "0")):
        for mode in ((), ("--json",)) if command[0] == "meta" else ((),):
            result = cli(*command, *mode, "--meta", f"sqlite://{missing}")
            assert result.exit_code == 2, (command, result.output)
            assert f"no meta store at {missing}" in result.stderr
            assert "Traceback" not in result.output
    assert not missing.exists()
    assert list(tmp_path.iterdir()) == []


def test_foreign_and_corrupt_files_are_refused(tmp_path: Path) -> None:
    local = tmp_path / "store.db"
    LocalTablestore(local).close()  # an SQLite database of another kind
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database at all" * 100)
    for path, expected in ((local, "not a tablestore-cdc meta store"),
                           (junk, "cannot open")):
        result = cli("meta", "batches", "--meta", f"sqlite://{path}")
        assert result.exit_code == 2
        assert result.stderr.startswith("error: ") and expected in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    bad_scheme = cli("meta", "batches", "--meta", "mysql://host/db")
    assert bad_scheme.exit_code == 2 and "unsupported scheme 'mysql'" in bad_scheme.stderr


def test_namespace_selection_errors(tmp_path: Path) -> None:
    two = build_meta(tmp_path / "two.db", namespaces=(NS, NS + "2"), batches=1)
    result = cli("meta", "batches", "--meta", two)
    assert result.exit_code == 2
    assert "has 2 namespaces; choose one with --namespace" in result.stderr
    assert repr(NS) in result.stderr and repr(NS + "2") in result.stderr
    wrong = cli("meta", "show", "abcd", "--meta", two, "--namespace", "nope")
    assert wrong.exit_code == 2
    assert f"no namespace 'nope' in meta store {two}" in wrong.stderr
    assert repr(NS) in wrong.stderr
    ok = cli_json("meta", "batches", "--meta", two, "--namespace", NS + "2")
    assert ok["namespace"] == NS + "2" and len(ok["batches"]) == 2
    listed = cli_json("meta", "namespaces", "--meta", two)
    assert [n["namespace"] for n in listed["namespaces"]] == [NS, NS + "2"]

    empty = f"sqlite://{tmp_path / 'empty.db'}"
    open_meta_store(empty).close()
    none = cli("meta", "batches", "--meta", empty)
    assert none.exit_code == 2 and "has no namespace yet" in none.stderr
    assert "no namespaces" in cli("meta", "namespaces", "--meta", empty).stdout


def test_ambiguous_prefix_and_unreachable_tunnel(tmp_path: Path) -> None:
    meta = build_meta(tmp_path / "m.db", batches=2)
    ambiguous = cli("meta", "show", "batch", "--meta", meta)
    assert ambiguous.exit_code == 2 and "matches 3 batches" in ambiguous.stderr
    # the namespace's endpoint names a store file that does not exist
    for command in ("channels", "lag"):
        result = cli("meta", command, "--meta", meta)
        assert result.exit_code == 2, result.output
        assert "no local store file at /nowhere/store.db" in result.stderr
    # progress still works without the tunnel: lag unknown, the error is in the snapshot
    records = [json.loads(x) for x in cli("progress", "--meta", meta).stdout.splitlines()]
    assert [r["records"] for r in records] == [0, 10, 10]
    assert all(r["waiting_for_parent"] is None for r in records)


def test_secrets_never_shown(tmp_path: Path) -> None:
    meta = build_meta(tmp_path / "m.db", batches=1)
    secret_uri = meta + "?busy_timeout_ms=5000&password=hunter2"
    result = cli("meta", "namespaces", "--meta", secret_uri)
    assert "hunter2" not in result.output


def test_any_backend_by_uri_dynamodb(moto_endpoint: str) -> None:
    """The same commands on DynamoDB (a moto server on 127.0.0.1), the listener's record
    included; inspection never creates a missing table, even with ``create_table=true``."""
    base = f"dynamodb://cdc-meta-cli?region=us-east-1&endpoint_url={moto_endpoint}"
    build_meta(base + "&create_table=true", batches=2)
    with open_meta_store(base) as meta:
        record_spark_metrics(meta, NS, {"uuid": "batch-1", "batch_id": 1})
    data = cli_json("meta", "batches", "--meta", base)
    assert [(b["uuid"], b["records"], b["spark_batch_id"]) for b in data["batches"]] == [
        ("batch-init", 0, None), ("batch-0", 10, None), ("batch-1", 10, 1)]
    assert [n["namespace"] for n in cli_json("meta", "namespaces", "--meta", base)[
        "namespaces"]] == [NS]
    shown = cli("meta", "show", "batch-1", "--meta", base)
    assert shown.exit_code == 0 and "test/1/task" in shown.stdout
    missing = f"dynamodb://cdc-meta-missing?region=us-east-1&endpoint_url={moto_endpoint}"
    result = cli("meta", "batches", "--meta", missing + "&create_table=true")
    assert result.exit_code == 2 and "does not exist" in result.stderr
    assert "cdc-meta-missing" in result.stderr
    import boto3

    client = boto3.client("dynamodb", region_name="us-east-1", endpoint_url=moto_endpoint)
    assert "cdc-meta-missing" not in client.list_tables()["TableNames"]


def test_follow_prints_only_new_or_changed_batches(tmp_path: Path) -> None:
    """``tablestore-cdc progress --follow`` in a real subprocess, while batches are added."""
    path = tmp_path / "m.db"
    meta_uri = build_meta(path, batches=1)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tablestore_cdc", "progress", "--meta", meta_uri, "--follow",
         "--interval", "0.1", "--no-tunnel"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env, cwd=REPO)
    watchdog = threading.Timer(60, proc.kill)  # a missing line must fail, not hang
    watchdog.start()
    try:
        assert proc.stdout is not None
        first = [json.loads(proc.stdout.readline()) for _ in range(2)]
        assert [r["uuid"] for r in first] == ["batch-init", "batch-0"]
        with open_meta_store(meta_uri) as meta:
            meta.create_batch(NS, "batch-1", "batch-0")  # minted: printed once
            fresh = json.loads(proc.stdout.readline())
            assert (fresh["uuid"], fresh["state"], fresh["channel_count"]) == (
                "batch-1", "minted", 0)
            add_batch(meta, NS, "batch-0", "batch-1", 5)  # planned, read, pushed: changed
            changed = []
            while not changed or changed[-1]["state"] != "pushed":
                changed.append(json.loads(proc.stdout.readline()))
            assert {r["uuid"] for r in changed} == {"batch-1"}
            assert changed[-1]["records"] == 10
            record_spark_metrics(meta, NS, {"uuid": "batch-1", "batch_id": 7})
            joined = json.loads(proc.stdout.readline())
            assert (joined["uuid"], joined["spark_batch_id"]) == ("batch-1", 7)
    finally:
        watchdog.cancel()
        proc.terminate()
        proc.wait(timeout=10)
    # nothing else was printed: the older batches did not change
    rest = [json.loads(line) for line in proc.stdout.read().splitlines() if line]
    assert [r["uuid"] for r in rest] == []


def test_follow_waits_for_the_first_namespace(tmp_path: Path) -> None:
    uri = f"sqlite://{tmp_path / 'late.db'}"
    store = open_meta_store(uri)
    polls: list[int] = []

    def sleep(_: float) -> None:  # a query "starts" after the second poll
        polls.append(1)
        if len(polls) == 2:
            build_meta(tmp_path / "late.db", batches=1)

    records = list(follow_feed(store, None, interval=0, polls=4, with_tunnel=False,
                               sleep=sleep))
    assert [r["uuid"] for r in records] == ["batch-init", "batch-0"]
    store.close()


# --- the listener (fast: its parsing and its failure isolation) -----------------------------------


#: the shape of ``query.lastProgress`` / ``StreamingQueryProgress.json`` from a real run
PROGRESS = {
    "id": "01f9fc5d-e529-4765-8ade-1a1549bb8c28", "runId": "5a1b", "name": None,
    "timestamp": "2026-11-22T02:21:52.000Z", "batchId": 3, "numInputRows": 17,
    "inputRowsPerSecond": 28.1, "processedRowsPerSecond": 22.5,
    "durationMs": {"triggerExecution": 753, "addBatch": 478},
    "sources": [
        {"description": "PythonMicroBatchStream", "startOffset": None,
         "endOffset": json.dumps({"uuid": "u-3", "source": NS}), "numInputRows": 17,
         "inputRowsPerSecond": 28.1, "processedRowsPerSecond": 22.5},
        {"description": "RateStream", "endOffset": "42", "numInputRows": 0},
    ],
}


def _serve(app: DashboardApp) -> tuple[Any, str]:
    server = make_server(app, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_dashboard_http_errors_and_fallbacks(tmp_path: Path, schema: dict[str, Any]) -> None:
    """Real HTTP on a synthetic store: an ambiguous namespace is a 409 naming the choices; a
    chosen one whose tunnel is unreachable still serves the meta table's view; an empty store
    serves ``namespace: null`` (the page waits for the query)."""
    two = build_meta(tmp_path / "two.db", namespaces=(NS, NS + "2"), batches=2)
    empty = f"sqlite://{tmp_path / 'empty.db'}"
    open_meta_store(empty).close()
    check = validator(schema, "snapshot")
    servers = []
    try:
        for uri, namespace in ((two, None), (two, NS), (empty, None)):
            server, url = _serve(DashboardApp.open(uri, namespace=namespace, cache_s=0))
            servers.append(server)
            status, content_type, body = _get(url + "/api/progress")
            assert content_type == "application/json"
            data = json.loads(body)
            if namespace is None and uri == two:
                assert status == 409 and "has 2 namespaces" in data["error"]
                assert repr(NS + "2") in data["error"]
                continue
            assert status == 200
            check.validate(data)
            if uri == empty:
                assert data["namespace"] is None and data["batches"] == []
                continue
            assert data["namespace"] == NS and data["batch_count"] == 3
            assert "no local store file at /nowhere/store.db" in data["tunnel_error"]
            assert [c["channel_id"] for c in data["channels"]] == ["ch-a", "ch-b"]
            assert [c["consumed"] for c in data["channels"]] == [10, 10]
            assert all(c["status"] is None and c["lag"] is None for c in data["channels"])
            assert data["throughput"]["records"] == 20
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
            server.app.close()


def test_listener_entries_from_a_progress_report() -> None:
    [(namespace, entry)] = spark_metrics(PROGRESS)
    assert namespace == NS
    assert entry["uuid"] == "u-3" and entry["batch_id"] == 3
    assert (entry["num_input_rows"], entry["batch_duration_ms"]) == (17, 753)
    assert entry["processed_rows_per_second"] == 22.5
    nan = {**PROGRESS, "sources": [{**PROGRESS["sources"][0],
                                    "inputRowsPerSecond": float("nan")}]}
    assert spark_metrics(nan)[0][1]["input_rows_per_second"] is None


def test_listener_records_and_never_raises(tmp_path: Path) -> None:
    uri = build_meta(tmp_path / "m.db", batches=1)

    class Event:
        progress = {**PROGRESS, "sources": [{**PROGRESS["sources"][0], "endOffset": json.dumps(
            {"uuid": "batch-0", "source": NS})}]}

    listener = ProgressListener(uri)
    listener.onQueryProgress(Event())
    listener.close()
    assert listener.errors == 0 and listener.recorded == 1
    with open_meta_store(uri) as meta:
        assert load_spark_metrics(meta, NS)["batch-0"]["batch_id"] == 3
        assert user_namespaces(meta) == [NS]  # the companion record stays hidden
    row = cli_json("meta", "batches", "--meta", uri)["batches"][1]
    assert row["spark_batch_id"] == 3

    broken = ProgressListener(f"sqlite://{tmp_path}/no/such/dir/meta.db")
    broken.onQueryProgress(Event())  # must not raise: the query would fail
    broken.onQueryProgress(object())
    assert broken.errors == 2 and broken.recorded == 0


# --- finding a Tablestore meta store; the SDK's import notice -------------------------------------


@pytest.mark.parametrize("args, options", [
    (["--endpoint", "http://127.0.0.1:38421", "--instance", "dev"],
     {"endpoint": "http://127.0.0.1:38421", "instance.name": "dev"}),
    (["--endpoint", "https://myinst.cn-hangzhou.ots.aliyuncs.com", "--checkpoint-table", "m"],
     {"endpoint": "https://myinst.cn-hangzhou.ots.aliyuncs.com", "checkpoint.table": "m"}),
    (["--endpoint", "local:///data/shop.db"], {"endpoint": "local:///data/shop.db"}),
])
def test_meta_uri_prints_the_meta_store_a_query_with_those_options_uses(
        args: list[str], options: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI and the dashboard find a query's default meta store from the query's own
    options (the same function builds both; inspection drops ``create_table``)."""
    from connector.options import SourceOptions

    for name in ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):  # (a CA bundle is not in the form)
        monkeypatch.delenv(name, raising=False)
    result = cli("meta", "uri", *args)
    assert result.exit_code == 0, result.output
    creds = ({"access.key.id": "AK", "access.key.secret": "SK"}
             if options["endpoint"].startswith("http") else {})
    query = SourceOptions.from_spark({"table.name": "t", "tunnel.name": "q", **creds,
                                      **options})
    assert result.stdout.strip() == query.meta_store.removesuffix("&create_table=true")


def test_no_sdk_notice_on_a_command_that_imports_the_sdk(tmp_path: Path) -> None:
    """Opening a Tablestore meta store imports the official SDK, which announces on stderr
    that its native codec is missing; the command prints its own one line only."""
    from tablestore_emulator.server import EmulatorServer

    with EmulatorServer(str(tmp_path / "store.db"), INSTANCE, KEY_ID, SECRET) as emulator:
        result = subprocess.run(
            [sys.executable, "-m", "tablestore_cdc", "meta", "namespaces", "--meta",
             f"tablestore://{INSTANCE}/nometa?endpoint={emulator.url}"],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "ALIBABA_CLOUD_ACCESS_KEY_ID": KEY_ID,
                 "ALIBABA_CLOUD_ACCESS_KEY_SECRET": SECRET})
    assert result.returncode == 2
    assert result.stderr.startswith("error: meta table 'nometa' does not exist")
    assert "Native" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


# --- meta diff of an unused batch, meta break-lease ----------------------------------------------


def test_diff_refuses_a_minted_batch_spark_never_planned(tmp_path: Path) -> None:
    uri = build_meta(tmp_path / "meta.db")
    with open_meta_store(uri) as meta:
        meta.create_batch(NS, "batch-unused", "batch-1")  # minted by latestOffset, not planned
    result = cli("meta", "diff", "batch-1", "batch-unused", "--meta", uri)
    assert result.exit_code == 2
    assert "batch-unused is no batch" in result.stderr
    assert "dropped" not in result.output and "Traceback" not in result.output


def _lease(uri: str, owner: str) -> None:
    with open_meta_store(uri) as meta:
        assert meta.take_lease(NS, owner, 120.0, namespace=NS) is None


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_break_lease_ends_a_dead_holders_lease_and_refuses_a_live_one(tmp_path: Path) -> None:
    import socket

    uri = build_meta(tmp_path / "meta.db")
    host = socket.gethostname()
    _lease(uri, f"{host}/{os.getpid()}/live")  # this test's own process: alive
    refused = cli("meta", "break-lease", "--meta", uri)
    assert refused.exit_code == 2 and "is running on this host" in refused.stderr
    with open_meta_store(uri) as meta:
        assert meta.get_lease(NS).live(time.time())

    uri2 = build_meta(tmp_path / "meta2.db")
    dead = f"{host}/{_dead_pid()}/gone"
    _lease(uri2, dead)
    broken = cli_json("meta", "break-lease", "--meta", uri2)
    assert broken["holder"] == dead and "broken" in broken["outcome"]
    with open_meta_store(uri2) as meta:
        assert not meta.get_lease(NS).live(time.time())
        assert meta.take_lease(NS, "next/1/x", 120.0, namespace=NS) is None  # starts now
        meta.release_lease(NS, "next/1/x")
    again = cli("meta", "break-lease", "--meta", uri2)
    assert again.exit_code == 0 and "no live lease" in again.stdout


def test_break_lease_of_another_hosts_holder_needs_force(tmp_path: Path) -> None:
    uri = build_meta(tmp_path / "meta.db")
    _lease(uri, "elsewhere.example/4242/abcd")
    refused = cli("meta", "break-lease", "--meta", uri)
    assert refused.exit_code == 2 and "add --force" in refused.stderr
    forced = cli("meta", "break-lease", "--meta", uri, "--force")
    assert forced.exit_code == 0, forced.output
    with open_meta_store(uri) as meta:
        assert not meta.get_lease(NS).live(time.time())


# --- hostile stored rows: tokens the tunnel refuses, manifests too large to lay out -------------


def _store_with_committed_batch(tmp_path: Path, bad_token: str) -> tuple[str, str]:
    """A real local store (table ``t``, tunnel ``n``, 10 rows over 2 channels) and a meta
    store whose latest committed batch recorded ``bad_token`` as channel ch-0000's end."""
    from connector.tunnel.local import LocalTunnelService

    store_path = tmp_path / "store.db"
    store = LocalTablestore(store_path)
    store.create_table("t", [("id", "INTEGER")], channels=2)
    service = LocalTunnelService(store)
    tunnel_id = service.create_tunnel("t", "n").tunnel_id
    store.batch_write("t", [("put", {"id": i}, {}) for i in range(10)])
    channels = [c.channel_id for c in store.list_channels("t")]
    starts = tuple(ChannelStart(channel_id=ch, token=service.get_checkpoint(tunnel_id, ch).token,
                                sequence_number=0, max_records=100) for ch in channels)
    ns = f"local:{store_path}#t#n"
    uri = f"sqlite://{tmp_path / 'meta.db'}"
    with open_meta_store(uri) as meta:
        meta.set_namespace_info(ns, {"endpoint": f"local:{store_path}", "table": "t",
                                     "tunnel": "n", "tunnel_id": tunnel_id})
        meta.create_batch(ns, "b0", None, state=BatchState.PUSHED,
                          manifest=Manifest(channels=starts, planned_at=time.time()))
        meta.create_batch(ns, "b1", "b0")
        meta.put_manifest(ns, "b1", "b0", Manifest(channels=starts, planned_at=time.time()))
        for ch, start in zip(channels, starts, strict=True):
            meta.put_end_checkpoint(ns, "b1", EndCheckpoint(
                channel_id=ch, start_token=start.token,
                token=bad_token if ch == "ch-0000" else start.token, sequence_number=0,
                records=0, attempt="test/1/task", written_at=time.time()))
        meta.mark_committed(ns, "b1")
    store.close()
    return uri, ns


@pytest.mark.parametrize("bad_token", [
    base64.b64encode(b"[" * 5_000).decode(), base64.b64encode(b'{"t":' * 5_000).decode(),
    "[" * 5_000, "x" * 200_000,
], ids=["nested-array", "nested-object", "raw-brackets", "huge"])
def test_a_stored_token_the_tunnel_refuses_is_a_corrupt_row_in_channels_lag_and_progress(
        tmp_path: Path, bad_token: str) -> None:
    """A token nested past the embedded store's bound (RecursionError before) in the latest
    committed batch: ``meta channels``, ``meta lag`` and ``progress`` name its row as corrupt
    on stderr, show that channel's lag as unknown and the other channel's as it is."""
    uri, ns = _store_with_committed_batch(tmp_path, bad_token)
    for command in (("meta", "channels"), ("meta", "lag"), ("meta", "channels", "--json"),
                    ("progress",)):
        result = cli(*command, "--meta", uri)
        assert result.exit_code == 0, (command, result.output)
        assert f"record '{ns}/end/b1/ch-0000' is corrupt" in result.stderr, command
        assert "the tunnel refuses its token" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    lag = cli_json("meta", "lag", "--meta", uri)
    by_channel = {r["channel_id"]: r for r in lag["lag"]}
    assert by_channel["ch-0000"]["position"] == "corrupt"
    assert by_channel["ch-0000"]["records_behind"] is None
    assert by_channel["ch-0001"]["position"] == "batch"
    assert by_channel["ch-0001"]["records_behind"] is not None
    assert lag["records_behind"] is None and lag["exact"] is False
    channels = cli_json("meta", "channels", "--meta", uri)["channels"]
    assert {c["channel_id"]: c["lag"] is None for c in channels} == {"ch-0000": True,
                                                                     "ch-0001": False}


def test_show_lists_a_bounded_number_of_channels_and_json_lists_them_all(tmp_path: Path) -> None:
    """A manifest of 3,000 channels with 3,000 children added: the table shows the first
    ``MAX_SHOWN_CHANNELS`` and says so, each cell of names is cut; ``--json`` has them all."""
    from tablestore_cdc.commands.meta.batches import MAX_SHOWN_CHANNELS

    uri = build_meta(tmp_path / "m.db", batches=0)
    names = [f"ch-{i:05d}" for i in range(3_000)]
    with open_meta_store(uri) as meta:
        meta.create_batch(NS, "wide", "batch-init")
        meta.put_manifest(NS, "wide", "batch-init", Manifest(
            channels=tuple(ChannelStart(channel_id=ch, token=f"{ch}@0", sequence_number=0,
                                        max_records=1, parent_ids=tuple(names[:50]))
                           for ch in names),
            children_added=tuple(names), planned_at=time.time()))
    started = time.monotonic()
    shown = cli("meta", "show", "wide", "--meta", uri)
    assert time.monotonic() - started < 30
    assert shown.exit_code == 0, shown.output
    assert f"the first {MAX_SHOWN_CHANNELS} of 3000 channels shown; --json lists them all" \
        in shown.stdout
    assert "ch-02999" not in shown.stdout and "(2990 more)" in shown.stdout
    assert len(cli_json("meta", "show", "wide", "--meta", uri)["channels"]) == 3_000


def test_a_stored_time_no_calendar_holds_is_shown_as_a_number(tmp_path: Path) -> None:
    """A finite time far outside any date (year -1897267726: ValueError in every command that
    showed it) is shown as the number it is."""
    uri = build_meta(tmp_path / "m.db", batches=0)
    with open_meta_store(uri) as meta:
        meta.create_batch(NS, "far", "batch-init", now=-5.987204871509679e16)
        meta.put_manifest(NS, "far", "batch-init", Manifest(channels=(), planned_at=1e300))
    for command in (("meta", "batches"), ("meta", "show", "far")):
        result = cli(*command, "--meta", uri)
        assert result.exit_code == 0, result.output
        assert "1e+300 (not a date)" in result.stdout
