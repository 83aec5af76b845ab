"""Per-table settings of a multi-table pipeline from a TOML file (``replicate --config``).

Read on the driver before Spark starts (``load_table_config``), validated with pydantic; an
error names the file, the table and the key (``TableConfigError``). The file::

    [defaults]                     # every table
    schema_drift = "lenient"

    [tables.orders]                # one table, over the defaults
    scd = 2
    target = "iceberg:///wh?table=cdc.orders"

    [tables.events]
    keys = ["device", "ts"]
    schema_drift = "exception"
    soft_delete_column = "deleted"
    snapshot_op = "READ"
    max_offsets_per_trigger = 50000

Keys: ``scd`` (1 or 2), ``schema_drift``, ``soft_delete_column``, ``target`` (a URI; may hold
``{table}``), ``keys`` (the target's key columns, when they differ from the source's primary
key), ``snapshot_op`` (the source's ``snapshot.op`` for the table), and the table's read
limits ``max_offsets_per_trigger``, ``max_bytes_per_trigger``, ``max_offsets_per_channel`` (the
source's ``maxOffsetsPerTrigger``, ``maxBytesPerTrigger``, ``maxOffsetsPerChannel``, for that
table alone in a multi-table query). Precedence, lowest first:
the command's defaults, ``[defaults]``, ``[tables.NAME]``, and a flag given on the command
line (``TableConfig.for_table``).

``schema_drift`` is the policy of the source and of the target alike, as ``replicate --table``
has it (Flink CDC's ``schema.change.behavior``): ``TableConfig.source_options`` turns each
table's ``schema_drift``, ``snapshot_op`` and read limits into the multi-table source's options
(for every table from ``[defaults]``, ``tables.options`` for the tables whose own differ),
unless ``--option`` names the source option itself.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cdc_common.errors import CdcError
from tablestore_cdc.pipeline.queries import ApplySettings


class TableConfigError(CdcError):
    """The per-table settings file cannot be used."""

    template = "config {path}: {where}{problem}"


class TableSettings(BaseModel):
    """The settings of one table (or ``[defaults]``); ``None``: not set here."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scd: Literal[1, 2] | None = None
    schema_drift: Literal["lenient", "try_evolve", "evolve", "exception", "ignore", "fail",
                          "add", "keep"] | None = None
    soft_delete_column: str | None = Field(default=None, min_length=1)
    target: str | None = Field(default=None, min_length=1)
    #: the target's storage options or catalog properties (``--target-option``)
    target_options: dict[str, str] | None = None
    keys: tuple[str, ...] | None = Field(default=None, min_length=1)
    snapshot_op: Literal["PUT", "READ"] | None = None
    max_offsets_per_trigger: int | None = Field(default=None, ge=1)
    max_bytes_per_trigger: int | None = Field(default=None, ge=1)
    max_offsets_per_channel: int | None = Field(default=None, ge=1)


#: the multi-table source's option each setting of the source side sets
SOURCE_OPTION_OF = {"schema_drift": "schema.change.behavior", "snapshot_op": "snapshot.op",
                    "max_offsets_per_trigger": "maxOffsetsPerTrigger",
                    "max_bytes_per_trigger": "maxBytesPerTrigger",
                    "max_offsets_per_channel": "maxOffsetsPerChannel"}
#: the settings only the source reads (``schema_drift`` is the target's policy too)
SOURCE_ONLY = frozenset(SOURCE_OPTION_OF) - {"schema_drift"}


class TableConfig(BaseModel):
    """The whole file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    defaults: TableSettings = TableSettings()
    tables: dict[str, TableSettings] = {}

    def for_table(self, table: str, base: ApplySettings, given: frozenset[str] = frozenset()
                  ) -> tuple[ApplySettings, tuple[str, ...] | None]:
        """``table``'s apply settings and key override: ``base`` (the command's), then
        ``[defaults]``, then ``[tables.TABLE]``, then the fields of ``base`` named in
        ``given`` (flags given on the command line) again."""
        settings = base
        keys = None
        for layer in (self.defaults, self.tables.get(table, TableSettings())):
            values = {k: v for k, v in layer.model_dump().items() if v is not None}
            keys = values.pop("keys", keys)
            for name in SOURCE_ONLY:  # the source's (``source_options``)
                values.pop(name, None)
            settings = dataclasses.replace(settings, **{k: v for k, v in values.items()
                                                        if k not in given})
        return settings, keys

    def source_options(self, options: dict[str, str], base: ApplySettings,
                       given: frozenset[str] = frozenset()) -> dict[str, str]:
        """The multi-table source's options (driver, before Spark starts): ``options`` (the
        ``--option`` values, which win), with ``schema.change.behavior`` and ``snapshot.op``
        from ``[defaults]`` (over ``base``, under the flags named in ``given``) and, in
        ``tables.options``, each ``[tables.NAME]``'s own where it differs."""
        named = {k.lower() for k in options}
        out = dict(options)

        def source_values(table: str | None) -> dict[str, str]:
            layers = [self.defaults] + ([self.tables[table]] if table is not None else [])
            values = {"schema_drift": base.schema_drift}
            for layer in layers:
                values.update({k: v for k, v in layer.model_dump(include=set(SOURCE_OPTION_OF))
                               .items() if v is not None and k not in given})
            return {SOURCE_OPTION_OF[k]: str(v) for k, v in values.items()
                    if SOURCE_OPTION_OF[k].lower() not in named}

        shared = source_values(None)
        out.update(shared)
        own = {table: {k: v for k, v in source_values(table).items() if shared.get(k) != v}
               for table in sorted(self.tables)}
        if any(own.values()) and "tables.options" not in named:
            out["tables.options"] = json.dumps({t: o for t, o in own.items() if o},
                                               separators=(",", ":"))
        return out


def load_table_config(path: Path) -> TableConfig:
    """Read and validate ``path`` (driver); ``TableConfigError`` naming the table and key."""
    try:
        raw: dict[str, Any] = tomllib.loads(path.read_text())
    except OSError as exc:
        raise TableConfigError(path=path, where="", problem=f"cannot be read ({exc.strerror})"
                               ) from None
    except tomllib.TOMLDecodeError as exc:
        raise TableConfigError(path=path, where="", problem=f"is not TOML ({exc})") from None
    try:
        return TableConfig.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = [str(p) for p in error["loc"]]
        if loc[:1] == ["tables"] and len(loc) >= 2:
            where = f"table {loc[1]!r}: " + (f"key {loc[2]!r}: " if len(loc) > 2 else "")
        elif loc[:1] == ["defaults"] and len(loc) >= 2:
            where = f"[defaults]: key {loc[1]!r}: "
        else:
            where = f"key {'.'.join(loc)!r}: " if loc else ""
        raise TableConfigError(path=path, where=where, problem=error["msg"]) from None
