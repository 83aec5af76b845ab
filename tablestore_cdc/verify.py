"""Exactly-once verification: compare what a sink delivered with the source's change log.

Used by the demo job, the tests and the fault-injection harness (one place for the rules; the
tests' own reads of a target's batches and SCD 2 history are ``testkit/target_reads.py``):

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
    return None if row is None else {k: v for k, v in row.items() if v is not None}


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


def row_attributes(row: Mapping[str, Any], key_columns: Sequence[str],
                   skip: Sequence[str] = ()) -> dict[str, Any]:
    """The attribute columns of an applied table's row: the key, ``skip``, the SCD 2 validity
    and nulls left out, ``_extra``'s typed JSON merged back."""
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
        state[key] = row_attributes(row, key_columns, (soft_delete_column or "",))
    return state
