"""The apply sink's targets as the lakehouse tests reach them: a change batch of table
``orders`` (``change``, ``batch``, two ready batches), a real embedded store with a history
and its change log cut into batches (``store_with_history``, ``source_batches``), a random
stream of small batches and the state it leaves (``ChangeStream``), and a Delta or
an Iceberg target in a temporary directory, in a moto S3 bucket (``S3Delta``) or in a catalog
pyiceberg's environment names (``CatalogIceberg``), with how to read it back and how another
writer commits into it."""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from connector.local import LocalTablestore
from connector.tunnel.page import PageLayout, records_to_page
from tablestore_cdc.lakehouse import DeltaApplySink, IcebergApplySink
from tablestore_cdc.lakehouse.iceberg import sqlite_catalog_properties
from tablestore_cdc.lakehouse.plan import CLOSE_AT, ApplyPlan
from tablestore_cdc.verify import read_delta
from testkit.target_reads import read_iceberg

UTC = dt.UTC
SCHEMA = pa.schema([
    pa.field("id", pa.int64(), False), pa.field("name", pa.string()), pa.field("qty", pa.int64()),
    pa.field("_op", pa.string(), False), pa.field("_channel_id", pa.string(), False),
    pa.field("_sequence", pa.string(), False), pa.field("_commit_ts", pa.timestamp("us", tz="UTC")),
    pa.field("_before", pa.string()), pa.field("_extra", pa.string()),
])


def change(op: str, channel: str, seq: int, ts: float, id_: int, name: str | None = None,
           qty: int | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": id_, "name": name, "qty": qty, "_op": op, "_channel_id": channel,
            "_sequence": f"{seq:020d}", "_commit_ts": dt.datetime.fromtimestamp(ts, UTC),
            "_before": None, "_extra": json.dumps(extra, sort_keys=True) if extra else None}


def batch(*rows: dict[str, Any]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=SCHEMA)


def string_keyed(batch_id: int, *rows: tuple[str, str, str]) -> pa.Table:
    """A batch of table ``orders`` keyed by a string column ``k`` instead of ``id``: one change
    per (op, key, name), in channel ``c``, sequenced by the batch id."""
    schema = pa.schema([pa.field("k", pa.string(), False), *list(SCHEMA)[1:]])
    changes = [{**change(op, "c", batch_id * 10 + i, batch_id, 0, name), "k": k}
               for i, (op, k, name) in enumerate(rows)]
    return pa.Table.from_pylist(changes, schema=schema)


class ChangeStream:
    """Random small batches of puts and deletes of table ``orders`` (channel ``c``), and the
    state they leave (key -> (name, qty)): from 1 to ``most`` changes a batch over keys 1 to
    ``keys``, a key held deleted with chance ``deletes`` (the maintenance tests and the
    maintenance soak stream them into a target)."""

    def __init__(self, seed: int = 7, *, most: int = 4, keys: int = 40,
                 deletes: float = 0.25) -> None:
        self.rng = random.Random(seed)
        self.most, self.keys, self.deletes = most, keys, deletes
        self.seq = 0
        self.state: dict[int, tuple[str, int]] = {}

    def next_batch(self) -> pa.Table:
        changes = []
        for _ in range(self.rng.randint(1, self.most)):
            self.seq += 1
            key = self.rng.randint(1, self.keys)
            if key in self.state and self.rng.random() < self.deletes:
                changes.append(change("DELETE", "c", self.seq, self.seq, key))
                del self.state[key]
            else:
                value = (f"v{self.seq}", self.seq)
                changes.append(change("PUT", "c", self.seq, self.seq, key, *value))
                self.state[key] = value
        return batch(*changes)


FIRST = batch(change("PUT", "c", 1, 1, 1, "a", 1))
WITH_COLOUR = batch(change("PUT", "c", 2, 2, 2, "b", 2, colour="red", size=7),
                    change("UPDATE", "c", 3, 3, 1, "a", 5, colour="blue"))


class Delta:
    """A Delta target in ``tmp`` and how to read it back (deltalake)."""

    name = "delta"

    def __init__(self, tmp: Path) -> None:
        self.path = str(tmp / "delta" / "orders")

    def sink(self, **options: Any) -> DeltaApplySink:
        return DeltaApplySink(self.path, key_columns=["id"], **options)

    def rows(self) -> list[dict[str, Any]]:
        return read_delta(self.path)

    def commits(self) -> int:
        """Table versions so far (a replayed batch must not add one)."""
        return DeltaTable(self.path).version() + 1

    def other_writer(self, changes: pa.Table, scd: int) -> None:
        """Another writer's commit of ``changes``' rows, straight into the table (deltalake)."""
        from deltalake import write_deltalake

        write_deltalake(self.path, _rows_of(changes, DeltaTable(self.path).schema().to_arrow(),
                                           scd), mode="append")


class Iceberg:
    """An Iceberg target (SQL catalog on SQLite) in ``tmp`` and how to read it back."""

    name = "iceberg"

    def __init__(self, tmp: Path) -> None:
        self.properties = sqlite_catalog_properties(str(tmp / "warehouse"))

    def sink(self, **options: Any) -> IcebergApplySink:
        return IcebergApplySink(self.properties, "cdc.orders", key_columns=["id"], **options)

    def rows(self) -> list[dict[str, Any]]:
        return read_iceberg(self.properties, "cdc.orders")

    def commits(self) -> int:
        """Snapshots so far (a replayed batch must not add one)."""
        from pyiceberg.catalog import load_catalog

        table = load_catalog("tablestore_cdc", **self.properties).load_table("cdc.orders")
        return len(table.metadata.snapshots)

    def other_writer(self, changes: pa.Table, scd: int) -> None:
        """Another writer's commit of ``changes``' rows, straight into the table (pyiceberg)."""
        from pyiceberg.catalog import load_catalog

        table = load_catalog("tablestore_cdc", **self.properties).load_table("cdc.orders")
        table.append(_rows_of(changes, table.schema().as_arrow(), scd))


def _rows_of(changes: pa.Table, schema: Any, scd: int) -> pa.Table:
    """PUT changes as rows of a table of ``schema`` (SCD 2: open versions)."""
    schema = pa.schema(schema)
    rows = [{k: v for k, v in row.items() if k in schema.names} for row in changes.to_pylist()]
    for row, source in zip(rows, changes.to_pylist(), strict=True):
        if scd == 2:
            row["__START_AT"] = source["_commit_ts"]
    return pa.Table.from_pylist(rows, schema=schema)


class S3Delta:
    """A Delta target in a bucket of a moto S3 server (``delta+s3://``, through
    ``open_apply_sink``), read back with deltalake. The environment must hold the server's
    ``AWS_ENDPOINT_URL`` and the fake credentials (``testkit.aws.AWS_TEST_ENV``)."""

    name = "delta+s3"

    def __init__(self, bucket: str, prefix: str = "lake/orders") -> None:
        self.uri = f"delta+s3://{bucket}/{prefix}"
        self.table_uri = f"s3://{bucket}/{prefix}"
        self.storage_options = {"AWS_ALLOW_HTTP": "true"}

    def sink(self, **options: Any) -> Any:
        from tablestore_cdc.lakehouse import open_apply_sink

        return open_apply_sink(self.uri, key_columns=["id"], **options)

    def table(self) -> DeltaTable:
        return DeltaTable(self.table_uri, storage_options=self.storage_options)

    def rows(self) -> list[dict[str, Any]]:
        return self.table().to_pyarrow_table().to_pylist()

    def commits(self) -> int:
        return self.table().version() + 1

    def other_writer(self, changes: pa.Table, scd: int) -> None:
        """Another writer's commit of ``changes``' rows, straight into the table (deltalake)."""
        from deltalake import write_deltalake

        table = self.table()
        write_deltalake(table, _rows_of(changes, table.schema().to_arrow(), scd), mode="append")


class CatalogIceberg:
    """An Iceberg target in the catalog pyiceberg's environment configuration names
    (``iceberg://CATALOG/NAMESPACE.orders``), read back with pyiceberg. ``properties``: the
    catalog's pyiceberg properties (``sql_catalog``'s, or a REST catalog's:
    ``testkit.rest_catalog``); ``catalog_env``: the same as the ``PYICEBERG_CATALOG__<NAME>__*``
    variables a test sets."""

    name = "iceberg-catalog"

    def __init__(self, catalog: str, properties: dict[str, str], namespace: str = "cdc") -> None:
        self.catalog, self.namespace = catalog, namespace
        self.identifier = f"{namespace}.orders"
        self.uri = f"iceberg://{catalog}/{self.identifier}"
        self.properties = dict(properties)
        prefix = f"PYICEBERG_CATALOG__{catalog.upper()}__"
        self.catalog_env = {prefix + key.replace(".", "__").upper(): value
                            for key, value in properties.items()}

    def sink(self, **options: Any) -> Any:
        from tablestore_cdc.lakehouse import open_apply_sink

        return open_apply_sink(self.uri, key_columns=["id"], **options)

    def table(self) -> Any:
        from pyiceberg.catalog import load_catalog

        return load_catalog(self.catalog, **self.properties).load_table(self.identifier)

    def rows(self) -> list[dict[str, Any]]:
        return read_iceberg(self.properties, self.identifier, self.catalog)

    def commits(self) -> int:
        return len(self.table().metadata.snapshots)

    def other_writer(self, changes: pa.Table, scd: int) -> None:
        table = self.table()
        table.append(_rows_of(changes, table.schema().as_arrow(), scd))


def sql_catalog(catalog_db: Path, warehouse: str, endpoint: str) -> dict[str, str]:
    """The pyiceberg properties of a SQL catalog on SQLite at ``catalog_db`` whose warehouse
    (``s3://...``) is on the S3 server at ``endpoint``."""
    return {"type": "sql", "uri": f"sqlite:///{catalog_db}", "warehouse": warehouse,
            "s3.endpoint": endpoint, "s3.region": "us-east-1"}


def store_with_history(path: Path, seed: int = 3, changes: int = 600) -> LocalTablestore:
    """A real embedded store: puts, updates, deletes over 40 keys, two splits and a merge."""
    rng = random.Random(seed)
    store = LocalTablestore(path)
    store.create_table("t", primary_key=[("id", "INTEGER")],
                       columns=[("name", "STRING"), ("qty", "INTEGER")], channels=2)
    for i in range(changes):
        if i in (changes // 4, changes // 2):
            store.split_channel("t", [c for c in store.list_channels("t") if not c.closed][0]
                                .channel_id)
        if i == 3 * changes // 4:
            children = sorted((c for c in store.list_channels("t") if not c.closed
                               and c.parent_ids), key=lambda c: c.range_lo)
            a, b = next((a, b) for a, b in zip(children, children[1:], strict=False)
                        if a.range_hi == b.range_lo)
            store.merge_channels("t", a.channel_id, b.channel_id)
        key = {"id": rng.randrange(40)}
        roll = rng.random()
        if roll < 0.2:
            store.delete_row("t", key)
        elif roll < 0.55:
            store.update_row("t", key, {"qty": i} if i % 2 else {"qty": i, "name": None})
        else:
            store.put_row("t", key, {"name": f"n{i}", "qty": i})
    return store


def source_batches(store: LocalTablestore, size: int) -> list[pa.Table]:
    """The change log as the source delivers it (``records_to_page`` per channel, plus
    ``_channel_id``), cut into batches of ``size`` changes in log order, rows shuffled."""
    layout = PageLayout.of_table(store.table_schema("t"))
    log = store.change_log("t")
    pages = []
    for start in range(0, len(log), size):
        chunk = log[start:start + size]
        parts = []
        for channel in dict.fromkeys(r.channel_id for r in chunk):
            page = pa.Table.from_batches([records_to_page(
                [r for r in chunk if r.channel_id == channel], layout)])
            parts.append(page.append_column(pa.field("_channel_id", pa.string(), False),
                                            pa.array([channel] * page.num_rows)))
        table = pa.concat_tables(parts).select(SCHEMA.names)
        order = list(range(table.num_rows))
        random.Random(start).shuffle(order)
        pages.append(table.take(order))
    return pages


#: two tables of a store, one with an INTEGER key and one with a STRING key (the object-store
#: tests: ``{table: (key column, type)}``)
TWO_KEYS = {"ints": ("id", "INTEGER"), "names": ("k", "STRING")}


def two_keys_key(table: str, i: int) -> Any:
    """Key ``i`` of ``TWO_KEYS``'s ``table``."""
    return i if TWO_KEYS[table][1] == "INTEGER" else f"name-{i:05d}"


def write_two_keys(store: LocalTablestore, start: int, count: int) -> None:
    """Puts of keys ``start``.., then updates and deletes of earlier keys, in both tables."""
    for table, (column, _) in TWO_KEYS.items():
        for i in range(start, start + count):
            store.put_row(table, {column: two_keys_key(table, i)}, {"v": i, "note": f"n{i}"})
            if i % 5 == 0 and i > start:
                store.update_row(table, {column: two_keys_key(table, i - 3)}, {"v": -i})
            if i % 7 == 0 and i > start:
                store.delete_row(table, {column: two_keys_key(table, i - 6)})


def two_keys_store(path: Path) -> LocalTablestore:
    """An embedded store at ``path`` with ``TWO_KEYS``'s tables (columns ``v``, ``note``; two
    channels each), empty."""
    store = LocalTablestore(path)
    for table, (column, kind) in TWO_KEYS.items():
        store.create_table(table, primary_key=[(column, kind)],
                           columns=[("v", "INTEGER"), ("note", "STRING")], channels=2)
    return store


def upserts(plan: ApplyPlan) -> list[dict[str, Any]]:
    """A plan's upserted rows as Python values."""
    return plan.upsert_table.to_pylist()


def deletes(plan: ApplyPlan) -> list[tuple[Any, ...]]:
    """A plan's deleted (or, soft deletes, only flagged) keys as Python values."""
    return [tuple(row.values()) for row in plan.delete_keys.to_pylist()]


def closes(plan: ApplyPlan) -> dict[tuple[Any, ...], dt.datetime]:
    """A plan's (SCD 2) touched keys and the time their open version ends."""
    return {tuple(v for k, v in row.items() if k != CLOSE_AT): row[CLOSE_AT]
            for row in plan.close_table.to_pylist()}
