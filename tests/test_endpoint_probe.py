"""A short outage shows in the table status on every endpoint a probe can reach
(``tablestore_cdc.pipeline.metrics``: ``reachable``, ``EndpointProbe``): a Tablestore or
DynamoDB Streams endpoint by a TCP connection, an embedded store by opening its file. While the
probe fails, a reading table's record is ``source unreachable (since ..., attempt 1)`` in the
meta store (what the feed, the dashboard and ``meta tables`` read) and
``tablestore_cdc_source_up`` is 0, before the query's own retries give up; once it answers, the
table streams again. Real sockets on 127.0.0.1, a real store file, a real SQLite meta store."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from connector.table_state import State
from meta_store import open_meta_store
from meta_store.sqlite import SqliteMetaStore
from tablestore_cdc.pipeline import metrics as metrics_module
from tablestore_cdc.pipeline.metrics import EndpointProbe, TableMetrics, reachable
from tablestore_cdc.table_status import TableStatus, TableStatusWriter, load_table_status

NS = "local:///s.db#orders#t"


@pytest.fixture
def listening() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts connections."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then closed)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        return int(server.getsockname()[1])


def test_a_local_store_answers_while_its_file_opens(tmp_path: Path) -> None:
    store = tmp_path / "store.db"
    store.write_bytes(b"SQLite format 3\x00")
    assert reachable(f"local://{store}") is True
    store.rename(tmp_path / "moved.db")
    assert reachable(f"local://{store}") is False
    assert reachable(f"local://{tmp_path}") is False  # a directory is no store


def test_a_tcp_endpoint_answers_while_it_accepts_connections(listening: int,
                                                             closed_port: int) -> None:
    for port, answers in ((listening, True), (closed_port, False)):
        assert reachable(f"http://127.0.0.1:{port}") is answers
        assert reachable("dynamodb-streams://t?checkpoint_table=c&endpoint_url="
                         f"http://127.0.0.1:{port}") is answers


def test_a_dynamodb_endpoint_without_an_endpoint_url_is_its_regions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def address(uri: str) -> tuple[str, int] | None:
        return metrics_module._address(urlsplit(uri))

    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    assert address("dynamodb-streams://t?checkpoint_table=c&region=eu-west-1") == (
        "streams.dynamodb.eu-west-1.amazonaws.com", 443)
    # a region only a profile names: not probed (the job's restart shows that outage)
    assert reachable("dynamodb-streams://t?checkpoint_table=c&profile=p") is None
    assert address("dynamodb-streams://t?checkpoint_table=c&region=cn-north-1") == (
        "streams.dynamodb.cn-north-1.amazonaws.com.cn", 443)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    assert address("dynamodb-streams://t?checkpoint_table=c") == (
        "streams.dynamodb.us-west-2.amazonaws.com", 443)
    assert reachable("sqlite:///x.db") is None


def test_an_outage_the_probe_sees_is_the_tables_status_until_it_answers(tmp_path: Path) -> None:
    store = tmp_path / "store.db"
    store.write_bytes(b"SQLite format 3\x00")
    meta = f"sqlite:///{tmp_path / 'meta.db'}"
    writer = TableStatusWriter(lambda table: (meta, None, NS))
    metrics = TableMetrics(source="src", probe=f"local://{store}")
    metrics.attach(writer)
    metrics.probe = writer.probe = EndpointProbe(f"local://{store}", every_s=0)

    def publish() -> dict[str, TableStatus]:
        return writer.publish({"orders": TableStatus(table="orders", job="j", selection="orders",
                                                     state=State.STREAMING)}, force=True)

    def recorded() -> TableStatus | None:
        meta_store = open_meta_store(meta)
        try:
            return load_table_status(meta_store, NS)
        finally:
            meta_store.close()

    sample = metrics.registry.get_sample_value
    assert publish()["orders"].state == State.STREAMING
    assert sample("tablestore_cdc_source_up", {"source": "src"}) == 1
    store.rename(tmp_path / "away.db")  # an unmounted disk, a file moved away
    down = publish()["orders"]
    assert down.state == State.UNREACHABLE and down.unreachable_since is not None
    assert down.label().startswith("source unreachable (since ")
    assert down.label().endswith(f"attempt 1): local://{store} does not answer (probed every "
                                 "0 s)")
    on_record = recorded()
    assert on_record is not None and on_record.state == State.UNREACHABLE
    assert sample("tablestore_cdc_source_up", {"source": "src"}) == 0
    assert sample("tablestore_cdc_table_up", {"table": "orders"}) == 0
    assert publish()["orders"].unreachable_since == down.unreachable_since  # the same outage
    (tmp_path / "away.db").rename(store)
    assert publish()["orders"].state == State.STREAMING
    assert (recorded() or down).state == State.STREAMING
    assert sample("tablestore_cdc_source_up", {"source": "src"}) == 1


def test_a_table_that_does_not_read_keeps_its_state(tmp_path: Path) -> None:
    probe = EndpointProbe(f"local://{tmp_path / 'missing.db'}", every_s=0)
    statuses = {"a": TableStatus(table="a", job="j", selection="*", state=State.FAILED,
                                 reason="bad"),
                "b": TableStatus(table="b", job="j", selection="*", state=State.WAITING)}
    shown = probe.applied(statuses)
    assert (shown["a"].state, shown["b"].state) == (State.FAILED, State.UNREACHABLE)


def test_the_metrics_show_an_outage_before_the_status_write_waits_on_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A meta store kept on the source's service is down with it: its write waits out the
    client's retries. The metrics are told first, so the page shows the outage meanwhile."""
    store = tmp_path / "store.db"
    store.write_bytes(b"SQLite format 3\x00")
    seen_while_writing: list[float | None] = []
    metrics = TableMetrics(source="src", probe=f"local://{store}")

    write = SqliteMetaStore.set_namespace_info

    def written(self: SqliteMetaStore, namespace: str, info: dict[str, str]) -> None:
        seen_while_writing.append(metrics.registry.get_sample_value(
            "tablestore_cdc_source_up", {"source": "src"}))
        write(self, namespace, info)

    monkeypatch.setattr(SqliteMetaStore, "set_namespace_info", written)
    writer = TableStatusWriter(lambda table: (f"sqlite:///{tmp_path / 'meta.db'}", None, NS))
    metrics.attach(writer)
    metrics.probe = writer.probe = EndpointProbe(f"local://{store}", every_s=0)
    status = TableStatus(table="orders", job="j", selection="orders", state=State.STREAMING)
    store.rename(tmp_path / "away.db")
    assert writer.publish({"orders": status}, force=True)["orders"].state == State.UNREACHABLE
    assert seen_while_writing == [0]  # the write came after the metrics
