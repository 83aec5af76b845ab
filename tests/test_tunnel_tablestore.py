"""The Tablestore Tunnel wire client against the project's emulator, over HTTP on 127.0.0.1.

- ``TestTablestoreTunnelContract``: the shared tunnel contract (tests/contract/tunnel_contract.py)
  through ``TablestoreTunnelService`` -> signed HTTP -> ``tablestore_emulator`` -> the store.
- Wire-level behaviour: tokens are base64 ``Token`` envelopes, records carry sequence info,
  errors map to the product's types (trimmed data is never retried, 503s and network errors
  are retried for a bounded time), responses with a bad signature are refused, reads from a
  service that pages on its own (no ``max_records``) cut pages into ``limit``-sized reads.
- The vendor option names (connector/options.py) and what they do with secrets.
- The retry policy and the service-code -> error-type mapping against a scripted HTTP server
  (codes the emulator never sends: OTSTunnelExpired, OTSPermissionDenied, a 500).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from connector.errors import (
    MalformedRecordError,
    OptionError,
    TransientTunnelError,
    TrimmedDataError,
    TunnelAuthError,
    TunnelExpiredError,
    TunnelParameterError,
    TunnelServiceError,
)
from connector.local import LocalTablestore
from connector.tunnel import open_tunnel_service
from connector.tunnel.base import Checkpoint, Op, TunnelType
from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore.client import TablestoreTunnelService, token_content
from connector.tunnel.tablestore.records import decode_page
from connector.tunnel.tablestore.transport import Credentials
from tablestore_emulator.server import EmulatorServer
from testkit.clock import FakeClock
from tests.contract.tunnel_contract import TunnelContract, consume, read_all
from tests.test_local_store import LocalHarness

INSTANCE = "inst"
KEY_ID = "test-key-id"
SECRET = "test-secret-3f9a1c"


def service_uri(url: str, secret: str = SECRET, **extra: str) -> str:
    query = f"instance={INSTANCE}&access_key_id={KEY_ID}&access_key_secret={secret}"
    for k, v in extra.items():
        query += f"&{k}={v}"
    return f"{url}?{query}"


class EmulatorHarness(LocalHarness):
    """Backend side of the contract: an emulator serving the store file over HTTP, the wire
    client as the service under test, and a writer on the same file (as a writer process).
    The writer's operations (create_table, put, split, ...) are the local harness's."""

    def __init__(self, path: Path) -> None:  # not the local harness's: no local service here
        self.writer = LocalTablestore(path)
        self.emulator = EmulatorServer(str(path), INSTANCE, KEY_ID, SECRET).start()
        self.service = open_tunnel_service(service_uri(self.emulator.url))

    def close(self) -> None:
        self.service.close()
        self.emulator.stop()
        self.writer.close()


@pytest.fixture
def tunnel_harness(tmp_path: Path):
    h = EmulatorHarness(tmp_path / "store.db")
    yield h
    h.close()


class TestTablestoreTunnelContract(TunnelContract):
    pass


# --- wire-level behaviour --------------------------------------------------------------------


def _one_channel(h: EmulatorHarness, rows: int = 0) -> tuple[str, str]:
    h.create_table("t", 1)
    for i in range(rows):
        h.put("t", f"k{i}", i)
    tid = h.service.create_tunnel("t", "tun").tunnel_id
    (cid,) = [c.channel_id for c in h.service.describe_tunnel("t", "tun").channels]
    return tid, cid


def test_tokens_are_token_envelopes_and_records_carry_sequence_info(
    tunnel_harness: EmulatorHarness,
) -> None:
    h = tunnel_harness
    tid, cid = _one_channel(h, 3)
    start = h.service.get_checkpoint(tid, cid).token
    content = token_content(start)
    assert content.iterator  # a stream channel's token has an iterator
    res = h.service.read_records(tid, cid, start, 10)
    assert [r.primary_key["id"] for r in res.records] == ["k0", "k1", "k2"]
    seqs = [r.sequence for r in res.records]
    assert all(len(s.split(":")) == 3 for s in seqs) and seqs == sorted(seqs)
    log = {r.primary_key["id"]: r.commit_ts_us for r in h.change_log("t")}
    assert {r.primary_key["id"]: r.commit_ts_us for r in res.records} == log


def test_update_delete_images_over_the_wire(tunnel_harness: EmulatorHarness) -> None:
    h = tunnel_harness
    h.create_table("t", 1)
    h.writer.put_row("t", {"id": "a"}, {"value": 1, "name": "x", "blob": b"\x00\x01"})
    h.writer.update_row("t", {"id": "a"}, {"value": 2, "name": None})
    h.writer.delete_row("t", {"id": "a"})
    tid = h.service.create_tunnel("t", "tun").tunnel_id
    (cid,) = [c.channel_id for c in h.service.describe_tunnel("t", "tun").channels]
    got, _ = read_all(h.service, tid, cid, h.service.get_checkpoint(tid, cid).token)
    want = h.change_log("t")
    assert [(r.op, dict(r.primary_key), dict(r.columns), r.before) for r in got] == [
        (r.op, dict(r.primary_key), dict(r.columns), r.before) for r in want]
    assert got[1].columns == {"value": 2, "name": None}
    assert got[2].op is Op.DELETE and got[2].before == {"value": 2, "blob": b"\x00\x01"}


def test_base_and_stream_base_records_sort_before_stream(
    tunnel_harness: EmulatorHarness,
) -> None:
    h = tunnel_harness
    h.create_table("t", 1)
    for i in range(5):
        h.put("t", f"k{i}", i)
    h.service.create_tunnel("t", "tun", TunnelType.BASE_AND_STREAM)
    h.put("t", "k9", 9)
    state = consume(h.service, "t", "tun", limit=2)
    base = [r for r in state.records if r.sequence.startswith("!")]
    stream = [r for r in state.records if not r.sequence.startswith("!")]
    assert len(base) == 5 and [r.primary_key["id"] for r in stream] == ["k9"]
    assert max(r.sequence for r in base) < min(r.sequence for r in stream)
    assert [r.sequence for r in base] == sorted(r.sequence for r in base)
    assert len({r.sequence for r in base}) == 5


def test_pages_cut_when_the_service_ignores_max_records(tunnel_harness: EmulatorHarness) -> None:
    h = tunnel_harness
    tid, cid = _one_channel(h, 7)
    client = TablestoreTunnelService.from_uri(service_uri(h.emulator.url))
    client.send_max_records = False  # as against a service that pages on its own
    token = client.get_checkpoint(tid, cid).token
    seen: list[str] = []
    while True:
        res = client.read_records(tid, cid, token, 3)
        seen += [r.primary_key["id"] for r in res.records]
        assert len(res.records) <= 3
        token = res.next_token
        if not res.may_more:
            break
    assert seen == [f"k{i}" for i in range(7)]
    # a mid-page token is pushed as its page token; reading from it again is exact
    mid = client.read_records(tid, cid, client.get_checkpoint(tid, cid).token, 2)
    assert "~" in mid.next_token
    client.checkpoint(tid, cid, Checkpoint(mid.next_token, 2))
    again = client.read_records(tid, cid, mid.next_token, 100)
    assert [r.primary_key["id"] for r in again.records] == [f"k{i}" for i in range(2, 7)]
    client.close()


def test_trimmed_is_not_retried_and_names_the_channel(tunnel_harness: EmulatorHarness) -> None:
    h = tunnel_harness
    tid, cid = _one_channel(h)
    start = h.service.get_checkpoint(tid, cid).token
    for i in range(3):
        h.put("t", f"k{i}", i)
    h.trim("t")
    clock = FakeClock()
    service = TablestoreTunnelService(h.emulator.url, INSTANCE, Credentials(KEY_ID, SECRET),
                                      clock=clock.monotonic, sleep=clock.sleep)
    began = clock.monotonic()
    with pytest.raises(TrimmedDataError) as exc:
        service.read_records(tid, cid, start, 10)
    service.close()
    assert clock.monotonic() - began < 1.0  # answered at once, not retried
    assert exc.value.lost == "3" and "OTSTrimmedDataAccess" in exc.value.service_message


def test_wrong_secret_is_a_typed_auth_error(tunnel_harness: EmulatorHarness) -> None:
    h = tunnel_harness
    h.create_table("t", 1)
    bad = open_tunnel_service(service_uri(h.emulator.url, secret="wrong-secret"))
    with pytest.raises(TunnelAuthError) as exc:
        bad.list_tunnels("t")
    assert exc.value.code == "OTSAuthFailed"
    assert "wrong-secret" not in str(exc.value) and SECRET not in str(exc.value)


def test_response_with_bad_signature_is_refused(tunnel_harness: EmulatorHarness) -> None:
    h = tunnel_harness
    h.create_table("t", 1)
    h.emulator.corrupt_response_signatures = True
    with pytest.raises(TunnelAuthError, match="signature"):
        h.service.list_tunnels("t")


def test_unreachable_service_retried_then_transient(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    clock = FakeClock()
    client = TablestoreTunnelService(f"http://127.0.0.1:{port}", INSTANCE,
                                     Credentials(KEY_ID, SECRET), retry_deadline_s=0.5,
                                     clock=clock.monotonic, sleep=clock.sleep)
    began = clock.monotonic()
    with pytest.raises(TransientTunnelError):
        client.list_tunnels("t")
    assert 0.3 < clock.monotonic() - began < 5  # retried for about the deadline, then gave up


_SERVE = (
    "import sys; from tablestore_emulator.server import EmulatorServer; "
    "e = EmulatorServer(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], "
    "port=int(sys.argv[5])).start(); print(e.url, flush=True); e.serve_forever()"
)


def _spawn_emulator(path: Path, port: int = 0) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(path), INSTANCE, KEY_ID, SECRET, str(port)],
        stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


@pytest.mark.slow
def test_emulator_killed_and_restarted_mid_read_is_survived(tmp_path: Path) -> None:
    """SIGKILL the emulator process; a read issued during the outage is retried by the
    transport until the restarted emulator answers."""
    path = tmp_path / "store.db"
    writer = LocalTablestore(path)
    writer.create_table("t", [("id", "STRING")], [("value", "INTEGER")], channels=1)
    proc, url = _spawn_emulator(path)
    port = int(url.rsplit(":", 1)[1])
    outage_met = threading.Event()

    def sleep_noting_the_outage(seconds: float) -> None:  # the transport's backoff
        outage_met.set()
        time.sleep(seconds)

    client = TablestoreTunnelService(url, INSTANCE, Credentials(KEY_ID, SECRET),
                                     sleep=sleep_noting_the_outage)
    restarted: list[subprocess.Popen[str]] = []
    try:
        tid = client.create_tunnel("t", "tun").tunnel_id
        (cid,) = [c.channel_id for c in client.describe_tunnel("t", "tun").channels]
        token = client.get_checkpoint(tid, cid).token
        writer.put_row("t", {"id": "a"}, {"value": 1})
        proc.kill()
        proc.wait()
        outage_met.clear()

        def restart() -> None:  # once the read below has failed against the dead emulator
            outage_met.wait(60)
            restarted.append(_spawn_emulator(path, port)[0])

        t = threading.Thread(target=restart)
        t.start()
        res = client.read_records(tid, cid, token, 10)
        t.join()
        assert [r.primary_key["id"] for r in res.records] == ["a"]
    finally:
        for p in [proc, *restarted]:
            p.kill()
            p.wait()
        client.close()
        writer.close()


def test_uri_errors_never_show_secrets() -> None:
    with pytest.raises(OptionError) as exc:
        open_tunnel_service(f"http://127.0.0.1:1/x?access_key_id=a&access_key_secret={SECRET}")
    assert SECRET not in str(exc.value)
    with pytest.raises(OptionError, match="instance"):
        open_tunnel_service(f"http://127.0.0.1:1?access_key_id=a&access_key_secret={SECRET}")
    svc = open_tunnel_service(
        f"https://myinst.cn-hangzhou.ots.aliyuncs.com?access_key_id=a&access_key_secret={SECRET}")
    assert isinstance(svc, TablestoreTunnelService) and svc.instance == "myinst"
    assert SECRET not in svc.uri and SECRET not in repr(svc)


def test_corrupted_record_in_a_page_is_a_typed_error() -> None:
    from connector.tunnel.tablestore.plainbuffer import Row, SequenceInfo, encode_row

    good = encode_row(Row((("id", "a"),), (), False, SequenceInfo(0, 1_700_000_000_000_000, 1)))
    assert decode_page([m.Record(action_type=m.ACTION_PUT_ROW, record=good)], "c", "t", None)
    millis = encode_row(Row((("id", "a"),), (), False, SequenceInfo(0, 1_700_000_000_000, 1)))
    with pytest.raises(MalformedRecordError, match="microseconds"):
        decode_page([m.Record(action_type=m.ACTION_PUT_ROW, record=millis)], "c", "t", None)
    for bad in (good[:-1], good[:10], good[:-1] + bytes([good[-1] ^ 1])):
        rec = m.Record(action_type=m.ACTION_PUT_ROW, record=bad)
        with pytest.raises(MalformedRecordError) as exc:
            decode_page([rec], "ch-1", "tok-123", None)
        assert exc.value.channel_id == "ch-1" and exc.value.token == "tok-123"


# --- the vendor's option names ---------------------------------------------------------------


def _vendor_options(url: str, **extra: str) -> dict[str, str]:
    opts = {"endpoint": url, "instance.name": INSTANCE, "table.name": "t",
            "tunnel.name": "tun", "access.key.id": KEY_ID, "access.key.secret": SECRET}
    opts.update(extra)
    return {k.lower(): v for k, v in opts.items()}  # Spark lower-cases option keys


def test_vendor_options_fold_credentials_out_of_sight(monkeypatch: pytest.MonkeyPatch) -> None:
    from connector.options import SourceOptions

    for env in ("ALIBABA_CLOUD_ACCESS_KEY_ID", "ALIBABA_CLOUD_ACCESS_KEY_SECRET",
                "ALIBABA_CLOUD_SECURITY_TOKEN"):
        monkeypatch.delenv(env, raising=False)
    o = SourceOptions.from_spark(_vendor_options("http://127.0.0.1:9", **{
        "security.token": "sts-token-77", "checkpoint.table": "my_meta"}))
    assert SECRET in o.endpoint and "sts-token-77" in o.endpoint  # travels to executors
    for text in (o.safe_endpoint, o.source_identity, repr(o), o.meta_store):
        assert SECRET not in text and "sts-token-77" not in text and KEY_ID not in text
    assert o.safe_endpoint == f"http://127.0.0.1:9?instance={INSTANCE}"
    assert o.meta_store == (f"tablestore://{INSTANCE}/my_meta?endpoint=http%3A%2F%2F127.0.0.1%3A9"
                            "&create_table=true")
    svc = open_tunnel_service(o.endpoint)
    assert isinstance(svc, TablestoreTunnelService) and svc.uri == o.safe_endpoint
    # the instance from the host of a real endpoint; credentials from the environment
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "env-id")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "env-secret-55")
    o2 = SourceOptions.from_spark({"endpoint": "https://myinst.cn-hangzhou.ots.aliyuncs.com",
                                   "table.name": "t", "tunnel.name": "tun"})
    assert o2.instance_name == "myinst" and "env-secret-55" in o2.endpoint
    assert "env-secret-55" not in o2.source_identity
    assert o2.meta_store.startswith("tablestore://myinst/tablestore_cdc_meta?")


def test_vendor_option_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    from connector.options import SourceOptions

    for env in ("ALIBABA_CLOUD_ACCESS_KEY_ID", "ALIBABA_CLOUD_ACCESS_KEY_SECRET"):
        monkeypatch.delenv(env, raising=False)
    with pytest.raises(OptionError, match="instance.name"):
        SourceOptions.from_spark({"endpoint": "http://127.0.0.1:9", "table.name": "t",
                                  "tunnel.name": "x", "access.key.id": "a",
                                  "access.key.secret": SECRET})
    with pytest.raises(OptionError, match="access.key.secret") as exc:
        SourceOptions.from_spark({"endpoint": "http://127.0.0.1:9", "instance.name": "i",
                                  "table.name": "t", "tunnel.name": "x", "access.key.id": "a"})
    assert "ALIBABA_CLOUD_ACCESS_KEY_SECRET" in str(exc.value)
    with pytest.raises(OptionError, match="catalog") as exc:
        SourceOptions.from_spark(_vendor_options("http://127.0.0.1:9", catalog='{"columns": '
                                                 '{"v": {"type": "decimal"}}}'))
    assert SECRET not in str(exc.value)
    with pytest.raises(OptionError, match="Tablestore"):
        SourceOptions.from_spark({"endpoint": "local:///tmp/x.db", "table.name": "t",
                                  "tunnel.name": "x", "access.key.secret": SECRET})


def test_catalog_declares_attribute_columns() -> None:
    from connector.options import SourceOptions
    from connector.tunnel.base import ColumnSpec, TableSchema

    catalog = ('{"columns": {"id": {"type": "string"}, "value": {"type": "long"}, '
               '"score": {"type": "double"}, "ok": {"type": "boolean"}, '
               '"raw": {"type": "binary"}, "name": {"type": "string"}}}')
    o = SourceOptions.from_spark(_vendor_options("http://127.0.0.1:9", catalog=catalog))
    table = TableSchema("t", (ColumnSpec("id", "STRING"),))
    declared = o.declared_schema(table)
    assert declared.primary_key == table.primary_key
    assert [(c.name, c.type) for c in declared.columns] == [
        ("value", "INTEGER"), ("score", "DOUBLE"), ("ok", "BOOLEAN"), ("raw", "BINARY"),
        ("name", "STRING")]


def test_tunnel_id_resolves_to_its_name(tunnel_harness: EmulatorHarness) -> None:
    from connector.options import SourceOptions

    h = tunnel_harness
    h.create_table("t", 1)
    tid = h.service.create_tunnel("t", "vendor-tunnel").tunnel_id
    opts = _vendor_options(h.emulator.url, **{"tunnel.id": tid})
    del opts["tunnel.name"]
    assert SourceOptions.from_spark(opts).tunnel_name == "vendor-tunnel"
    with pytest.raises(OptionError, match="not tunnel.name"):
        SourceOptions.from_spark({**opts, "tunnel.name": "other"})
    with pytest.raises(OptionError, match="no tunnel with this id"):
        SourceOptions.from_spark({**opts, "tunnel.id": "nope"})


# --- retry policy and error mapping, against a scripted server --------------------------------


class _ScriptedServer:
    """A tiny HTTP server answering each POST with the next scripted (status, code) -- 200
    means an empty, correctly signed ListTunnelResponse -- and counting requests."""

    def __init__(self, script: list[tuple[int, str]]) -> None:
        import http.server

        from tablestore_emulator import auth

        self.script, self.requests = list(script), 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - stdlib name
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.requests += 1
                status, code = outer.script.pop(0) if outer.script else (200, "")
                body = (m.ListTunnelResponse().SerializeToString() if status == 200
                        else m.Error(code=code, message=f"scripted {code}").SerializeToString())
                headers = auth.response_headers(self.path, body, request_id="r",
                                                access_key_id=KEY_ID, access_key_secret=SECRET)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize(
    ("script", "requests", "error"),
    [
        ([(503, "OTSTunnelServerUnavailable")] * 2, 3, None),  # retried, then answered
        ([(500, "OTSInternalServerError")], 1, TunnelServiceError),  # never retried
        ([(400, "OTSTunnelExpired")], 1, TunnelExpiredError),
        ([(403, "OTSPermissionDenied")], 1, TunnelAuthError),
        ([(400, "OTSParameterInvalid")], 1, TunnelParameterError),
    ],
)
def test_retry_policy_and_error_types(script: list[tuple[int, str]], requests: int,
                                      error: type[Exception] | None) -> None:
    server = _ScriptedServer(script)
    client = open_tunnel_service(service_uri(server.url))
    try:
        if error is None:
            assert client.list_tunnels("t") == []
        else:
            with pytest.raises(error) as exc:
                client.list_tunnels("t")
            assert exc.value.code == script[0][1] and "scripted" in str(exc.value)
            assert not exc.value.retryable
        assert server.requests == requests
    finally:
        client.close()
        server.close()
