"""Targets built from a real change stream, for the reconcile tests: no Spark.

``apply_stream`` opens the table's tunnel service (any backend: the embedded store, the
emulator over the wire, DynamoDB Streams on moto), reads the whole change stream through a
tunnel of its own, parents before children (a channel read to its end is checkpointed
``FINISHED`` so its children open), and applies it with a real apply sink
(``tablestore_cdc.lakehouse``) in batches of the source's output layout
(``connector.tunnel.page.records_to_page`` plus ``_channel_id``), as the source delivers them.

``DeltaTarget`` and ``IcebergTarget`` are a target URI and how to change its table behind the
product's back (rows deleted, changed, added); ``OrdersTarget`` the same on the demo's
``orders`` table (the Spark tests of reconcile and resnapshot); ``found`` sorts a report's
differences by label; ``table_runner`` runs one table's re-snapshot signals alone.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa

from connector.tunnel import FINISHED, ChannelStatus, Checkpoint, Record, open_tunnel_service
from connector.tunnel.page import PageLayout, records_to_page
from tablestore_cdc.resnapshot.hook import RepairRunner, RepairTarget


def apply_stream(tunnel_uri: str, table: str, sink: Any, *, tunnel_name: str | None = None,
                 batch_records: int = 100, app_id: str = "build-query",
                 layout: PageLayout | None = None) -> int:
    """Apply every change of ``table`` with ``sink`` through a new tunnel (``tunnel_name``,
    default a fresh one); returns the batches applied."""
    tunnel_name = tunnel_name or f"build-{uuid.uuid4().hex[:8]}"
    with open_tunnel_service(tunnel_uri) as tunnel:
        schema = tunnel.table_schema(table)
        keys = tuple(c.name for c in schema.primary_key)
        layout = layout or PageLayout.of_table(schema)
        tunnel_id = tunnel.ensure_tunnel(table, tunnel_name).tunnel_id
        pending: list[pa.Table] = []
        batches = 0
        done: set[str] = set()
        while True:
            channels = [c for c in tunnel.describe_tunnel(table, tunnel_name).channels
                        if c.status is ChannelStatus.OPEN and c.channel_id not in done]
            if not channels:
                break
            for channel in channels:
                records, finished = _read_channel(tunnel, tunnel_id, channel.channel_id)
                for start in range(0, len(records), batch_records):
                    page = pa.Table.from_batches([records_to_page(
                        records[start:start + batch_records], layout)])
                    pending.append(page.append_column(
                        pa.field("_channel_id", pa.string(), False),
                        pa.array([channel.channel_id] * page.num_rows)))
                    if sum(p.num_rows for p in pending) >= batch_records:
                        sink.apply(pa.concat_tables(pending), app_id, batches, keys)
                        batches, pending = batches + 1, []
                if finished:
                    tunnel.checkpoint(tunnel_id, channel.channel_id,
                                      Checkpoint(FINISHED, len(records) + 1))
                    done.add(channel.channel_id)
                else:
                    done.add(channel.channel_id)  # open: read to its head
        if pending:
            sink.apply(pa.concat_tables(pending), app_id, batches, keys)
            batches += 1
    return batches


def _read_channel(tunnel: Any, tunnel_id: str, channel_id: str) -> tuple[list[Record], bool]:
    token = tunnel.get_checkpoint(tunnel_id, channel_id).token
    records: list[Record] = []
    while token != FINISHED:
        result = tunnel.read_records(tunnel_id, channel_id, token, 500)
        records += result.records
        token = result.next_token
        if not result.records and not result.may_more:
            break
    return records, token == FINISHED


class Target:
    """A target URI and how to change it behind the product's back."""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def live_keys(self) -> list[int]:
        raise NotImplementedError

    def tamper(self, deleted: list[int], changed: list[int], added: int) -> None:
        raise NotImplementedError


class DeltaTarget(Target):
    def __init__(self, root: Path) -> None:
        super().__init__(f"delta://{root}/delta")
        self.path = str(root / "delta")

    def live_keys(self) -> list[int]:
        return sorted(deltalake.DeltaTable(self.path).to_pyarrow_table(columns=["id"])
                      .column("id").to_pylist())

    def tamper(self, deleted: list[int], changed: list[int], added: int) -> None:
        table = deltalake.DeltaTable(self.path)
        table.delete(f"id IN ({', '.join(map(str, deleted))})")
        deltalake.DeltaTable(self.path).update(predicate=f"id = {changed[0]}",
                                               updates={"qty": "-1"})
        deltalake.DeltaTable(self.path).update(predicate=f"id = {changed[1]}",
                                               updates={"name": "'changed by hand'"})
        schema = pa.schema(deltalake.DeltaTable(self.path).schema().to_arrow())
        row: dict[str, Any] = {f.name: None for f in schema}
        row.update(id=added, name="added by hand", qty=7)
        deltalake.write_deltalake(self.path, pa.Table.from_pylist([row], schema=schema),
                                  mode="append")


class IcebergTarget(Target):
    def __init__(self, root: Path) -> None:
        from tablestore_cdc.lakehouse.iceberg import sqlite_catalog_properties

        super().__init__(f"iceberg://{root}/wh?table=cdc.t")
        self.props = sqlite_catalog_properties(str(root / "wh"))

    def table(self) -> Any:
        from pyiceberg.catalog import load_catalog

        return load_catalog("tablestore_cdc", **self.props).load_table("cdc.t")

    def live_keys(self) -> list[int]:
        return sorted(self.table().scan(selected_fields=("id",)).to_arrow().column("id")
                      .to_pylist())

    def tamper(self, deleted: list[int], changed: list[int], added: int) -> None:
        from pyiceberg import expressions

        # the expressions' pydantic fields type their constructors keyword-only for mypy;
        # pyiceberg's documented calls are positional
        In: Any = expressions.In  # noqa: N806
        EqualTo: Any = expressions.EqualTo  # noqa: N806
        table = self.table()
        table.delete(In("id", set(deleted)))
        rows = self.table().scan(row_filter=In("id", set(changed))).to_arrow().to_pylist()
        for row in rows:
            if row["id"] == changed[0]:
                row["qty"] = -1
            else:
                row["name"] = "changed by hand"
            self.table().overwrite(pa.Table.from_pylist([row], schema=table.schema().as_arrow()),
                                   overwrite_filter=EqualTo("id", row["id"]))
        schema = self.table().schema().as_arrow()
        new: dict[str, Any] = {f.name: None for f in schema}
        new.update(id=added, name="added by hand", qty=7)
        self.table().append(pa.Table.from_pylist([new], schema=schema))


def found(report: Any) -> dict[str, set[Any]]:
    out: dict[str, set[Any]] = {"MISSING": set(), "EXTRA": set(), "DIFFERENT": set(),
                                "IN-FLIGHT": set()}
    for d in report.comparison.differences:
        out[d.label].add(d.key[0])
    return out


def settle(pipeline: Any, store_path: Path) -> None:
    """Every change of the demo's ``orders`` applied by ``pipeline`` and the target's applied
    position past them: it trails the newest apply batch by up to one batch, so a write to a
    new key, applied, twice, moves it past every earlier change."""
    import time

    from connector.local import LocalTablestore
    from tablestore_cdc.demo.writer import DEMO_TABLE

    pipeline.drain()
    with LocalTablestore(store_path) as store:
        for extra in (1, 2):
            store.put_row(DEMO_TABLE, {"order_id": 10_000_000 + extra}, {"status": "x"})
            pipeline.drain()
            time.sleep(1.0)
            pipeline.drain()


#: keys the demo writer never touches (it counts up from 1): the tampered rows
BASE = 5_000_000


def make_orders(store_path: Path, rows: int = 20) -> None:
    """The demo's ``orders`` table (4 channels) with ``rows`` rows outside the writer's keys."""
    from connector.local import LocalTablestore
    from tablestore_cdc.demo.writer import DEMO_TABLE

    with LocalTablestore(store_path) as store:
        store.create_table(DEMO_TABLE, primary_key=[("order_id", "INTEGER")],
                           columns=[("customer", "STRING"), ("amount", "DOUBLE"),
                                    ("status", "STRING")], channels=4)
        for i in range(rows):
            store.put_row(DEMO_TABLE, {"order_id": BASE + i},
                          {"customer": f"c{i}", "amount": float(i), "status": "new"})


class OrdersTarget:
    """The test targets of tests/test_reconcile.py on the demo's ``orders`` table."""

    @staticmethod
    def delta(root: Path) -> Target:
        return _Orders(DeltaTarget(root))

    @staticmethod
    def iceberg(root: Path) -> Target:
        target = IcebergTarget(root)
        target.uri = target.uri.replace("cdc.t", "cdc.orders")
        target.table = _iceberg_table(target)  # type: ignore[method-assign]
        return _Orders(target)


def _iceberg_table(target: IcebergTarget) -> Any:
    def table() -> Any:
        from pyiceberg.catalog import load_catalog

        return load_catalog("tablestore_cdc", **target.props).load_table("cdc.orders")
    return table


class _Orders(Target):
    """A test target whose key is ``order_id`` and whose columns are the demo's: the delete,
    change and add of ``Target.tamper`` done with those names."""

    def __init__(self, inner: Target) -> None:
        super().__init__(inner.uri)
        self.inner = inner

    def tamper(self, deleted: list[int], changed: list[int], added: int) -> None:
        import deltalake
        import pyarrow as pa

        inner = self.inner
        if isinstance(inner, DeltaTarget):
            deltalake.DeltaTable(inner.path).delete(
                f"order_id IN ({', '.join(map(str, deleted))})")
            deltalake.DeltaTable(inner.path).update(predicate=f"order_id = {changed[0]}",
                                                    updates={"amount": "-1.0"})
            deltalake.DeltaTable(inner.path).update(predicate=f"order_id = {changed[1]}",
                                                    updates={"status": "'by hand'"})
            schema = pa.schema(deltalake.DeltaTable(inner.path).schema().to_arrow())
            row = {f.name: None for f in schema} | {"order_id": added, "status": "by hand"}
            deltalake.write_deltalake(inner.path, pa.Table.from_pylist([row], schema=schema),
                                      mode="append")
            return
        from pyiceberg import expressions

        In: Any = expressions.In  # noqa: N806 - keyword-only for mypy (see IcebergTarget)
        EqualTo: Any = expressions.EqualTo  # noqa: N806
        assert isinstance(inner, IcebergTarget)
        inner.table().delete(In("order_id", set(deleted)))
        for key, column, value in ((changed[0], "amount", -1.0),
                                   (changed[1], "status", "by hand")):
            rows = inner.table().scan(row_filter=EqualTo("order_id", key)).to_arrow()
            row = rows.to_pylist()[0] | {column: value}
            inner.table().overwrite(pa.Table.from_pylist([row], schema=rows.schema),
                                    overwrite_filter=EqualTo("order_id", key))
        schema = inner.table().schema().as_arrow()
        row = {f.name: None for f in schema} | {"order_id": added, "status": "by hand"}
        inner.table().append(pa.Table.from_pylist([row], schema=schema))


def table_runner(target: RepairTarget, **kwargs: Any) -> RepairRunner:
    """A ``RepairRunner`` of one table's signals alone, each repaired into ``target``."""
    return RepairRunner(lambda: (target.spec.table,), lambda _table: target.spec,
                        lambda _table: target, **kwargs)
