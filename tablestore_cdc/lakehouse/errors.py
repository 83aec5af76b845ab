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
    """A change carries an attribute the target has no column for, under
    ``schema_drift=exception``."""

    template = ("table {table}: change in channel {channel_id!r} at {sequence} carries new "
                "column(s) {columns} that the target does not have (schema_drift=exception); "
                "add them to the target, or choose schema_drift=lenient (new nullable columns, "
                "values that fit no column kept in _extra; the default), evolve (new columns, "
                "a value that fits no column fails) or ignore (kept in _extra)")


class ColumnTypeConflictError(LakehouseError):
    """A value fits no column of the target under the drift policy (docs/lakehouse.md, "Schema
    drift"): its type differs and no lossless widening the format can make holds it."""

    template = ("table {table}: column {column!r} is {column_type} but the change in channel "
                "{channel_id!r} at {sequence} carries {value_type} ({value!r}), which it cannot "
                "hold losslessly ({why}; schema_drift={policy}); choose schema_drift=lenient to "
                "keep such values typed in _extra, or convert the column in the target")


class ForeignTargetError(LakehouseError):
    """The target table exists but does not belong to this job (lakehouse/ownership.py):
    refused before anything is written."""

    template = ("target {table}: {problem}; nothing was written. To take it over on purpose "
                "(its keys and their types are checked), pass adopt_target=True "
                "(replicate: --adopt-target); job {job!r} then owns it")


class TargetKeysError(LakehouseError):
    """The target table's key columns are not the changes' keys: never written, not even when
    adopting it."""

    template = ("target {table}: {problem}; nothing was written: apply the changes into "
                "another table")


class QueryIdUnknownError(LakehouseError):
    """Called outside a streaming query with no ``app_id`` given."""

    template = ("the apply sink found no streaming query id for batch {batch_id} (Spark sets "
                "the local property sql.streaming.queryId in foreachBatch; not over Spark "
                "Connect): pass app_id=... to the sink")


class ObjectStoreError(LakehouseError):
    """The object store holding a target failed a request after the client's own retries
    (throttled, a connection reset, a timeout): retryable. The job restarts the query and the
    replayed batch is applied from where the table stands (its app transaction skips a commit
    that landed unseen)."""

    template = ("target {table}: the object store failed a request after {attempts} "
                "attempt(s) of the batch, each request retried by delta-rs (storage options "
                "max_retries, retry_timeout): {problem}")
    retryable = True


class TargetStoreRefusedError(LakehouseError):
    """The object store holding a target refused a request (a 4xx: credentials, a missing
    bucket; a storage option delta-rs cannot parse): asked again it answers the same."""

    template = ("target {table}: the object store refused: {problem}; check the bucket, the "
                "credentials and the --target-option values")
