"""The embedded local store and its tunnel service, against real SQLite files and processes.

- ``TestLocalTunnelContract``: the shared tunnel contract (tests/contract/tunnel_contract.py).
- Table API, channel operations, trimming, URIs, lag: local-only behaviour.
- The ``tablestore-cdc local`` CLI through typer's CliRunner.
- Concurrency: writer processes (spawn) on one file; gapless per-channel sequences.
- The acceptance test: a writer process (with a split and a merge midway) and a reader process
  consuming the tunnel concurrently; the reader sees every change exactly once, in per-key order.
"""

from __future__ import annotations

import base64
import json
import multiprocessing as mp
import pickle
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from connector.errors import (
    InvalidChannelOperationError,
    InvalidCheckpointError,
    InvalidRowError,
    MalformedTokenError,
    OptionError,
    TableExistsError,
    TrimmedDataError,
    UnknownChannelError,
    UnknownTableError,
    UnknownTunnelError,
)
from connector.local import LocalTablestore
from connector.tunnel import open_tunnel_service
from connector.tunnel.base import (
    FINISHED,
    ChannelStatus,
    Checkpoint,
    Op,
    StartPosition,
    TunnelType,
)
from connector.tunnel.local import LocalTunnelService
from connector.tunnel.local.channels import KEY_SPACE
from connector.tunnel.local.names import InvalidNameError
from connector.tunnel.local.tunnels import MAX_TOKEN_DEPTH, encode_token, json_depth_exceeds
from connector.tunnel.local.values import key_hash
from tablestore_cdc.commands.local import app as cli_app
from testkit.tunnel_harnesses import LocalHarness
from testkit.waiting import wait_until
from tests.contract.tunnel_contract import ConsumerState, TunnelContract, consume, consume_pass

pytestmark = pytest.mark.store_table(
    primary_key=[("id", "INTEGER"), ("region", "STRING")],
    columns=[("name", "STRING"), ("score", "DOUBLE"), ("ok", "BOOLEAN"), ("blob", "BINARY"),
             ("n", "INTEGER")],
    channels=4)

# --- the contract ------------------------------------------------------------------------------


@pytest.fixture
def tunnel_harness(tmp_path: Path):
    h = LocalHarness(tmp_path / "store.db")
    yield h
    h.close()


class TestLocalTunnelContract(TunnelContract):
    pass


# --- table API -----------------------------------------------------------------------------------


PK = {"id": 1, "region": "eu"}


def test_types_roundtrip_and_undeclared_columns(store: LocalTablestore) -> None:
    row = {
        "name": "x",
        "score": 2,
        "ok": False,
        "blob": b"\x00\xff",
        "n": -(2**63),
        "extra": 1.5,
        "free_bytes": b"ab",
    }
    store.put_row("t", PK, row)
    got = store.get_row("t", PK)
    assert got == {**row, "score": 2.0}
    assert isinstance(got["score"], float) and got["ok"] is False
    (rec,) = store.change_log("t")
    assert rec.op is Op.PUT and rec.before is None
    assert rec.primary_key == PK and list(rec.primary_key) == ["id", "region"]
    assert rec.columns == got and rec.sequence == f"{1:020d}"
    assert store.get_row("t", {"id": 2, "region": "eu"}) is None
    assert store.list_tables() == ["t"]
    schema = store.table_schema("t")
    assert [(c.name, c.type) for c in schema.primary_key] == [
        ("id", "INTEGER"),
        ("region", "STRING"),
    ]


@pytest.mark.parametrize(
    "pk, cols, fragment",
    [
        ({"id": True, "region": "eu"}, {}, "key column 'id' expects INTEGER"),
        ({"id": 1}, {}, "primary key column 'region' is missing"),
        ({"id": 1, "region": "eu", "zone": 3}, {}, "column 'zone' is not a primary key column"),
        ({"id": "1", "region": "eu"}, {}, "key column 'id' expects INTEGER (int), got str"),
        (PK, {"n": True}, "column 'n' expects INTEGER"),
        (PK, {"n": 2**63}, "column 'n' expects INTEGER within 64 bits"),
        (PK, {"score": "high"}, "column 'score' expects DOUBLE"),
        (PK, {"ok": 1}, "column 'ok' expects BOOLEAN"),
        (PK, {"blob": "text"}, "column 'blob' expects BINARY"),
        (PK, {"free": [1, 2]}, "column 'free' expects one of int, float, bool, str, bytes"),
        (PK, {"name": None}, "column 'name' is None; omit it in put_row"),
        (PK, {"id": 5}, "column 'id' is a primary key column"),
    ],
)
def test_bad_rows_rejected_naming_table_and_column(
    store: LocalTablestore, pk: dict[str, Any], cols: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(InvalidRowError) as exc:
        store.put_row("t", pk, cols)
    assert str(exc.value).startswith("table 't': ")
    assert fragment in str(exc.value)
    assert store.change_log("t") == []
    assert all(c.head_seq == 0 for c in store.list_channels("t"))


def test_unknown_table(store: LocalTablestore) -> None:
    with pytest.raises(UnknownTableError, match="table 'nope' does not exist in local store"):
        store.put_row("nope", {"id": 1}, {})
    with pytest.raises(UnknownTableError):
        store.list_channels("nope")
    with pytest.raises(UnknownTableError):
        store.change_log("nope")


def test_create_table_errors(store: LocalTablestore) -> None:
    with pytest.raises(TableExistsError, match="table 't' already exists"):
        store.create_table("t", [("id", "INTEGER")])
    with pytest.raises(InvalidRowError, match="key column 'k' has type 'DOUBLE'"):
        store.create_table("u", [("k", "DOUBLE")])
    with pytest.raises(InvalidRowError, match="column 'k' is declared twice"):
        store.create_table("u", [("k", "STRING")], [("k", "STRING")])
    with pytest.raises(InvalidChannelOperationError, match="channels must be an integer"):
        store.create_table("u", [("k", "STRING")], channels=0)
    assert store.list_tables() == ["t"]


BAD_NAMES = ["x\ud800", "\udcff", "t\n", "t\x00u", "\tt", "t\x7f", "t\x85"]


@pytest.mark.parametrize("name", BAD_NAMES, ids=ascii)
def test_a_name_with_a_surrogate_or_control_character_is_refused_when_created(
        store: LocalTablestore, name: str) -> None:
    """SQLite cannot store a lone surrogate (it raised UnicodeEncodeError), and no name of the
    service holds a control character: each is an ``InvalidNameError`` naming the field."""
    svc = LocalTunnelService(store)
    for field, call in (
            ("table name", lambda: store.create_table(name, [("id", "INTEGER")])),
            ("key column name", lambda: store.create_table("u", [(name, "INTEGER")])),
            ("column name", lambda: store.create_table("u", [("id", "INTEGER")],
                                                      [(name, "STRING")])),
            ("tunnel name", lambda: svc.create_tunnel("t", name))):
        with pytest.raises(InvalidNameError) as info:
            call()
        assert isinstance(info.value, InvalidRowError)
        assert str(info.value).startswith(f"{field} {name!r} is not a valid name: it holds a")
        # the tunnel API's callers (the emulator's routes) map the tunnel errors: 400
        assert isinstance(info.value, UnknownTunnelError) == (field == "tunnel name")
        str(info.value).encode("utf-8")  # printable as it is
    assert store.list_tables() == ["t"] and svc.list_tunnels() == []


@pytest.mark.parametrize("name", BAD_NAMES, ids=ascii)
def test_a_name_with_a_surrogate_or_control_character_is_unknown_when_looked_up(
        store: LocalTablestore, name: str) -> None:
    """Every lookup by such a name ends in the lookup's own "does not exist" error (what the
    emulator maps to 400), with the reason, before the name reaches SQLite."""
    svc = LocalTunnelService(store)
    tid = svc.create_tunnel("t", "tun").tunnel_id
    channel = store.list_channels("t")[0].channel_id
    token = svc.get_checkpoint(tid, channel).token
    lookups: list[tuple[type[Exception], Any]] = [
        (UnknownTableError, lambda: store.put_row(name, {"id": 1, "region": "x"}, {})),
        (UnknownTableError, lambda: store.get_row(name, {"id": 1})),
        (UnknownTableError, lambda: store.scan(name)),
        (UnknownTableError, lambda: store.drop_table(name)),
        (UnknownTableError, lambda: store.list_channels(name)),
        (UnknownTableError, lambda: svc.create_tunnel(name, "tun2")),
        (UnknownTableError, lambda: svc.list_tunnels(name)),
        (UnknownTunnelError, lambda: svc.describe_tunnel("t", name)),
        (UnknownTunnelError, lambda: svc.delete_tunnel("t", name)),
        (UnknownTunnelError, lambda: svc.get_checkpoint(name, channel)),
        (UnknownTunnelError, lambda: svc.head_sequences(name)),
        (UnknownChannelError, lambda: svc.get_checkpoint(tid, name)),
        (UnknownChannelError, lambda: svc.checkpoint(tid, name, Checkpoint(token, 1))),
        (UnknownChannelError, lambda: svc.read_records(tid, name, token, 10)),
        (InvalidChannelOperationError, lambda: store.split_channel("t", name)),
        (InvalidChannelOperationError, lambda: store.merge_channels("t", name, channel)),
    ]
    for expected, call in lookups:
        with pytest.raises(expected) as info:
            call()
        str(info.value).encode("utf-8")
    assert svc.describe_tunnel("t", "tun").tunnel.tunnel_id == tid


def test_a_value_or_attribute_name_that_is_not_utf8_text_is_refused(
        store: LocalTablestore) -> None:
    """A lone surrogate in a STRING value, a key or an attribute name was stored (escaped in
    the row's JSON) and broke whoever read it as text later (a page, the wire, Spark): now an
    ``InvalidRowError`` naming the column, and nothing is written."""
    calls = [
        (lambda: store.put_row("t", {"id": 1, "region": "x\ud800"}, {}), "key column 'region'"),
        (lambda: store.put_row("t", {"id": 1, "region": "x"}, {"name": "\udcff"}),
         "column 'name'"),
        (lambda: store.put_row("t", {"id": 1, "region": "x"}, {"free": "a\udc80"}),
         "column 'free'"),
        (lambda: store.put_row("t", {"id": 1, "region": "x"}, {"f\ud800": 1}), "column name"),
        (lambda: store.put_row("t", {"id": 1, "region": "x"}, {"f\n": 1}), "column name"),
        (lambda: store.scan_span("t", "region", "a\ud800", None), "a bound of key column"),
    ]
    for call, words in calls:
        with pytest.raises(InvalidRowError, match=words) as info:
            call()
        str(info.value).encode("utf-8")
    store.put_row("t", {"id": 1, "region": "x"}, {"name": "line one\nline two\t\u00e9\U0001f600"})
    assert store.get_row("t", {"id": 1, "region": "x"}) == {
        "name": "line one\nline two\t\u00e9\U0001f600"}
    assert len(store.change_log("t")) == 1


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


@pytest.mark.parametrize("token", [
    _b64(b"[" * 100_000), _b64(b'{"t":' * 50_000), _b64(b'{"t":"t","c":[[[[[1]]]]],"s":1}'),
    _b64(b'{"t":"t","c":"ch-0000","s":' + b"[" * 5_000 + b"]" * 5_000 + b"}"),
    "A" * 100_000, _b64(b'{"t":"t","c":"ch-0000","s":1e999}'), "\ud800",
], ids=lambda t: ascii(t[:12]))
def test_a_nested_or_oversized_token_is_malformed_in_every_call(
        store: LocalTablestore, token: str) -> None:
    """A token whose JSON nests deeper than ``MAX_TOKEN_DEPTH`` raised RecursionError in the
    reads, the lag and the checkpoint push: now ``MalformedTokenError`` before any JSON parser
    sees it, and its message stays short whatever the token's length."""
    svc = LocalTunnelService(store)
    tid = svc.create_tunnel("t", "tun").tunnel_id
    store.put_row("t", {"id": 1, "region": "x"}, {"n": 1})
    channel = store.list_channels("t")[0].channel_id
    for call in (lambda: svc.read_records(tid, channel, token, 10),
                 lambda: svc.lag(tid, {channel: token}),
                 lambda: svc.has_new_data(tid, {channel: token}),
                 lambda: svc.checkpoint(tid, channel, Checkpoint(token, 1))):
        with pytest.raises((MalformedTokenError, InvalidCheckpointError)) as info:
            call()
        assert len(str(info.value)) < 400


def test_the_token_depth_bound_is_above_the_stores_own_tokens(store: LocalTablestore) -> None:
    assert not json_depth_exceeds(base64.b64decode(encode_token("t", "ch-0000", 7)),
                                  MAX_TOKEN_DEPTH)
    assert json_depth_exceeds(b"[" * (MAX_TOKEN_DEPTH + 1), MAX_TOKEN_DEPTH)
    assert not json_depth_exceeds(b'["[[[[[[[[[[", {"a": "{{{{{{{{"}]', MAX_TOKEN_DEPTH)
    assert not json_depth_exceeds(b'["\\", "\\\"[[[[[[["]', MAX_TOKEN_DEPTH)


def test_batch_write_is_atomic(store: LocalTablestore) -> None:
    good = [("put", {"id": i, "region": "eu"}, {"n": i}) for i in range(5)]
    with pytest.raises(InvalidRowError, match="operation #5"):
        store.batch_write("t", [*good, ("upsert", PK, {})])
    with pytest.raises(InvalidRowError, match="column 'n' expects INTEGER"):
        store.batch_write("t", [*good, ("update", PK, {"n": "x"})])
    assert store.change_log("t") == [] and store.count_rows("t") == 0
    store.batch_write(
        "t",
        [
            *good,
            ("update", {"id": 0, "region": "eu"}, {"n": 10}),
            ("delete", {"id": 1, "region": "eu"}, None),
        ],
    )
    log = store.change_log("t")
    assert len(log) == 7 and store.count_rows("t") == 4
    assert store.get_row("t", {"id": 0, "region": "eu"}) == {"n": 10}


def test_record_images_and_missing_rows(store: LocalTablestore) -> None:
    store.update_row("t", PK, {"name": "a"})  # creates the row, like Tablestore's UpdateRow
    store.update_row("t", PK, {"n": 1, "name": None})
    store.put_row("t", PK, {"score": 1.0})
    store.delete_row("t", PK)
    store.delete_row("t", PK)  # of a missing row: still logged
    ops = [(r.op, dict(r.columns), r.before) for r in store.change_log("t")]
    assert ops == [
        (Op.UPDATE, {"name": "a"}, None),
        (Op.UPDATE, {"n": 1, "name": None}, {"name": "a"}),
        (Op.PUT, {"score": 1.0}, {"n": 1}),
        (Op.DELETE, {}, {"score": 1.0}),
        (Op.DELETE, {}, None),
    ]
    assert [int(r.sequence) for r in store.change_log("t")] == [1, 2, 3, 4, 5]
    assert store.get_row("t", PK) is None


def test_channels_split_merge_and_routing(store: LocalTablestore) -> None:
    chans = store.list_channels("t")
    assert [c.channel_id for c in chans] == ["ch-0000", "ch-0001", "ch-0002", "ch-0003"]
    assert chans[0].range_lo == 0 and chans[-1].range_hi == KEY_SPACE
    assert all(a.range_hi == b.range_lo for a, b in zip(chans, chans[1:], strict=False))
    assert len({c.range_hi - c.range_lo for c in chans}) == 1
    a, b = store.split_channel("t", "ch-0001")
    assert (a, b) == ("ch-0004", "ch-0005")
    child = store.merge_channels("t", "ch-0002", b)  # b is the upper half, adjacent to ch-0002
    by_id = {c.channel_id: c for c in store.list_channels("t")}
    assert by_id["ch-0001"].closed and by_id["ch-0002"].closed and by_id[b].closed
    assert by_id[a].parent_ids == ("ch-0001",)
    assert by_id[child].parent_ids == (b, "ch-0002")
    assert (by_id[child].range_lo, by_id[child].range_hi) == (
        by_id[b].range_lo,
        by_id["ch-0002"].range_hi,
    )
    with pytest.raises(InvalidChannelOperationError, match="'ch-0001' is closed"):
        store.split_channel("t", "ch-0001")
    with pytest.raises(InvalidChannelOperationError, match="not adjacent"):
        store.merge_channels("t", "ch-0000", "ch-0003")
    with pytest.raises(InvalidChannelOperationError, match="no channel 'ch-9'"):
        store.merge_channels("t", "ch-0000", "ch-9")
    for i in range(200):  # every write lands in the open channel owning its key hash
        store.put_row("t", {"id": i, "region": "x"}, {"n": i})
    open_ranges = {
        c.channel_id: (c.range_lo, c.range_hi) for c in store.list_channels("t") if not c.closed
    }
    for r in store.change_log("t"):
        lo, hi = open_ranges[r.channel_id]
        pk_json = json.dumps(dict(sorted(r.primary_key.items())), separators=(",", ":"))
        assert lo <= key_hash(pk_json) < hi


def test_trim_history_and_trimmed_reads(store: LocalTablestore) -> None:
    for i in range(40):
        store.put_row("t", {"id": i, "region": "x"}, {"n": i})
    heads = {c.channel_id: c.head_seq for c in store.list_channels("t")}
    assert store.trim_history("t", older_than_s=3600) == 0
    with pytest.raises(InvalidChannelOperationError, match="needs keep_last or older_than_s"):
        store.trim_history("t")
    assert store.trim_history("t", keep_last=2) == 40 - 2 * 4
    assert {c.channel_id: c.trimmed_upto for c in store.list_channels("t")} == {
        k: h - 2 for k, h in heads.items()
    }
    assert len(store.change_log("t")) == 8
    svc = LocalTunnelService(store)
    tid = svc.create_tunnel("t", "early").tunnel_id  # EARLIEST: starts at what is still held
    assert all(
        len(svc.read_records(tid, c, svc.get_checkpoint(tid, c).token, 10).records) == 2
        for c in heads
    )
    old = svc.create_tunnel("t", "probe").tunnel_id
    store.trim_history("t", keep_last=0)
    with pytest.raises(TrimmedDataError) as exc:
        svc.read_records(old, "ch-0000", svc.get_checkpoint(old, "ch-0000").token, 10)
    err = exc.value
    assert (err.requested, err.earliest, err.lost) == (
        heads["ch-0000"] - 1,
        heads["ch-0000"] + 1,
        2,
    )
    assert "2 change(s) are lost" in str(err)
    again = pickle.loads(pickle.dumps(err))  # travels from executors to the driver
    assert isinstance(again, TrimmedDataError) and again.resume_token == err.resume_token
    res = svc.read_records(old, "ch-0000", err.resume_token, 10)
    assert (list(res.records), res.may_more) == ([], False)


def test_lag_and_has_new_data_positions(store: LocalTablestore) -> None:
    svc = LocalTunnelService(store)
    tid = svc.create_tunnel("t", "tun").tunnel_id
    for i in range(20):
        store.put_row("t", {"id": i, "region": "x"}, {"n": i})
    time.sleep(0.05)  # let time pass: the lag asserted is the records' age on the wall clock
    lag = svc.lag(tid, {})
    heads = {c.channel_id: c.head_seq for c in store.list_channels("t")}
    assert {k: v.records_behind for k, v in lag.items()} == heads
    assert all(v.seconds_behind >= 0.05 for v in lag.values() if v.records_behind)
    pos = {}
    for c in heads:
        res = svc.read_records(tid, c, svc.get_checkpoint(tid, c).token, 1000)
        pos[c] = res.next_token
    assert {v.records_behind for v in svc.lag(tid, pos).values()} == {0}
    assert {v.seconds_behind for v in svc.lag(tid, pos).values()} == {0.0}
    assert svc.has_new_data(tid, pos) is False


def test_latest_and_base_and_stream_start_positions(store: LocalTablestore) -> None:
    for i in range(10):
        store.put_row("t", {"id": i, "region": "x"}, {"n": i})
    store.split_channel("t", "ch-0000")
    svc = LocalTunnelService(store)
    late = svc.create_tunnel("t", "late", start_position=StartPosition.LATEST).tunnel_id
    assert svc.get_checkpoint(late, "ch-0000") == Checkpoint(FINISHED, 0)
    bas = svc.create_tunnel("t", "bas", TunnelType.BASE_AND_STREAM)
    desc = {c.channel_id: c for c in svc.describe_tunnel("t", "bas").channels}
    assert "base-ch-0000" not in desc  # closed at creation: no snapshot, terminated
    assert desc["ch-0000"].status is ChannelStatus.TERMINATED
    assert desc["ch-0001"].parent_ids == ("base-ch-0001",)
    assert desc["ch-0004"].status is ChannelStatus.WAIT
    base_rows = 0
    for c in (c for c in desc if c.startswith("base-")):
        token = svc.get_checkpoint(bas.tunnel_id, c).token
        base_rows += len(svc.read_records(bas.tunnel_id, c, token, 100).records)
    assert base_rows == store.count_rows("t") == 10
    svc.delete_tunnel("t", "bas")
    with store.transaction() as conn:
        assert conn.execute("SELECT count(*) FROM cdc_base_records").fetchone() == (0,)


def test_checkpoint_rules_local(store: LocalTablestore) -> None:
    svc = LocalTunnelService(store)
    tid = svc.create_tunnel("t", "tun").tunnel_id
    store.put_row("t", PK, {"n": 1})
    (cid,) = {r.channel_id for r in store.change_log("t")}
    start = svc.get_checkpoint(tid, cid)
    with pytest.raises(InvalidCheckpointError, match="non-negative integer"):
        svc.checkpoint(tid, cid, Checkpoint(start.token, -1))
    store.split_channel("t", cid)
    res = svc.read_records(tid, cid, start.token, 10)
    assert res.next_token == FINISHED
    svc.checkpoint(tid, cid, Checkpoint(FINISHED, 2))
    svc.checkpoint(tid, cid, Checkpoint(FINISHED, 2))  # idempotent
    with pytest.raises(InvalidCheckpointError, match="already terminated"):
        svc.checkpoint(tid, cid, Checkpoint(start.token, 3))
    # a TERMINATED channel can still be re-read (a replayed batch may need to)
    assert len(svc.read_records(tid, cid, start.token, 10).records) == 1


def test_from_uri(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    for bad, why in [
        ("local://rel/s.db", "use three slashes"),
        ("local:s.db", "absolute"),
        (f"local://{path}?x=1", "no query"),
        (f"local://{tmp_path}/missing.db", "local create-table"),
    ]:
        with pytest.raises(OptionError, match=why) as exc:
            LocalTunnelService.from_uri(bad)
        assert "option 'endpoint'" in str(exc.value)
    LocalTablestore(path).create_table("t", [("id", "STRING")])
    with open_tunnel_service(f"local://{path}") as svc:
        assert isinstance(svc, LocalTunnelService) and svc.uri == f"local://{path}"
        assert svc.list_tunnels() == []


def _fork_child_write(store: LocalTablestore) -> None:
    store.put_row("t", {"id": 99, "region": "fork"}, {"n": 1})


def test_instance_inherited_by_fork_opens_its_own_connection(store: LocalTablestore) -> None:
    store.put_row("t", PK, {"n": 0})  # the parent's connection is open and used
    p = mp.get_context("fork").Process(target=_fork_child_write, args=(store,))
    p.start()
    p.join(20)
    assert p.exitcode == 0
    assert store.get_row("t", {"id": 99, "region": "fork"}) == {"n": 1}
    assert len(store.change_log("t")) == 2


# --- CLI ------------------------------------------------------------------------------------------


def _cli(*args: str, code: int = 0) -> str:
    res = CliRunner().invoke(cli_app, [str(a) for a in args])
    assert res.exit_code == code, res.output
    return res.output


def test_cli_commands(tmp_path: Path) -> None:
    db = tmp_path / "sub" / "s.db"
    out = _cli(
        "create-table",
        db,
        "t",
        "--pk",
        "id:INTEGER",
        "--col",
        "name:STRING",
        "--col",
        "score:DOUBLE",
        "--col",
        "data:binary",
        "--channels",
        "2",
    )
    assert "created table t" in out and db.is_file()
    out = _cli("write", db, "t", "--count", "300", "--seed", "1", "--keys", "40")
    assert "wrote 300 changes to t" in out and "changes/s" in out
    _cli(
        "put",
        db,
        "t",
        "--pk",
        "id=1000",
        "--col",
        "name=x",
        "--col",
        "score=2",
        "--col",
        "data=b64:AAE=",
        "--col",
        "free=true",
    )
    s = LocalTablestore(db)
    assert s.get_row("t", {"id": 1000}) == {
        "name": "x",
        "score": 2.0,
        "data": b"\x00\x01",
        "free": True,
    }
    assert len(s.change_log("t")) == 301
    assert "split ch-0000 into ch-0002 and ch-0003" in _cli("split", db, "t", "ch-0000")
    assert "into ch-0004" in _cli("merge", db, "t", "ch-0003", "ch-0001")
    chans = json.loads(_cli("channels", db, "t", "--json"))
    assert [(c["channel_id"], c["closed"]) for c in chans] == [
        ("ch-0000", True),
        ("ch-0001", True),
        ("ch-0002", False),
        ("ch-0003", True),
        ("ch-0004", False),
    ]
    assert chans[4]["parent_ids"] == ["ch-0003", "ch-0001"]
    assert "ch-0004" in _cli("channels", db, "t")
    LocalTunnelService(s).create_tunnel("t", "tun")
    tunnels = json.loads(_cli("tunnels", db, "t", "--json"))
    assert [t["tunnel_name"] for t in tunnels] == ["tun"]
    assert Counter(c["status"] for c in tunnels[0]["channels"]) == {"OPEN": 2, "WAIT": 3}
    assert "tun" in _cli("tunnels", db)
    assert json.loads(_cli("tables", db, "--json"))[0]["table"] == "t"
    assert "trimmed 301 change(s)" in _cli("trim", db, "t", "--keep-last", "0")
    # same seed, same writes
    s.create_table("u", [("id", "STRING")], [("v", "INTEGER")])
    s.create_table("w", [("id", "STRING")], [("v", "INTEGER")])
    _cli("write", db, "u", "--count", "50", "--seed", "7")
    _cli("write", db, "w", "--count", "50", "--seed", "7")
    strip = [(r.op, dict(r.primary_key), dict(r.columns)) for r in s.change_log("u")]
    assert strip == [(r.op, dict(r.primary_key), dict(r.columns)) for r in s.change_log("w")]


@pytest.mark.parametrize(
    "args, message",
    [
        (["channels", "{db}", "nope"], "error: table 'nope' does not exist"),
        (["channels", "{missing}", "t"], "no local store at"),
        (["merge", "{db}", "t", "ch-0000", "ch-0002"], "not adjacent"),
        (["create-table", "{db}", "u", "--pk", "id:FLOAT"], "expected NAME:TYPE"),
        (["create-table", "{db}", "t", "--pk", "id:INTEGER"], "already exists"),
        (["put", "{db}", "t", "--pk", "id=abc"], "'abc' is not a valid INTEGER"),
        (["put", "{db}", "t", "--pk", "id=1", "--pk", "x=1"], "not a primary key column"),
        (["write", "{db}", "t", "--rate", "0"], "--rate must be positive"),
    ],
)
def test_cli_errors_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    db = tmp_path / "s.db"
    LocalTablestore(db).create_table("t", [("id", "INTEGER")], channels=4)
    res = CliRunner().invoke(cli_app, [a.format(db=db, missing=tmp_path / "none.db") for a in args])
    assert res.exit_code == 2
    assert message in res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


# --- concurrency across processes -----------------------------------------------------------------


def _concurrent_writer(path: str, writer: int, count: int, start: Any) -> None:
    store = LocalTablestore(path, create=False)
    rng = random.Random(writer)
    start.wait(30)
    for j in range(count):
        key = {"id": f"w{writer}-{j % 25}"}
        roll = rng.random()
        if roll < 0.5:
            store.put_row("t", key, {"value": f"{writer}:{j}"})
        elif roll < 0.8:
            store.update_row("t", key, {"value": f"{writer}:{j}", "j": j})
        else:
            store.delete_row("t", key)


def _expected_ops(writer: int, count: int) -> dict[str, list[tuple[str, Any]]]:
    rng = random.Random(writer)
    out: dict[str, list[tuple[str, Any]]] = {}
    for j in range(count):
        roll = rng.random()
        op = "PUT" if roll < 0.5 else "UPDATE" if roll < 0.8 else "DELETE"
        out.setdefault(f"w{writer}-{j % 25}", []).append(
            (op, None if op == "DELETE" else f"{writer}:{j}")
        )
    return out


def test_concurrent_writer_processes(tmp_path: Path) -> None:
    path = str(tmp_path / "s.db")
    LocalTablestore(path).create_table("t", [("id", "STRING")], [("value", "STRING")], channels=3)
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    count = 400
    procs = [ctx.Process(target=_concurrent_writer, args=(path, w, count, start)) for w in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    store = LocalTablestore(path)
    log = store.change_log("t")
    assert len(log) == 4 * count
    for c in store.list_channels("t"):
        seqs = [int(r.sequence) for r in log if r.channel_id == c.channel_id]
        assert seqs == list(range(1, c.head_seq + 1))  # gapless, strictly increasing
    got: dict[str, list[tuple[str, Any]]] = {}
    for r in log:  # one channel per key here, so log order is write order per key
        got.setdefault(r.primary_key["id"], []).append(
            (r.op.value, None if r.op is Op.DELETE else r.columns["value"])
        )
    expected: dict[str, list[tuple[str, Any]]] = {}
    for w in range(4):
        expected.update(_expected_ops(w, count))
    assert got == expected


# --- acceptance: a writer and a reader process, split and merge midway ----------------------------


def _acceptance_writer(path: str, total: int, keys: int, out: str, started: Any) -> None:
    """Random inserts/updates/deletes over ``keys`` keys; split ch-0000 at 1/3, merge its upper
    half with ch-0001 at 2/3. Writes its own log of what it wrote, in order."""
    store = LocalTablestore(path, create=False)
    rng = random.Random(42)
    live: set[int] = set()
    log: list[tuple[str, str, dict[str, Any]]] = []
    started.wait(30)
    t0 = time.perf_counter()
    upper = None
    for i in range(total):
        if i == total // 3:
            _, upper = store.split_channel("t", "ch-0000")
        if i == 2 * total // 3:
            store.merge_channels("t", upper, "ch-0001")
        k = rng.randrange(keys)
        key = f"k{k:04d}"
        roll = rng.random()
        if k not in live or roll < 0.15:
            cols: dict[str, Any] = {"value": i, "name": f"n{i}"}
            store.put_row("t", {"id": key}, cols)
            live.add(k)
            log.append(("PUT", key, cols))
        elif roll < 0.75:
            cols = {"value": i} if roll < 0.6 else {"value": i, "name": None}
            store.update_row("t", {"id": key}, cols)
            log.append(("UPDATE", key, cols))
        else:
            store.delete_row("t", {"id": key})
            live.discard(k)
            log.append(("DELETE", key, {}))
    elapsed = time.perf_counter() - t0
    Path(out).write_text(json.dumps({"elapsed": elapsed, "log": log}))


def _acceptance_reader(path: str, writer_done: Any, out: str, started: Any) -> None:
    """The consumer loop (tests/contract/tunnel_contract.py) polling until the writer is done
    and one more full drain finds nothing."""
    svc = LocalTunnelService.from_uri(f"local://{path}")
    tid = svc.describe_tunnel("t", "tun").tunnel.tunnel_id
    state = ConsumerState(tid)
    started.wait(30)
    t0 = time.perf_counter()
    polls = 0
    while not writer_done.is_set():
        read, finished = consume_pass(svc, "t", "tun", state, limit=500)
        polls += 1
        if not read and not finished:
            time.sleep(0.002)
    while_writing = len(state.records)
    consume(svc, "t", "tun", state, limit=500)
    elapsed = time.perf_counter() - t0
    Path(out).write_text(
        json.dumps(
            {
                "elapsed": elapsed,
                "polls": polls,
                "while_writing": while_writing,
                "records": [
                    [r.op.value, r.primary_key["id"], dict(r.columns), r.channel_id, r.sequence]
                    for r in state.records
                ],
            }
        )
    )


def test_acceptance_concurrent_writer_and_reader_with_split_and_merge(tmp_path: Path) -> None:
    path = str(tmp_path / "s.db")
    total, keys = 10_000, 300
    store = LocalTablestore(path)
    store.create_table(
        "t", [("id", "STRING")], [("value", "INTEGER"), ("name", "STRING")], channels=4
    )
    LocalTunnelService(store).create_tunnel("t", "tun")
    ctx = mp.get_context("spawn")
    started, done = ctx.Event(), ctx.Event()
    wout, rout = str(tmp_path / "writer.json"), str(tmp_path / "reader.json")
    writer = ctx.Process(target=_acceptance_writer, args=(path, total, keys, wout, started))
    reader = ctx.Process(target=_acceptance_reader, args=(path, done, rout, started))
    writer.start()
    reader.start()
    started.set()
    writer.join(60)
    done.set()
    reader.join(60)
    assert (writer.exitcode, reader.exitcode) == (0, 0)
    wrote = json.loads(Path(wout).read_text())
    got = json.loads(Path(rout).read_text())

    expected: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for op, key, cols in wrote["log"]:
        expected.setdefault(key, []).append((op, cols))
    received: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for op, key, cols, _, _ in got["records"]:
        received.setdefault(key, []).append((op, cols))
    assert got["while_writing"] > 0  # the reader really ran alongside the writer
    assert len(got["records"]) == total
    assert len({(c, s) for *_, c, s in got["records"]}) == total  # nothing doubled
    assert received == expected  # per key: same changes, same order
    chans = {c.channel_id: c for c in store.list_channels("t")}
    assert {c for c, ch in chans.items() if ch.closed} == {"ch-0000", "ch-0001", "ch-0005"}
    assert chans["ch-0006"].parent_ids == ("ch-0005", "ch-0001")
    assert {c for *_, c, _ in got["records"]} == set(chans)  # every channel was read

    # a catch-up read of the whole history by a fresh tunnel, for the read rate alone
    svc = LocalTunnelService(store)
    svc.create_tunnel("t", "catch-up")
    t0 = time.perf_counter()
    state = consume(svc, "t", "catch-up", limit=1000)
    catch_up = time.perf_counter() - t0
    assert len(state.records) == total
    print(
        f"\nacceptance: {total} changes over {keys} keys, 4 channels + split + merge\n"
        f"  write rate           {total / wrote['elapsed']:8.0f} changes/s "
        f"({wrote['elapsed']:.2f} s, one transaction per change)\n"
        f"  concurrent read rate {total / got['elapsed']:8.0f} changes/s "
        f"({got['elapsed']:.2f} s; {got['while_writing']} read during {got['polls']} passes "
        "while the writer ran)\n"
        f"  catch-up read rate   {total / catch_up:8.0f} changes/s ({catch_up:.2f} s)"
    )


def _token_seq(token: str) -> int:
    """The sequence inside a local token (format: connector/tunnel/local/tunnels.py)."""
    return int(json.loads(base64.b64decode(token))["s"])


def test_base_and_stream_created_while_a_writer_runs(tmp_path: Path) -> None:
    """A BaseAndStream tunnel created mid-stream (after a split, before a merge): the base
    snapshot plus the stream records partition the change log exactly at the creation point."""
    path = str(tmp_path / "s.db")
    total = 3000
    store = LocalTablestore(path)
    store.create_table(
        "t", [("id", "STRING")], [("value", "INTEGER"), ("name", "STRING")], channels=4
    )
    ctx = mp.get_context("spawn")
    started = ctx.Event()
    writer = ctx.Process(
        target=_acceptance_writer, args=(path, total, 200, str(tmp_path / "w.json"), started)
    )
    writer.start()
    started.set()
    wait_until(f"the writer to write {total // 2} changes",
               lambda: sum(c.head_seq for c in store.list_channels("t")),
               lambda written: written >= total // 2, timeout=120, interval=0.001,
               process=writer)
    svc = LocalTunnelService(LocalTablestore(path))
    tid = svc.create_tunnel("t", "bas", TunnelType.BASE_AND_STREAM).tunnel_id
    at_creation = {c.channel_id: c for c in svc.describe_tunnel("t", "bas").channels}
    s0 = {}
    for cid in at_creation:
        if not cid.startswith("base-"):
            cp = svc.get_checkpoint(tid, cid)
            s0[cid] = None if cp.finished else _token_seq(cp.token)
    writer.join(60)
    assert writer.exitcode == 0
    assert sum(c.head_seq for c in store.list_channels("t")) == total
    state = consume(svc, "t", "bas", limit=300)

    log = store.change_log("t")  # parents before children: per key, in write order
    closed_at_creation = {c for c, s in s0.items() if s is None}
    assert "ch-0000" in closed_at_creation  # the split happened before (the merge usually after)
    before = [
        r
        for r in log
        if r.channel_id in s0 and (s0[r.channel_id] is None or int(r.sequence) <= s0[r.channel_id])
    ]
    before_ids = {(r.channel_id, r.sequence) for r in before}
    after = [r for r in log if (r.channel_id, r.sequence) not in before_ids]
    assert 0 < len(before) < total and len(before) + len(after) == total
    snapshot: dict[str, dict[str, Any]] = {}
    for r in before:
        image = r.after_image()
        if image is None:
            snapshot.pop(r.primary_key["id"], None)
        else:
            snapshot[r.primary_key["id"]] = image
    base = [r for r in state.records if r.channel_id.startswith("base-")]
    stream = [r for r in state.records if not r.channel_id.startswith("base-")]
    assert len(base) == len(snapshot)  # each row once
    assert {r.primary_key["id"]: dict(r.columns) for r in base} == snapshot
    assert len(stream) == len(after)  # nothing missed or doubled across the boundary
    assert {(r.channel_id, r.sequence) for r in stream} == {
        (r.channel_id, r.sequence) for r in after
    }
    final: dict[str, dict[str, Any]] = {}
    for r in state.records:  # base PUTs, then the stream, as a replicating sink would apply
        image = (
            r.after_image()
            if r.op is not Op.UPDATE
            else {**final.get(r.primary_key["id"], {}), **r.columns}
        )
        if image is None:
            final.pop(r.primary_key["id"], None)
        else:
            final[r.primary_key["id"]] = {k: v for k, v in image.items() if v is not None}
    with store.transaction() as conn:
        rows = conn.execute("SELECT pk, attrs FROM cdc_rows WHERE table_name = 't'").fetchall()
    assert final == {json.loads(pk)["id"]: json.loads(attrs) for pk, attrs in rows}


def test_commit_times_of_many_channels_in_one_query(tmp_path: Path) -> None:
    """``changelog.commit_times`` (the emulator's DescribeTunnel progress): the commit time of
    the asked record of each channel, over more channels than one query asks at once; records
    not held are left out."""
    from benchmarks.common import create_bench_table, keys_per_channel
    from connector.tunnel.local import changelog

    store = LocalTablestore(tmp_path / "s.db")
    create_bench_table(store, 450, table="t")
    keys = [k for ks in keys_per_channel(450, 2) for k in ks]
    store.batch_write("t", [("put", {"id": k}, {"name": "a", "qty": 1}) for k in keys])
    store.batch_write("t", [("put", {"id": k}, {"name": "b", "qty": 2}) for k in keys])
    with store.transaction() as conn:
        held = {(c, s): ts for c, s, ts in conn.execute(
            "SELECT channel_id, seq, commit_ts_us FROM cdc_changes WHERE table_name = 't'")}
        channels = sorted({c for c, _ in held})
        asked = {c: 1 + i % 5 for i, c in enumerate(channels)}  # four held per channel
        got = changelog.commit_times(conn, "t", asked)
    assert len(channels) == 450 and len({ts for ts in held.values()}) == 2
    assert got == {c: held[(c, s)] for c, s in asked.items() if (c, s) in held}
    assert len(got) == 4 * 90 and all(asked[c] <= 4 for c in got)
    store.close()
