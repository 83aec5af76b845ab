"""One table's reconciliation, start to end (the CLI's process; also a Python API).

``reconcile_table`` pins the target's version and reads how far the stream applied it, compares
the source with it (``compare``), and, when they differ, reads the change stream after the
applied position (``inflight``) to label the differences still in flight. The order matters:
the target is pinned before the source is scanned, and the change stream read after, so a row
the scan saw change is always among the changes read. ``key_from`` / ``key_to`` (a
re-snapshot's range on the first key column) limit both reads to that range.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cdc_common.uris import redact_uri
from tablestore_cdc.reconcile.compare import Comparison, Progress, compare
from tablestore_cdc.reconcile.inflight import WAIT_DEADLINE_S, InFlight, in_flight_keys
from tablestore_cdc.reconcile.keyrange import KeyRange
from tablestore_cdc.reconcile.layout import CompareLayout
from tablestore_cdc.reconcile.source import SourceSpec, open_source_table
from tablestore_cdc.reconcile.target import open_target_table

KINDS = ("MISSING", "EXTRA", "DIFFERENT")


@dataclass
class TableReport:
    """The outcome for one source/target pair."""

    table: str
    source: str
    target: str
    target_version: str
    scd: int
    comparison: Comparison
    in_flight: InFlight | None
    seconds: float
    key_columns: tuple[str, ...] = ()
    #: the compared attribute columns
    columns: list[str] = field(default_factory=list)
    #: the key range compared (None: the whole table)
    span: KeyRange | None = None

    def counts(self) -> dict[str, int]:
        """Differences by kind (not in flight), and ``IN-FLIGHT``."""
        out = dict.fromkeys((*KINDS, "IN-FLIGHT"), 0)
        for d in self.comparison.differences:
            out[d.label] += 1
        return out

    @property
    def ok(self) -> bool:
        """No difference, or only differences in flight."""
        return all(d.in_flight for d in self.comparison.differences)


def reconcile_table(spec: SourceSpec, target_uri: str, *, soft_delete_column: str | None = None,
                    ignore: Iterable[str] = (), in_flight: bool = True,
                    progress: Progress | None = None, key_from: Any = None,
                    key_to: Any = None,
                    target_options: Mapping[str, str] | None = None,
                    wait_s: float = WAIT_DEADLINE_S) -> TableReport:
    """Compare ``spec``'s table with the table at ``target_uri`` (module docstring), only the
    keys whose first column is in ``[key_from, key_to)`` when either is given;
    ``target_options``: replicate's ``--target-option``s; ``wait_s``: how long the in-flight
    read waits for a channel in WAIT (``inflight.in_flight_keys``). Raises the product's
    errors for a bad source, target or option."""
    started = time.monotonic()
    options = spec.source_options()
    target = open_target_table(target_uri, soft_delete_column, target_options)
    applied = target.applied() if in_flight else None
    with open_source_table(spec) as source:
        layout = CompareLayout.build(source.schema, target.schema,
                                     soft_delete_column=soft_delete_column, ignore=ignore,
                                     target_name=redact_uri(target_uri))
        span = (None if key_from is None and key_to is None
                else KeyRange(layout.key_columns[0], key_from, key_to))
        comparison = compare(source, target, layout, progress, span=span)
        shown = source.shown
    found: InFlight | None = None
    if in_flight and comparison.differences:
        found = in_flight_keys(options, applied, (d.key for d in comparison.differences),
                               progress, wait_s)
        for d in comparison.differences:
            d.in_flight = d.key in found.changed
    return TableReport(table=spec.table, source=shown, target=redact_uri(target_uri),
                       target_version=target.version, scd=target.scd, comparison=comparison,
                       in_flight=found, seconds=time.monotonic() - started,
                       key_columns=layout.key_columns, columns=[n for n, _ in layout.value_columns],
                       span=span)


def as_json(report: TableReport, limit: int) -> dict[str, Any]:
    """The report as ``--json`` prints it (the first ``limit`` differences listed)."""
    c = report.comparison
    listed = sorted(c.differences,
                    key=lambda d: (d.in_flight, d.kind, tuple(map(repr, d.key))))[:limit]
    return {
        "table": report.table, "source": report.source, "target": report.target,
        "target_version": report.target_version, "scd": report.scd, "ok": report.ok,
        "rows": {"source": c.source_rows, "target": c.target_rows},
        "unequal_buckets": c.unequal_buckets, "rows_compared_by_key": c.drill_rows,
        "rereads": c.rounds,
        "differences": report.counts(),
        "in_flight": None if report.in_flight is None else {
            "determined": report.in_flight.determined, "note": report.in_flight.note,
            "position": report.in_flight.position},
        "listed": [{"label": d.label, "kind": d.kind, "in_flight": d.in_flight,
                    "key": json_value(dict(zip(report.key_columns, d.key, strict=True))),
                    "columns": d.columns,
                    "source": json_value(d.source), "target": json_value(d.target),
                    **({"note": d.note} if d.note else {})} for d in listed],
        "seconds": round(report.seconds, 3),
    }


def json_value(value: Any) -> Any:
    """``value`` as JSON can carry it: bytes as ``{"$binary": base64}``, times as ISO-8601."""
    import base64
    import datetime as dt

    if isinstance(value, bytes):
        return {"$binary": base64.b64encode(value).decode()}
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    if isinstance(value, float) and value != value:
        return "NaN"
    return value
