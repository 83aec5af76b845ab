"""Schema drift on the target side: which value goes where (driver, called by
``plan.plan_batch``), under the policies and the type lattice the source shares
(``cdc_common.schema_change``: defined there once).

Tablestore attributes have no declared type: the same attribute may hold an INTEGER in one row
and a STRING in the next, and new attributes appear whenever an application writes one. The
sink decides per **value** where it is stored, under one policy named as Flink CDC names its
``schema.change.behavior`` (docs/lakehouse.md, "Schema drift"):

- ``exception`` (alias ``fail``): the target never changes; a new attribute or a value that does
  not fit its column fails the batch with a typed error, nothing committed;
- ``evolve`` (alias ``add``): new attributes become new nullable columns, a column is widened
  along the lattice below where the target format can do it; anything else fails the batch;
- ``try_evolve``: as ``evolve``, but a value the target cannot take is kept in ``_extra``;
- ``lenient`` (the default): the same as ``try_evolve`` here (Flink's two differ in how
  dropped and renamed columns are sent, which a schemaless source never emits);
- ``ignore`` (alias ``keep``): the target's columns never change; new attributes and values
  that do not fit are kept in ``_extra``.

**The lattice** (``cdc_common.schema_change``): lossless widening only; an integer value
goes into a double column up to 2^53, anything into a string column only with
``widen_to_string=True``. Widening a column is a metadata change only where the format has
it: Iceberg's type promotion (int -> long, float -> double); delta-rs (deltalake 1.6.6) has no
type widening, so a Delta column keeps its type and a value that needs a wider one is handled
as "does not fit".
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pyarrow as pa

from cdc_common.schema_change import (
    EXCEPTION,
    POLICIES_ALLOWED,
    adds_columns,
    fits,
    is_string,
    join,
    keeps_misfits,
    natural_type,
    policy_named,
    promotion,
    type_fits,
    type_name,
)
from tablestore_cdc.lakehouse.errors import (
    ApplyOptionError,
    ColumnTypeConflictError,
    SchemaDriftError,
)

#: a target format's metadata-only widenings: (column type, wider type) -> allowed
Promotions = Callable[[pa.DataType, pa.DataType], bool]


def canonical_policy(name: str) -> str:
    """The policy ``name`` stands for (an alias resolved); ``ApplyOptionError`` if unknown."""
    policy = policy_named(name)
    if policy is None:
        raise ApplyOptionError(option="schema_drift", value=name, problem="unknown policy",
                               allowed=POLICIES_ALLOWED)
    return policy


def no_promotions(column: pa.DataType, wider: pa.DataType) -> bool:
    """A format without metadata-only type widening (delta-rs)."""
    return False


def iceberg_promotions(column: pa.DataType, wider: pa.DataType) -> bool:
    """Iceberg's type promotions that the lattice uses: int -> long, float -> double (int8 and
    int16 are int in Iceberg)."""
    return ((pa.types.is_integer(column) and column.bit_width <= 32 and wider == pa.int64())
            or (column == pa.float32() and wider == pa.float64()))


def as_stored(value: Any, typ: pa.DataType) -> Any:
    """``value`` as the column of ``typ`` stores it: its text in a string column (only reached
    with ``widen_to_string``), else unchanged."""
    if not is_string(typ) or value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    return repr(value) if isinstance(value, float) else str(value)


# --- the target's columns after a batch --------------------------------------------------------

#: the target's column of values that have no column they fit (typed JSON)
EXTRA_COLUMN = "_extra"


@dataclass
class TargetLayout:
    """The target's schema after this batch and what the batch changes in it."""

    schema: pa.Schema
    added: list[pa.Field] = field(default_factory=list)
    #: column -> (its type before, its type after this batch)
    promoted: dict[str, tuple[pa.DataType, pa.DataType]] = field(default_factory=dict)
    widen_to_string: bool = False
    #: columns whose every value in this batch fits by the batch's declared type
    checked: frozenset[str] = frozenset()

    @functools.cached_property
    def types(self) -> dict[str, pa.DataType]:
        """Columns an image may fill (every column but ``_extra``) and their types."""
        return {f.name: f.type for f in self.schema if f.name != EXTRA_COLUMN}

    @property
    def keeps_extra(self) -> bool:
        """Whether the target has an ``_extra`` column (every row then sets it)."""
        return EXTRA_COLUMN in self.schema.names

    def schema_changes(self) -> list[str]:
        """What the batch changes in the target's schema, one line each (recorded in the
        target's history, logged, and in ``ApplyResult.schema_changes``)."""
        return ([f"add column {f.name} {f.type}" for f in self.added]
                + [f"widen column {name} {old} -> {new}"
                   for name, (old, new) in self.promoted.items()])


class Drift(NamedTuple):
    """A value of an image as the layout sees it: which change carried it."""

    value: Any
    channel_id: str
    sequence: str


def plan_layout(target: pa.Schema, declared: pa.Schema, images: Iterable[tuple[
        Mapping[str, Any], str, str]], options: Any, table: str,
        promotions: Promotions = no_promotions) -> TargetLayout:
    """The target's columns after this batch under ``options.schema_drift`` (module doc).

    ``images``: each change's image with its channel and sequence, in a deterministic order
    (a replay plans the same layout). Raises ``SchemaDriftError`` / ``ColumnTypeConflictError``
    when a value fits nowhere under the policy."""
    policy, wide = options.schema_drift, options.widen_to_string
    known = {f.name: f.type for f in target}
    types = dict(known)
    promoted: dict[str, tuple[pa.DataType, pa.DataType]] = {}
    checked = frozenset(f.name for f in declared if f.name in known and type_fits(
        f.type, known[f.name], wide))
    new_values: dict[str, list[Drift]] = {}
    misfits = False
    for image, channel_id, sequence in images:
        for name, value in image.items():
            if value is None or name in checked or name in options.key_columns:
                continue
            if name not in known:
                if policy == EXCEPTION:
                    raise SchemaDriftError(table=table, channel_id=channel_id,
                                           sequence=sequence, columns=sorted(
                                               k for k, v in image.items()
                                               if k not in known and v is not None))
                if adds_columns(policy):
                    new_values.setdefault(name, []).append(Drift(value, channel_id, sequence))
                else:
                    misfits = True
                continue
            if fits(value, types[name], wide):
                continue
            wider = promotion(value, types[name]) if adds_columns(policy) else None
            if wider is not None and promotions(known[name], wider):
                types[name] = wider
                promoted[name] = (known[name], wider)
            elif keeps_misfits(policy):
                misfits = True
            else:
                raise conflict(table, name, types[name], Drift(value, channel_id, sequence),
                               policy, wider is not None)
    added = []
    for name, values in new_values.items():
        kinds = list(dict.fromkeys(natural_type(d.value) for d in values))
        typ = join(kinds) or (pa.string() if wide else kinds[0])
        for drift in values:
            if not fits(drift.value, typ, wide):
                if not keeps_misfits(policy):
                    raise conflict(table, name, typ, drift, policy, False)
                misfits = True
        added.append(pa.field(name, typ))
    if misfits and EXTRA_COLUMN not in known:
        added.append(pa.field(EXTRA_COLUMN, pa.string()))
    schema = pa.schema([pa.field(f.name, types[f.name], f.nullable, f.metadata)
                        for f in target] + added)
    return TargetLayout(schema, added, promoted, wide, checked)


def conflict(table: str, column: str, typ: pa.DataType, drift: Drift, policy: str,
             format_limit: bool) -> ColumnTypeConflictError:
    why = ("the target format cannot widen the column in place" if format_limit
           else "no lossless widening holds both")
    return ColumnTypeConflictError(table=table, column=column, column_type=str(typ),
                                   value_type=type_name(drift.value), value=drift.value,
                                   channel_id=drift.channel_id, sequence=drift.sequence,
                                   policy=policy, why=why)
