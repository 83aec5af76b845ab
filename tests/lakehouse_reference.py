"""The apply sink's planning as it was before it went columnar: per change, with Python
objects (the reference ``tests/test_lakehouse_plan.py`` compares ``plan.plan_batch`` with).
It shares the options, the new table's schema and the layout decision (``drift.plan_layout``)
with the product, and orders, reduces and routes values one change at a time."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, NamedTuple

import pyarrow as pa

from cdc_common.schema_change import EVOLVE, EXCEPTION, fits
from connector.schema import to_json
from tablestore_cdc.lakehouse.changes import declared_columns
from tablestore_cdc.lakehouse.changes import from_json as _from_json
from tablestore_cdc.lakehouse.drift import (
    EXTRA_COLUMN,
    Promotions,
    TargetLayout,
    as_stored,
    no_promotions,
    plan_layout,
)
from tablestore_cdc.lakehouse.errors import ChangeBatchError
from tablestore_cdc.lakehouse.plan import (
    END_AT,
    META_COLUMNS,
    REQUIRED_META,
    START_AT,
    ApplyOptions,
    initial_schema,
)

Key = tuple[Any, ...]


class Change(NamedTuple):
    """One change of the batch: its key, where it came from and the row's image after it."""

    key: Key
    op: str
    channel_id: str
    sequence: str
    commit_ts: dt.datetime | None
    #: attribute columns after the change (declared columns and ``_extra``), {} for a DELETE
    image: Mapping[str, Any]
    #: the part of ``image`` that came from ``_extra`` (undeclared attributes)
    extra: Mapping[str, Any]

    @property
    def deleted(self) -> bool:
        return self.op == "DELETE"


def read_changes(batch: pa.Table, key_columns: Sequence[str]) -> list[Change]:
    """The batch's rows as ``Change`` records (any order)."""
    for name in (*key_columns, *REQUIRED_META):
        if name not in batch.column_names:
            raise ChangeBatchError(column=name)
    attributes = [n for n in batch.column_names if n not in META_COLUMNS and n not in key_columns]

    def column(name: str) -> list[Any]:
        return batch.column(name).to_pylist()

    keys = list(zip(*[column(k) for k in key_columns], strict=True))
    values = list(zip(*[column(a) for a in attributes], strict=True)) if attributes \
        else [()] * batch.num_rows
    extras = column("_extra") if "_extra" in batch.column_names else [None] * batch.num_rows
    changes = []
    for key, op, channel_id, sequence, commit_ts, row, extra_json in zip(
            keys, column("_op"), column("_channel_id"), column("_sequence"),
            column("_commit_ts"), values, extras, strict=True):
        image: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        if op != "DELETE":
            image = dict(zip(attributes, row, strict=True))
            if extra_json:
                extra = {k: _from_json(v) for k, v in json.loads(extra_json).items()}
                image.update(extra)
        changes.append(Change(key, op, channel_id, sequence, commit_ts, image, extra))
    return changes


def ordered_changes(changes: Iterable[Change]) -> dict[Key, list[Change]]:
    """Each key's changes in the source's order (the rule in the module docstring)."""
    by_key_channel: dict[Key, dict[str, list[Change]]] = defaultdict(lambda: defaultdict(list))
    for change in changes:
        by_key_channel[change.key][change.channel_id].append(change)
    by_sequence = attrgetter("sequence")
    ordered: dict[Key, list[Change]] = {}
    for key, channels in by_key_channel.items():
        runs = [sorted(run, key=by_sequence) for run in channels.values()]
        if len(runs) > 1:  # the key moved channels (a split or merge) within this batch
            runs.sort(key=lambda run: (_ts(run[0]), _ts(run[-1]), run[0].channel_id))
        ordered[key] = [change for run in runs for change in run]
    return ordered


def _ts(change: Change) -> dt.datetime:
    return change.commit_ts or dt.datetime.min.replace(tzinfo=dt.UTC)


@dataclass
class ReferencePlan:
    """One batch's effect on the target, as rows of ``layout.schema`` (dicts).

    SCD 1: ``upserts`` are final images (with the soft-delete flag when that option is on);
    ``deletes`` are keys to remove, or, with a soft-delete column, keys whose row is only
    flagged (their last image is not in this batch). SCD 2: ``upserts`` are new versions;
    ``closes`` maps a key to the time its open version ends (its first change here)."""

    layout: TargetLayout
    changes: int
    upserts: list[dict[str, Any]] = field(default_factory=list)
    deletes: list[Key] = field(default_factory=list)
    closes: dict[Key, dt.datetime] = field(default_factory=dict)
    #: values written into ``_extra`` because they fit no column (or, ``ignore``, have none)
    values_in_extra: int = 0

    def is_empty(self) -> bool:
        return not (self.upserts or self.deletes or self.closes or self.layout.added
                    or self.layout.promoted)


def plan_batch(batch: pa.Table, target: pa.Schema | None, options: ApplyOptions,
               table: str, promotions: Promotions = no_promotions) -> ReferencePlan:
    """The whole plan for one batch (``target`` None: the table does not exist yet).
    ``promotions``: the type widenings the target's format makes in place (drift.py)."""
    changes = read_changes(batch, options.key_columns)
    schema = target if target is not None else initial_schema(batch.schema, options)
    images = ((c.image, c.channel_id, c.sequence) for c in sorted(
        changes, key=lambda c: (_ts(c), c.channel_id, c.sequence)))
    # a new table is made with the first batch's attributes (under ignore: into _extra)
    creating = target is None and options.schema_drift == EXCEPTION
    declared = declared_columns(batch.schema, batch.column("_extra")
                                if "_extra" in batch.column_names else None)
    layout = plan_layout(schema, declared, images, dataclasses.replace(
        options, schema_drift=EVOLVE) if creating else options, table, promotions)
    if target is None:  # a new table is created with its columns, not evolved into them
        layout = TargetLayout(layout.schema, [], {}, layout.widen_to_string, layout.checked)
    by_key = ordered_changes(changes)
    plan = ReferencePlan(layout=layout, changes=len(changes))
    if options.scd == 2:
        reduce_scd2(by_key, options, plan)
    else:
        reduce_scd1(by_key, options, plan)
    return plan


def reduce_scd1(by_key: Mapping[Key, list[Change]], options: ApplyOptions,
                plan: ReferencePlan) -> None:
    flag = options.soft_delete_column
    for key, changes in by_key.items():
        last = changes[-1]
        if not last.deleted:
            plan.upserts.append(_row(key, last.image, options, plan,
                                     {flag: False} if flag else {}))
        elif flag is None:
            plan.deletes.append(key)
        else:
            images = [c for c in changes if not c.deleted]
            if images:  # the row's last image is in this batch: keep it, flagged
                plan.upserts.append(_row(key, images[-1].image, options, plan,
                                         {flag: True}))
            else:
                plan.deletes.append(key)


def reduce_scd2(by_key: Mapping[Key, list[Change]], options: ApplyOptions,
                plan: ReferencePlan) -> None:
    for key, changes in by_key.items():
        for change in changes:
            if change.commit_ts is None:
                raise ChangeBatchError(column="_commit_ts (null: SCD type 2 needs it)")
        plan.closes[key] = changes[0].commit_ts  # type: ignore[assignment]
        for change, following in zip(changes, [*changes[1:], None], strict=True):
            if change.deleted:
                continue
            plan.upserts.append(_row(key, change.image, options, plan, {
                START_AT: change.commit_ts,
                END_AT: following.commit_ts if following is not None else None}))


def _row(key: Key, image: Mapping[str, Any], options: ApplyOptions, plan: ReferencePlan,
         system: Mapping[str, Any]) -> dict[str, Any]:
    """A target row: the key, each image value in its column when it fits (drift.py), the
    others in ``_extra``, then the system columns."""
    layout = plan.layout
    row: dict[str, Any] = dict(zip(options.key_columns, key, strict=True))
    types, checked, wide = layout.types, layout.checked, layout.widen_to_string
    leftover = {}
    for name, value in image.items():
        if name in row or value is None:
            continue
        typ = types.get(name)
        if name in checked or (typ is not None and fits(value, typ, wide)):
            row[name] = as_stored(value, typ) if wide and typ is not None else value
        else:
            leftover[name] = value
    if layout.keeps_extra:
        row[EXTRA_COLUMN] = _extra_json(leftover) if leftover else None
        plan.values_in_extra += len(leftover)
    elif leftover:  # plan_layout adds _extra whenever a value needs it
        raise AssertionError(f"values {sorted(leftover)} have no column and no _extra")
    row.update(system)
    return row


def _extra_json(values: Mapping[str, Any]) -> str:
    return to_json(dict(values)) or ""


