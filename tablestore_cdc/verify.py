"""Exactly-once verification: compare what a sink delivered with the source's change log.

Used by the demo job, the tests and the fault-injection harness (one place for the rules):

- **lost / duplicated**: the multiset of delivered (``_channel_id``, ``_sequence``) pairs against
  the change log's;
- **per-key order**: for every primary key, the delivered changes, in delivery order, must be the
  source's changes in source order;
- **state**: the table materialized from the delivered changes must equal the source table.

Runs on the driver (or any process); plain Python, no Spark.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from connector.tunnel.base import Op, Record


def key_of(primary_key: Mapping[str, Any]) -> str:
    """A canonical string for a primary key (dict order and int/str types preserved)."""
    return json.dumps(dict(sorted(primary_key.items())), sort_keys=True, default=str)


@dataclass(frozen=True)
class Delivered:
    """One change as a sink received it. ``position`` orders deliveries (e.g. (batch id, row
    index)); ``after`` holds the row's attribute columns after the change (None for DELETE)."""

    channel_id: str
    sequence: str
    key: str
    op: str
    position: tuple[Any, ...] = ()
    after: Mapping[str, Any] | None = None


@dataclass
class Verification:
    expected: int
    delivered: int
    lost: int
    duplicated: int
    keys_out_of_order: int
    state_mismatches: int | None = None
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.lost == 0 and self.duplicated == 0 and self.keys_out_of_order == 0
                and not self.state_mismatches)

    def summary(self) -> str:
        state = ("" if self.state_mismatches is None
                 else f", state {'matches' if self.state_mismatches == 0 else 'DIFFERS'}"
                 f" ({self.state_mismatches} key(s) differ)")
        return (f"{self.expected} changes in the source, {self.delivered} delivered: "
                f"{self.lost} lost, {self.duplicated} duplicated, "
                f"{self.keys_out_of_order} key(s) out of order{state}")


def verify(
    change_log: Sequence[Record],
    delivered: Iterable[Delivered],
    source_rows: Mapping[str, Mapping[str, Any]] | None = None,
    check_order: bool = True,
) -> Verification:
    """Compare ``delivered`` with ``change_log`` (the source's records in write order).

    ``source_rows`` (key -> attribute columns of the live row) enables the state check.
    """
    deliveries = sorted(delivered, key=lambda d: d.position)
    expected_ids = Counter((r.channel_id, r.sequence) for r in change_log)
    got_ids = Counter((d.channel_id, d.sequence) for d in deliveries)
    lost = expected_ids - got_ids
    duplicated = got_ids - expected_ids
    examples = [f"lost {c}@{s}" for c, s in list(lost)[:3]]
    examples += [f"duplicated {c}@{s}" for c, s in list(duplicated)[:3]]

    out_of_order = 0
    if check_order:
        source_order: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for r in change_log:
            source_order[key_of(r.primary_key)].append((r.channel_id, r.sequence))
        delivered_order: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for d in deliveries:
            delivered_order[d.key].append((d.channel_id, d.sequence))
        for key, expected in source_order.items():
            if delivered_order.get(key, []) != expected:
                out_of_order += 1
                if len(examples) < 8:
                    examples.append(f"key {key}: order differs")

    mismatches = None
    if source_rows is not None:
        state = materialize(deliveries)
        keys = set(state) | set(source_rows)
        mismatches = sum(1 for k in keys if _normal(state.get(k)) != _normal(source_rows.get(k)))
    return Verification(
        expected=sum(expected_ids.values()), delivered=sum(got_ids.values()),
        lost=sum(lost.values()), duplicated=sum(duplicated.values()),
        keys_out_of_order=out_of_order, state_mismatches=mismatches, examples=examples,
    )


def materialize(deliveries: Iterable[Delivered]) -> dict[str, dict[str, Any]]:
    """Apply changes in delivery order: key -> attribute columns of the live row."""
    state: dict[str, dict[str, Any]] = {}
    for d in deliveries:
        if d.op == Op.DELETE.value:
            state.pop(d.key, None)
        else:
            state[d.key] = dict(d.after or {})
    return state


def _normal(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {k: v for k, v in row.items() if v is not None}


def rows_by_key(rows: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]
                ) -> dict[str, Mapping[str, Any]]:
    """(primary key, attribute columns) pairs -> the ``source_rows`` mapping of ``verify``."""
    return {key_of(pk): attrs for pk, attrs in rows}


# --- tables the apply sink writes (tablestore_cdc.lakehouse), read back on their own --------------
# Read with deltalake / pyiceberg directly, never through the sink's code, so a sink bug cannot
# hide behind a matching reader.

#: columns the apply sink adds to a table (SCD 2 validity; ``_extra`` is merged back)
SCD2_COLUMNS = ("__START_AT", "__END_AT")


def read_delta(path: str) -> list[dict[str, Any]]:
    """Every row of the Delta table at ``path`` (``deltalake``)."""
    from deltalake import DeltaTable

    return DeltaTable(path).to_pyarrow_table().to_pylist()


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


def _attributes(row: Mapping[str, Any], key_columns: Sequence[str],
                skip: Sequence[str] = ()) -> dict[str, Any]:
    attrs = {k: v for k, v in row.items() if k not in key_columns and k not in skip
             and k not in SCD2_COLUMNS and k != "_extra" and v is not None}
    if row.get("_extra"):
        attrs.update(json.loads(row["_extra"]))
    return attrs


def table_state(rows: Iterable[Mapping[str, Any]], key_columns: Sequence[str],
                soft_delete_column: str | None = None) -> dict[str, dict[str, Any]]:
    """key -> attribute columns of the live rows of an applied table: SCD 1 rows not flagged
    deleted, or SCD 2 open versions (``__END_AT`` null). Compare with ``rows_by_key``."""
    state: dict[str, dict[str, Any]] = {}
    for row in rows:
        if "__END_AT" in row and row["__END_AT"] is not None:
            continue
        if soft_delete_column and row.get(soft_delete_column):
            continue
        key = key_of({k: row[k] for k in key_columns})
        if key in state:
            raise AssertionError(f"key {key} has two live rows in the table")
        state[key] = _attributes(row, key_columns, (soft_delete_column or "",))
    return state


#: one SCD 2 version: (start, end or None, attribute columns), times in epoch microseconds
Version = tuple[int, int | None, dict[str, Any]]


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
             _attributes(row, key_columns)))
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


def _micros(value: Any) -> int:
    import datetime as dt

    return (value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
