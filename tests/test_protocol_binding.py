"""Binding a query to its source (connector.planning.binding), without Spark: the driver
protocol called in Spark's order over a real local store, a real SQLite meta store and the
project's emulator, restarts simulated by new protocol objects handed the offsets Spark logged.

- The identity is the service's, not the URL's spelling: a restart through another spelling of
  the same store or emulator resumes exactly, and nothing new is created for it.
- Checkpoints and meta namespaces written before the identity changed keep working.
- Every refusal comes before anything is created (a changed ``tunnel.name`` creates no tunnel
  and no namespace; a changed ``meta.store`` creates no file) and says what changed.
- One live query per source: a second query is refused, naming ``tunnel.name``; a restart of
  the same query takes the lease over at once; a killed query's lease expires (clock injected).

Spark's own behaviour for the same cases is covered by integration/test_first_hour.py (slow).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from connector.errors import CheckpointMetaStoreError, CheckpointMismatchError, SourceInUseError
from connector.local import LocalTablestore
from connector.options import SourceOptions
from connector.planning import lease as lease_module
from connector.planning.offsets import initial_uuid
from connector.protocol import StreamProtocol
from connector.tunnel import Record
from connector.tunnel.local import LocalTunnelService
from meta_store import open_meta_store
from testkit.emulator import INSTANCE, SOURCE_OPTIONS
from testkit.fixtures import put_rows
from testkit.partition_reads import read_partition
from testkit.protocol_runs import run_batch


def options(endpoint: str, **extra: str) -> SourceOptions:
    return SourceOptions.from_spark({"endpoint": endpoint, "table.name": "t",
                                     "tunnel.name": "q", **extra})


def local(store: LocalTablestore, **extra: str) -> SourceOptions:
    return options(f"local://{store.path}", **extra)


def keys(records: list[Record]) -> list[tuple[str, str]]:
    return sorted((r.channel_id, r.sequence) for r in records)


def tunnels(store: LocalTablestore) -> list[str]:
    with LocalTunnelService(store.path) as service:
        return sorted(t.tunnel_name for t in service.list_tunnels("t"))


def namespaces(meta_uri: str) -> list[str]:
    with open_meta_store(meta_uri, create=False) as meta:
        return meta.list_namespaces()


class Owners:
    """Another planning process, in this one: the lease owner id and the clock are switched
    by the test (``connector.planning.lease.owner_id`` / ``now``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.owner, self.clock = "process-1", 1_000_000.0
        monkeypatch.setattr(lease_module, "owner_id", lambda: self.owner)
        monkeypatch.setattr(lease_module, "now", lambda: self.clock)
        # the owners proved to be an earlier process of this one: per test, as the owner
        # names repeat from test to test (a real owner id is unique)
        monkeypatch.setattr(lease_module, "_predecessors", set())

    def protocol(self, owner: str, opts: SourceOptions) -> StreamProtocol:
        self.owner = owner
        return StreamProtocol(opts)


@pytest.fixture
def owners(monkeypatch: pytest.MonkeyPatch) -> Owners:
    return Owners(monkeypatch)


# --- the identity: the service, not the URL's spelling ------------------------------------------


def test_another_spelling_of_the_store_path_resumes_the_checkpoint(store: LocalTablestore
                                                                   ) -> None:
    put_rows(store, range(20))
    first = StreamProtocol(local(store))
    end, seen = run_batch(first, first.initial_offset())
    first.close()
    put_rows(store, range(20, 30))
    path = Path(store.path)
    (path.parent / "x").mkdir()
    spelled = options(f"local://{path.parent}/./x/../{path.name}")
    assert spelled.source_identity == local(store).source_identity
    again = StreamProtocol(spelled)
    _, more = run_batch(again, end)  # the offset Spark logged under the first spelling
    assert keys(seen + more) == keys(store.change_log("t"))
    assert namespaces(local(store).meta_store) == [local(store).source_identity]


def test_the_emulator_through_localhost_resumes_a_checkpoint_of_127_0_0_1(
        tmp_path: Path, store: LocalTablestore, emulator: Any) -> None:
    port = emulator.url.rsplit(":", 1)[1]
    put_rows(store, range(15))
    first = StreamProtocol(options(f"http://127.0.0.1:{port}", **SOURCE_OPTIONS))
    end, seen = run_batch(first, first.initial_offset())
    first.close()
    put_rows(store, range(15, 40))
    again = StreamProtocol(options(f"http://localhost:{port}", **SOURCE_OPTIONS))
    end2, more = run_batch(again, end)
    assert end2["source"] == end["source"] == f"tablestore:{INSTANCE}#t#q"
    assert len(seen + more) == len(store.change_log("t")) == 40
    assert len({(r.channel_id, r.sequence) for r in seen + more}) == 40
    meta = again.meta
    assert meta.list_namespaces() == [f"tablestore:{INSTANCE}#t#q"]  # no namespace per spelling
    again.close()


# --- checkpoints and namespaces written before the identity named the service -----------------


def old_version_state(store: LocalTablestore) -> tuple[str, list[dict]]:
    """What an earlier version left: a namespace ``<endpoint>#<table>#<tunnel>`` in the meta
    store and offsets whose source is that string (no ``metaStore``). The namespace
    description is written as that version's ``NamespaceRecord`` wrote it; the batches are
    written by the protocol, which continues such a namespace (their rows never changed)."""
    opts = local(store)
    legacy = f"local://{store.path}#t#q"
    assert opts.legacy_namespace == legacy
    with LocalTunnelService(store.path) as service:
        tunnel_id = service.create_tunnel("t", "q").tunnel_id
    with open_meta_store(opts.meta_store) as meta:
        meta.set_namespace_info(legacy, {"endpoint": f"local://{store.path}", "table": "t",
                                         "tunnel": "q", "tunnel_id": tunnel_id})
    proto = StreamProtocol(opts)
    initial = proto.initial_offset()
    # the earlier version's initial offset of generation 0: the same UUID
    assert initial["uuid"] == initial_uuid(legacy, tunnel_id, 0)
    offsets = [initial]
    put_rows(store, range(10))
    for _ in range(2):
        end, _ = run_batch(proto, offsets[-1])
        offsets.append(end)
    proto.close()
    return legacy, [{k: v for k, v in o.items() if k != "metaStore"} for o in offsets]


@pytest.mark.parametrize("spelling", ["same", "another"])
def test_an_earlier_versions_checkpoint_and_namespace_keep_working(store: LocalTablestore,
                                                                   spelling: str) -> None:
    legacy, offsets = old_version_state(store)
    assert all(o["source"] == legacy for o in offsets)
    put_rows(store, range(10, 25))
    path = Path(store.path)
    endpoint = (f"local://{path}" if spelling == "same" else f"local://{path.parent}/./{path.name}")
    restarted = StreamProtocol(options(endpoint))
    end, more = run_batch(restarted, offsets[-1])
    assert end["source"] == legacy  # the checkpoint's batches stay where they are
    assert len(more) == 15
    assert namespaces(local(store).meta_store) == [legacy]  # nothing copied, nothing new


def test_a_new_query_of_an_earlier_versions_namespace_continues_its_generations(
        store: LocalTablestore) -> None:
    legacy, offsets = old_version_state(store)
    second = StreamProtocol(local(store))  # a new checkpoint directory, after an upgrade
    initial = second.initial_offset()
    assert initial["source"] == legacy and initial["uuid"] != offsets[0]["uuid"]
    _, records = run_batch(second, initial)
    assert records == []  # from the tunnel's pushed checkpoints: nothing read twice


# --- refusals: before anything is created, saying what changed ----------------------------


def test_a_changed_tunnel_name_is_refused_before_anything_is_created(store: LocalTablestore
                                                                     ) -> None:
    put_rows(store, range(10))
    first = StreamProtocol(local(store))
    end, _ = run_batch(first, first.initial_offset())
    first.close()
    before = (tunnels(store), namespaces(local(store).meta_store))
    renamed = StreamProtocol(local(store, **{"tunnel.name": "kill-test-2"}))
    with pytest.raises(CheckpointMismatchError) as caught:
        renamed.latest_offset(end, None)
    message = str(caught.value)
    assert "another tunnel ('q', now 'kill-test-2')" in message
    assert "set tunnel.name back" in message and "new checkpoint location" in message
    assert (tunnels(store), namespaces(local(store).meta_store)) == before


@pytest.mark.parametrize("change, says", [
    ({"table.name": "u"}, "another table ('t', now 'u')"),
    ({"endpoint": "local://{tmp}/elsewhere.db"}, "another store file"),
])
def test_a_restart_on_another_source_says_what_changed(tmp_path: Path, store: LocalTablestore,
                                                       change: dict, says: str) -> None:
    with LocalTablestore(tmp_path / "elsewhere.db") as elsewhere:
        elsewhere.create_table("t", primary_key=[("id", "INTEGER")], channels=1)
    change = {k: v.format(tmp=tmp_path) for k, v in change.items()}
    put_rows(store, range(5))
    first = StreamProtocol(local(store))
    end, _ = run_batch(first, first.initial_offset())
    first.close()
    changed = SourceOptions.from_spark({"endpoint": f"local://{store.path}",
                                        "table.name": "t", "tunnel.name": "q", **change,
                                        "meta.store": local(store).meta_store})
    with pytest.raises(CheckpointMismatchError, match="checkpoint location was written by") as e:
        StreamProtocol(changed).latest_offset(end, None)
    assert says in str(e.value)


def test_a_changed_meta_store_is_named_and_no_file_is_created(tmp_path: Path,
                                                              store: LocalTablestore) -> None:
    put_rows(store, range(5))
    first = StreamProtocol(local(store))
    end, _ = run_batch(first, first.initial_offset())
    first.close()
    other = tmp_path / "other.meta.db"
    moved = StreamProtocol(local(store, **{"meta.store": f"sqlite://{other}"}))
    with pytest.raises(CheckpointMetaStoreError) as caught:
        moved.latest_offset(end, None)
    message = str(caught.value)
    assert f"written with meta store 'sqlite://{tmp_path}/store.meta.db'" in message
    assert f"the meta store 'sqlite://{other}' does not hold" in message
    assert not other.exists() and tunnels(store) == ["q"]
    # an offset of an earlier version does not name its meta store: still no file, and a hint
    old = {k: v for k, v in end.items() if k != "metaStore"}
    with pytest.raises(CheckpointMetaStoreError, match="written with another meta store"):
        StreamProtocol(local(store, **{"meta.store": f"sqlite://{other}"})).latest_offset(
            old, None)
    assert not other.exists()


def test_the_default_meta_table_of_a_tablestore_endpoint_is_not_created_by_a_refusal(
        store: LocalTablestore, emulator: Any) -> None:
    put_rows(store, range(5))
    first = StreamProtocol(options(emulator.url, **SOURCE_OPTIONS))
    end, _ = run_batch(first, first.initial_offset())
    first.close()
    with LocalTablestore(store.path) as raw:
        tables = set(raw.list_tables())
    elsewhere = options(emulator.url, **SOURCE_OPTIONS, **{"checkpoint.table": "other_meta"})
    with pytest.raises(CheckpointMetaStoreError, match="tablestore_cdc_meta"):
        StreamProtocol(elsewhere).latest_offset(end, None)
    with LocalTablestore(store.path) as raw:
        assert set(raw.list_tables()) == tables  # no other_meta table


# --- one live query per source -----------------------------------------------------------------


def test_a_second_query_on_a_live_tunnel_is_refused(store: LocalTablestore,
                                                    owners: Owners) -> None:
    put_rows(store, range(20))
    first = owners.protocol("process-1", local(store, maxOffsetsPerChannel="4"))
    start = first.initial_offset()
    end, seen = run_batch(first, start)
    second = owners.protocol("process-2", local(store))  # another checkpoint directory
    with pytest.raises(SourceInUseError) as caught:
        second.initial_offset()
    message = str(caught.value)
    assert message.startswith("option 'tunnel.name': tunnel 'q' on table 't' is being read by "
                              "another query (planning process process-1")
    assert "foreachBatch" in message and "one-query-many-sinks" in message
    owners.owner = "process-1"
    while True:  # the first query goes on, exactly
        nxt, more = run_batch(first, end)
        seen += more
        if nxt == end:
            break
        end = nxt
    assert keys(seen) == keys(store.change_log("t"))
    first.close()  # stopped: the lease is released at once
    assert owners.protocol("process-2", local(store)).initial_offset()


def test_a_second_query_started_during_batch_0_is_refused_at_its_first_batch(
        store: LocalTablestore, owners: Owners) -> None:
    put_rows(store, range(10))
    first = owners.protocol("process-1", local(store))
    initial = first.initial_offset()
    first.plan(initial, first.latest_offset(initial, None))  # batch 0 runs
    second = owners.protocol("process-2", local(store))
    assert second.initial_offset() == initial  # the same generation: no evidence yet
    with pytest.raises(SourceInUseError):
        second.latest_offset(initial, None)  # it would have joined the first one's batch 0


def test_a_restart_of_the_same_query_takes_the_lease_over_at_once(store: LocalTablestore,
                                                                  owners: Owners) -> None:
    put_rows(store, range(30))
    first = owners.protocol("process-1", local(store, maxOffsetsPerChannel="5"))
    end, seen = run_batch(first, first.initial_offset())
    end, more = run_batch(first, end)
    seen += more
    # the first process is SIGKILLed: its lease stays live; Spark restarts on its checkpoint
    restarted = owners.protocol("process-2", local(store, maxOffsetsPerChannel="5"))
    while True:
        nxt, more = run_batch(restarted, end)
        seen += more
        if nxt == end:
            break
        end = nxt
    assert keys(seen) == keys(store.change_log("t"))
    owners.owner, owners.clock = "process-1", owners.clock + lease_module.TIP_EVERY_S
    put_rows(store, range(30, 31))
    with pytest.raises(SourceInUseError, match="planning process process-2"):
        # a leftover of the killed process is refused before it plans a batch
        first.plan(end, first.latest_offset(end, None))


def test_a_restart_during_batch_0_replays_it_and_takes_the_lease_over(
        store: LocalTablestore, owners: Owners) -> None:
    put_rows(store, range(10))
    first = owners.protocol("process-1", local(store))
    initial = first.initial_offset()
    end0 = first.latest_offset(initial, None)
    first.plan(initial, end0)  # SIGKILLed while batch 0 runs
    restarted = owners.protocol("process-2", local(store))
    assert restarted.initial_offset() == initial
    records = [r for p in restarted.plan(initial, end0) for r in read_partition(p)]
    restarted.commit(end0)
    assert keys(records) == keys(store.change_log("t"))


def test_a_killed_querys_lease_expires(store: LocalTablestore, owners: Owners) -> None:
    put_rows(store, range(10))
    first = owners.protocol("process-1", local(store))
    run_batch(first, first.initial_offset())  # then SIGKILLed: no release
    second = owners.protocol("process-2", local(store))  # a new checkpoint directory
    with pytest.raises(SourceInUseError) as caught:
        second.initial_offset()
    assert "expires in 120 s" in str(caught.value)
    owners.clock += lease_module.TTL_S + 1
    third = owners.protocol("process-2", local(store))
    assert third.initial_offset()["uuid"]


def test_the_lease_is_renewed_while_a_long_batch_runs(store: LocalTablestore,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The renewal thread, on the real clock with a short TTL: a batch running several TTLs
    keeps the lease; once the query stops, a second one starts at once."""
    monkeypatch.setattr(lease_module, "TTL_S", 0.4)
    owner = ["process-1"]
    monkeypatch.setattr(lease_module, "owner_id", lambda: owner[0])
    put_rows(store, range(5))
    first = StreamProtocol(local(store))
    initial = first.initial_offset()
    end, _ = run_batch(first, initial)
    put_rows(store, range(5, 9))
    first.plan(end, first.latest_offset(end, None))
    time.sleep(1.5)  # the batch runs for more than three TTLs
    owner[0] = "process-2"
    with pytest.raises(SourceInUseError):
        StreamProtocol(local(store)).initial_offset()
    first.close()
    assert StreamProtocol(local(store)).initial_offset()["uuid"]
