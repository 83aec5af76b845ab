"""The emulator's table API, driven by the official ``tablestore`` SDK over HTTP.

Each test starts an in-process ``EmulatorServer`` on 127.0.0.1 port 0 over a fresh store file
and talks to it with ``tablestore.OTSClient`` (no retries: an error must surface at once).
Writes are checked in the store's change log, as the tunnel will serve them.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

tablestore = pytest.importorskip("tablestore")

from tablestore import (  # noqa: E402
    INF_MAX,
    INF_MIN,
    BatchGetRowRequest,
    BatchWriteRowRequest,
    CapacityUnit,
    Condition,
    DeleteRowItem,
    OTSClient,
    OTSClientError,
    OTSServiceError,
    PutRowItem,
    ReservedThroughput,
    Row,
    RowExistenceExpectation,
    TableInBatchGetRowItem,
    TableInBatchWriteRowItem,
    TableMeta,
    TableOptions,
    UpdateRowItem,
)
from tablestore.retry import NoRetryPolicy  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from connector.local import LocalTablestore  # noqa: E402
from connector.tunnel.base import Op  # noqa: E402
from connector.tunnel.local.schema import TABLES as STORE_TABLES  # noqa: E402
from tablestore_cdc.commands.local import app as local_app  # noqa: E402
from tablestore_emulator.errors import OtsError  # noqa: E402
from tablestore_emulator.server import EmulatorServer  # noqa: E402
from testkit.emulator import INSTANCE, KEY_ID, SECRET  # noqa: E402

IGNORE = Condition(RowExistenceExpectation.IGNORE)
EXPECT_EXIST = Condition(RowExistenceExpectation.EXPECT_EXIST)
EXPECT_NOT_EXIST = Condition(RowExistenceExpectation.EXPECT_NOT_EXIST)


@pytest.fixture
def store_path(tmp_path: Path) -> str:
    return str(tmp_path / "store.db")


@pytest.fixture
def emulator(store_path: str) -> Iterator[EmulatorServer]:
    with EmulatorServer(store_path, INSTANCE, KEY_ID, SECRET) as server:
        yield server


def make_client(url: str, secret: str = SECRET, key_id: str = KEY_ID) -> OTSClient:
    return OTSClient(url, key_id, secret, INSTANCE, retry_policy=NoRetryPolicy())


@pytest.fixture
def client(emulator: EmulatorServer) -> OTSClient:
    return make_client(emulator.url)


def create(client: OTSClient, name: str = "orders", pk: list | None = None) -> None:
    meta = TableMeta(name, pk or [("id", "STRING"), ("n", "INTEGER")])
    client.create_table(meta, TableOptions(), ReservedThroughput(CapacityUnit(0, 0)))


def service_error(fn, *args, **kwargs) -> OTSServiceError:  # type: ignore[no-untyped-def]
    with pytest.raises(OTSServiceError) as info:
        fn(*args, **kwargs)
    return info.value


def get(client: OTSClient, table: str, pk: list, **kw) -> dict | None:  # type: ignore[no-untyped-def]
    _, row, _ = client.get_row(table, pk, max_version=1, **kw)
    return None if row is None else {name: value for name, value, _ts in row.attribute_columns}


# --- tables -----------------------------------------------------------------------------------


def test_create_describe_list_delete_table(client: OTSClient, store_path: str) -> None:
    assert client.list_table() == ()
    create(client, "orders")
    create(client, "users", [("uid", "INTEGER")])
    assert client.list_table() == ("orders", "users")
    desc = client.describe_table("orders")
    assert desc.table_meta.table_name == "orders"
    assert desc.table_meta.schema_of_primary_key == [("id", "STRING"), ("n", "INTEGER")]
    assert desc.table_options.max_version == 1
    assert desc.table_options.time_to_live == -1

    err = service_error(create, client, "orders")
    assert (err.get_http_status(), err.get_error_code()) == (409, "OTSObjectAlreadyExist")

    client.put_row("orders", Row([("id", "a"), ("n", 1)], [("v", 1)]))
    client.delete_table("orders")
    assert client.list_table() == ("users",)
    with closing(sqlite3.connect(store_path)) as conn:  # nothing of it is left in the file
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'cdc_%'")]
        for t in tables:
            cols = {r[1] for r in conn.execute(f"PRAGMA table_info({t})")}
            key = "table_name" if "table_name" in cols else "name" if t == "cdc_tables" else None
            if key:
                n = conn.execute(f"SELECT count(*) FROM {t} WHERE {key} = 'orders'").fetchone()
                assert n == (0,), t
    err = service_error(client.describe_table, "orders")
    assert (err.get_http_status(), err.get_error_code()) == (404, "OTSObjectNotExist")
    err = service_error(client.delete_table, "orders")
    assert err.get_error_code() == "OTSObjectNotExist"
    # The name can be used again, with another key.
    create(client, "orders", [("k", "BINARY")])
    assert client.describe_table("orders").table_meta.schema_of_primary_key == [("k", "BINARY")]


def test_bad_table_requests_get_parameter_invalid(client: OTSClient) -> None:
    err = service_error(create, client, "bad-name")
    assert (err.get_http_status(), err.get_error_code()) == (400, "OTSParameterInvalid")
    err = service_error(create, client, "five", [(f"k{i}", "INTEGER") for i in range(5)])
    assert err.get_error_code() == "OTSParameterInvalid"
    err = service_error(client.put_row, "missing", Row([("id", 1)], [("a", 1)]))
    assert err.get_error_code() == "OTSObjectNotExist"


# --- rows -------------------------------------------------------------------------------------


def test_put_row_with_each_condition(client: OTSClient) -> None:
    create(client)
    pk = [("id", "a"), ("n", 1)]
    client.put_row("orders", Row(pk, [("v", 1)]), EXPECT_NOT_EXIST)
    err = service_error(client.put_row, "orders", Row(pk, [("v", 2)]), EXPECT_NOT_EXIST)
    assert (err.get_http_status(), err.get_error_code()) == (403, "OTSConditionCheckFail")
    assert get(client, "orders", pk) == {"v": 1}

    client.put_row("orders", Row(pk, [("w", "x")]), EXPECT_EXIST)  # replaces the whole row
    assert get(client, "orders", pk) == {"w": "x"}
    other = [("id", "b"), ("n", 1)]
    err = service_error(client.put_row, "orders", Row(other, [("v", 1)]), EXPECT_EXIST)
    assert err.get_error_code() == "OTSConditionCheckFail"
    assert get(client, "orders", other) is None

    client.put_row("orders", Row(other, [("v", 3)]), IGNORE)
    client.put_row("orders", Row(other, [("v", 4)]), IGNORE)
    assert get(client, "orders", other) == {"v": 4}


def test_update_row_with_each_condition(client: OTSClient) -> None:
    create(client)
    pk = [("id", "a"), ("n", 1)]
    err = service_error(client.update_row, "orders", Row(pk, {"put": [("v", 1)]}), EXPECT_EXIST)
    assert err.get_error_code() == "OTSConditionCheckFail"
    client.update_row("orders", Row(pk, {"put": [("v", 1), ("w", "x")]}), EXPECT_NOT_EXIST)
    err = service_error(
        client.update_row, "orders", Row(pk, {"put": [("v", 2)]}), EXPECT_NOT_EXIST
    )
    assert err.get_error_code() == "OTSConditionCheckFail"
    client.update_row(
        "orders", Row(pk, {"put": [("v", 2)], "delete_all": ["w"]}), EXPECT_EXIST
    )
    assert get(client, "orders", pk) == {"v": 2}
    client.update_row("orders", Row(pk, {"increment": [("v", 5)]}), IGNORE)
    assert get(client, "orders", pk) == {"v": 7}


def test_delete_row_with_each_condition(client: OTSClient) -> None:
    create(client)
    pk = [("id", "a"), ("n", 1)]
    err = service_error(client.delete_row, "orders", Row(pk), EXPECT_EXIST)
    assert err.get_error_code() == "OTSConditionCheckFail"
    err = service_error(client.delete_row, "orders", Row(pk), EXPECT_NOT_EXIST)
    assert (err.get_http_status(), err.get_error_code()) == (400, "OTSParameterInvalid")
    client.put_row("orders", Row(pk, [("v", 1)]))
    client.delete_row("orders", Row(pk), EXPECT_EXIST)
    assert get(client, "orders", pk) is None
    client.delete_row("orders", Row(pk), IGNORE)  # a missing row: still fine


def test_column_conditions(client: OTSClient) -> None:
    from tablestore import (
        ComparatorType,
        CompositeColumnCondition,
        LogicalOperator,
        SingleColumnCondition,
    )

    create(client)
    pk = [("id", "a"), ("n", 1)]
    client.put_row("orders", Row(pk, [("rank", 1), ("state", "minted")]))

    def cond(column: str, value: object, op: str = ComparatorType.EQUAL,
             pass_if_missing: bool = True) -> Condition:
        return Condition(RowExistenceExpectation.EXPECT_EXIST,
                         SingleColumnCondition(column, value, op, pass_if_missing))

    client.update_row("orders", Row(pk, {"put": [("rank", 2)]}), cond("rank", 1))
    err = service_error(client.update_row, "orders", Row(pk, {"put": [("rank", 3)]}),
                        cond("rank", 1))
    assert err.get_error_code() == "OTSConditionCheckFail"
    client.update_row("orders", Row(pk, {"put": [("rank", 3)]}),
                      cond("rank", 3, ComparatorType.LESS_THAN))
    err = service_error(client.update_row, "orders", Row(pk, {"put": [("x", 1)]}),
                        cond("missing", 1, pass_if_missing=False))
    assert err.get_error_code() == "OTSConditionCheckFail"
    client.update_row("orders", Row(pk, {"put": [("x", 1)]}), cond("missing", 1))
    either = CompositeColumnCondition(LogicalOperator.OR)
    either.add_sub_condition(SingleColumnCondition("state", "planned", ComparatorType.EQUAL))
    either.add_sub_condition(SingleColumnCondition("rank", 3, ComparatorType.GREATER_EQUAL))
    client.delete_row("orders", Row(pk), Condition(RowExistenceExpectation.EXPECT_EXIST, either))
    assert get(client, "orders", pk) is None


def test_get_row_values_and_columns_to_get(client: OTSClient) -> None:
    create(client, "t", [("k", "BINARY")])
    pk = [("k", bytearray(b"\x00\xff"))]
    values = [("i", -(2**63)), ("f", 1.5), ("b", True), ("s", "héllo"), ("bin", bytearray(b"\x01"))]
    client.put_row("t", Row(pk, values))
    _, row, _ = client.get_row("t", pk, max_version=1)
    assert row.primary_key == pk
    assert sorted((n, v) for n, v, _ in row.attribute_columns) == sorted(values)
    assert get(client, "t", pk, columns_to_get=["s", "nope"]) == {"s": "héllo"}
    assert get(client, "t", pk, columns_to_get=["nope"]) is None
    assert get(client, "t", [("k", bytearray(b"\x01"))]) is None
    err = service_error(client.get_row, "t", [("k", 1)], max_version=1)
    assert err.get_error_code() == "OTSParameterInvalid"  # wrong key type


def test_get_range_over_several_pages(client: OTSClient, emulator: EmulatorServer) -> None:
    create(client, "r", [("g", "STRING"), ("n", "INTEGER")])
    for g in ("a", "b"):
        for n in range(12):  # 2 < 10 numerically: the order is the service's, not text
            client.put_row("r", Row([("g", g), ("n", n)], [("v", f"{g}{n}")]))
    emulator.context.range_page_rows = 5  # the service's page cap, lowered

    def read_all(direction: str, start: list, end: list, limit: int | None = None) -> tuple:
        rows, pages = [], 0
        while start is not None:
            _, start, page, _ = client.get_range(
                "r", direction, start, end, limit=limit, max_version=1
            )
            rows.extend((dict(r.primary_key)["g"], dict(r.primary_key)["n"]) for r in page)
            pages += 1
        return rows, pages

    everything = [(g, n) for g in ("a", "b") for n in range(12)]
    rows, pages = read_all("FORWARD", [("g", INF_MIN), ("n", INF_MIN)],
                           [("g", INF_MAX), ("n", INF_MAX)])
    assert rows == everything and pages == 5
    rows, pages = read_all("FORWARD", [("g", "a"), ("n", 3)], [("g", "b"), ("n", 2)], limit=4)
    assert rows == everything[3:14] and pages == 3
    rows, _ = read_all("BACKWARD", [("g", "b"), ("n", 2)], [("g", "a"), ("n", 3)])
    assert rows == list(reversed(everything[4:15]))
    _, nxt, page, _ = client.get_range(
        "r", "FORWARD", [("g", "a"), ("n", INF_MIN)], [("g", "a"), ("n", INF_MAX)],
        columns_to_get=["v"], limit=2, max_version=1,
    )
    assert [r.attribute_columns[0][1] for r in page] == ["a0", "a1"]
    assert nxt == [("g", "a"), ("n", 2)]
    err = service_error(client.get_range, "r", "FORWARD", [("g", "b"), ("n", 0)],
                        [("g", "a"), ("n", 0)], max_version=1)
    assert err.get_error_code() == "OTSParameterInvalid"


def test_get_range_picks_rows_by_the_first_key_columns_span_in_the_services_order(
        client: OTSClient) -> None:
    """The store chooses the rows by the first key column's span before the exact range is
    kept: integers by number (2 < 10 < 2**40, negatives first), strings by UTF-8 bytes
    ("z" < "é"), binaries by bytes (chosen in full, then filtered)."""
    def keys(table: str, direction: str, start: list, end: list) -> list[tuple]:
        _, _, page, _ = client.get_range(table, direction, start, end, max_version=1)
        return [tuple(v for _, v in r.primary_key) for r in page]

    create(client, "ints", [("n", "INTEGER"), ("s", "STRING")])
    create(client, "texts", [("s", "STRING"), ("n", "INTEGER")])
    create(client, "bins", [("b", "BINARY"), ("n", "INTEGER")])
    for n in (-5, 2, 10, 2**40):
        client.put_row("ints", Row([("n", n), ("s", "x")], [("v", 1)]))
    for s in ("y", "z", "é", "zz"):
        client.put_row("texts", Row([("s", s), ("n", 1)], [("v", 1)]))
    for b in (b"\x00", b"\x7f", b"\xff"):
        client.put_row("bins", Row([("b", bytearray(b)), ("n", 1)], [("v", 1)]))
    assert keys("ints", "FORWARD", [("n", 2), ("s", INF_MIN)], [("n", 10), ("s", INF_MAX)]) \
        == [(2, "x"), (10, "x")]
    assert keys("ints", "BACKWARD", [("n", 2**40), ("s", INF_MIN)], [("n", -5), ("s", "x")]) \
        == [(10, "x"), (2, "x")]
    assert keys("ints", "FORWARD", [("n", INF_MIN), ("s", INF_MIN)], [("n", 3), ("s", INF_MIN)]) \
        == [(-5, "x"), (2, "x")]
    assert keys("texts", "FORWARD", [("s", "z"), ("n", INF_MIN)], [("s", "é"), ("n", INF_MAX)]) \
        == [("z", 1), ("zz", 1), ("é", 1)]
    assert keys("texts", "FORWARD", [("s", "y"), ("n", 2)], [("s", "zz"), ("n", INF_MIN)]) \
        == [("z", 1)]
    assert keys("bins", "FORWARD", [("b", bytearray(b"\x01")), ("n", INF_MIN)],
                [("b", INF_MAX), ("n", INF_MAX)]) == [(bytearray(b"\x7f"), 1),
                                                      (bytearray(b"\xff"), 1)]


def test_batch_write_row_and_batch_get_row(client: OTSClient) -> None:
    create(client)
    client.put_row("orders", Row([("id", "old"), ("n", 0)], [("v", 0)]))
    req = BatchWriteRowRequest()
    req.add(TableInBatchWriteRowItem("orders", [
        PutRowItem(Row([("id", "p"), ("n", 1)], [("v", 1)]), EXPECT_NOT_EXIST),
        PutRowItem(Row([("id", "old"), ("n", 0)], [("v", 9)]), EXPECT_NOT_EXIST),  # fails
        UpdateRowItem(Row([("id", "old"), ("n", 0)], {"put": [("w", 2)]}), EXPECT_EXIST),
        DeleteRowItem(Row([("id", "gone"), ("n", 0)]), EXPECT_EXIST),  # fails
    ]))
    result = client.batch_write_row(req)
    assert not result.is_all_succeed()
    ok_put, failed_put = result.get_put()
    assert len(ok_put) == 1 and [f.error_code for f in failed_put] == ["OTSConditionCheckFail"]
    ok_update, failed_update = result.get_update()
    assert len(ok_update) == 1 and not failed_update
    _, failed_delete = result.get_delete()
    assert [f.error_code for f in failed_delete] == ["OTSConditionCheckFail"]

    get_req = BatchGetRowRequest()
    get_req.add(TableInBatchGetRowItem(
        "orders", [[("id", "p"), ("n", 1)], [("id", "old"), ("n", 0)], [("id", "x"), ("n", 0)]],
        max_version=1,
    ))
    get_req.add(TableInBatchGetRowItem("missing", [[("id", "p")]], max_version=1))
    got = client.batch_get_row(get_req)
    rows = got.get_result_by_table("orders")
    assert [r.is_ok for r in rows] == [True, True, True]
    assert [dict((n, v) for n, v, _ in r.row.attribute_columns) if r.row else None
            for r in rows] == [{"v": 1}, {"v": 0, "w": 2}, None]
    assert [r.error_code for r in got.get_result_by_table("missing")] == ["OTSObjectNotExist"]


# --- authentication -----------------------------------------------------------------------------


def test_wrong_secret_or_key_is_refused(emulator: EmulatorServer) -> None:
    err = service_error(make_client(emulator.url, secret="wrong").list_table)
    assert (err.get_http_status(), err.get_error_code()) == (403, "OTSAuthFailed")
    assert "Signature mismatch" in err.get_error_message()
    err = service_error(make_client(emulator.url, key_id="other").list_table)
    assert err.get_error_code() == "OTSAuthFailed"


def test_stale_or_missing_date_is_refused(
    emulator: EmulatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = make_client(emulator.url)
    real_now = tablestore.utils.get_now_utc_datetime
    monkeypatch.setattr(
        tablestore.utils, "get_now_utc_datetime", lambda: real_now() - dt.timedelta(minutes=20)
    )
    err = service_error(client.list_table)
    assert (err.get_http_status(), err.get_error_code()) == (403, "OTSAuthFailed")
    assert "x-ots-date" in err.get_error_message()
    monkeypatch.undo()
    # No signature headers at all: the service's error, as a protobuf Error body.
    request = urllib.request.Request(emulator.url + "/ListTable", data=b"", method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    from tablestore.protobuf import table_store_pb2 as pb

    error = pb.Error.FromString(info.value.read())
    assert info.value.code == 400 and error.code == "OTSParameterInvalid"
    assert info.value.headers["x-ots-requestid"]


def test_the_sdk_rejects_a_response_with_a_broken_signature(
    emulator: EmulatorServer, client: OTSClient
) -> None:
    create(client)
    emulator.corrupt_response_signatures = True
    with pytest.raises(OTSClientError, match="Invalid signature in response"):
        client.put_row("orders", Row([("id", "a"), ("n", 1)], [("v", 1)]))
    emulator.corrupt_response_signatures = False
    assert get(client, "orders", [("id", "a"), ("n", 1)]) == {"v": 1}  # the write did land


def test_ots_error_pickles() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(OtsError(409, "OTSObjectAlreadyExist", "taken")))
    assert (err.http_status, err.code, err.message) == (409, "OTSObjectAlreadyExist", "taken")


# --- writes become channel changes --------------------------------------------------------------


def test_writes_through_the_wire_are_channel_changes(client: OTSClient, store_path: str) -> None:
    create(client)
    pk = [("id", "a"), ("n", 1)]
    client.put_row("orders", Row(pk, [("v", 1), ("w", "x")]))
    client.update_row("orders", Row(pk, {"put": [("v", 2)], "delete": ["w"]}), IGNORE)
    client.delete_row("orders", Row(pk), IGNORE)
    store = LocalTablestore(store_path, create=False)
    log = [r for r in store.change_log("orders") if r.primary_key == {"id": "a", "n": 1}]
    assert [r.op for r in log] == [Op.PUT, Op.UPDATE, Op.DELETE]
    assert [dict(r.columns) for r in log] == [{"v": 1, "w": "x"}, {"v": 2, "w": None}, {}]
    assert [r.before for r in log] == [None, {"v": 1, "w": "x"}, {"v": 2}]
    assert len({r.channel_id for r in log}) == 1
    assert [int(r.sequence) for r in log] == sorted(int(r.sequence) for r in log)
    # a failed condition writes nothing
    with pytest.raises(OTSServiceError):
        client.update_row("orders", Row(pk, {"put": [("v", 3)]}), EXPECT_EXIST)
    assert len(store.change_log("orders")) == 3
    store.close()


def test_writes_follow_a_channel_split_and_merge_made_by_the_local_cli(
    client: OTSClient, store_path: str
) -> None:
    create(client)
    keys = [[("id", f"k{i}"), ("n", i)] for i in range(40)]
    for pk in keys:
        client.put_row("orders", Row(pk, [("v", 0)]))
    store = LocalTablestore(store_path, create=False)
    parent = store.list_channels("orders")[0].channel_id
    result = CliRunner().invoke(local_app, ["split", store_path, "orders", parent])
    assert result.exit_code == 0, result.output
    children = {c.channel_id for c in store.list_channels("orders") if parent in c.parent_ids}
    assert len(children) == 2
    for pk in keys:
        client.update_row("orders", Row(pk, {"put": [("v", 1)]}), IGNORE)
    log = store.change_log("orders")
    by_key: dict[tuple, list] = {}
    for r in log:
        by_key.setdefault(tuple(r.primary_key.values()), []).append(r)
    moved = 0
    for records in by_key.values():
        put, update = records
        assert (put.op, update.op) == (Op.PUT, Op.UPDATE)
        assert update.before == {"v": 0} and dict(update.columns) == {"v": 1}
        if put.channel_id == parent:
            assert update.channel_id in children  # the closed parent takes no new writes
            moved += 1
        else:
            assert update.channel_id == put.channel_id
    assert moved > 0
    # merge the two children back: writes through the wire land in the merged channel
    lo, hi = sorted(children)
    result = CliRunner().invoke(local_app, ["merge", store_path, "orders", lo, hi])
    assert result.exit_code == 0, result.output
    (merged,) = [c.channel_id for c in store.list_channels("orders")
                 if set(c.parent_ids) == children]
    for pk in keys:
        client.delete_row("orders", Row(pk), IGNORE)
    deletes = [r for r in store.change_log("orders") if r.op is Op.DELETE]
    assert len(deletes) == len(keys) and all(r.before == {"v": 1} for r in deletes)
    for r in deletes:
        put = by_key[tuple(r.primary_key.values())][0]
        assert r.channel_id == (merged if put.channel_id == parent else put.channel_id)
    store.close()


# --- the command ------------------------------------------------------------------------------


@pytest.mark.timeout(60)  # the command serves forever if it accepts the file
def test_emulator_command_refuses_a_file_that_is_not_its_store(tmp_path: Path) -> None:
    """``--store`` naming a meta-store file or a file that is not SQLite is refused in one line
    before anything opens it (as the ``local`` commands do): nothing is written into it."""
    from meta_store import open_meta_store
    from tablestore_cdc.commands.app import app as root_app

    meta = tmp_path / "shop.meta.db"
    open_meta_store(f"sqlite://{meta}").close()
    text = tmp_path / "notadb.txt"
    text.write_text("hello\n")
    for path, message in ((meta, "an SQLite database of something else"),
                          (text, "not an SQLite database"),
                          (tmp_path, "is a directory")):
        before = path.read_bytes() if path.is_file() else None
        res = CliRunner().invoke(root_app, [
            "emulator", "--store", str(path), "--instance", INSTANCE, "--access-key-id", KEY_ID,
            "--access-key-secret", SECRET, "--port", "0"])
        assert res.exit_code == 2, res.output
        assert message in res.output and "Traceback" not in res.output
        assert len(res.output.strip().splitlines()) == 1
        if before is not None:
            assert path.read_bytes() == before
    with closing(sqlite3.connect(meta)) as conn:  # no store table was added to the meta store
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert not tables & STORE_TABLES, tables


def test_the_emulator_command_without_the_sdk_names_the_extra(tmp_path, monkeypatch) -> None:
    """Without the tablestore extra, one line with its install, never a traceback. (The wheel's
    real install without the extra: integration/test_user_install.py.)"""
    from tablestore_cdc.commands.app import app as root_app

    monkeypatch.setitem(sys.modules, "tablestore_emulator.server", None)  # an import fails
    res = CliRunner().invoke(root_app, [
        "emulator", "--store", str(tmp_path / "store.db"), "--instance", INSTANCE,
        "--access-key-id", KEY_ID, "--access-key-secret", SECRET])
    assert res.exit_code == 2, res.output
    assert res.output.startswith("error: the emulator needs the Tablestore SDK")
    assert "pip install 'tablestore-cdc[tablestore]'" in res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output
    assert not (tmp_path / "store.db").exists()


@pytest.mark.slow
def test_emulator_command_serves_until_sigterm(tmp_path: Path) -> None:
    store = tmp_path / "cli.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tablestore_cdc", "emulator", "--store", str(store),
         "--instance", INSTANCE, "--access-key-id", KEY_ID, "--access-key-secret", SECRET,
         "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("listening on http://127.0.0.1:"), line
        url = line.removeprefix("listening on ")
        assert int(url.rsplit(":", 1)[1]) > 0
        client = make_client(url)
        create(client)
        client.put_row("orders", Row([("id", "a"), ("n", 1)], [("v", 1)]))
        assert get(client, "orders", [("id", "a"), ("n", 1)]) == {"v": 1}
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert out == ""  # exactly one line was printed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert LocalTablestore(store, create=False).count_rows("orders") == 1
