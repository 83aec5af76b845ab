"""What one micro-batch does to a target table, whatever its format (driver, plain Python).

The Delta and Iceberg sinks (``delta.py``, ``iceberg.py``) call ``plan_batch`` with the batch
as an Arrow table and the target's current schema; they turn the returned ``ApplyPlan`` into
one commit of their format. Three steps, one function each:

1. ``ordered_changes``: each key's changes in the source's order. Within a channel that is
   ``_sequence`` order (``_sequence`` is not comparable across channels). A key moves to another
   channel only when its channel splits or merges, and the source reads a parent to its end
   before any record of its children, so every change of a key in the parent was committed
   before any in the child: a key's channels are ordered by the commit time of their first
   change (then of their last; the channel id breaks an exact tie). Fed straight from the
   source a batch holds one channel per key (docs/schema.md, "Order"); a batch read back from
   a change log (``tablestore-cdc replicate``) may span a split, and this rule orders it.
2. ``drift.plan_layout``: the target's columns after this batch under the schema-drift policy.
   Attributes the reader's schema does not declare arrive in ``_extra`` (JSON); with the
   declared attribute columns they make a change's *image*. Each image value goes into its
   column when it fits (widening the column or adding one where the policy and the format
   allow), else into the target's ``_extra`` or, under the strict policies, fails the batch.
3. ``reduce_scd1`` / ``reduce_scd2``: SCD type 1 keeps each key's final image (or its delete);
   SCD type 2 keeps every version, valid from its change's commit time (``__START_AT``) to the
   next change's (``__END_AT``, null while current), as Spark's auto-CDC flows name them; a
   delete ends the current version and opens none.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, NamedTuple

import pyarrow as pa

from tablestore_cdc.lakehouse.drift import (
    DEFAULT_POLICY,
    EVOLVE,
    EXCEPTION,
    EXTRA_COLUMN,
    IGNORE,
    TIMESTAMP,
    Promotions,
    TargetLayout,
    as_stored,
    canonical_policy,
    fits,
    no_promotions,
    plan_layout,
)
from tablestore_cdc.lakehouse.errors import ApplyOptionError, ChangeBatchError

#: the source's metadata columns (docs/schema.md); never target columns
META_COLUMNS = ("_op", "_channel_id", "_sequence", "_commit_ts", "_before", "_extra")
REQUIRED_META = ("_op", "_channel_id", "_sequence", "_commit_ts")
#: SCD type 2 validity columns, named as Spark's auto-CDC flows (``create_auto_cdc_flow``) name them
START_AT = "__START_AT"
END_AT = "__END_AT"

Key = tuple[Any, ...]


@dataclass(frozen=True)
class ApplyOptions:
    """How changes are applied; shared by every target.

    ``key_columns``: the table's primary key (the source marks them non-nullable, see
    ``key_columns_of``). ``scd``: 1 (current state) or 2 (history). ``schema_drift``: one of
    ``drift.POLICIES`` or an alias (stored as the policy it stands for). ``widen_to_string``:
    any value fits a string column, as its text. ``soft_delete_column`` (SCD 1 only): a DELETE
    sets this boolean column to true and keeps the row instead of removing it."""

    key_columns: tuple[str, ...]
    scd: int = 1
    schema_drift: str = DEFAULT_POLICY
    soft_delete_column: str | None = None
    widen_to_string: bool = False

    def __post_init__(self) -> None:
        if not self.key_columns:
            raise ApplyOptionError(option="key_columns", value=self.key_columns,
                                   problem="no key column", allowed="the table's primary key")
        if self.scd not in (1, 2):
            raise ApplyOptionError(option="scd", value=self.scd, problem="unknown SCD type",
                                   allowed="1 (current state) or 2 (history)")
        object.__setattr__(self, "schema_drift", canonical_policy(self.schema_drift))
        if self.soft_delete_column is not None:
            if self.scd == 2:
                raise ApplyOptionError(
                    option="soft_delete_column", value=self.soft_delete_column,
                    problem="SCD type 2 already keeps deleted rows (a delete ends the current "
                    "version)", allowed="no soft-delete column with scd=2")
            reserved = {*self.key_columns, *META_COLUMNS, START_AT, END_AT}
            if self.soft_delete_column in reserved:
                raise ApplyOptionError(option="soft_delete_column",
                                       value=self.soft_delete_column,
                                       problem="the name is taken by a key or system column",
                                       allowed="a new column name, e.g. _deleted")

    def system_fields(self) -> list[pa.Field]:
        """Columns the sink adds after the table's own: soft-delete flag or SCD2 validity."""
        if self.scd == 2:
            return [pa.field(START_AT, TIMESTAMP), pa.field(END_AT, TIMESTAMP)]
        if self.soft_delete_column:
            return [pa.field(self.soft_delete_column, pa.bool_())]
        return []


def key_columns_of(schema: pa.Schema | Any) -> tuple[str, ...]:
    """The key columns of a change schema (Arrow or Spark): the non-nullable non-metadata
    columns, as ``connector.schema.output_schema`` declares them."""
    fields = list(schema)
    return tuple(f.name for f in fields if not f.nullable and f.name not in META_COLUMNS)


# --- 1. order ------------------------------------------------------------------------------------


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


# --- 2. the target's columns (schema drift: drift.py) ------------------------------------------


def initial_schema(declared: pa.Schema, options: ApplyOptions) -> pa.Schema:
    """The schema of a new target: the batch's key and declared attribute columns, then
    ``_extra`` (``ignore``) and the system columns."""
    fields = [_normal_field(declared.field(k), nullable=False) for k in options.key_columns]
    fields += [_normal_field(f, nullable=True) for f in declared
               if f.name not in META_COLUMNS and f.name not in options.key_columns]
    if options.schema_drift == IGNORE:
        fields.append(pa.field(EXTRA_COLUMN, pa.string()))
    return pa.schema(fields + options.system_fields())


def _normal_field(f: pa.Field, nullable: bool) -> pa.Field:
    typ = TIMESTAMP if pa.types.is_timestamp(f.type) else f.type
    return pa.field(f.name, typ, nullable=nullable)


def _from_json(value: Any) -> Any:
    """A value of ``_extra`` as Python: ``{"$binary": b64}`` is bytes; nested values stay JSON."""
    if isinstance(value, dict):
        if set(value) == {"$binary"}:
            return base64.b64decode(value["$binary"])
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    if isinstance(value, list):
        return json.dumps(value, separators=(",", ":"))
    return value


# --- 3. reduce -------------------------------------------------------------------------------


@dataclass
class ApplyPlan:
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
               table: str, promotions: Promotions = no_promotions) -> ApplyPlan:
    """The whole plan for one batch (``target`` None: the table does not exist yet).
    ``promotions``: the type widenings the target's format makes in place (drift.py)."""
    changes = read_changes(batch, options.key_columns)
    schema = target if target is not None else initial_schema(batch.schema, options)
    images = ((c.image, c.channel_id, c.sequence) for c in sorted(
        changes, key=lambda c: (_ts(c), c.channel_id, c.sequence)))
    # a new table is made with the first batch's attributes (under ignore: into _extra)
    creating = target is None and options.schema_drift == EXCEPTION
    layout = plan_layout(schema, batch.schema, images, dataclasses.replace(
        options, schema_drift=EVOLVE) if creating else options, table, promotions)
    if target is None:  # a new table is created with its columns, not evolved into them
        layout = TargetLayout(layout.schema, [], {}, layout.widen_to_string, layout.checked)
    by_key = ordered_changes(changes)
    plan = ApplyPlan(layout=layout, changes=len(changes))
    if options.scd == 2:
        reduce_scd2(by_key, options, plan)
    else:
        reduce_scd1(by_key, options, plan)
    return plan


def reduce_scd1(by_key: Mapping[Key, list[Change]], options: ApplyOptions,
                plan: ApplyPlan) -> None:
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
                plan: ApplyPlan) -> None:
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


def _row(key: Key, image: Mapping[str, Any], options: ApplyOptions, plan: ApplyPlan,
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
    from connector.schema import to_json

    return to_json(dict(values)) or ""


def to_arrow(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Plan rows as an Arrow table of the target's schema (missing columns are null)."""
    return pa.Table.from_pylist(rows, schema=schema)
