"""Fuzz target: requests to the emulator, from the HTTP framing down to each route's body.

Input, sent on fresh connections to one emulator (a table ``orders`` and a tunnel on it exist,
so requests that name them reach the handlers' depths):

- raw requests: a signed request to a route, its bytes mutated anywhere (request line,
  headers, ``Content-Length``, body) or extra headers added (repeated or non-numeric lengths,
  ``Transfer-Encoding``, values that are not ASCII);
- signed requests whose body is a message of the route's request type generated field by
  field (names that exist and names that do not, numbers at their type's bounds, PlainBuffer
  rows with every value kind and range bounds), serialized with or without its required
  fields, then mutated or not.

Property: every answer the emulator gives is a success or the service's error shape -- a 4xx
(or 503 for a busy store) whose body the official SDK reads as its ``OTSServiceError`` --
never a 500, and nothing is logged at ERROR (no traceback). A connection may also be closed
without an answer when what was sent is not even a request line.
"""

from __future__ import annotations

import http.client
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import event, given
from hypothesis import strategies as st

pytest.importorskip("tablestore")

from connector.tunnel.tablestore import messages as m  # noqa: E402
from connector.tunnel.tablestore.plainbuffer import (  # noqa: E402
    Cell,
    CellOp,
    Row,
    Special,
    encode_row,
)
from tablestore_emulator.server import EmulatorServer  # noqa: E402
from testkit.emulator_requests import (  # noqa: E402
    ROUTES,
    ErrorLog,
    emulator_with_tunnel,
    exchange,
    raw_request,
    request_type,
    sample_request,
    sdk_verdict,
    signed_headers,
)
from testkit.fuzzing import fuzz_settings, mostly, mutated  # noqa: E402

pytestmark = pytest.mark.fuzz


ERRORS = ErrorLog()


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorServer]:
    path = Path(tmp_path_factory.mktemp("fuzz-emulator")) / "store.db"
    with emulator_with_tunnel(path, [("id", "STRING"), ("n", "INTEGER")],
                              ERRORS) as (server, tunnel, channels):
        KNOWN["tunnel_id"], KNOWN["channel_id"] = [tunnel], channels
        KNOWN["client_id"] = [m.ConnectResponse.FromString(_call(
            server, "/tunnel/connect", m.ConnectRequest(tunnel_id=tunnel))).client_id]
        yield server


#: ids of what the fixture made (a tunnel, its channels, a connected client), by field name
KNOWN: dict[str, list[str]] = {"table_name": ["orders"], "tunnel_name": ["t1"]}


def _call(server: EmulatorServer, path: str, request: Any) -> bytes:
    body = request.SerializeToString()
    answer = exchange(server.url, raw_request(path, body, signed_headers(path, body)))
    assert answer.status == 200, answer
    return answer.body


def judge(emulator: EmulatorServer, path: str, raw: bytes) -> None:
    """Send ``raw``; the answer is a success or the service's error shape (module docstring)."""
    before = len(ERRORS.records)
    try:
        answer = exchange(emulator.url, raw, half_close=True)
    except (http.client.RemoteDisconnected, ConnectionResetError):
        event("closed without an answer")
        assert not raw.split(b"\r\n", 1)[0].startswith((b"POST /", b"GET /")) or \
            b"\r\n\r\n" not in raw, raw[:200]
        return
    finally:
        logged = ERRORS.records[before:]
        assert not logged, [r.getMessage() for r in logged]
    assert answer.status != 500 and answer.status < 600, answer
    if answer.status < 300:
        event(f"status {answer.status}")
    else:
        from tablestore import OTSServiceError

        verdict = sdk_verdict(answer, path if path in ROUTES else "/ListTable")
        assert isinstance(verdict, OTSServiceError), (verdict, answer)
        words = re.sub(r"'[^']*'|: .*|[0-9]+", "_", verdict.get_error_message())[:40]
        event(f"status {answer.status} {verdict.get_error_code()}: {words}")
        assert verdict.get_http_status() == answer.status
        assert answer.status < 500 or verdict.get_error_code() == "OTSServerUnavailable"


# --- raw requests ------------------------------------------------------------------------------

EXTRA_HEADERS = st.sampled_from([
    b"Content-Length: 0", b"Content-Length: 5", b"Content-Length: abc", b"Content-Length: -1",
    b"Transfer-Encoding: chunked", b"x-ots-signature: \xc3\xa9", b"x-ots-date: \xff",
    b"Connection: close", b"Expect: 100-continue", b"x-ots-instancename: other",
    b"Content-Length:", b": empty name", b"no colon", b"x-a: " + b"a" * 70_000,
])


@fuzz_settings()
@given(st.sampled_from(ROUTES), st.data())
def test_fuzz_raw_requests_get_the_services_answer(emulator: EmulatorServer, route: str,
                                                   data: Any) -> None:
    body = sample_request(request_type(route)).SerializePartialToString()
    raw = raw_request(route, body, signed_headers(route, body))
    head, _, rest = raw.partition(b"\r\n\r\n")
    extra = data.draw(st.lists(EXTRA_HEADERS, max_size=3))
    if extra:
        head += b"\r\n" + b"\r\n".join(extra)
    raw = data.draw(mutated(head + b"\r\n\r\n" + rest, max_edits=3))
    judge(emulator, route, raw)


# --- signed requests with generated bodies -------------------------------------------------------

NAMES = mostly(st.sampled_from(["orders", "t1", "id", "n", "v"]),
               st.sampled_from(["nope", "", "a b", "_" * 300]) | st.text(max_size=6), one_in=4)
KEY_VALUES = mostly(st.text(max_size=6) | st.integers(-2**63, 2**63 - 1) | st.binary(max_size=6),
                    st.sampled_from(list(Special)), one_in=5)
CELL_VALUES = (st.text(max_size=6) | st.integers(-2**63, 2**63 - 1) | st.floats()
               | st.booleans() | st.binary(max_size=6))


@st.composite
def plainbuffer_rows(draw: Any) -> bytes:
    key = tuple(draw(st.lists(st.tuples(st.sampled_from(["id", "n", "x"]), KEY_VALUES),
                              max_size=3)))
    cells = tuple(Cell(name, value if op in (CellOp.PUT, CellOp.INCREMENT) else None, op,
                       None if op is CellOp.DELETE_ALL_VERSION else ts)
                  for name, value, op, ts in draw(st.lists(st.tuples(
                      st.sampled_from(["v", "w", "id"]), CELL_VALUES,
                      st.sampled_from(list(CellOp)), st.none() | st.integers(0, 2**62)),
                      max_size=3)))
    try:
        return encode_row(Row(key, cells, draw(st.booleans())))
    except (TypeError, ValueError, OverflowError):
        return b""


_INTS = {FieldDescriptor.TYPE_INT32: (-2**31, 2**31 - 1), FieldDescriptor.TYPE_INT64:
         (-2**63, 2**63 - 1), FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
         FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1), FieldDescriptor.TYPE_SINT64:
         (-2**63, 2**63 - 1), FieldDescriptor.TYPE_SINT32: (-2**31, 2**31 - 1)}


def _scalar(field: FieldDescriptor, known: bool) -> Any:
    if field.type == FieldDescriptor.TYPE_STRING:
        if known and field.name in KNOWN:  # mostly what exists: past the lookups
            return mostly(st.deferred(lambda: st.sampled_from(KNOWN[field.name])), NAMES,
                          one_in=4)
        return NAMES
    if field.type == FieldDescriptor.TYPE_BYTES:
        return plainbuffer_rows() | st.binary(max_size=16)
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type == FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values])
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=False, width=64 if field.type ==
                         FieldDescriptor.TYPE_DOUBLE else 32)
    lo, hi = _INTS.get(field.type, (-2**31, 2**31 - 1))
    return st.integers(lo, hi) | st.sampled_from([lo, hi, 0, 1, -1 if lo < 0 else 2])


@st.composite
def message_of(draw: Any, cls: Any, known: bool = True, depth: int = 0) -> Any:
    """A ``cls`` message, field by field: a required field nearly always, others half the
    time; ``known``: names and ids mostly those of what exists."""
    msg = cls()
    for field in cls.DESCRIPTOR.fields:
        required = field.label == FieldDescriptor.LABEL_REQUIRED
        if not draw(mostly(st.just(required), st.just(not required), one_in=20)):
            continue
        count = draw(st.integers(0, 2)) if field.label == FieldDescriptor.LABEL_REPEATED else 1
        for _ in range(count):
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                if depth >= 4:
                    continue
                sub = draw(message_of(field.message_type._concrete_class, known, depth + 1))
                target = getattr(msg, field.name)
                (target.add() if field.label == FieldDescriptor.LABEL_REPEATED
                 else target).CopyFrom(sub)
            elif field.label == FieldDescriptor.LABEL_REPEATED:
                getattr(msg, field.name).append(draw(_scalar(field, known)))
            else:
                setattr(msg, field.name, draw(_scalar(field, known)))
    return msg


@fuzz_settings()
@given(st.sampled_from(ROUTES), st.data())
def test_fuzz_generated_bodies_get_the_services_answer(emulator: EmulatorServer, route: str,
                                                       data: Any) -> None:
    # the table and tunnel every example may use are not deleted
    known = route not in ("/DeleteTable", "/tunnel/delete")
    body = data.draw(message_of(request_type(route), known)).SerializePartialToString()
    body = data.draw(mostly(st.just(body), mutated(body), one_in=4))
    judge(emulator, route, raw_request(route, body, signed_headers(route, body)))
