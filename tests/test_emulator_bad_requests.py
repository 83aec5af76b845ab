"""Malformed requests to the emulator: the service's 4xx error shape, never a 500 or a traceback.

Requests no SDK sends, written byte by byte (``testkit.emulator_requests``): protobuf string
fields that are not UTF-8 in every route's request, header values that are not ASCII, a body
whose end is unknown (a ``Content-Length`` that is not a number, given twice, with a
``Transfer-Encoding``), request lines and methods ``http.server`` itself refuses. Each answer is
judged by the official ``tablestore`` SDK's response handling: it must raise its
``OTSServiceError`` with the status and code of the service's error reference; a framing error
also closes the connection, and no request logs an error on the emulator.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("tablestore")

from google.protobuf.descriptor import FieldDescriptor  # noqa: E402

from tablestore_emulator.server import EmulatorServer  # noqa: E402
from testkit.emulator_requests import (  # noqa: E402
    ROUTES,
    exchange,
    raw_request,
    request_type,
    sdk_verdict,
    signed_headers,
    with_text,
)


@pytest.fixture(scope="module")
def emulator(ots_emulator: EmulatorServer) -> EmulatorServer:
    """The module's emulator (the shared ``ots_emulator``: a store with no tables)."""
    return ots_emulator


@pytest.fixture(autouse=True)
def no_error_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Client input is never the emulator's bug: nothing at ERROR (a traceback) is logged."""
    with caplog.at_level(logging.ERROR, logger="tablestore_emulator"):
        yield
    assert not [r for r in caplog.records if r.name.startswith("tablestore_emulator")]


def service_error(answer: Any, path: str, status: int = 400,
                  code: str = "OTSParameterInvalid") -> str:
    """The SDK reads ``answer`` as the service's error ``status`` / ``code``; its message."""
    from tablestore import OTSServiceError

    verdict = sdk_verdict(answer, path)
    assert isinstance(verdict, OTSServiceError), (verdict, answer)
    assert (verdict.get_http_status(), verdict.get_error_code()) == (status, code), verdict
    assert verdict.get_request_id()
    return str(verdict.get_error_message())


# --- protobuf string fields that are not UTF-8 -------------------------------------------------

MARK = "zqzqzqzq"


def _string_paths(cls: Any, depth: int = 0) -> list[tuple[str, ...]]:
    """Paths to every string field of ``cls``, message fields followed 3 deep."""
    out: list[tuple[str, ...]] = []
    for field in cls.DESCRIPTOR.fields:
        if field.type == FieldDescriptor.TYPE_STRING:
            out.append((field.name,))
        elif field.type == FieldDescriptor.TYPE_MESSAGE and depth < 3:
            sub = field.message_type._concrete_class
            out += [(field.name, *p) for p in _string_paths(sub, depth + 1)]
    return out


def _with_mark(cls: Any, path: tuple[str, ...]) -> bytes:
    """A request whose string field at ``path`` holds bytes that are not UTF-8."""
    data = with_text(cls, path, MARK).SerializePartialToString()
    assert data.count(MARK.encode()) == 1
    return data.replace(MARK.encode(), b"\xffq\xc0\xaf\xed\xa0\x80z")  # 3 bad sequences


CASES = [(route, path) for route in ROUTES for path in _string_paths(request_type(route))]


def test_every_route_has_string_fields_to_corrupt() -> None:
    assert {route for route, _ in CASES} >= set(ROUTES) - {"/ListTable"}


@pytest.mark.parametrize("route, field", CASES, ids=lambda v: "/".join(v) if
                         isinstance(v, tuple) else v)
def test_a_string_field_that_is_not_utf8_is_400(emulator: EmulatorServer, route: str,
                                                field: tuple[str, ...]) -> None:
    body = _with_mark(request_type(route), field)
    answer = exchange(emulator.url, raw_request(route, body, signed_headers(route, body)))
    message = service_error(answer, route)
    assert "not UTF-8" in message and all(name in message for name in field), message


# --- header values that are not ASCII ----------------------------------------------------------


@pytest.mark.parametrize("header", ["x-ots-signature", "x-ots-date", "x-ots-accesskeyid",
                                    "x-ots-instancename", "x-ots-contentmd5",
                                    "x-ots-apiversion", "x-ots-ststoken"])
@pytest.mark.parametrize("value", ["é", "\u2603", b"\xff\xfe", b"ab\x80"], ids=repr)
def test_a_header_value_that_is_not_ascii_is_400(emulator: EmulatorServer, header: str,
                                                 value: Any) -> None:
    headers = signed_headers("/ListTable", b"")
    headers[header] = value
    answer = exchange(emulator.url, raw_request("/ListTable", b"", headers))
    message = service_error(answer, "/ListTable")
    assert header in message and "not ASCII" in message


# --- a body whose end is unknown ---------------------------------------------------------------


def _framed(emulator: EmulatorServer, *lengths: bytes, extra: bytes = b"") -> Any:
    body = b""
    head = raw_request("/ListTable", body, signed_headers("/ListTable", body),
                       content_length=False)
    fields = b"".join(b"Content-Length: " + n + b"\r\n" for n in lengths) + extra
    answer = exchange(emulator.url, head[:-2] + fields + b"\r\n" + b"x" * 16,
                      check_closed=True)
    assert answer.closed, "a framing error must close the connection"
    assert answer.headers.get("connection") == "close"
    return answer


@pytest.mark.parametrize("length", [b"abc", b"-1", b"+0", b"1e3", b"0x10", b"1 2", b"",
                                    b"\xef\xbc\x95", b"99999999999999999999999"], ids=repr)
def test_a_content_length_that_is_not_a_number_is_400_and_closes(emulator: EmulatorServer,
                                                                  length: bytes) -> None:
    message = service_error(_framed(emulator, length), "/ListTable")
    assert "Content-Length" in message or "too large" in message


@pytest.mark.parametrize("lengths", [(b"0", b"0"), (b"0", b"16"), (b"16", b"0")], ids=repr)
def test_a_repeated_content_length_is_400_and_closes(emulator: EmulatorServer,
                                                     lengths: tuple[bytes, bytes]) -> None:
    assert "more than once" in service_error(_framed(emulator, *lengths), "/ListTable")


@pytest.mark.parametrize("encoding", [b"chunked", b"gzip, chunked", b"identity"])
def test_a_transfer_encoding_is_400_and_closes(emulator: EmulatorServer,
                                               encoding: bytes) -> None:
    answer = _framed(emulator, b"0", extra=b"Transfer-Encoding: " + encoding + b"\r\n")
    assert "Transfer-Encoding" in service_error(answer, "/ListTable")


def test_a_body_over_the_limit_is_400_and_closes_unread(emulator: EmulatorServer) -> None:
    assert "too large" in service_error(_framed(emulator, b"%d" % (16 * 1024 * 1024 + 1)),
                                        "/ListTable")


def test_a_well_framed_request_keeps_the_connection(emulator: EmulatorServer) -> None:
    """The control: the same request framed right is answered 200, the connection kept."""
    raw = raw_request("/ListTable", b"", signed_headers("/ListTable", b""))
    answer = exchange(emulator.url, raw, check_closed=True)
    assert answer.status == 200 and answer.closed is False
    assert sdk_verdict(answer, "/ListTable") is None


# --- what http.server refuses itself -----------------------------------------------------------

HTTP_LEVEL = {
    "GET": b"GET /ListTable HTTP/1.1\r\nHost: x\r\n\r\n",
    "HEAD-less garbage": b"garbage\r\n\r\n",
    "bad version": b"POST /ListTable HTTP/9.9\r\nHost: x\r\n\r\n",
    "not HTTP": b"POST /ListTable FTP/1.0\r\nHost: x\r\n\r\n",
    "line too long": b"POST /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",
    "header too long": b"POST /ListTable HTTP/1.1\r\nx-a: " + b"a" * 70_000 + b"\r\n\r\n",
    "too many headers": b"POST /ListTable HTTP/1.1\r\n" + b"x-a: 1\r\n" * 120 + b"\r\n",
    "empty method": b" /ListTable HTTP/1.1\r\n\r\n",
    "DELETE": b"DELETE /ListTable HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
}


@pytest.mark.parametrize("name", list(HTTP_LEVEL))
def test_what_http_server_refuses_comes_in_the_services_shape(emulator: EmulatorServer,
                                                              name: str) -> None:
    answer = exchange(emulator.url, HTTP_LEVEL[name], check_closed=True)
    assert 400 <= answer.status < 500 and answer.closed
    message = service_error(answer, "/ListTable", status=answer.status)
    assert message.startswith("Malformed HTTP request")
