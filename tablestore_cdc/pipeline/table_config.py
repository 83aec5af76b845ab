"""Per-table settings of a multi-table pipeline from a TOML file (``replicate --config``).

Read on the driver before Spark starts (``load_table_config``), validated with pydantic; an
error names the file, the table and the key (``TableConfigError``). The file's ``[defaults]``
and ``[tables.NAME]`` take the keys of ``TableSettings`` (an example and what each key means:
docs/multi-table.md, "Per-table settings"); ``replicate --column`` is ``columns`` from the
command line (``column_types``). Precedence, lowest first: the command's defaults,
``[defaults]``, ``[tables.NAME]``, and a flag given on the command line
(``TableConfig.for_table``).

``schema_drift`` is the policy of the source and of the target alike (Flink CDC's
``schema.change.behavior``): ``TableConfig.source_options`` turns each table's
``schema_drift``, ``snapshot_op``, ``columns`` and read limits into the multi-table source's
options (for every table from ``[defaults]``, ``tables.options`` for the tables whose own
differ), unless ``--option`` names the source option itself.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from cdc_common.errors import CdcError
from connector.option_values import CATALOG_TYPES
from tablestore_cdc.pipeline.queries import ApplySettings


class TableConfigError(CdcError):
    """The per-table settings file cannot be used."""

    template = "config {path}: {where}{problem}"


class ColumnTypeError(CdcError):
    """A ``replicate --column`` value that cannot be used (CLI process, before Spark)."""

    template = "option '--column': got {value!r}: {problem}; allowed: {allowed}"


#: what ``--column`` takes
COLUMN_ALLOWED = ("TABLE.COLUMN=TYPE (with --table: COLUMN=TYPE), TYPE one of "
                  + ", ".join(sorted(CATALOG_TYPES)))


def _column_type(column: str, typ: str) -> str:
    """``typ`` as a catalog type name (lower case); ``ValueError`` saying what is wrong."""
    if not column or column.startswith("_"):
        raise ValueError(f"column {column!r}: names starting with '_' (or empty) are the "
                         "source's own")
    name = typ.strip().lower()
    if name not in CATALOG_TYPES:
        raise ValueError(f"column {column!r}: type {typ!r} is not one of "
                         + ", ".join(sorted(CATALOG_TYPES)))
    return name


def column_types(specs: list[str] | None, table: str | None = None
                 ) -> dict[str, dict[str, str]]:
    """``replicate --column`` values -> {table: {column: type}} (CLI process, before Spark).
    ``TABLE.COLUMN=TYPE``; with ``table`` (``--table``) also ``COLUMN=TYPE``. A value that is
    neither, a column of another table than ``table``, or an unknown type: ``ColumnTypeError``
    (one line, exit 2, naming ``--column``)."""
    out: dict[str, dict[str, str]] = {}
    for spec in specs or []:
        name, sep, typ = spec.partition("=")
        owner, dot, column = name.strip().rpartition(".")
        if not dot and table is not None:
            owner = table
        if not sep or not owner or not column.strip():
            raise ColumnTypeError(value=spec, problem="not TABLE.COLUMN=TYPE",
                                  allowed=COLUMN_ALLOWED)
        if table is not None and owner != table:
            raise ColumnTypeError(value=spec, problem=f"names table {owner!r}, not --table "
                                  f"{table!r}", allowed=COLUMN_ALLOWED)
        try:
            out.setdefault(owner, {})[column.strip()] = _column_type(column.strip(), typ)
        except ValueError as exc:
            raise ColumnTypeError(value=spec, problem=str(exc), allowed=COLUMN_ALLOWED
                                  ) from None
    return out


def catalog_option(columns: dict[str, str]) -> str:
    """{column: type} as the source's ``catalog`` option (``connector.options``), the one
    mechanism that fixes a column's type in the change batch and so in the target."""
    return json.dumps({"columns": {c: {"type": t} for c, t in sorted(columns.items())}},
                      separators=(",", ":"))


class MaintenanceSettings(BaseModel):
    """A table's ``maintenance = {...}``: the job's own maintenance of its target
    (``lakehouse.upkeep.MaintenancePolicy``; ``enabled = false``: none); ``None``: not set."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    enabled: bool | None = None
    every_minutes: float | None = Field(default=None, ge=0)
    every_batches: int | None = Field(default=None, ge=1)
    compact_files: int | None = Field(default=None, ge=0)
    small_file_mb: float | None = Field(default=None, gt=0)
    keep_snapshots: int | None = Field(default=None, ge=1)
    expire_hours: float | None = Field(default=None, ge=0)
    vacuum_hours: float | None = Field(default=None, ge=1)
    vacuum_every_minutes: float | None = Field(default=None, ge=0)

    def over(self, policy: Any) -> Any:
        """``policy`` with the keys set here."""
        values = {k: v for k, v in self.model_dump().items() if v is not None}
        if "small_file_mb" in values:
            values["small_file_bytes"] = int(values.pop("small_file_mb") * (1 << 20))
        return dataclasses.replace(policy, **values)


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
    maintenance: MaintenanceSettings | None = None
    #: attribute columns of a fixed type (the source's ``catalog``): {column: type}
    columns: dict[str, str] | None = None

    @field_validator("columns")
    @classmethod
    def _columns(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return None
        return {column: _column_type(column, typ) for column, typ in value.items()}


#: the multi-table source's option each setting of the source side sets
SOURCE_OPTION_OF = {"schema_drift": "schema.change.behavior", "snapshot_op": "snapshot.op",
                    "max_offsets_per_trigger": "maxOffsetsPerTrigger",
                    "max_bytes_per_trigger": "maxBytesPerTrigger",
                    "max_offsets_per_channel": "maxOffsetsPerChannel",
                    "columns": "catalog"}
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
            if layer.maintenance is not None:
                values["maintenance"] = layer.maintenance.over(settings.maintenance)
            for name in SOURCE_ONLY:  # the source's (``source_options``)
                values.pop(name, None)
            settings = dataclasses.replace(settings, **{k: v for k, v in values.items()
                                                        if k not in given})
        return settings, keys

    def source_options(self, options: dict[str, str], base: ApplySettings,
                       given: frozenset[str] = frozenset(),
                       columns: dict[str, dict[str, str]] | None = None) -> dict[str, str]:
        """The multi-table source's options (driver, before Spark starts): ``options`` (the
        ``--option`` values, which win), with ``schema.change.behavior`` and ``snapshot.op``
        from ``[defaults]`` (over ``base``, under the flags named in ``given``) and, in
        ``tables.options``, each ``[tables.NAME]``'s own where it differs. ``columns``
        (``replicate --column``, ``column_types``): {table: {column: type}} over the file's
        ``columns``, as each table's ``catalog``."""
        named = {k.lower() for k in options}
        out = dict(options)
        flags = columns or {}

        def source_values(table: str | None) -> dict[str, str]:
            layers = [self.defaults] + ([self.tables.get(table, TableSettings())]
                                        if table is not None else [])
            values: dict[str, Any] = {"schema_drift": base.schema_drift}
            typed: dict[str, str] = {}
            for layer in layers:
                values.update({k: v for k, v in layer.model_dump(include=set(SOURCE_OPTION_OF))
                               .items() if v is not None and k not in given})
                typed.update(layer.columns or {})
            typed.update(flags.get(table, {}) if table is not None else {})
            values.pop("columns", None)
            if typed:
                values["columns"] = catalog_option(typed)
            return {SOURCE_OPTION_OF[k]: str(v) for k, v in values.items()
                    if SOURCE_OPTION_OF[k].lower() not in named}

        shared = source_values(None)
        out.update(shared)
        own = {table: {k: v for k, v in source_values(table).items() if shared.get(k) != v}
               for table in sorted(set(self.tables) | set(flags))}
        if any(own.values()) and "tables.options" not in named:
            out["tables.options"] = json.dumps({t: o for t, o in own.items() if o},
                                               separators=(",", ":"))
        return out


#: how deep a settings file may nest arrays, inline tables and tables (the file needs 3:
#: ``[tables.NAME]`` and a key): deeper, it is refused before ``tomllib`` parses it (whose
#: recursion a few thousand brackets exhaust)
MAX_SETTINGS_DEPTH = 64


def bracket_depth_exceeds(text: str, limit: int) -> bool:
    """Whether TOML ``text`` nests ``[``/``{`` deeper than ``limit``: one linear scan that
    skips strings (basic, literal, multi-line) and comments; no recursion, whatever the text."""
    depth, i, n = 0, 0, len(text)
    while i < n:
        c = text[i]
        if c == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end + 1
            continue
        if c in "\"'":
            quote = c * 3 if text.startswith(c * 3, i) else c
            i += len(quote)
            while i < n and not text.startswith(quote, i):
                if quote[0] == '"' and text[i] == "\\":
                    i += 1  # the escaped character
                elif len(quote) == 1 and text[i] == "\n":
                    break  # an unterminated one-line string: tomllib reports it
                i += 1
            i += len(quote)
            continue
        if c in "[{":
            depth += 1
            if depth > limit:
                return True
        elif c in "]}":
            depth -= 1
        i += 1
    return False


def _nesting_exceeds(value: Any, limit: int) -> bool:
    """Whether parsed TOML nests tables and arrays deeper than ``limit`` (dotted keys make
    tables without brackets): iterative, no recursion."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return False


#: the most digits Python converts to an int (``sys.get_int_max_str_digits``; 0: no limit)
_INT_DIGITS = sys.get_int_max_str_digits() or 4300
#: a run of more digits than that
_LONG_DIGITS = re.compile(rf"[0-9][0-9_]{{{_INT_DIGITS},}}")


def _too_long_integer(text: str) -> str:
    """Where the integer that is too long to convert is, for the error: its line and key."""
    found = _LONG_DIGITS.search(text)
    if found is None:
        return ""
    line_no = text.count("\n", 0, found.start()) + 1
    line = text[text.rfind("\n", 0, found.start()) + 1:found.start()]
    key = line.split("=", 1)[0].strip() if "=" in line else ""
    return f"line {line_no}: " + (f"key {key[:80]!r}: " if key else "")


def load_table_config(path: Path) -> TableConfig:
    """Read and validate ``path`` (driver); ``TableConfigError`` naming the table and key.

    Hostile files end in the same error: bytes that are not UTF-8 (naming the byte's offset),
    nesting past ``MAX_SETTINGS_DEPTH``, an integer of more digits than Python converts."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TableConfigError(path=path, where="", problem=f"cannot be read ({exc.strerror})"
                               ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TableConfigError(path=path, where="", problem=(
            f"is not UTF-8 text (byte 0x{data[exc.start]:02X} at offset {exc.start})")
            ) from None
    too_deep = TableConfigError(path=path, where="", problem=(
        f"nests arrays or tables deeper than {MAX_SETTINGS_DEPTH} levels"))
    if bracket_depth_exceeds(text, MAX_SETTINGS_DEPTH):
        raise too_deep
    try:
        raw: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TableConfigError(path=path, where="", problem=f"is not TOML ({exc})") from None
    except RecursionError:
        raise too_deep from None
    except ValueError as exc:  # int(): more digits than the int-str conversion limit
        raise TableConfigError(path=path, where=_too_long_integer(text), problem=(
            f"an integer of more than {_INT_DIGITS} digits (more than Python converts)"
            if "digits" in str(exc) else str(exc))) from None
    if _nesting_exceeds(raw, MAX_SETTINGS_DEPTH):
        raise too_deep
    try:
        return TableConfig.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = [str(p) for p in error["loc"]]
        if loc[:1] == ["tables"] and len(loc) >= 2:
            where = f"table {loc[1]!r}: " + (f"key {'.'.join(loc[2:])!r}: "
                                              if len(loc) > 2 else "")
        elif loc[:1] == ["defaults"] and len(loc) >= 2:
            where = f"[defaults]: key {'.'.join(loc[1:])!r}: "
        else:
            where = f"key {'.'.join(loc)!r}: " if loc else ""
        raise TableConfigError(path=path, where=where, problem=error["msg"]) from None
