"""A target the apply sink wrote, read back on its own by the tests, the benchmarks and the
fault harness: an Iceberg table's rows, the batches committed into a Delta or Iceberg table,
and the SCD 2 versions of a table against the versions its source's change log implies.

Read with deltalake / pyiceberg directly, never through the sink's code, so a sink bug cannot
hide behind a matching reader (the product's own reads, used by the demo too, are in
``tablestore_cdc.verify``). Runs in the test process; plain Python, no Spark.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from connector.tunnel.base import Record
from tablestore_cdc.verify import key_of, row_attributes

#: one SCD 2 version: (start, end or None, attribute columns), times in epoch microseconds
Version = tuple[int, int | None, dict[str, Any]]


def read_iceberg(catalog_properties: Mapping[str, str], identifier: str,
                 catalog_name: str = "tablestore_cdc") -> list[dict[str, Any]]:
    """Every row of an Iceberg table (``pyiceberg``: the catalog, then a full scan). The SQL
    catalog keeps tables per catalog name: the sink's default is ``tablestore_cdc``."""
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog(catalog_name, **catalog_properties)
    return catalog.load_table(identifier).scan().to_arrow().to_pylist()


def delta_batches(path: str) -> list[tuple[str, int]]:
    """(query id, batch id) of every batch's data commit of the Delta table at ``path``,
    oldest first, from its commit infos (``deltalake``): a batch applied twice shows twice."""
    from deltalake import DeltaTable

    from tablestore_cdc.lakehouse.delta import BATCH_ID_KEY, QUERY_ID_KEY

    return [(str(c[QUERY_ID_KEY]), int(c[BATCH_ID_KEY])) for c in reversed(
        DeltaTable(path).history()) if QUERY_ID_KEY in c and BATCH_ID_KEY in c]


def iceberg_batches(catalog_properties: Mapping[str, str], identifier: str,
                    catalog_name: str = "tablestore_cdc") -> list[tuple[str, int]]:
    """(query id, batch id) of every batch's snapshot of an Iceberg table, oldest first, from
    the snapshot summaries (``pyiceberg``)."""
    from pyiceberg.catalog import load_catalog

    from tablestore_cdc.lakehouse.iceberg import BATCH_ID_PROPERTY, QUERY_ID_PROPERTY

    table = load_catalog(catalog_name, **catalog_properties).load_table(identifier)
    summaries = [s.summary for s in table.metadata.snapshots]  # in commit order
    return [(str(s.get(QUERY_ID_PROPERTY)), int(str(s.get(BATCH_ID_PROPERTY))))
            for s in summaries if s is not None and s.get(QUERY_ID_PROPERTY) is not None]


def source_history(change_log: Sequence[Record]) -> dict[str, list[Version]]:
    """key -> the versions the change log implies: one per PUT/UPDATE, valid until the key's
    next change (open for the last one unless a DELETE ends it)."""
    by_key: dict[str, list[Record]] = defaultdict(list)
    for record in change_log:  # change_log: parents before children, each channel in order
        by_key[key_of(record.primary_key)].append(record)
    history: dict[str, list[Version]] = {}
    for key, records in by_key.items():
        versions = []
        for record, following in zip(records, [*records[1:], None], strict=True):
            after = record.after_image()
            if after is not None:
                versions.append((record.commit_ts_us,
                                 None if following is None else following.commit_ts_us,
                                 {k: v for k, v in after.items() if v is not None}))
        if versions:
            history[key] = versions
    return history


def table_history(rows: Iterable[Mapping[str, Any]], key_columns: Sequence[str]
                  ) -> dict[str, list[Version]]:
    """key -> the versions in an SCD 2 table, ordered like ``source_history``'s."""
    history: dict[str, list[Version]] = defaultdict(list)
    for row in rows:
        end = row["__END_AT"]
        history[key_of({k: row[k] for k in key_columns})].append(
            (_micros(row["__START_AT"]), None if end is None else _micros(end),
             row_attributes(row, key_columns)))
    return {k: sorted(v, key=_version_order) for k, v in history.items()}


def history_mismatches(source: Mapping[str, list[Version]],
                       table: Mapping[str, list[Version]]) -> list[str]:
    """Keys whose versions differ (compared in (start, end) order)."""
    return sorted(k for k in set(source) | set(table)
                  if sorted(source.get(k, []), key=_version_order) != table.get(k, []))


def _version_order(version: Version) -> tuple[int, float, str]:
    """(start, end, image): versions of one commit time (one atomic batch write touching a key
    twice) compare as a multiset."""
    return (version[0], float("inf") if version[1] is None else version[1],
            json.dumps(version[2], sort_keys=True, default=str))


def _micros(value: dt.datetime) -> int:
    return (value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
