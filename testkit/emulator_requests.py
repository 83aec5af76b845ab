"""Requests to the emulator written byte by byte, and the official SDK's verdict on the answer.

The emulator must answer any request -- however malformed -- in the service's error shape. The
tests that check it (``tests/test_emulator_bad_requests.py``) and the emulator's fuzz target
(``tests/fuzz/test_fuzz_emulator.py``) send requests no SDK would send, so they are made here:

- ``request_type(path)``: the protobuf request message of every route the emulator serves (the
  table API's from the ``tablestore`` SDK, the tunnel API's from ``connector``'s messages);
- ``sample_request(cls)``: a message of that type with every required field set, recursively;
- ``signed_headers(path, body)``: the v2-signed ``x-ots-*`` headers an SDK would send;
- ``exchange(url, raw)``: send raw bytes on a fresh connection, read one HTTP answer, and tell
  whether the server closed the connection after it;
- ``nested_condition(depth, leaf)`` / ``put_row_body(table, key, condition)``: a PutRow whose
  column condition is ``depth`` NOTs around one comparison with a ``leaf``-byte value, written
  in one pass whatever its depth (the hostile-input tests and the fuzz targets send them);
- ``post(url, path, body)``: one signed request on a fresh connection;
- ``sdk_verdict(answer, path)``: the ``tablestore`` SDK's own response handling
  (``OTSProtocol.handle_error``) run on the answer: the ``OTSServiceError`` it raises (status,
  code, message), ``None`` for a success, or the ``OTSClientError`` of an answer it cannot read;
- ``emulator_with_tunnel(path, primary_key, errors)``: the emulator in this process with a
  table ``orders`` and a tunnel ``t1`` on it, what it logs at ERROR kept in an ``ErrorLog``
  (the fuzz targets' setup).
"""

from __future__ import annotations

import http.client
import logging
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from google.protobuf.descriptor import FieldDescriptor

from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore import signing
from tablestore_emulator import plainbuffer as plb
from tablestore_emulator import table_api, tunnel_api
from tablestore_emulator.server import EmulatorServer
from testkit.emulator import INSTANCE, KEY_ID, SECRET
from testkit.wire_bytes import varint

#: the tunnel API's request messages (the table API's are the SDK's ``<Name>Request``)
TUNNEL_REQUESTS: dict[str, Any] = {
    "/tunnel/create": m.CreateTunnelRequest, "/tunnel/list": m.ListTunnelRequest,
    "/tunnel/describe": m.DescribeTunnelRequest, "/tunnel/delete": m.DeleteTunnelRequest,
    "/tunnel/connect": m.ConnectRequest, "/tunnel/heartbeat": m.HeartbeatRequest,
    "/tunnel/shutdown": m.ShutdownRequest, "/tunnel/getcheckpoint": m.GetCheckpointRequest,
    "/tunnel/readrecords": m.ReadRecordsRequest, "/tunnel/checkpoint": m.CheckpointRequest,
    "/tunnel/getrpo": m.GetRpoRequest,
}
ROUTES = sorted([*table_api.ROUTES, *tunnel_api.ROUTES])


def request_type(path: str) -> Any:
    """The protobuf message class a route parses its body as."""
    if path in TUNNEL_REQUESTS:
        return TUNNEL_REQUESTS[path]
    from tablestore.protobuf import table_store_pb2 as pb

    return getattr(pb, path.lstrip("/") + "Request")


def sample_request(cls: Any, text: str = "t") -> Any:
    """A ``cls`` message with every required field set (strings to ``text``), recursively."""
    msg = cls()
    fill_required(msg, text)
    return msg


def fill_required(msg: Any, text: str = "t", depth: int = 0) -> None:
    """Set every unset required field of ``msg`` (strings to ``text``), recursively."""
    for field in msg.DESCRIPTOR.fields:
        if field.label != FieldDescriptor.LABEL_REQUIRED or depth > 8:
            continue
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            fill_required(getattr(msg, field.name), text, depth + 1)
        elif msg.HasField(field.name):
            continue
        elif field.type == FieldDescriptor.TYPE_STRING:
            setattr(msg, field.name, text)
        elif field.type == FieldDescriptor.TYPE_BYTES:
            setattr(msg, field.name, text.encode())
        elif field.type == FieldDescriptor.TYPE_ENUM:
            setattr(msg, field.name, field.enum_type.values[0].number)
        elif field.type == FieldDescriptor.TYPE_BOOL:
            setattr(msg, field.name, True)
        else:
            setattr(msg, field.name, 1)


def with_text(cls: Any, path: tuple[str, ...], text: str) -> Any:
    """A ``cls`` message with its required fields set (``sample_request``) and ``text`` in the
    string field at ``path`` (field names from the top; a repeated field gets one more item)."""
    msg = sample_request(cls)
    target = msg
    for name in path:
        field = target.DESCRIPTOR.fields_by_name[name]
        repeated = field.label == FieldDescriptor.LABEL_REPEATED
        if field.type == FieldDescriptor.TYPE_STRING:
            if repeated:
                getattr(target, name).append(text)
            else:
                setattr(target, name, text)
        elif repeated:
            target = getattr(target, name).add()
            fill_required(target)
        else:
            target = getattr(target, name)
    return msg


def signed_headers(path: str, body: bytes, *, secret: str = SECRET) -> dict[str, str]:
    """The ``x-ots-*`` headers an SDK sends with ``body`` to ``path``, signed with ``secret``."""
    headers = {"x-ots-date": signing.ots_date(), "x-ots-apiversion": "2015-12-31",
               "x-ots-accesskeyid": KEY_ID, "x-ots-instancename": INSTANCE,
               "x-ots-contentmd5": signing.content_md5(body)}
    headers["x-ots-signature"] = signing.request_signature(path, headers,
                                                           signing.SigningKey(secret))
    return headers


def raw_request(path: str, body: bytes, headers: dict[str, Any], *,
                content_length: bool = True, method: str = "POST") -> bytes:
    """An HTTP/1.1 request as bytes: header values are str (sent as UTF-8) or bytes."""
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1"]
    for name, value in headers.items():
        lines.append(name.encode() + b": " + (value if isinstance(value, bytes)
                                              else str(value).encode()))
    if content_length:
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


@dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    #: the server closed the connection after answering (None: not checked)
    closed: bool | None


def exchange(url: str, raw: bytes, *, check_closed: bool = False, half_close: bool = False,
             timeout: float = 10.0) -> Answer:
    """Send ``raw`` on a new connection and read one answer (``http.client``'s parser);
    ``check_closed``: wait (up to 2 s) to see whether the server closes the connection;
    ``half_close``: end the sending side after ``raw`` (a server waiting for more -- a request
    line, a body -- then reads the end of the stream instead of waiting)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        try:
            sock.sendall(raw)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server answered and closed before reading all of it
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        body = resp.read()
        headers = {k.lower(): v for k, v in resp.getheaders()}
        closed = None
        if check_closed:
            try:
                sock.settimeout(min(timeout, 2.0))
                closed = sock.recv(1) == b""
            except ConnectionResetError:
                closed = True
            except TimeoutError:
                closed = False
        return Answer(resp.status, resp.reason, headers, body, closed)


def nested_condition(depth: int, leaf: int = 1, column: str = "c") -> bytes:
    """A ``table_store_filter.Filter``: ``depth`` composite NOTs around one single-column
    comparison ``column == <leaf bytes of "x">`` (depth 0: the comparison alone). Written by
    hand from the inside out and joined once, so a deep tree with a large leaf costs its size
    once, not its depth times."""
    from tablestore.protobuf import table_store_filter_pb2 as fpb

    value = struct.pack("<BI", plb.VT_STRING, leaf)
    head = fpb.SingleColumnValueFilter(comparator=fpb.CT_EQUAL, column_name=column,
                                       column_value=b"", filter_if_missing=False,
                                       latest_version_only=True).SerializeToString()
    # column_value (field 3) is written last, with its real length, after the other fields
    head = head.replace(b"\x1a\x00", b"")
    single_len = len(head) + 1 + len(varint(len(value) + leaf)) + len(value) + leaf
    prefixes = [head + b"\x1a" + varint(len(value) + leaf) + value]
    # Filter{type=1, filter=<single>}
    size = single_len
    outer = [b"\x08\x01\x12" + varint(size)]
    size += len(outer[-1])
    for _ in range(depth):
        # Composite{combinator=NOT, sub_filters=[<filter>]}, then Filter{type=2, filter=it}
        comp = b"\x08\x01\x12" + varint(size)
        size += len(comp)
        filt = b"\x08\x02\x12" + varint(size)
        size += len(filt)
        outer += [comp, filt]
    return b"".join([*reversed(outer), *prefixes, b"x" * leaf])


def put_row_body(table: str, key: list[tuple[str, Any]], condition: bytes | None = None) -> bytes:
    """A PutRowRequest of ``key`` (no attributes) to ``table``, with a column condition."""
    from tablestore.protobuf import table_store_pb2 as pb

    cond = pb.Condition(row_existence=pb.IGNORE)
    if condition is not None:
        cond.column_condition = condition
    req = pb.PutRowRequest(table_name=table, row=plb.write_row(key), condition=cond)
    return bytes(req.SerializeToString())


def post(url: str, path: str, body: bytes, *, timeout: float = 10.0) -> Answer:
    """One request to ``path``, signed as an SDK signs it, on a fresh connection."""
    return exchange(url, raw_request(path, body, signed_headers(path, body)), timeout=timeout)


def sdk_verdict(answer: Answer, path: str, *, api_name: str | None = None) -> Any:
    """What the ``tablestore`` SDK makes of ``answer`` to a request to ``path``: the
    ``OTSServiceError`` it raises (the service's error shape), ``None`` (a success), or the
    ``OTSClientError`` it raises for an answer it cannot read as the service's."""
    from tablestore import OTSClient, OTSClientError, OTSServiceError
    from tablestore.auth import RequestContext

    client = OTSClient("http://127.0.0.1:1", KEY_ID, SECRET, INSTANCE)
    # a tunnel path has no SDK API name: a table API's stands in (it only picks the parser)
    name = api_name or (path.lstrip("/") if path in table_api.ROUTES else "ListTable")
    context = RequestContext(client.credentials_provider.get_credentials())
    try:
        client.protocol.handle_error(name, path, answer.status, answer.reason, answer.headers,
                                     answer.body, client._signer, context)
    except (OTSServiceError, OTSClientError) as exc:
        return exc
    return None


__all__ = ["ROUTES", "TUNNEL_REQUESTS", "Answer", "exchange",
           "fill_required", "nested_condition", "post", "put_row_body", "raw_request",
           "request_type", "sample_request", "sdk_verdict", "signed_headers", "with_text"]


class ErrorLog(logging.Handler):
    """The records logged at ERROR or above, kept in ``records`` (the fuzz targets assert an
    input logged none)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _ok(answer: Answer) -> bytes:
    assert answer.status == 200, answer
    return answer.body


@contextmanager
def emulator_with_tunnel(path: Path, primary_key: list[tuple[str, str]], errors: ErrorLog
                         ) -> Iterator[tuple[EmulatorServer, str, list[str]]]:
    """An emulator in this process (``EmulatorServer``, ``testkit.emulator``'s instance and key
    pair) serving the store file ``path``, with a table ``orders`` of ``primary_key`` (made by
    the official SDK) and a stream tunnel ``t1`` on it; ``errors`` holds what the
    emulator logs at ERROR meanwhile. Yields the server, the tunnel's id and its channels'."""
    from tablestore import CapacityUnit, OTSClient, ReservedThroughput, TableMeta, TableOptions
    from tablestore.retry import NoRetryPolicy

    logger = logging.getLogger("tablestore_emulator")
    logger.addHandler(errors)
    try:
        with EmulatorServer(str(path), INSTANCE, KEY_ID, SECRET) as server:
            client = OTSClient(server.url, KEY_ID, SECRET, INSTANCE, retry_policy=NoRetryPolicy())
            client.create_table(TableMeta("orders", primary_key), TableOptions(),
                                ReservedThroughput(CapacityUnit(0, 0)))
            tunnel = m.CreateTunnelRequest()
            tunnel.tunnel.table_name, tunnel.tunnel.tunnel_name = "orders", "t1"
            tunnel.tunnel.tunnel_type = m.TUNNEL_TYPE["Stream"]
            tunnel_id = m.CreateTunnelResponse.FromString(
                _ok(post(server.url, "/tunnel/create", tunnel.SerializeToString()))).tunnel_id
            described = m.DescribeTunnelResponse.FromString(_ok(post(
                server.url, "/tunnel/describe", m.DescribeTunnelRequest(
                    table_name="orders", tunnel_name="t1").SerializeToString())))
            yield server, tunnel_id, [c.channel_id for c in described.channels]
    finally:
        logger.removeHandler(errors)
