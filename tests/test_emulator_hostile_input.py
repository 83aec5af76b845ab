"""Hostile input to the emulator: each class of it ends in a 4xx in the service's shape, fast,
at a memory cost bounded by the request's size, and leaves the server serving others.

Against a real ``EmulatorServer`` on 127.0.0.1 (in this process), requests written byte by byte
and signed as the SDKs sign them (``testkit.emulator_requests``); answers read by the official
``tablestore`` SDK's response handling:

- nesting: a column condition nested past ``MAX_FILTER_DEPTH`` (with a leaf of megabytes),
  one with more than ``MAX_FILTER_CONDITIONS`` conditions, and one just within the bounds,
  which is evaluated;
- names that end in a newline (a ``$`` that matched before a trailing newline).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tablestore")

from tablestore.protobuf import table_store_filter_pb2 as fpb  # noqa: E402
from tablestore.protobuf import table_store_pb2 as pb  # noqa: E402

from tablestore_emulator.column_filter import (  # noqa: E402
    MAX_FILTER_CONDITIONS,
    MAX_FILTER_DEPTH,
)
from tablestore_emulator.server import EmulatorServer  # noqa: E402
from testkit.emulator_requests import (  # noqa: E402
    AK,
    INSTANCE,
    SK,
    nested_condition,
    post,
    put_row_body,
    sdk_verdict,
)

TABLE = "orders"
KEY = [("id", "k1")]


def create_table(url: str, name: str = TABLE) -> None:
    from tablestore import CapacityUnit, OTSClient, ReservedThroughput, TableMeta, TableOptions
    from tablestore.retry import NoRetryPolicy

    client = OTSClient(url, AK, SK, INSTANCE, retry_policy=NoRetryPolicy())
    client.create_table(TableMeta(name, [("id", "STRING")]), TableOptions(),
                        ReservedThroughput(CapacityUnit(0, 0)))


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorServer]:
    path = Path(tmp_path_factory.mktemp("emu")) / "store.db"
    with EmulatorServer(str(path), INSTANCE, AK, SK) as server:
        create_table(server.url)
        yield server


def service_error(answer: Any, path: str, status: int = 400,
                  code: str = "OTSParameterInvalid") -> str:
    """The SDK reads ``answer`` as the service's error ``status`` / ``code``; its message."""
    from tablestore import OTSServiceError

    verdict = sdk_verdict(answer, path)
    assert isinstance(verdict, OTSServiceError), (verdict, answer)
    assert (verdict.get_http_status(), verdict.get_error_code()) == (status, code), verdict
    return str(verdict.get_error_message())


# --- nesting ---------------------------------------------------------------------------------


def test_a_condition_nested_700_deep_with_a_large_leaf_is_400_at_once(
        emulator: EmulatorServer) -> None:
    body = put_row_body(TABLE, KEY, nested_condition(700, leaf=12 * 1024 * 1024))
    started = time.monotonic()
    answer = post(emulator.url, "/PutRow", body, timeout=30)
    assert "nested deeper than" in service_error(answer, "/PutRow")
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("depth", [MAX_FILTER_DEPTH, 600, 5000])
def test_a_condition_nested_past_the_bound_is_400(emulator: EmulatorServer, depth: int) -> None:
    answer = post(emulator.url, "/PutRow", put_row_body(TABLE, KEY, nested_condition(depth)))
    assert f"deeper than {MAX_FILTER_DEPTH}" in service_error(answer, "/PutRow")


@pytest.mark.parametrize("nots", [MAX_FILTER_DEPTH - 2, MAX_FILTER_DEPTH - 1])
def test_a_condition_nested_to_the_bound_is_evaluated(emulator: EmulatorServer,
                                                      nots: int) -> None:
    """The row does not exist and ``filter_if_missing`` is off: the comparison passes, and an
    odd number of NOTs around it fails the condition (403), an even number passes it."""
    answer = post(emulator.url, "/PutRow",
                  put_row_body(TABLE, [("id", f"nots-{nots}")], nested_condition(nots)))
    if nots % 2:
        service_error(answer, "/PutRow", 403, "OTSConditionCheckFail")
    else:
        assert answer.status == 200, answer


def _flat_and(conditions: int) -> bytes:
    single = fpb.Filter(type=fpb.FT_SINGLE_COLUMN_VALUE, filter=fpb.SingleColumnValueFilter(
        comparator=fpb.CT_EQUAL, column_name="c", column_value=b"\x03\x01\x00\x00\x00x",
        filter_if_missing=False, latest_version_only=True).SerializeToString())
    comp = fpb.CompositeColumnValueFilter(combinator=fpb.LO_AND)
    comp.sub_filters.extend([single] * conditions)
    return bytes(fpb.Filter(type=fpb.FT_COMPOSITE_COLUMN_VALUE,
                            filter=comp.SerializeToString()).SerializeToString())


def test_a_condition_with_too_many_conditions_is_400(emulator: EmulatorServer) -> None:
    answer = post(emulator.url, "/PutRow",
                  put_row_body(TABLE, KEY, _flat_and(MAX_FILTER_CONDITIONS + 1)))
    assert f"more than {MAX_FILTER_CONDITIONS}" in service_error(answer, "/PutRow")
    many = post(emulator.url, "/PutRow",
                put_row_body(TABLE, [("id", "many")], _flat_and(MAX_FILTER_CONDITIONS - 1)))
    assert many.status == 200, many


@pytest.mark.parametrize("raw", [b"\x08\x02\x12\x02\x08\x01", b"\x08\x02", b"\x12\x00",
                                 b"\x08\x02\x12\x05\x08", b"\x0b\x0c", b"\x08\x09\x12\x00",
                                 b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"])
def test_a_malformed_condition_is_400(emulator: EmulatorServer, raw: bytes) -> None:
    answer = post(emulator.url, "/PutRow", put_row_body(TABLE, KEY, raw))
    assert "condition" in service_error(answer, "/PutRow").lower()


# --- names -----------------------------------------------------------------------------------


def _create_table_body(name: str, key_column: str = "id") -> bytes:
    meta = pb.TableMeta(table_name=name, primary_key=[
        pb.PrimaryKeySchema(name=key_column, type=pb.STRING)])
    return bytes(pb.CreateTableRequest(
        table_meta=meta, reserved_throughput=pb.ReservedThroughput(
            capacity_unit=pb.CapacityUnit(read=0, write=0))).SerializeToString())


@pytest.mark.parametrize("name", ["fresh\n", "fresh\r\n", "\nfresh"])
def test_a_table_name_ending_in_a_newline_is_400(emulator: EmulatorServer, name: str) -> None:
    answer = post(emulator.url, "/CreateTable", _create_table_body(name))
    assert "Invalid table name" in service_error(answer, "/CreateTable")


def test_a_key_column_name_ending_in_a_newline_is_400(emulator: EmulatorServer) -> None:
    answer = post(emulator.url, "/CreateTable", _create_table_body("fresh", "id\n"))
    assert "name" in service_error(answer, "/CreateTable")
