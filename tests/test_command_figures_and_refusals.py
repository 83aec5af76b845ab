"""Figures and failure modes of the operator's commands, as a new user meets them.

Fast tests against real SQLite files: meta stores built through the ``MetaStore`` API, local
stores through ``LocalTablestore``, then the ``tablestore-cdc`` commands run in-process
(typer's ``CliRunner``). Covers ``meta diff`` totals across a split and a merge, ``meta batches
--limit``, the dashboard's throughput figure, read-only ``local`` commands on foreign files,
corrupt meta rows, and the CLI's small defects.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
import uuid as uuid_lib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cdc_common.tokens import FINISHED
from connector.local import LocalTablestore
from meta_store import BatchState, ChannelStart, EndCheckpoint, Manifest, open_meta_store
from tablestore_cdc.commands.app import app as root_app
from tablestore_cdc.feed.snapshot import throughput

NS = "local:///nowhere/store.db#t#n"


def cli(*args: Any, columns: int = 220) -> Any:
    return CliRunner().invoke(root_app, [str(a) for a in args], env={"COLUMNS": str(columns)})


def _tok(ch: str, seq: int) -> str:
    return f"eyJ0IjoidCIsImMiOi{ch}@{seq}"  # shares a long prefix, like real tokens


class Run:
    """A meta store shaped like a run with a split and a merge (through the MetaStore API).

    batch 0: a, b (5 each) · batch 1: a (finished, split into c+d), b 5 · batch 2: b 5, c 3,
    d 4 · batch 3: c (finished), d (finished) - merged into e · batch 4: b 5, e 6.
    Channels c and d appear and finish strictly between batch 0 and batch 4.
    """

    def __init__(self, path: Path) -> None:
        self.uri = f"sqlite://{path}"
        self.uuids = [str(uuid_lib.uuid4()) for _ in range(6)]
        self.records: list[int] = []
        seq: dict[str, int] = {}
        plan = [
            {"a": 5, "b": 5},
            {"a": -1, "b": 5},
            {"b": 5, "c": 3, "d": 4},
            {"b": 0, "c": -1, "d": -1},
            {"b": 5, "e": 6},
        ]
        with open_meta_store(self.uri) as meta:
            meta.set_namespace_info(NS, {"endpoint": "local:///nowhere/store.db", "table": "t",
                                         "tunnel": "n", "tunnel_id": "tid"})
            init = self.uuids[0]
            meta.create_batch(NS, init, None, state=BatchState.PUSHED, manifest=Manifest(
                channels=tuple(ChannelStart(channel_id=ch, token=_tok(ch, 0), sequence_number=0,
                                            max_records=100) for ch in ("a", "b")),
                planned_at=time.time()))
            prev = init
            for i, reads in enumerate(plan):
                uuid = self.uuids[i + 1]
                meta.create_batch(NS, uuid, prev)
                starts = tuple(ChannelStart(channel_id=ch, token=_tok(ch, seq.get(ch, 0)),
                                            sequence_number=seq.get(ch, 0), max_records=100)
                               for ch in sorted(reads))
                meta.put_manifest(NS, uuid, prev, Manifest(channels=starts,
                                                           planned_at=time.time() - 1))
                total = 0
                for ch, n in reads.items():
                    start = seq.get(ch, 0)
                    finished = n < 0
                    n = 2 if finished else n  # a finishing read still delivers 2 records
                    seq[ch] = start + n + (1 if finished else 0)
                    total += n
                    meta.put_end_checkpoint(NS, uuid, EndCheckpoint(
                        channel_id=ch, start_token=_tok(ch, start),
                        token=FINISHED if finished else _tok(ch, seq[ch]),
                        sequence_number=seq[ch], records=n, attempt="t/1/task",
                        written_at=time.time()))
                meta.mark_committed(NS, uuid)
                meta.mark_pushed(NS, [uuid])
                self.records.append(total)
                prev = uuid


# --- item 2: wrong figures -----------------------------------------------------------------


def test_diff_counts_channels_that_appeared_and_finished_in_between(tmp_path: Path) -> None:
    run = Run(tmp_path / "m.db")
    a, b = run.uuids[1], run.uuids[5]
    result = cli("meta", "diff", a, b, "--meta", run.uri, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    expected = sum(run.records[1:])  # batches 1..4
    assert data["batches_between"] == 4
    assert data["records"] == expected == 5 + 2 + 5 + 3 + 4 + 2 + 2 + 5 + 6
    by_id = {c["channel_id"]: c for c in data["channels"]}
    assert set(by_id) == {"a", "b", "c", "d", "e"}
    assert by_id["c"]["only_in"] == "between" and by_id["c"]["records"] == 3 + 2
    assert by_id["d"]["records"] == 4 + 2
    assert sum(c["records"] for c in data["channels"]) == data["records"]
    rich = cli("meta", "diff", a, b, "--meta", run.uri)
    assert f"4 batch(es), {expected} record(s)" in rich.stdout
    assert "appeared and finished in between" in rich.stdout


def test_batches_limit_totals_describe_the_rows_shown(tmp_path: Path) -> None:
    run = Run(tmp_path / "m.db")
    shown = cli("meta", "batches", "--limit", "2", "--meta", run.uri)
    assert shown.exit_code == 0, shown.output
    last_two = sum(run.records[-2:])
    assert f"2 of 6 batch(es) shown, {last_two} record(s) in them" in shown.stdout
    assert f"all 6: {sum(run.records)} record(s)" in shown.stdout
    data = json.loads(cli("meta", "batches", "--limit", "2", "--meta", run.uri, "--json").stdout)
    assert [r["uuid"] for r in data["batches"]] == run.uuids[-2:]
    assert (data["total_batches"], data["total_records"]) == (6, sum(run.records))
    negative = cli("meta", "batches", "--limit", "-3", "--meta", run.uri)
    assert negative.exit_code == 2
    assert "'--limit'" in negative.output and "greater than or equal to 0" in negative.output


def test_throughput_rate_and_caption_describe_the_same_rows() -> None:
    def record(i: int, rows: int, planned: float, committed: float) -> dict[str, Any]:
        return {"uuid": f"u{i}", "spark_batch_id": i, "initial": False, "records": rows,
                "times": {"planned": planned, "committed": committed}, "query": None}

    records = [record(0, 1000, 0.0, 1.0), record(1, 1000, 1.0, 3.0),
               record(2, 1000, 3.0, 5.0), record(3, 1000, 5.5, 7.5)]
    tp = throughput(records)
    # the rate counts the rows committed after the window's first commit, over that span
    assert tp["rate_records"] == 3000 and tp["seconds"] == 6.5
    assert tp["rows_per_second"] == pytest.approx(tp["rate_records"] / tp["seconds"])
    single = throughput(records[:1])
    assert single["rate_records"] == 1000 and single["seconds"] == 1.0
    assert single["rows_per_second"] == pytest.approx(1000.0)


# --- item 4: read-only local commands ------------------------------------------------------


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("command", [["tables"], ["channels", "t"], ["split", "t", "ch-0001"],
                                     ["tunnels"]])
def test_read_only_local_commands_leave_a_foreign_sqlite_file_alone(tmp_path: Path,
                                                                    command: list[str]) -> None:
    app_db = tmp_path / "app.db"
    with sqlite3.connect(app_db) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO users VALUES (1, 'ada')")
    conn.close()
    meta_db = tmp_path / "meta.db"
    Run(meta_db)
    for foreign in (app_db, meta_db):
        before, had_wal = _digest(foreign), Path(f"{foreign}-wal").exists()
        result = cli("local", command[0], foreign, *command[1:])
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith("error: ") and "not a local store" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert _digest(foreign) == before
        assert Path(f"{foreign}-wal").exists() == had_wal


def test_local_commands_refuse_a_non_database_in_one_line(tmp_path: Path) -> None:
    junk = tmp_path / "notes.txt"
    junk.write_text("not a database\n" * 50)
    before = _digest(junk)
    for args in (["tables", junk], ["write", junk, "t", "--count", "1"],
                 ["create-table", junk, "t", "--pk", "id:INTEGER"]):
        result = cli("local", *args)
        assert result.exit_code == 2, (args, result.output)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "not a local store" in result.stderr or "not an SQLite" in result.stderr
    assert _digest(junk) == before


def test_read_only_local_commands_do_not_write_a_real_store(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with LocalTablestore(path) as store:
        store.create_table("t", primary_key=[("id", "INTEGER")], channels=2)
        store.put_row("t", {"id": 1}, {})
    with sqlite3.connect(path) as conn:  # fold the WAL in, so the file alone is the store
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    before = _digest(path)
    for args in (["tables", path], ["channels", path, "t"], ["tunnels", path]):
        result = cli("local", *args)
        assert result.exit_code == 0, result.output
    assert _digest(path) == before


# --- item 5: corrupt rows ------------------------------------------------------------------


def _corrupt_batch(path: Path, uuid: str) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE cdc_batches SET record = substr(record, 1, 25) WHERE uuid = ?",
                     (uuid,))
    conn.close()


def test_one_corrupt_batch_row_is_marked_and_the_tools_carry_on(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    run = Run(path)
    bad = run.uuids[3]
    _corrupt_batch(path, bad)
    key = f"{NS}/batch/{bad}"

    listing = cli("meta", "batches", "--meta", run.uri)
    assert listing.exit_code == 0, listing.output
    assert "corrupt" in listing.stdout and bad in listing.stdout
    assert key in listing.stderr
    data = json.loads(cli("meta", "batches", "--meta", run.uri, "--json").stdout)
    assert [c["key"] for c in data["corrupt"]] == [key]
    assert len(data["batches"]) == 5

    other = cli("meta", "show", run.uuids[4][:8], "--meta", run.uri)
    assert other.exit_code == 0, other.output
    assert run.uuids[4] in other.stdout

    shown_bad = cli("meta", "show", bad, "--meta", run.uri)
    assert shown_bad.exit_code == 2 and key in shown_bad.stderr

    out = tmp_path / "export.json"
    exported = cli("meta", "export", "--meta", run.uri, "-o", out)
    assert exported.exit_code == 0, exported.output
    document = json.loads(out.read_text())
    assert len(document["batches"]) == 5
    assert [c["key"] for c in document["corrupt"]] == [key]
    assert "1 corrupt record" in exported.stderr

    feed = cli("progress", "--meta", run.uri, "--no-tunnel")
    assert feed.exit_code == 0, feed.output
    assert len(feed.stdout.splitlines()) == 5


def test_a_corrupt_end_checkpoint_row_is_marked(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    run = Run(path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE cdc_end_checkpoints SET record = '{\"channel' "
                     "WHERE uuid = ? AND channel_id = 'b'", (run.uuids[2],))
    conn.close()
    listing = cli("meta", "batches", "--meta", run.uri, "--json")
    assert listing.exit_code == 0, listing.output
    data = json.loads(listing.stdout)
    assert [c["key"] for c in data["corrupt"]] == [f"{NS}/end/{run.uuids[2]}/b"]
    exported = cli("meta", "export", "--meta", run.uri)
    assert exported.exit_code == 0, exported.output
    assert len(json.loads(exported.stdout)["corrupt"]) == 1


def test_a_corrupt_namespace_info_row_gets_a_clear_message(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    run = Run(path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE cdc_namespaces SET info = '[1, 2]' WHERE ns = ?", (NS,))
    conn.close()
    assert cli("meta", "batches", "--meta", run.uri).exit_code == 0  # needs no info
    listing = cli("meta", "namespaces", "--meta", run.uri)
    assert listing.exit_code == 0, listing.output
    assert NS in listing.stdout
    assert "validation error" not in listing.stderr
    assert f"the info record of namespace {NS!r} is corrupt" in listing.stderr
    channels = cli("meta", "channels", "--meta", run.uri)
    assert channels.exit_code == 2
    assert "validation error" not in channels.stderr
    error = [line for line in channels.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "is corrupt" in error[0], channels.stderr


# --- item 6: CLI polish --------------------------------------------------------------------


def test_boolean_flags_are_shown_as_flags() -> None:
    for args in (["meta", "batches", "--help"], ["meta", "gc", "--help"],
                 ["local", "tables", "--help"]):
        result = cli(*args)
        assert result.exit_code == 0
        assert "<bool>" not in result.stdout and "--json" in result.stdout


def test_export_into_a_missing_directory_is_one_line(tmp_path: Path) -> None:
    run = Run(tmp_path / "m.db")
    target = tmp_path / "no" / "such" / "dir" / "export.json"
    result = cli("meta", "export", "--meta", run.uri, "-o", target)
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"error: cannot write {target}: directory "
                                     f"{target.parent} does not exist")


def test_short_uuid_prefix_names_the_minimum(tmp_path: Path) -> None:
    run = Run(tmp_path / "m.db")
    result = cli("meta", "show", "7", "--meta", run.uri)
    assert result.exit_code == 2
    assert "at least 4 characters" in result.stderr


def test_missing_dynamodb_table_hint_does_not_suggest_create_table(moto_endpoint: str) -> None:
    uri = (f"dynamodb://cdc-meta-absent?region=us-east-1&endpoint_url={moto_endpoint}"
           "&create_table=true")
    result = cli("meta", "batches", "--meta", uri)
    assert result.exit_code == 2
    assert "pass create_table=true" not in result.stderr
    assert "never creates" in result.stderr


def test_namespace_column_does_not_wrap_at_120_columns(tmp_path: Path) -> None:
    run = Run(tmp_path / "m.db")
    result = cli("meta", "namespaces", "--meta", run.uri, columns=120)
    assert result.exit_code == 0
    lines = [line for line in result.stdout.splitlines() if "local:" in line or "#t#n" in line]
    assert len(lines) == 1 and NS in lines[0], result.stdout


def test_show_token_cells_show_what_tells_them_apart(tmp_path: Path) -> None:
    run = Run(tmp_path / "m.db")
    result = cli("meta", "show", run.uuids[1], "--meta", run.uri)
    assert result.exit_code == 0
    for ch, seq in (("a", 5), ("b", 5)):
        assert f"{ch}@{seq}" in result.stdout  # the tail that differs, not the shared head
    assert "spark batch id=? (no ProgressListener reported it)" in result.stdout
    assert "None" not in result.stdout


def test_follow_on_an_empty_store_says_it_is_waiting(tmp_path: Path) -> None:
    import subprocess
    import sys

    uri = f"sqlite://{tmp_path / 'empty.db'}"
    open_meta_store(uri).close()
    repo = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-m", "tablestore_cdc", "progress", "--meta", uri,
                             "--follow", "--interval", "0.1", "--no-tunnel"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=repo)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "waiting for a query" in line, line
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_dashboard_snapshot_survives_and_lists_a_corrupt_row(tmp_path: Path) -> None:
    from tablestore_cdc.dashboard import DashboardApp

    path = tmp_path / "m.db"
    run = Run(path)
    _corrupt_batch(path, run.uuids[3])
    app = DashboardApp.open(run.uri)
    try:
        snapshot = json.loads(app.snapshot_json())
    finally:
        app.close()
    assert snapshot["batch_count"] == 5
    assert [c["key"] for c in snapshot["corrupt"]] == [f"{NS}/batch/{run.uuids[3]}"]


# --- item 3: is the query alive? -----------------------------------------------------------


def test_activity_tells_live_idle_stale_and_stopped() -> None:
    from tablestore_cdc.feed.snapshot import STALE_AFTER_S, activity

    def committed(at: float) -> dict[str, Any]:
        return {"initial": False, "times": {"committed": at}}

    now = 10_000.0
    recent = [committed(now - 3), committed(now - 2), committed(now - 1)]
    old = [committed(now - 500), committed(now - 499), committed(now - 498)]
    assert activity([], None, None, now)["state"] == "waiting"
    assert activity(recent, None, 5, now)["state"] == "live"
    assert activity(old, None, 0, now)["state"] == "idle"  # caught up: nothing to do
    stale = activity(old, None, 7, now)
    assert stale["state"] == "stale" and stale["last_commit_age_s"] == 498
    assert stale["stale_after_s"] == STALE_AFTER_S
    assert activity(old, None, None, now)["state"] == "stale"  # lag unknown
    heartbeat = {"status": "running", "at": now - 5, "query_id": "q", "reason": None}
    assert activity(old, heartbeat, 7, now)["state"] == "live"  # the listener heard from it
    stopped = activity(recent, {"status": "stopped", "at": now - 1, "query_id": "q",
                                "reason": "boom"}, 5, now)
    assert (stopped["state"], stopped["stopped_at"], stopped["reason"]) == (
        "stopped", now - 1, "boom")
    slow = [committed(now - 600 * i) for i in range(4, 0, -1)]  # a 10-minute trigger
    assert activity(slow, None, 3, now + 60)["state"] == "live"


def test_a_corrupt_dynamodb_item_is_marked_too(moto_endpoint: str) -> None:
    """The same tolerance on DynamoDB (a moto server on 127.0.0.1): a batch item whose
    document was cut short is listed as corrupt, the others are read."""
    import boto3

    table = "cdc-meta-corrupt"
    base = f"dynamodb://{table}?region=us-east-1&endpoint_url={moto_endpoint}"
    with open_meta_store(base + "&create_table=true") as meta:
        meta.set_namespace_info(NS, {"endpoint": "local:///nowhere/store.db", "table": "t",
                                     "tunnel": "n", "tunnel_id": "tid"})
        prev = None
        for uuid in ("b0", "b1", "b2"):
            meta.create_batch(NS, uuid, prev)
            prev = uuid
    client = boto3.client("dynamodb", region_name="us-east-1", endpoint_url=moto_endpoint)
    items = client.query(TableName=table, KeyConditionExpression="ns = :ns",
                         ExpressionAttributeValues={":ns": {"S": NS}})["Items"]
    victim = next(i for i in items if i["sk"]["S"].endswith("b1"))
    client.update_item(TableName=table, Key={"ns": victim["ns"], "sk": victim["sk"]},
                       UpdateExpression="SET doc = :d", ExpressionAttributeValues={
                           ":d": {"S": victim["doc"]["S"][:10]}})
    result = cli("meta", "batches", "--meta", base, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert sorted(b["uuid"] for b in data["batches"]) == ["b0", "b2"]
    assert [c["key"] for c in data["corrupt"]] == [f"{NS}/{victim['sk']['S']}"]


def test_a_corrupt_tablestore_meta_row_is_marked_too(tmp_path_factory: Any,
                                                     monkeypatch: Any) -> None:
    """And on the Tablestore meta store (the local emulator over HTTP, official SDK)."""
    pytest.importorskip("tablestore")
    from tablestore_emulator.server import EmulatorServer
    from testkit.emulator import INSTANCE, KEY_ID, SECRET
    from testkit.tablestore_meta import ENV, table_uri, tablestore_raw_writer

    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    store = tmp_path_factory.mktemp("emulator") / "store.db"
    with EmulatorServer(str(store), INSTANCE, KEY_ID, SECRET) as emulator:
        uri = table_uri(emulator)
        with open_meta_store(uri + "&create_table=true") as meta:
            meta.set_namespace_info(NS, {"table": "t", "tunnel": "n"})
            prev = None
            for uuid in ("b0", "b1", "b2"):
                meta.create_batch(NS, uuid, prev)
                prev = uuid
        tablestore_raw_writer(emulator, uri)(NS, "b1", None, '{"uuid": "b1", "pre')
        result = cli("meta", "batches", "--meta", uri, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert sorted(b["uuid"] for b in data["batches"]) == ["b0", "b2"]
    assert [c["key"] for c in data["corrupt"]] == [f"{NS}/B#b1"]
