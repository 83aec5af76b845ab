"""The Tablestore Tunnel wire client against the project's emulator, over HTTP on 127.0.0.1.

- ``TestTablestoreTunnelContract``: the shared tunnel contract (tests/contract/tunnel_contract.py)
  through ``TablestoreTunnelService`` -> signed HTTP -> ``tablestore_emulator`` -> the store
  (sequence numbers by the SDKs' stored + 1 rule instead of the consumer's).
- Wire-level behaviour: tokens are base64 ``Token`` envelopes, records carry sequence info,
  errors map to the product's types (trimmed data is never retried, 503s and network errors
  are retried for a bounded time), responses with a bad signature are refused, reads from a
  service that pages on its own (no ``max_records``) cut pages into ``limit``-sized reads.
- The vendor option names (connector/options.py) and what they do with secrets.
- The retry policy (the Java SDK's for idempotent calls), error-response validation and the
  service-code -> error-type mapping against a scripted HTTP server (codes and shapes the
  emulator never sends: OTSTunnelExpired, OTSPermissionDenied, 5xx, a bare 502, a trimmed
  message without the emulator's detail).
- "Not there" confirmed by ListTable / ListTunnel before ``ensure_tunnel`` creates, in both
  shapes the service uses (404 ``OTSObjectNotExist`` from a small fake, 400
  ``OTSParameterInvalid`` from the emulator and the fake), and not created when the lists
  show the tunnel.
- Checkpoint pushes: stored + 1, one call per push, a refused push re-read and retried once,
  then raised (never silent); the rule over a SIGKILL and a new process (slow).
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
    UnknownTableError,
)
from connector.local import LocalTablestore
from connector.tunnel import open_tunnel_service
from connector.tunnel.base import ChannelLag, Checkpoint, Op, TunnelType
from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore.client import TablestoreTunnelService, token_content
from connector.tunnel.tablestore.records import decode_page
from connector.tunnel.tablestore.transport import VALIDATION_ATTEMPTS, Credentials
from tablestore_emulator.server import EmulatorServer
from testkit.clock import FakeClock
from testkit.emulator import INSTANCE, KEY_ID, SECRET, service_uri
from testkit.tunnel_harnesses import EmulatorHarness
from tests.contract.tunnel_contract import TunnelContract, consume, read_all


@pytest.fixture
def tunnel_harness(tmp_path: Path):
    h = EmulatorHarness(tmp_path / "store.db")
    yield h
    h.close()


class TestTablestoreTunnelContract(TunnelContract):
    """The shared contract, but for sequence numbers: the service numbers pushes itself (the
    official SDKs push the stored number + 1, and the emulator refuses anything else), so a
    pushed checkpoint comes back with the service's number, not the consumer's. The two
    contract tests about the consumer's numbers are replaced by the SDK rule's here."""

    def test_independent_checkpoints_per_tunnel(self, tunnel_harness: EmulatorHarness) -> None:
        h = tunnel_harness
        h.create_table("t", 1)
        for i in range(4):
            h.put("t", f"k{i}", i)
        one, two = self._tunnel(h, "t", "one"), self._tunnel(h, "t", "two")
        cid = self._only_channel(h, "t", "one")
        res = h.service.read_records(one, cid, h.service.get_checkpoint(one, cid).token, 3)
        h.service.checkpoint(one, cid, Checkpoint(res.next_token, 3))
        assert h.service.get_checkpoint(one, cid) == Checkpoint(res.next_token, 1)
        start_two = h.service.get_checkpoint(two, cid)
        assert start_two.token != res.next_token and start_two.sequence_number == 0
        assert len(read_all(h.service, two, cid, start_two.token)[0]) == 4
        assert len(read_all(h.service, one, cid, res.next_token)[0]) == 1

    def test_stale_checkpoint_rejected_equal_accepted(self, tunnel_harness: EmulatorHarness
                                                      ) -> None:
        """The SDK rule instead: whatever number the consumer gives, the push carries the
        stored + 1; the same position again is not pushed; a lower consumer number is no
        longer a refusal (the service does not see it)."""
        h = tunnel_harness
        h.create_table("t", 1)
        for i in range(3):
            h.put("t", f"k{i}", i)
        tid = self._tunnel(h, "t")
        cid = self._only_channel(h, "t")
        res = h.service.read_records(tid, cid, h.service.get_checkpoint(tid, cid).token, 2)
        h.service.checkpoint(tid, cid, Checkpoint(res.next_token, 5))
        h.service.checkpoint(tid, cid, Checkpoint(res.next_token, 5))  # held: not pushed
        h.service.checkpoint(tid, cid, Checkpoint(res.next_token, 4))
        assert h.service.get_checkpoint(tid, cid) == Checkpoint(res.next_token, 1)
        more = h.service.read_records(tid, cid, res.next_token, 10)
        h.service.checkpoint(tid, cid, Checkpoint(more.next_token, 6))
        assert h.service.get_checkpoint(tid, cid) == Checkpoint(more.next_token, 2)


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


def test_lag_from_what_the_service_reports(tunnel_harness: EmulatorHarness) -> None:
    """``lag``: one read per channel at its position. Caught up: 0 and 0.0, whatever time has
    passed; behind within a page: the exact count and the first unread change's age; behind
    by more than a page: the age and the page's count, a lower bound; a WAIT child: 0 and
    0.0, lower bounds -- numbers throughout."""
    h = tunnel_harness
    tid, cid = _one_channel(h, 0)
    start = h.service.get_checkpoint(tid, cid).token
    assert h.service.lag(tid, {})[cid] == ChannelLag(cid, 0, 0.0)  # nothing yet
    for i in range(30):
        h.put("t", f"k{i}", i)
    first_ts = min(r.commit_ts_us for r in h.change_log("t"))
    time.sleep(0.05)
    behind = h.service.lag(tid, {cid: start})[cid]
    assert behind.records_behind == 30
    assert behind.seconds_behind is not None and behind.seconds_behind >= 0.05
    assert abs(behind.seconds_behind - (time.time() - first_ts / 1e6)) < 5
    read = h.service.read_records(tid, cid, start, 100)
    time.sleep(0.05)
    assert h.service.lag(tid, {cid: read.next_token})[cid] == ChannelLag(cid, 0, 0.0)
    h.writer.batch_write("t", [("put", {"id": f"m{i}"}, {"value": i}) for i in range(600)])
    far = h.service.lag(tid, {cid: start})[cid]
    assert 500 <= far.records_behind < 630 and not far.exact  # one page counted of 630
    assert far.seconds_behind >= behind.seconds_behind
    low, _ = h.split("t", cid)
    lags = h.service.lag(tid, {cid: start})
    # WAIT: the service serves none of it: what can be known, a lower bound
    assert lags[low] == ChannelLag(low, 0, 0.0, exact=False)
    assert h.service.head_sequences(tid) is None


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


def test_requests_with_an_sts_token_are_signed_over_it(tunnel_harness: EmulatorHarness
                                                       ) -> None:
    """The token's header is one of the signed x-ots-* lines (the emulator checks every one
    of them)."""
    h = tunnel_harness
    h.create_table("t", 1)
    for token in ("sts-token-value", None):
        service = TablestoreTunnelService(h.emulator.url, INSTANCE,
                                          Credentials(KEY_ID, SECRET, token))
        try:
            assert service.list_tunnels("t") == []
        finally:
            service.close()


def test_wrong_secret_is_a_typed_auth_error(tunnel_harness: EmulatorHarness) -> None:
    h = tunnel_harness
    h.create_table("t", 1)
    bad = open_tunnel_service(service_uri(h.emulator.url, secret="wrong-secret"))
    with pytest.raises(TunnelAuthError) as exc:
        bad.list_tunnels("t")
    assert exc.value.code == "OTSAuthFailed"
    assert "wrong-secret" not in str(exc.value) and SECRET not in str(exc.value)


def test_a_secret_with_url_characters_reaches_the_service_intact(tmp_path: Path) -> None:
    """The options fold the secret into the endpoint's query, percent-encoded once; the client
    decodes it once (a second decoding turned ``%41`` into ``A`` and failed the signature)."""
    from connector.options import SourceOptions

    secret = "s%41e+c/r=e&t"
    writer = LocalTablestore(tmp_path / "store.db")
    writer.create_table("t", [("id", "STRING")])
    emulator = EmulatorServer(str(tmp_path / "store.db"), INSTANCE, KEY_ID, secret).start()
    try:
        opts = SourceOptions.from_spark(_vendor_options(emulator.url, **{
            "access.key.secret": secret}))
        with open_tunnel_service(opts.endpoint) as service:
            assert service.list_tunnels("t") == []
            assert secret not in service.uri and "s%41e" not in opts.source_identity
    finally:
        emulator.stop()
        writer.close()


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
    # travels to executors, in the typed endpoint's secret fields (never in a URI)
    assert o.endpoint.access_key_secret.get_secret_value() == SECRET
    assert o.endpoint.security_token.get_secret_value() == "sts-token-77"
    assert SECRET not in str(o.endpoint) and SECRET not in repr(o.endpoint)
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
    assert o2.instance_name == "myinst"
    assert o2.endpoint.access_key_secret.get_secret_value() == "env-secret-55"
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
    """``tunnel.id`` is read when the query binds (one ListTunnel), never while the options
    are validated."""
    from connector.options import SourceOptions
    from connector.protocol import StreamProtocol

    h = tunnel_harness
    h.create_table("t", 1)
    tid = h.service.create_tunnel("t", "vendor-tunnel").tunnel_id
    opts = _vendor_options(h.emulator.url, **{"tunnel.id": tid})
    del opts["tunnel.name"]
    options = SourceOptions.from_spark(opts)
    assert options.tunnel_name is None  # validation asked the service nothing
    assert options.resolved(h.service).tunnel_name == "vendor-tunnel"
    protocol = StreamProtocol(options)
    assert protocol.identity.tunnel == protocol.options.tunnel_name == "vendor-tunnel"
    protocol.close()
    with pytest.raises(OptionError, match="not tunnel.name"):
        SourceOptions.from_spark({**opts, "tunnel.name": "other"}).resolved(h.service)
    with pytest.raises(OptionError, match="no tunnel with this id"):
        SourceOptions.from_spark({**opts, "tunnel.id": "nope"}).resolved(h.service)


# --- retry policy and error mapping, against a scripted server --------------------------------


class _FakeServer:
    """A tiny HTTP server on 127.0.0.1 answering each POST with ``answer(path, body)`` ->
    ``(status, body, signing secret or None)``; the answer is signed as the service signs
    (``tablestore_emulator.auth``) unless the secret is ``None``, and dated ``date_offset_s``
    from now. Records the paths asked."""

    date_offset_s = 0.0

    def answer(self, path: str, body: bytes) -> tuple[int, bytes, str | None]:
        raise NotImplementedError

    def start(self) -> None:
        import http.server

        from tablestore_emulator import auth

        outer = self
        self.paths: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - stdlib name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.paths.append(self.path)
                status, payload, secret = outer.answer(self.path, body)
                headers = {"x-ots-requestid": "r"}
                if secret is not None:
                    headers = auth.response_headers(self.path, payload, request_id="r",
                                                    access_key_id=KEY_ID,
                                                    access_key_secret=secret,
                                                    now=time.time() + outer.date_offset_s)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    @property
    def requests(self) -> int:
        return len(self.paths)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _ScriptedServer(_FakeServer):
    """Answers each POST with the next scripted ``(status, code[, message])`` -- code ``""``:
    a bare, non-protobuf body, as a proxy's -- and, once the script is used up, a signed
    success for the path (``ListTable`` lists ``tables``; ``routes`` may give other paths'
    bodies; else an empty message). ``error_secret`` signs error answers (``None``: unsigned,
    as the service's auth refusals)."""

    def __init__(self, script: list[tuple], tables: tuple[str, ...] = ("t",),
                 error_secret: str | None = SECRET, routes: dict | None = None) -> None:
        from tablestore.protobuf import table_store_pb2 as pb

        self.script, self.error_secret = list(script), error_secret
        self.ok = {"/ListTable": pb.ListTableResponse(table_names=tables).SerializeToString(),
                   **(routes or {})}
        self.start()

    def answer(self, path: str, body: bytes) -> tuple[int, bytes, str | None]:
        status, code, *rest = self.script.pop(0) if self.script else (200, "")
        if status == 200:
            return 200, self.ok.get(path, b""), SECRET
        if not code:
            return status, b"<html>502 Bad Gateway</html>", None
        message = rest[0] if rest else f"scripted {code}"
        return status, m.Error(code=code, message=message).SerializeToString(), \
            self.error_secret


def _list(client: TablestoreTunnelService) -> object:
    return client.list_tunnels("t")


def _delete(client: TablestoreTunnelService) -> object:
    return client.delete_tunnel("t", "tun")


@pytest.mark.parametrize(
    ("call", "script", "requests", "error"),
    [
        # idempotent calls (ListTunnel): the Java SDK's list, any 5xx, a bare 5xx body
        (_list, [(503, "OTSTunnelServerUnavailable")] * 2, 3, None),
        (_list, [(500, "OTSInternalServerError")], 2, None),
        (_list, [(503, "OTSServerUnavailable"), (503, "OTSTimeout")], 3, None),
        (_list, [(502, "")], 2, None),
        (_list, [(400, "OTSTunnelExpired")], 1, TunnelExpiredError),
        (_list, [(403, "OTSPermissionDenied")], 1, TunnelAuthError),
        # refused in the "not there" shape, but ListTable shows the table: not confirmed
        (_list, [(400, "OTSParameterInvalid")], 2, TunnelParameterError),
        # a call that changes state (DeleteTunnel): only the tunnel server's "busy" is retried
        (_delete, [(503, "OTSTunnelServerUnavailable")], 2, None),
        (_delete, [(500, "OTSInternalServerError")], 1, TunnelServiceError),
        (_delete, [(503, "OTSServerUnavailable")], 1, TunnelServiceError),
    ],
)
def test_retry_policy_and_error_types(call, script: list[tuple[int, str]], requests: int,
                                      error: type[Exception] | None) -> None:
    server = _ScriptedServer(script)
    client = open_tunnel_service(service_uri(server.url))
    try:
        if error is None:
            call(client)
        else:
            with pytest.raises(error) as exc:
                call(client)
            assert exc.value.code == script[0][1] and "scripted" in str(exc.value)
            assert not exc.value.retryable
        assert server.requests == requests
    finally:
        client.close()
        server.close()


def test_error_responses_are_validated_as_the_python_sdk_does() -> None:
    # an error answer signed with another secret: never believed (asked again, as any answer
    # that fails validation, until it keeps failing)
    server = _ScriptedServer([(400, "OTSTunnelExpired")] * VALIDATION_ATTEMPTS,
                             error_secret="someone-else")
    client = open_tunnel_service(service_uri(server.url))
    try:
        with pytest.raises(TunnelAuthError, match="signature") as exc:
            client.list_tunnels("t")
        assert exc.value.code == "ResponseInvalid"
    finally:
        client.close()
        server.close()
    # unsigned answers are accepted as the service sends its auth refusals
    server = _ScriptedServer([(403, "OTSAuthFailed")], error_secret=None)
    client = open_tunnel_service(service_uri(server.url))
    try:
        with pytest.raises(TunnelAuthError) as exc:
            client.list_tunnels("t")
        assert exc.value.code == "OTSAuthFailed"
    finally:
        client.close()
        server.close()


@pytest.mark.parametrize(("offset_s", "accepted"), [(-14 * 60, True), (14 * 60, True),
                                                    (-16 * 60, False), (16 * 60, False)])
def test_answers_dated_more_than_15_minutes_off_are_refused(offset_s: float,
                                                            accepted: bool) -> None:
    """The SDKs' rule: a signed answer whose x-ots-date is more than 15 minutes from this
    machine's clock is never used (asked again, then refused as invalid)."""
    server = _ScriptedServer([])
    server.date_offset_s = offset_s
    client = open_tunnel_service(service_uri(server.url))
    try:
        if accepted:
            assert client.list_tunnels("t") == []
            assert server.requests == 1
        else:
            with pytest.raises(TunnelAuthError, match="x-ots-date") as exc:
                client.list_tunnels("t")
            assert exc.value.code == "ResponseInvalid"
            assert server.requests == VALIDATION_ATTEMPTS
    finally:
        client.close()
        server.close()


@pytest.mark.parametrize(("status", "channel_type", "named"), [
    ("PAUSED", "Stream", "'PAUSED' is not a valid ChannelStatus"),
    ("OPEN", "HISTORY", "'HISTORY' is not a valid ChannelType"),
])
def test_a_channel_status_or_type_this_client_does_not_know(status: str, channel_type: str,
                                                             named: str) -> None:
    """A DescribeTunnel answer naming a status or type outside the service's reference is a
    service error naming it, never a guess."""
    answer = m.DescribeTunnelResponse(tunnel=m.TunnelInfo(
        tunnel_id="tid", tunnel_type="Stream", table_name="t", tunnel_name="tun",
        instance_name=INSTANCE, stream_id="t_stream", stage="ProcessStream"))
    answer.channels.add(channel_id="c1", channel_type="Stream", channel_status="OPEN")
    answer.channels.add(channel_id="c2", channel_type=channel_type, channel_status=status)
    server = _ScriptedServer([], routes={"/tunnel/describe": answer.SerializeToString()})
    client = open_tunnel_service(service_uri(server.url))
    try:
        with pytest.raises(TunnelServiceError, match=named) as exc:
            client.describe_tunnel("t", "tun")
        assert exc.value.code == "UnknownValue" and "'c2'" in str(exc.value)
    finally:
        client.close()
        server.close()


def test_trimmed_in_the_documented_shape_is_trimmed_data(tunnel_harness: EmulatorHarness
                                                         ) -> None:
    """400 OTSTunnelServerUnavailable "OTSTrimmedDataAccess ..." with nothing after it (the
    service's message; the emulator's ``[resume=...]`` detail absent) -> TrimmedDataError at
    once, no position to resume from."""
    h = tunnel_harness
    tid, cid = _one_channel(h)
    token = h.service.get_checkpoint(tid, cid).token
    message = "OTSTrimmedDataAccess Requested stream data is already trimmed or does not exist."
    server = _ScriptedServer([(400, "OTSTunnelServerUnavailable", message)])
    client = open_tunnel_service(service_uri(server.url))
    try:
        with pytest.raises(TrimmedDataError) as exc:
            client.read_records(tid, cid, token, 10)
        assert server.requests == 1 and exc.value.resume_token == ""
        assert exc.value.service_message == message
    finally:
        client.close()
        server.close()


# --- "not there", confirmed before anything is created ----------------------------------------


class _FakeTunnelService(_FakeServer):
    """A small Tunnel service answering as the service's reference documents, for shapes the
    emulator does not send: one table ``t``; a missing tunnel refused with ``missing`` (status,
    code); ``refuse_describe`` makes DescribeTunnel refuse an existing tunnel too. Messages are
    arbitrary: the client must not read meaning into them."""

    def __init__(self, missing: tuple[int, str] = (404, "OTSObjectNotExist"),
                 refuse_describe: bool = False) -> None:
        self.missing, self.refuse_describe = missing, refuse_describe
        self.tunnels: dict[str, str] = {}
        self.start()

    def _info(self, name: str) -> object:
        return m.TunnelInfo(tunnel_id=self.tunnels[name], tunnel_type="Stream", table_name="t",
                            instance_name=INSTANCE, stream_id="s", stage="ProcessStream",
                            tunnel_name=name, create_time=1)

    def answer(self, path: str, body: bytes) -> tuple[int, bytes, str | None]:
        from tablestore.protobuf import table_store_pb2 as pb

        def refuse(status: int, code: str) -> tuple[int, bytes, str | None]:
            return status, m.Error(code=code, message="zz 42").SerializeToString(), SECRET

        if path == "/ListTable":
            reply = pb.ListTableResponse(table_names=["t"])
        elif path == "/tunnel/list":
            reply = m.ListTunnelResponse(tunnels=[self._info(n) for n in self.tunnels])
        elif path == "/tunnel/create":
            name = m.parse(m.CreateTunnelRequest, body).tunnel.tunnel_name
            self.tunnels[name] = f"id-{name}"
            reply = m.CreateTunnelResponse(tunnel_id=f"id-{name}")
        elif path == "/tunnel/describe":
            name = m.parse(m.DescribeTunnelRequest, body).tunnel_name
            if name not in self.tunnels:
                return refuse(*self.missing)
            if self.refuse_describe:
                return refuse(400, "OTSParameterInvalid")
            reply = m.DescribeTunnelResponse(tunnel=self._info(name))
        else:
            return refuse(400, "OTSParameterInvalid")
        return 200, reply.SerializeToString(), SECRET


@pytest.mark.parametrize("missing", [(404, "OTSObjectNotExist"), (400, "OTSParameterInvalid")])
def test_create_when_missing_in_both_shapes_confirmed_by_list(missing: tuple[int, str]) -> None:
    service = _FakeTunnelService(missing)
    client = open_tunnel_service(service_uri(service.url))
    try:
        info = client.ensure_tunnel("t", "tun")
        assert (info.tunnel_id, info.tunnel_name) == ("id-tun", "tun")
        assert service.paths == ["/tunnel/describe", "/ListTable", "/tunnel/list",
                                 "/tunnel/create", "/tunnel/describe"]
    finally:
        client.close()
        service.close()


def test_a_refusal_the_lists_do_not_confirm_creates_nothing() -> None:
    """DescribeTunnel answers 400 OTSParameterInvalid although ListTunnel lists the tunnel:
    the request was bad for another reason; nothing is created, the service's error stands."""
    service = _FakeTunnelService(refuse_describe=True)
    service.tunnels["tun"] = "id-tun"
    client = open_tunnel_service(service_uri(service.url))
    try:
        with pytest.raises(TunnelParameterError, match="zz 42"):
            client.ensure_tunnel("t", "tun")
        assert "/tunnel/create" not in service.paths
    finally:
        client.close()
        service.close()


def test_create_when_missing_against_the_emulator(tunnel_harness: EmulatorHarness) -> None:
    h = tunnel_harness
    h.create_table("t", 1)
    paths = _count_requests(h.emulator)
    info = h.service.ensure_tunnel("t", "new-tunnel")
    assert info.tunnel_name == "new-tunnel"
    assert paths == ["/tunnel/describe", "/ListTable", "/tunnel/list", "/tunnel/create",
                     "/tunnel/describe"]
    with pytest.raises(UnknownTableError):
        h.service.ensure_tunnel("nope", "x")


def _count_requests(emulator: EmulatorServer) -> list[str]:
    """The paths the emulator serves from now on, in order (its route table wrapped)."""
    seen: list[str] = []

    def counted(path: str, handler):  # noqa: ANN001, ANN202 - a test shim
        def run(ctx, body):  # noqa: ANN001, ANN202
            seen.append(path)
            return handler(ctx, body)
        return run

    emulator.routes = {p: counted(p, fn) for p, fn in emulator.routes.items()}
    return seen


# --- checkpoints: the SDKs' stored + 1 -----------------------------------------------------------


def test_checkpoint_pushes_cost_one_call_and_follow_stored_plus_one(
    tunnel_harness: EmulatorHarness,
) -> None:
    h = tunnel_harness
    tid, cid = _one_channel(h, 6)
    start = h.service.get_checkpoint(tid, cid).token
    tokens = []
    token = start
    for _ in range(3):
        token = h.service.read_records(tid, cid, token, 2).next_token
        tokens.append(token)
    fresh = TablestoreTunnelService.from_uri(service_uri(h.emulator.url))  # a new process
    paths = _count_requests(h.emulator)
    fresh.checkpoint(tid, cid, Checkpoint(tokens[0], 2))
    assert paths == ["/tunnel/getcheckpoint", "/tunnel/checkpoint"]  # first push of a channel
    paths.clear()
    fresh.checkpoint(tid, cid, Checkpoint(tokens[1], 4))
    fresh.checkpoint(tid, cid, Checkpoint(tokens[1], 4))  # held already: no call
    assert paths == ["/tunnel/checkpoint"]
    assert h.service.get_checkpoint(tid, cid) == Checkpoint(tokens[1], 2)
    # another writer pushes in between: refused, re-read, pushed at the re-read number + 1
    h.service.checkpoint(tid, cid, Checkpoint(tokens[0], 9))
    paths.clear()
    fresh.checkpoint(tid, cid, Checkpoint(tokens[2], 6))
    assert paths == ["/tunnel/checkpoint", "/tunnel/getcheckpoint", "/tunnel/checkpoint"]
    assert h.service.get_checkpoint(tid, cid) == Checkpoint(tokens[2], 4)
    fresh.close()


def test_a_refused_finished_push_is_never_silent(tunnel_harness: EmulatorHarness) -> None:
    """A service that keeps refusing a push (another writer racing every time): the client
    re-reads and tries once more, then raises -- it does not report success."""
    from connector.errors import StaleCheckpointError

    h = tunnel_harness
    tid, cid = _one_channel(h, 1)
    token = h.service.get_checkpoint(tid, cid).token
    routes: dict[str, bytes] = {
        "/tunnel/getcheckpoint": m.GetCheckpointResponse(checkpoint=token,
                                                         sequence_number=3).SerializeToString()}
    server = _ScriptedServer([(200, ""), (400, "OTSSequenceNumberNotMatch"), (200, ""),
                              (400, "OTSSequenceNumberNotMatch"), (200, "")], routes=routes)
    client = open_tunnel_service(service_uri(server.url))
    try:
        with pytest.raises(StaleCheckpointError, match="refused twice"):
            client.checkpoint(tid, cid, Checkpoint("finished", 2))
        assert server.paths == ["/tunnel/getcheckpoint", "/tunnel/checkpoint",
                                "/tunnel/getcheckpoint", "/tunnel/checkpoint",
                                "/tunnel/getcheckpoint"]
    finally:
        client.close()
        server.close()


_PUSHER = """
import sys, time
from connector.tunnel import open_tunnel_service
from connector.tunnel.base import Checkpoint
client = open_tunnel_service(sys.argv[1])
tid, cid, token = sys.argv[2], sys.argv[3], sys.argv[4]
for i in range(3):
    token = client.read_records(tid, cid, token, 1).next_token
    client.checkpoint(tid, cid, Checkpoint(token, 100 + i))
print("pushed", flush=True)
time.sleep(3600)
"""


@pytest.mark.slow
def test_stored_plus_one_holds_over_sigkill_and_restart(tunnel_harness: EmulatorHarness) -> None:
    """A process pushes three checkpoints and is SIGKILLed; a new process (no memory of the
    numbers) goes on: its pushes are the stored number + 1, which the emulator requires."""
    h = tunnel_harness
    tid, cid = _one_channel(h, 5)
    start = h.service.get_checkpoint(tid, cid)
    uri = service_uri(h.emulator.url)
    proc = subprocess.Popen([sys.executable, "-c", _PUSHER, uri, tid, cid, start.token],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "pushed"
    finally:
        proc.kill()
        proc.wait()
    killed_at = h.service.get_checkpoint(tid, cid)
    assert killed_at.sequence_number == start.sequence_number + 3
    restarted = TablestoreTunnelService.from_uri(uri)
    token = killed_at.token
    for i in range(2):
        token = restarted.read_records(tid, cid, token, 1).next_token
        restarted.checkpoint(tid, cid, Checkpoint(token, 1 + i))  # a "lower" consumer number
    assert restarted.get_checkpoint(tid, cid) == Checkpoint(token,
                                                           start.sequence_number + 5)
    restarted.close()
