"""The apply-changes sink's errors (driver): each names the option or column and what to do."""

from __future__ import annotations

from connector.errors import CdcError


class LakehouseError(CdcError):
    """Root of the apply-changes sink's errors."""


class TargetUriError(LakehouseError, ValueError):
    """``--target`` / ``open_apply_sink`` got a URI it cannot use."""

    template = "target {uri!r}: {problem}; expected {allowed}"


class TargetDependencyError(LakehouseError, ImportError):
    """A target whose library is not installed (the Iceberg target without the ``lakehouse``
    extra); raised when the sink is made, so ``replicate`` fails before Spark starts."""

    template = "the {target} target needs {package}, which is not installed: {install}"


class ApplyOptionError(LakehouseError, ValueError):
    """An option of the sink (``scd``, ``schema_drift``, ``soft_delete_column``, keys) is bad."""

    template = "option {option!r}: {problem} (got {value!r}; allowed: {allowed})"


class ChangeBatchError(LakehouseError, ValueError):
    """The batch lacks a column the sink needs (a user ``.schema(...)`` that dropped it)."""

    template = ("the change batch has no column {column!r}; the apply sink needs the key "
                "columns and _op, _channel_id, _sequence, _commit_ts: keep them in the "
                "reader's schema")


class SchemaDriftError(LakehouseError):
    """A change carries a column the target table does not have, under ``schema_drift=fail``."""

    template = ("table {table}: change in channel {channel_id!r} at {sequence} carries new "
                "column(s) {columns} that the target does not have (schema_drift=fail); "
                "add them to the target, or choose schema_drift=add (new nullable columns) "
                "or schema_drift=keep (kept as JSON in the _extra column)")


class ColumnTypeConflictError(LakehouseError):
    """A value cannot go into its column: the types differ. Fails under every drift policy."""

    template = ("table {table}: column {column!r} is {column_type} but the change in channel "
                "{channel_id!r} at {sequence} carries {value_type} ({value!r}); a type "
                "change is never applied silently: convert the column in the target, or "
                "write the values with one type in the source")


class QueryIdUnknownError(LakehouseError):
    """Called outside a streaming query with no ``app_id`` given."""

    template = ("the apply sink found no streaming query id for batch {batch_id} (Spark sets "
                "the local property sql.streaming.queryId in foreachBatch; not over Spark "
                "Connect): pass app_id=... to the sink")
