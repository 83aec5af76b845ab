"""Credentials given only as the source's options (``access.key.id`` / ``access.key.secret``)
reach the ``tablestore://`` meta store on the driver and in executors, with no
``ALIBABA_CLOUD_*`` variable anywhere — and never appear in what the meta table stores.

Runs the protocol (driver side) and ``read_partition`` (executor side) against the emulator over
HTTP, in Spark's call order, without Spark.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from connector.options import SourceOptions
from connector.protocol import StreamProtocol
from testkit.emulator import INSTANCE, KEY_ID, SECRET
from testkit.partition_reads import read_partition
from testkit.tunnel_harnesses import EmulatorHarness

ENV = ("ALIBABA_CLOUD_ACCESS_KEY_ID", "ALIBABA_CLOUD_ACCESS_KEY_SECRET",
       "ALIBABA_CLOUD_SECURITY_TOKEN")


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    h = EmulatorHarness(tmp_path / "store.db")
    h.create_table("t", channels=2)
    for i in range(20):
        h.put("t", f"k{i}", i)
    yield h
    h.close()


def _options(url: str) -> SourceOptions:
    return SourceOptions.from_spark({
        "endpoint": url, "instance.name": INSTANCE, "table.name": "t", "tunnel.name": "tun",
        "access.key.id": KEY_ID, "access.key.secret": SECRET, "checkpoint.table": "cdc_meta",
    })


def test_option_credentials_reach_driver_and_executor_meta_store(harness: EmulatorHarness
                                                                 ) -> None:
    options = _options(harness.emulator.url)
    assert options.meta_store.startswith(f"tablestore://{INSTANCE}/cdc_meta?")
    assert options.meta_store_credentials == {"access_key_id": KEY_ID,
                                              "access_key_secret": SECRET}
    protocol = StreamProtocol(options)  # driver: opens the meta table with the options' keys
    try:
        start = protocol.initial_offset()
        end = protocol.latest_offset(start, None)
        partitions = protocol.plan(start, end)
        assert partitions
        # what crosses to an executor: the credentials travel, but never in a repr/log line
        for p in partitions:
            assert SECRET not in repr(p)
        records = [r for p in partitions
                   for r in read_partition(pickle.loads(pickle.dumps(p)))]  # executor side
        assert sorted(r.primary_key["id"] for r in records) == sorted(f"k{i}" for i in range(20))
        protocol.commit(end)
        exported = [protocol.meta.get_end_checkpoints(protocol.namespace, protocol.uuid_of(end)),
                    protocol.meta.get_namespace_info(protocol.namespace)]
        assert SECRET not in repr(exported) and KEY_ID not in repr(exported)
    finally:
        protocol.close()


def test_credentials_refused_for_a_meta_store_that_takes_none(tmp_path: Path) -> None:
    from meta_store import open_meta_store
    from meta_store.errors import MetaStoreUriError

    with pytest.raises(MetaStoreUriError, match="takes no credentials"):
        open_meta_store(f"sqlite:///{tmp_path}/m.db", {"access_key_id": "a",
                                                        "access_key_secret": "b"})
