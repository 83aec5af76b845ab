"""Hostile input to the emulator: each class of it ends in a 4xx in the service's shape, fast,
at a memory cost bounded by the request's size, and leaves the server serving others.

Against a real ``EmulatorServer`` on 127.0.0.1 (in this process), requests written byte by byte
and signed as the SDKs sign them (``testkit.emulator_requests``); answers read by the official
``tablestore`` SDK's response handling:

- nesting: a column condition nested past ``MAX_FILTER_DEPTH`` (with a leaf of megabytes),
  one with more than ``MAX_FILTER_CONDITIONS`` conditions, and one just within the bounds,
  which is evaluated;
- names that end in a newline (a ``$`` that matched before a trailing newline);
- slow and many peers: 200 connections holding half a request do not hold up a signed
  request; a request dripped past ``REQUEST_READ_TIMEOUT_S`` and a connection idle past
  ``KEEPALIVE_IDLE_TIMEOUT_S`` are closed; past ``MAX_CONNECTIONS`` busy ones a newcomer gets
  a 503 at once;
- an unsigned request announcing a large body is answered without its body being read;
- memory: the emulator as a child process (``testkit.emulator.EmulatorProcess``) answers a
  700-deep condition with a 12 MB leaf, and one within the bounds with the same leaf, with its
  peak resident memory growing by less than ``RSS_BOUND`` (psutil, and the kernel's peak).
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tablestore")

from tablestore.protobuf import table_store_filter_pb2 as fpb  # noqa: E402
from tablestore.protobuf import table_store_pb2 as pb  # noqa: E402

from tablestore_emulator import server as server_module  # noqa: E402
from tablestore_emulator.column_filter import (  # noqa: E402
    MAX_FILTER_CONDITIONS,
    MAX_FILTER_DEPTH,
)
from tablestore_emulator.server import EmulatorServer  # noqa: E402
from testkit.emulator import INSTANCE, KEY_ID, SECRET  # noqa: E402
from testkit.emulator_requests import (  # noqa: E402
    exchange,
    nested_condition,
    post,
    put_row_body,
    raw_request,
    sdk_verdict,
    signed_headers,
)

TABLE = "orders"
KEY = [("id", "k1")]


def create_table(url: str, name: str = TABLE) -> None:
    from tablestore import CapacityUnit, OTSClient, ReservedThroughput, TableMeta, TableOptions
    from tablestore.retry import NoRetryPolicy

    client = OTSClient(url, KEY_ID, SECRET, INSTANCE, retry_policy=NoRetryPolicy())
    client.create_table(TableMeta(name, [("id", "STRING")]), TableOptions(),
                        ReservedThroughput(CapacityUnit(0, 0)))


@pytest.fixture(scope="module")
def emulator(ots_emulator: EmulatorServer) -> EmulatorServer:
    """The module's emulator (the shared ``ots_emulator``) with table ``orders``."""
    create_table(ots_emulator.url)
    return ots_emulator


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


# --- slow and many peers -------------------------------------------------------------------


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _list_table_request() -> bytes:
    body = pb.ListTableRequest().SerializeToString()
    return raw_request("/ListTable", body, signed_headers("/ListTable", body))


def test_200_half_open_connections_do_not_hold_up_a_signed_request(
        emulator: EmulatorServer) -> None:
    half = _list_table_request()[:60]
    held: list[socket.socket] = []
    try:
        for _ in range(200):
            sock = _connect(emulator.url)
            sock.sendall(half)
            held.append(sock)
        started = time.monotonic()
        answer = post(emulator.url, "/ListTable", pb.ListTableRequest().SerializeToString())
        assert answer.status == 200, answer
        assert time.monotonic() - started < 5
        # the longest-waiting ones were closed for the newcomers: at most the cap are held
        time.sleep(0.5)
        still_open = 0
        for sock in held:
            sock.setblocking(False)
            try:
                still_open += sock.recv(1) != b""
            except BlockingIOError:
                still_open += 1
            except ConnectionResetError:
                pass
        assert still_open <= server_module.MAX_CONNECTIONS
        assert still_open >= server_module.MAX_CONNECTIONS - 10  # the newest are kept
    finally:
        for sock in held:
            sock.close()


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server ends the connection within ``seconds`` (no answer expected)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _read_until_closed(sock: socket.socket, seconds: float) -> tuple[bytes, bool]:
    """What the server sends within ``seconds``, and whether it then closed."""
    got, deadline = b"", time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return got, True
        except TimeoutError:
            return got, False
        if not chunk:
            return got, True
        got += chunk
    return got, False


@pytest.fixture
def quick_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "REQUEST_READ_TIMEOUT_S", 1.0)
    monkeypatch.setattr(server_module, "KEEPALIVE_IDLE_TIMEOUT_S", 1.5)


@pytest.mark.usefixtures("quick_timeouts")
def test_a_request_dripped_past_the_read_timeout_is_closed(tmp_path: Path) -> None:
    with EmulatorServer(str(tmp_path / "s.db"), INSTANCE, KEY_ID, SECRET) as emu:
        sock = _connect(emu.url)
        started = time.monotonic()
        closed = False
        with sock:
            for byte in _list_table_request():  # a byte each 0.2 s: each read is quick
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    closed = True
                    break
                if _closed_within(sock, 0.2):
                    closed = True
                    break
                if time.monotonic() - started > 5:
                    break
        assert closed
        assert 0.8 < time.monotonic() - started < 3


@pytest.mark.usefixtures("quick_timeouts")
def test_a_kept_alive_connection_idle_past_its_timeout_is_closed(tmp_path: Path) -> None:
    with EmulatorServer(str(tmp_path / "s.db"), INSTANCE, KEY_ID, SECRET) as emu:
        with _connect(emu.url) as sock:
            sock.sendall(_list_table_request())
            sock.settimeout(5)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            started = time.monotonic()
            assert _closed_within(sock, 5)
            assert 1.2 < time.monotonic() - started < 4


def test_past_the_cap_of_busy_connections_a_newcomer_gets_503_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "MAX_CONNECTIONS", 2)
    release = threading.Event()

    def slow_list_table(ctx: Any, body: bytes) -> bytes:
        release.wait(10)
        return bytes(pb.ListTableResponse().SerializeToString())

    with EmulatorServer(str(tmp_path / "s.db"), INSTANCE, KEY_ID, SECRET) as emu:
        emu.routes["/ListTable"] = slow_list_table
        busy = [_connect(emu.url) for _ in range(2)]
        try:
            for sock in busy:
                sock.sendall(_list_table_request())
            time.sleep(0.5)  # both are in the handler
            started = time.monotonic()
            answer = post(emu.url, "/ListTable", pb.ListTableRequest().SerializeToString())
            assert time.monotonic() - started < 2
            service_error(answer, "/ListTable", 503, "OTSServerUnavailable")
            release.set()
            for sock in busy:
                assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        finally:
            release.set()
            for sock in busy:
                sock.close()


# --- bodies before signatures --------------------------------------------------------------


def test_an_unsigned_request_announcing_a_large_body_is_answered_unread(
        emulator: EmulatorServer) -> None:
    """Only the headers are sent: the 403 comes without the server waiting for the body."""
    body = b"x" * (server_module.UNSIGNED_BODY_LIMIT + 1)
    headers = signed_headers("/ListTable", body, secret="not-the-secret")
    head = raw_request("/ListTable", body, headers)[:-len(body)]
    with _connect(emulator.url) as sock:
        sock.sendall(head)
        started = time.monotonic()
        reply, closed = _read_until_closed(sock, 5)
        assert reply.startswith(b"HTTP/1.1 403"), reply
        assert closed
        assert time.monotonic() - started < 2


def test_a_signed_request_whose_body_is_not_the_signed_one_is_403(
        emulator: EmulatorServer) -> None:
    body = pb.ListTableRequest().SerializeToString()
    headers = signed_headers("/ListTable", body)
    answer = exchange(emulator.url, raw_request("/ListTable", b"\x0a\x00", headers))
    assert "MD5" in service_error(answer, "/ListTable", 403, "OTSAuthFailed")


def test_a_body_shorter_than_its_length_is_400(emulator: EmulatorServer) -> None:
    body = pb.ListTableRequest().SerializeToString() + b"\x0a\x00"
    raw = raw_request("/ListTable", body, signed_headers("/ListTable", body))[:-1]
    answer = exchange(emulator.url, raw, half_close=True)
    assert "ended after" in service_error(answer, "/ListTable")


# --- memory: the emulator as a child process ----------------------------------------------

#: how much a request of a few MB may grow the emulator's resident memory (its peak)
RSS_BOUND = 512 * 1024 * 1024


def _peak_rss(pid: int) -> int:
    """The process's peak resident memory (the kernel's VmHWM), else its current one."""
    import psutil

    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(psutil.Process(pid).memory_info().rss)


@pytest.mark.parametrize("nots", [700, MAX_FILTER_DEPTH - 1])
def test_a_nested_condition_with_a_large_leaf_costs_bounded_memory(tmp_path: Path,
                                                                   nots: int) -> None:
    from testkit.emulator import EmulatorProcess

    emu = EmulatorProcess(tmp_path / "s.db", tmp_path / "emulator.log", INSTANCE, KEY_ID,
                          SECRET).start()
    try:
        assert emu.proc is not None
        create_table(emu.url)
        body = put_row_body(TABLE, KEY, nested_condition(nots, leaf=12 * 1024 * 1024))
        before = _peak_rss(emu.proc.pid)
        started = time.monotonic()
        answer = post(emu.url, "/PutRow", body, timeout=30)
        took = time.monotonic() - started
        grown = _peak_rss(emu.proc.pid) - before
        if nots > MAX_FILTER_DEPTH:
            service_error(answer, "/PutRow")
        else:  # the row is absent, the comparison passes, an odd number of NOTs fails it
            service_error(answer, "/PutRow", 403, "OTSConditionCheckFail")
        assert took < 5
        assert grown < RSS_BOUND, f"peak resident memory grew by {grown >> 20} MB"
    finally:
        emu.kill()
