"""Fuzz target: hostile request shapes sent to the emulator -- nesting, amplification, slow peers.

Structure-aware, beside ``test_fuzz_emulator.py`` (which mutates bytes and generates fields):
one emulator on 127.0.0.1 (in this process), a table ``orders`` and a tunnel on it, and

- nesting: PutRow column conditions whose composite spine (NOT / AND / OR, a pattern repeated)
  runs from a few levels to thousands, with sibling conditions at each level, sometimes
  mutated; tunnel tokens (ReadRecords, Checkpoint) whose JSON nests from one level to a
  hundred thousand;
- amplification: a deep spine around a leaf of up to megabytes, and composites of up to
  hundreds of thousands of tiny conditions -- small structure, large leaf or large count;
- slow peers: a signed request dripped in pieces with pauses, while idle connections hold
  half a request, against a read timeout lowered to a fraction of a second.

Properties: every answer is a success or the service's 4xx error shape (the official SDK reads
it as its ``OTSServiceError``), never a 500 and nothing logged at ERROR; a condition within
``MAX_FILTER_DEPTH`` / ``MAX_FILTER_CONDITIONS`` is evaluated (200 or 403) and one past them is
a 400; a nested token is a 400; for the nesting and amplification inputs the process's peak
resident memory grows by less than ``RSS_BOUND`` per input; a dripped request is answered, or
closed unanswered no earlier than the read timeout. Each input's shape and outcome is reported
with ``event`` (``--hypothesis-show-statistics``).
"""

from __future__ import annotations

import base64
import http.client
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

pytest.importorskip("tablestore")

from tablestore.protobuf import table_store_filter_pb2 as fpb  # noqa: E402
from tablestore.protobuf import table_store_pb2 as pb  # noqa: E402

from connector.tunnel.tablestore import messages as m  # noqa: E402
from tablestore_emulator import plainbuffer as plb  # noqa: E402
from tablestore_emulator import server as server_module  # noqa: E402
from tablestore_emulator.column_filter import (  # noqa: E402
    MAX_FILTER_CONDITIONS,
    MAX_FILTER_DEPTH,
)
from tablestore_emulator.server import EmulatorServer  # noqa: E402
from testkit.emulator_requests import (  # noqa: E402
    ErrorLog,
    emulator_with_tunnel,
    exchange,
    post,
    put_row_body,
    raw_request,
    sdk_verdict,
    signed_headers,
)
from testkit.fuzzing import fuzz_settings, mostly, mutated  # noqa: E402
from testkit.wire_bytes import varint  # noqa: E402

pytestmark = pytest.mark.fuzz

#: how much one input may grow this process's peak resident memory (the emulator runs here)
RSS_BOUND = 512 * 1024 * 1024


ERRORS = ErrorLog()
KNOWN: dict[str, str] = {}


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorServer]:
    path = Path(tmp_path_factory.mktemp("fuzz-hostile")) / "store.db"
    with emulator_with_tunnel(path, [("id", "STRING")], ERRORS) as (server, tunnel, channels):
        KNOWN["tunnel_id"], KNOWN["channel_id"] = tunnel, channels[0]
        yield server


# --- memory ------------------------------------------------------------------------------------


def _reset_peak() -> int:
    """Reset this process's peak resident memory (Linux); its resident memory now."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return _peak()


def _peak() -> int:
    import psutil

    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(psutil.Process().memory_info().rss)


# --- the outcome -------------------------------------------------------------------------------


def judged(emulator: EmulatorServer, path: str, body: bytes) -> tuple[int, str, str]:
    """Send ``body`` signed; ``(status, code, message)`` of a success or the service's error
    shape (asserted), nothing logged at ERROR, the peak memory grown by less than the bound."""
    before = len(ERRORS.records)
    base = _reset_peak()
    answer = post(emulator.url, path, body, timeout=30)
    grown = _peak() - base
    logged = ERRORS.records[before:]
    assert not logged, [r.getMessage() for r in logged]
    assert grown < RSS_BOUND, f"peak resident memory grew by {grown >> 20} MB"
    if answer.status == 200:
        return 200, "", ""
    from tablestore import OTSServiceError

    verdict = sdk_verdict(answer, path)
    assert isinstance(verdict, OTSServiceError), (verdict, answer)
    assert 400 <= answer.status < 500, answer
    return answer.status, verdict.get_error_code(), verdict.get_error_message()


# --- nesting and amplification: column conditions -------------------------------------------------


def _single(column: str, value: bytes) -> bytes:
    """A Filter holding one ``column == value`` comparison (``value``: a PlainBuffer string)."""
    single = fpb.SingleColumnValueFilter(
        comparator=fpb.CT_EQUAL, column_name=column, column_value=value,
        filter_if_missing=False, latest_version_only=True).SerializeToString()
    return bytes(fpb.Filter(type=fpb.FT_SINGLE_COLUMN_VALUE,
                            filter=single).SerializeToString())


def _string_value(size: int) -> bytes:
    return struct.pack("<BI", plb.VT_STRING, size) + b"x" * size


def condition_tree(spine: list[int], siblings: int, leaf: int, width: int) -> tuple[bytes, int]:
    """A Filter: ``spine`` composites (outermost first) around an AND of ``width`` tiny
    comparisons and one comparison with a ``leaf``-byte value (the AND left out when
    ``width`` is 0); each AND / OR level of the spine also holds ``siblings`` tiny ones.
    Written from the inside out and joined once. Returns it and its count of conditions."""
    tiny = _single("c", _string_value(1))
    core = _single("c", _string_value(leaf))
    count = 1
    if width:
        comp = b"\x08" + varint(fpb.LO_AND) + (b"\x12" + varint(len(tiny)) + tiny) * width \
            + b"\x12" + varint(len(core)) + core
        core = b"\x08\x02\x12" + varint(len(comp)) + comp
        count += width + 1
    parts, size = [core], len(core)
    for combinator in reversed(spine):
        side = b"" if combinator == fpb.LO_NOT else (
            b"\x12" + varint(len(tiny)) + tiny) * siblings
        count += 1 + (0 if combinator == fpb.LO_NOT else siblings)
        comp_head = b"\x08" + varint(combinator) + side + b"\x12" + varint(size)
        size += len(comp_head)
        filt_head = b"\x08\x02\x12" + varint(size)
        size += len(filt_head)
        parts += [comp_head, filt_head]
    return b"".join(reversed(parts)), count


COMBINATORS = st.sampled_from([fpb.LO_NOT, fpb.LO_AND, fpb.LO_OR])


@st.composite
def conditions(draw: Any) -> tuple[bytes, bool, str]:
    """(a Filter's bytes, whether it is within the bounds, its shape for ``event``)."""
    depth = draw(mostly(st.integers(0, MAX_FILTER_DEPTH + 2), st.integers(40, 3000), one_in=4))
    pattern = draw(st.lists(COMBINATORS, min_size=1, max_size=4))
    spine = [pattern[i % len(pattern)] for i in range(depth)]
    siblings = draw(mostly(st.integers(0, 2), st.integers(3, 40), one_in=6))
    leaf = draw(mostly(st.integers(0, 64), st.integers(64 * 1024, 3 * 1024 * 1024), one_in=6))
    width = draw(mostly(st.just(0), st.integers(1, 3000), one_in=5))
    if depth > 200:
        siblings = min(siblings, 2)  # the body stays under the request cap
    raw, count = condition_tree(spine, siblings, leaf, width)
    levels = depth + (2 if width else 1)
    within = levels <= MAX_FILTER_DEPTH and count <= MAX_FILTER_CONDITIONS
    shape = (f"{'within' if within else 'past'} bounds, "
             f"{'leaf >= 64 KB' if leaf >= 65536 else 'small leaf'}, "
             f"{'wide' if width else 'narrow'}")
    return raw, within, shape


@fuzz_settings()
@given(conditions(), st.data())
def test_fuzz_nested_conditions_are_bounded(emulator: EmulatorServer,
                                            condition: tuple[bytes, bool, str],
                                            data: Any) -> None:
    raw, within, shape = condition
    edited = data.draw(mostly(st.just(raw), mutated(raw[:4096], max_edits=3), one_in=5))
    key = [("id", f"k{data.draw(st.integers(0, 50))}")]
    status, code, message = judged(emulator, "/PutRow", put_row_body("orders", key, edited))
    event(f"{shape}{', mutated' if edited is not raw else ''}: {status} {code}")
    if edited is raw:
        if within:
            assert status in (200, 403), (status, code, message)
        else:
            assert (status, code) == (400, "OTSParameterInvalid"), (status, code, message)


# --- nesting: tunnel tokens ----------------------------------------------------------------------


@st.composite
def nested_tokens(draw: Any) -> tuple[str, str]:
    depth = draw(mostly(st.integers(1, 8), st.integers(9, 100_000), one_in=3))
    kind = draw(st.sampled_from(["array", "object", "in a token", "unclosed"]))
    if kind == "array":
        text = b"[" * depth + b"]" * depth
    elif kind == "object":
        text = b'{"a":' * depth + b"1" + b"}" * depth
    elif kind == "in a token":
        text = b'{"t":"orders","c":"x","s":' + b"[" * depth + b"]" * depth + b"}"
    else:
        text = b"[" * depth
    inner = base64.b64encode(text).decode("ascii")
    content = m.TokenContentV2(iterator=inner, total_count=0)
    envelope = m.Token(version=2, content=content.SerializeToString())
    label = f"{kind}, {'deep' if depth > 8 else 'shallow'}"
    return base64.b64encode(envelope.SerializeToString()).decode("ascii"), label


@fuzz_settings()
@given(nested_tokens(), st.sampled_from(["/tunnel/readrecords", "/tunnel/checkpoint"]))
def test_fuzz_nested_tokens_are_400(emulator: EmulatorServer, token: tuple[str, str],
                                    route: str) -> None:
    text, label = token
    ids = {"tunnel_id": KNOWN["tunnel_id"], "client_id": "c", "channel_id": KNOWN["channel_id"]}
    request = (m.ReadRecordsRequest(token=text, **ids) if route == "/tunnel/readrecords"
               else m.CheckpointRequest(checkpoint=text, sequence_number=1, **ids))
    status, code, message = judged(emulator, route, request.SerializeToString())
    event(f"{route} {label}: {status} {code}")
    assert (status, code) == (400, "OTSParameterInvalid"), (status, code, message)


# --- slow peers ----------------------------------------------------------------------------------

#: the read timeout while this target runs (the server reads it per connection)
DRIP_TIMEOUT_S = 0.08


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=5)


@fuzz_settings()
@given(st.lists(st.integers(1, 400), min_size=1, max_size=6),
       st.lists(st.integers(0, 20), min_size=1, max_size=6), st.integers(0, 20))
def test_fuzz_dripped_requests_are_answered_or_timed_out(emulator: EmulatorServer,
                                                         cuts: list[int], pauses_ms: list[int],
                                                         idle_peers: int) -> None:
    body = pb.ListTableRequest().SerializeToString()
    raw = raw_request("/ListTable", body, signed_headers("/ListTable", body))
    saved = server_module.REQUEST_READ_TIMEOUT_S
    server_module.REQUEST_READ_TIMEOUT_S = DRIP_TIMEOUT_S
    peers: list[socket.socket] = []
    try:
        for _ in range(idle_peers):  # half a request each, held for the whole input
            peer = _connect(emulator.url)
            peer.sendall(raw[:30])
            peers.append(peer)
        pieces, at = [], 0
        for cut in sorted(set(cuts)):
            if at < cut < len(raw):
                pieces.append(raw[at:cut])
                at = cut
        pieces.append(raw[at:])
        started = time.monotonic()
        with _connect(emulator.url) as sock:
            try:
                for i, piece in enumerate(pieces):
                    sock.sendall(piece)
                    if i < len(pieces) - 1:
                        time.sleep(pauses_ms[i % len(pauses_ms)] / 1000)
                resp = http.client.HTTPResponse(sock)
                resp.begin()
                resp.read()
                status: int | None = resp.status
            except (http.client.RemoteDisconnected, ConnectionError):
                status = None
        took = time.monotonic() - started
    finally:
        server_module.REQUEST_READ_TIMEOUT_S = saved
        for peer in peers:
            peer.close()
    event(f"{len(pieces)} pieces, {'with' if idle_peers else 'no'} idle peers: "
          f"{'closed' if status is None else status}")
    if status is None:
        assert took >= DRIP_TIMEOUT_S * 0.9, took  # closed no earlier than the timeout
    else:
        assert status == 200


def test_a_signed_request_after_the_fuzzing_is_answered(emulator: EmulatorServer) -> None:
    """The server still serves: nothing the targets above sent held it up."""
    answer = exchange(emulator.url, raw_request(
        "/ListTable", b"", signed_headers("/ListTable", b"")))
    assert answer.status == 200, answer
