"""The official Tablestore Java SDK (``com.aliyun.openservices:tablestore``, its ``TunnelClient``
and ``tunnel.worker``) judges the emulator over the wire.

``integration/java_sdk_judge`` (built once by Maven, ``testkit/java_sdk_judge.py``) runs against
``tablestore-cdc emulator`` serving a table with two channels: a client with a wrong secret is
refused (the SDK's error code); CreateTunnel (Stream, earliest), ListTunnel and DescribeTunnel;
then the SDK's own ``TunnelWorker`` with an ``IChannelProcessor`` prints every record it is
handed. Rows are written by the official Python SDK -- puts with every value type, updates that
set one column and delete another, deletes -- before the judge starts and while it reads, with
one of the channels split in between (the worker must finish the parent and pick up its
children). The records the Java SDK decodes must equal what was written, key by key and in
order, each at the sequence the store committed it, none lost and none twice.

``test_java_sdk_reads_base_data_then_stream``: the same worker on a BaseAndStream tunnel reads
each live row once from the base channels, then the later changes from the stream channels.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tablestore")

from tablestore import Row  # noqa: E402

from connector.local import LocalTablestore  # noqa: E402
from testkit.emulator import INSTANCE, KEY_ID, SECRET  # noqa: E402
from testkit.java_sdk_judge import fetch, judge_command, parse_lines  # noqa: E402
from testkit.wire_e2e import IGNORE, Emulator, create_source_table, sdk_client  # noqa: E402

pytestmark = [pytest.mark.extended, pytest.mark.slow]

KEYS = 12
#: what one record is compared by: type, then {column: (operation, value)}
Expected = tuple[str, dict[str, tuple[str, Any]]]


@pytest.fixture(scope="module")
def judge_build() -> Path:
    missing = [tool for tool in ("mvn", "java") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"the Java SDK judge needs {' and '.join(missing)} (Maven and a Java 17+ "
                    "runtime) to build and run the Tablestore Java SDK")
    return fetch()


def write(client: Any, start: int, n: int) -> dict[int, list[Expected]]:
    """Writes ``n`` changes through the official Python SDK; returns what each key's records
    must say, in order. Each key's first change is a put (rows that exist: no change is a
    no-op); then updates (one column set, another deleted) and deletes."""
    expected: dict[int, list[Expected]] = {}
    for i in range(start, start + n):
        key = i % KEYS
        pk = [("id", key)]
        if i >= KEYS and i % 5 == 4:
            client.delete_row("t", Row(pk), IGNORE)
            change: Expected = ("DELETE", {})
        elif i >= KEYS and i % 5 in (1, 3):
            client.update_row("t", Row(pk, {"PUT": [("qty", i)], "DELETE_ALL": ["name"]}), IGNORE)
            change = ("UPDATE", {"qty": ("PUT", i), "name": ("DELETE_ALL_VERSION", None)})
        else:
            blob = f"b{i}".encode()
            client.put_row("t", Row(pk, [("name", f"n{i}"), ("qty", i), ("ratio", i / 4),
                                         ("ok", i % 2 == 0), ("raw", bytearray(blob))]), IGNORE)
            change = ("PUT", {"name": ("PUT", f"n{i}"), "qty": ("PUT", i),
                              "ratio": ("PUT", i / 4), "ok": ("PUT", i % 2 == 0),
                              "raw": ("PUT", {"base64": base64.b64encode(blob).decode()})})
        expected.setdefault(key, []).append(change)
    return expected


def decoded(record: dict[str, Any]) -> Expected:
    return (record["type"], {c["name"]: (c["op"], c["value"]) for c in record["columns"]})


def per_key(records: list[dict[str, Any]]) -> dict[int, list[Expected]]:
    out: dict[int, list[Expected]] = {}
    for record in records:
        assert [name for name, _ in record["pk"]] == ["id"], record
        out.setdefault(record["pk"][0][1], []).append(decoded(record))
    return out


def read_lines(path: Path) -> list[dict[str, Any]]:
    return parse_lines(path.read_text()) if path.exists() else []


def start_judge(tmp_path: Path, build: Path, url: str, records: int,
                *extra: str) -> subprocess.Popen[bytes]:
    """The judge reading ``records`` records, its JSON lines into ``judge.out``."""
    with (tmp_path / "judge.out").open("wb") as stdout, \
            (tmp_path / "judge.err").open("wb") as stderr:
        return subprocess.Popen(
            judge_command(build, url, INSTANCE, KEY_ID, SECRET, "t", records=records,
                          timeout_s=150) + list(extra),
            stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL)


def wait_for(tmp_path: Path, judge: subprocess.Popen[bytes], what: str,
             done: Callable[[list[dict[str, Any]]], bool]) -> None:
    """Wait (90 s at most) until the judge's lines so far satisfy ``done``."""
    out, err = tmp_path / "judge.out", tmp_path / "judge.err"
    deadline = time.monotonic() + 90
    while not done(read_lines(out)):
        assert judge.poll() is None, \
            f"the judge exited before {what}:\n{out.read_text()}\n{err.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"not {what} in 90 s:\n{err.read_text()[-3000:]}"
        time.sleep(0.2)


def finish(tmp_path: Path, judge: subprocess.Popen[bytes]) -> list[dict[str, Any]]:
    """The judge's lines once it has exited 0."""
    judge.wait(timeout=200)
    lines = read_lines(tmp_path / "judge.out")
    assert judge.returncode == 0, \
        f"{lines[-3:]}\n{(tmp_path / 'judge.err').read_text()[-3000:]}"
    return lines


def n_records(lines: list[dict[str, Any]]) -> int:
    return sum(line["event"] == "record" for line in lines)


def test_java_sdk_tunnel_worker_reads_what_was_written(tmp_path: Path,
                                                       judge_build: Path) -> None:
    started = time.monotonic()
    wall_ms = [int(time.time() * 1000) - 1000]
    emulator = Emulator(tmp_path / "store.db", tmp_path / "emulator.log").start()
    store = LocalTablestore(tmp_path / "store.db")
    judge: subprocess.Popen[bytes] | None = None
    try:
        client = sdk_client(emulator.url)
        create_source_table(client)
        expected = write(client, 0, 60)
        first, second = 60, 60
        judge = start_judge(tmp_path, judge_build, emulator.url, first + second)
        wait_for(tmp_path, judge, "20 records read", lambda lines: n_records(lines) >= 20)
        parent = store.list_channels("t")[0].channel_id
        store.split_channel("t", parent)  # while the worker reads
        for key, changes in write(client, first, second).items():
            expected.setdefault(key, []).extend(changes)
        lines = finish(tmp_path, judge)
        wall_ms.append(int(time.time() * 1000))
    finally:
        if judge is not None and judge.poll() is None:
            judge.kill()
            judge.wait()
        emulator.kill()
    try:
        change_log = store.change_log("t")
        channels = store.list_channels("t")
    finally:
        store.close()
    events = {line["event"]: line for line in lines if line["event"] != "record"}
    records = [line for line in lines if line["event"] == "record"]

    # a wrong secret: the SDK's own error, as the service's error reference has it
    bad = events["bad_key"]
    assert (bad["refused"], bad["error_code"], bad["http_status"]) == \
        (True, "OTSAuthFailed", 403), bad
    # CreateTunnel, ListTunnel, DescribeTunnel as the SDK parses them
    tunnel_id = events["create"]["tunnel_id"]
    assert tunnel_id
    listed = events["list"]["tunnels"]
    assert [(t["name"], t["id"], t["type"], t["table"], t["instance"]) for t in listed] == \
        [("java-judge", tunnel_id, "Stream", "t", INSTANCE)], listed
    described = events["describe"]
    assert (described["tunnel"]["id"], described["tunnel"]["type"],
            described["tunnel"]["stage"], described["tunnel"]["expired"]) == \
        (tunnel_id, "Stream", "ProcessStream", False), described
    # the wire's nanoseconds, as the SDK turns them into milliseconds: the test's own minutes
    assert wall_ms[0] <= described["tunnel"]["create_time_ms"] <= wall_ms[1], described
    assert sorted(c["id"] for c in described["channels"]) == \
        sorted(c.channel_id for c in channels if not c.parent_ids), described
    assert {c["type"] for c in described["channels"]} == {"Stream"}, described
    assert events["done"]["records"] == first + second

    # the records: what was written, key by key in order, none lost, none twice
    assert len(records) == first + second == len(change_log)
    got = per_key(records)
    assert got == expected
    # a wrong expectation fails the comparison (a changed value, a dropped record)
    wrong = {key: list(changes) for key, changes in expected.items()}
    wrong[0][-1] = (wrong[0][-1][0], {**wrong[0][-1][1], "qty": ("PUT", -1)})
    wrong[1] = wrong[1][:-1]
    assert got != wrong
    # each at the sequence the store committed it, in its channel; PUT cells carry the commit
    # time (ms), deleted columns none
    committed = {(r.primary_key["id"], n): r for key in range(KEYS)
                 for n, r in enumerate(r for r in change_log if r.primary_key["id"] == key)}
    seen: dict[int, int] = {}
    for record in records:
        key = record["pk"][0][1]
        n = seen[key] = seen.get(key, -1) + 1
        store_record = committed[(key, n)]
        assert record["seq"] == {"epoch": 0, "timestamp": store_record.commit_ts_us,
                                 "row_index": int(store_record.sequence)}, record
        assert record["channel"] == store_record.channel_id, record
        for column in record["columns"]:
            ts = store_record.commit_ts_us // 1000 if column["op"] == "PUT" else None
            assert column["ts"] == ts, record
    # the split's children were read after their parent: the worker finished the parent
    children = {c.channel_id for c in channels if c.parent_ids == (parent,)}
    assert len(children) == 2
    order = [record["channel"] for record in records]
    assert children & set(order), "no record came from the split's children"
    last_parent = max(i for i, channel in enumerate(order) if channel == parent)
    first_child = min(i for i, channel in enumerate(order) if channel in children)
    assert last_parent < first_child
    # and, as DescribeTunnel tells the SDK afterwards, the parent TERMINATED, its children and
    # the other channel open
    after = {c["id"]: c["status"] for c in events["describe_after"]["channels"]}
    assert after == {channel.channel_id: "TERMINATED" if channel.channel_id == parent else "OPEN"
                     for channel in channels}, after
    print(f"Java SDK judge: {len(records)} records agreed in "
          f"{time.monotonic() - started:.1f} s")


def state_of(changes: dict[int, list[Expected]]) -> dict[int, dict[str, Any]]:
    """Each live row's columns after the changes (what a base-data read sees)."""
    rows: dict[int, dict[str, Any]] = {}
    for key, key_changes in changes.items():
        for kind, columns in key_changes:
            if kind == "DELETE":
                rows.pop(key, None)
                continue
            row = rows.setdefault(key, {}) if kind == "UPDATE" else {}
            for name, (op, value) in columns.items():
                if op == "PUT":
                    row[name] = value
                else:
                    row.pop(name, None)
            rows[key] = row
    return rows


def test_java_sdk_reads_base_data_then_stream(tmp_path: Path, judge_build: Path) -> None:
    """BaseAndStream: the worker reads each live row once from the base channels (PUT, the row
    as it stood when the tunnel was created, no sequence), finishes them, then the changes
    written after the tunnel was created from the stream channels."""
    emulator = Emulator(tmp_path / "store.db", tmp_path / "emulator.log").start()
    judge: subprocess.Popen[bytes] | None = None
    try:
        client = sdk_client(emulator.url)
        create_source_table(client)
        base = state_of(write(client, 0, 40))
        stream_count = 30
        judge = start_judge(tmp_path, judge_build, emulator.url, len(base) + stream_count,
                            "--type", "BaseAndStream", "--tunnel", "java-judge-base")
        wait_for(tmp_path, judge, "the tunnel created",
                 lambda lines: any(line["event"] == "describe" for line in lines))
        stream = write(client, 40, stream_count)
        lines = finish(tmp_path, judge)
    finally:
        if judge is not None and judge.poll() is None:
            judge.kill()
            judge.wait()
        emulator.kill()
    events = {line["event"]: line for line in lines if line["event"] != "record"}
    records = [line for line in lines if line["event"] == "record"]
    described = events["describe"]
    assert (described["tunnel"]["type"], described["tunnel"]["stage"]) == \
        ("BaseAndStream", "ProcessBaseData"), described
    # the base channels open, the stream channels waiting for them
    before = {c["id"]: (c["type"], c["status"]) for c in described["channels"]}
    base_ids = [c for c in before if c.startswith("BaseData_")]
    assert len(base_ids) == 2, described
    assert before == {**{c: ("BaseData", "OPEN") for c in base_ids},
                      **{c.removeprefix("BaseData_"): ("Stream", "WAIT") for c in base_ids}}

    base_records = [r for r in records if r["channel"].startswith("BaseData_")]
    stream_records = [r for r in records if not r["channel"].startswith("BaseData_")]
    assert len(base_records) == len(base) and len(stream_records) == stream_count
    # the base: each live row once, as it stood, a PUT without a sequence of its own
    assert {r["pk"][0][1]: decoded(r) for r in base_records} == \
        {key: ("PUT", {name: ("PUT", value) for name, value in row.items()})
         for key, row in base.items()}
    assert {json.dumps(r["seq"]) for r in base_records} == \
        {json.dumps({"epoch": 0, "timestamp": 0, "row_index": 0})}
    # then the stream: the later changes, key by key in order, each with its sequence
    assert per_key(stream_records) == stream
    assert all(r["seq"]["timestamp"] > 0 for r in stream_records)
    assert records.index(stream_records[0]) == len(base_records), "stream read before base"
    after = {c["id"]: c["status"] for c in events["describe_after"]["channels"]}
    assert after == {**{c: "TERMINATED" for c in base_ids},
                     **{c.removeprefix("BaseData_"): "OPEN" for c in base_ids}}, after
