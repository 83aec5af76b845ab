"""The product's typed errors: one root, a message template per subclass, keyword fields.

Every error is raised with keyword fields only (``UnknownBatchError(uuid=..., namespace=...)``)
and renders its message from the class's ``template``. Errors raised on executors travel back to
the driver by pickling; ``__reduce__`` rebuilds them from their fields, so they keep their type
and fields on the way.

The root ``CdcError`` lives in the foundation (``cdc_common.errors``) and the meta store's
errors one layer down (``meta_store.errors``; ``meta_store`` depends on nothing of
``connector``); both are re-exported here: the rest of the product imports every error from
this module. Nothing here imports pyspark or an SDK.
"""

from __future__ import annotations

from cdc_common.errors import CdcError as CdcError  # the root: the bottom layer
from meta_store.errors import (  # noqa: F401 - the meta store's errors, one layer down
    CorruptMetaRecordError,
    EndCheckpointConflictError,
    MetaStoreAbsentError,
    MetaStoreError,
    MetaStoreRequestError,
    MetaStoreUriError,
    MetaTableMissingError,
    TransientMetaStoreError,
    UnknownBatchError,
)

# --- options and source identity (driver) -------------------------------------------------


class OptionError(CdcError, ValueError):
    """A reader option is missing, unknown or has a bad value."""

    template = "option '{option}': {problem} (got {value!r}; allowed: {allowed})"


class CheckpointMismatchError(CdcError):
    """A Spark checkpoint directory belongs to another source (``connector.identity``): another
    service, table or tunnel. ``change`` says which, ``remedy`` what to do."""

    template = (
        "this checkpoint location was written by source {found!r}, but the query now reads "
        "{expected!r}: {change}; {remedy}"
    )


class CheckpointMetaStoreError(CdcError):
    """The meta store the query uses has no record of the namespace its checkpoint was written
    in: another ``meta.store`` (``recorded``, from the checkpoint's offsets, when known)."""

    template = (
        "this checkpoint location's batches are in meta-store namespace {namespace!r}, which "
        "the meta store {current!r} does not hold: {why}"
    )


class SourceInUseError(CdcError):
    """Another live query holds the source's lease (``connector.planning.lease``): two queries
    on one tunnel are refused."""

    template = (
        "option 'tunnel.name': tunnel {tunnel!r} on table {table!r} is being read by another "
        "query (planning process {holder}; its lease was renewed {renewed_ago:.0f} s ago and "
        "expires in {expires_in:.0f} s unless renewed). Two queries on one tunnel break "
        "delivery: each pushes its own checkpoints, which releases child channels before the "
        "other query has read their parents, and retention deletes the other query's batches. "
        "To write one stream to several sinks, run one query and write each batch to all of "
        "them in foreachBatch (docs/operations.md#one-query-many-sinks); give an independent "
        "reader its own tunnel.name. If that query was killed, this one can start once its "
        "lease has expired (at {expires_at}), or at once after `tablestore-cdc meta break-lease "
        "--meta {meta} --namespace {key}` (which checks that its process is dead)"
    )


class JavaMissingError(CdcError):
    """No usable Java runtime for Spark."""

    template = "{detail}"


class SparkStartError(CdcError):
    """Spark's JVM ended before it started: a package of ``spark.jars.packages`` that Ivy
    could not resolve (no network, a version not released), said above by Ivy."""

    template = ("Spark did not start: its JVM exited while resolving {packages} (Ivy's "
                "UNRESOLVED lines above say which); reach Maven Central once, or put the jars "
                "in the Ivy cache (~/.ivy2.5.2) or in Spark's jars")


# --- tunnel service -------------------------------------------------------------------------


class TunnelError(CdcError):
    """Root of tunnel-service errors (any backend)."""


class UnknownTableError(TunnelError, KeyError):
    template = "table {table!r} does not exist in {endpoint}"


class TableExistsError(TunnelError):
    template = "table {table!r} already exists in {endpoint}"


class UnknownTunnelError(TunnelError, KeyError):
    template = "tunnel {tunnel!r} does not exist on table {table!r}"


class TunnelExistsError(TunnelError):
    template = "tunnel {tunnel!r} already exists on table {table!r}"


class UnknownChannelError(TunnelError, KeyError):
    template = "channel {channel_id!r} does not exist in tunnel {tunnel_id!r}"


class ChannelNotReadableError(TunnelError):
    template = (
        "channel {channel_id!r} of tunnel {tunnel_id!r} cannot be read now: status {status}"
        " (a child channel is readable only after all its parents are finished)"
    )


class MalformedTokenError(TunnelError, ValueError):
    template = "channel {channel_id!r}: token {token!r} is not a valid checkpoint token: {reason}"


class StaleCheckpointError(TunnelError):
    """A pushed checkpoint's sequence number is below the stored one (OTSSequenceNumberNotMatch)."""

    template = (
        "channel {channel_id!r} of tunnel {tunnel_id!r}: checkpoint sequence {pushed} is lower "
        "than the stored {stored}; the push is stale"
    )


class InvalidCheckpointError(TunnelError, ValueError):
    template = "channel {channel_id!r} of tunnel {tunnel_id!r}: {reason}"


class InvalidRowError(TunnelError, ValueError):
    """A write names unknown columns, lacks key columns or has values of the wrong type."""

    template = "table {table!r}: {reason}"


class InvalidChannelOperationError(TunnelError, ValueError):
    template = "table {table!r}: {reason}"


class DataLossError(CdcError):
    """Records the consumer needs are gone (trimmed by retention). Never retried."""


class TrimmedDataError(DataLossError):
    """``resume_token`` is the first position still held, for ``failOnDataLoss=false``."""

    channel_id: str
    resume_token: str
    template = (
        "channel {channel_id!r}: records from sequence {requested} were requested but the "
        "oldest change still held is {earliest}; {lost} change(s) are lost"
    )


class StartBeforeTunnelError(DataLossError):
    """``startingTimestamp`` names an instant the tunnel cannot read from: it started later
    (a LATEST tunnel created after it), so the changes in between are not in it."""

    template = (
        "startingTimestamp {starting} is before tunnel {tunnel!r} started ({started}, "
        "startingPosition latest): the changes committed in between cannot be read through "
        "it; use a new tunnel.name (created from startingTimestamp), or set "
        "failOnDataLoss=false to start at the tunnel's start"
    )


class RangeReadError(CdcError):
    """A bounded batch read (``spark.read``, ``connector.range_read``) cannot read a channel."""

    template = "batch read through tunnel {tunnel!r}, channel {channel_id!r}: {problem}"


class TransientTunnelError(TunnelError):
    retryable = True
    template = "tunnel service temporarily unavailable: {detail}"


class TunnelRequestError(TunnelError):
    """A cloud tunnel backend refused a request for a reason retrying will not fix (access
    denied, validation, a missing checkpoint table, ...)."""

    template = "{endpoint}: {operation} failed: {reason}"


class StreamNotEnabledError(TunnelError):
    """The source table has no change stream to read (DynamoDB: StreamSpecification off)."""

    template = "table {table!r} at {endpoint} has no stream enabled: {hint}"


class MalformedRecordError(TunnelError, ValueError):
    """A record the tunnel service sent cannot be decoded (never turned into a wrong row)."""

    template = "channel {channel_id!r}: a record read from token {token!r} is malformed: {reason}"


class SchemaChangeError(CdcError):
    """A value read from the tunnel does not fit its output column, and the query's
    ``schema.change.behavior`` neither keeps nor drops it (``exception``, ``evolve``), or keeps
    it but the output has nowhere to (no ``_extra`` column, or a key column). Raised in the read
    task after the batch's end is recorded: a restart, with another policy or schema, replays
    exactly the same batch (docs/schema.md, "Values of another type")."""

    template = (
        "table {table!r}: column {column!r} is {column_type} but the change in channel "
        "{channel_id!r} at {sequence} carries {value_type} {value!r}, which it cannot hold "
        "losslessly (schema.change.behavior={policy}); {remedy}. The batch's end is recorded: "
        "a restart replays exactly this batch"
    )


class TunnelAnswerTooLargeError(TunnelError):
    """An answer from the tunnel endpoint past the client's limits
    (``connector.tunnel.tablestore.http``: ``MAX_ANSWER_BYTES``, ``MAX_HEADER_COUNT``,
    ``MAX_HEADER_BYTES``): not one the service sends, whose largest answer (a ReadRecords page)
    is about 1 MB. Refused without reading the rest, never retried (driver or executor)."""

    template = (
        "{endpoint} {operation}: answer refused: its {what} exceeds the client's limit of "
        "{limit}; the Tablestore Tunnel service sends nothing that large: check that the "
        "endpoint is the service's address, and any proxy in between"
    )


class EndpointTlsError(TunnelError):
    """An https endpoint's certificate, host name or TLS cannot be verified: a configuration
    error, reported at once (never retried). ``problem`` names the endpoint and what to fix."""

    template = "{problem}"


class EndpointUnreachableError(TunnelError):
    """At a query's start the tunnel endpoint gave no answer at all (no such host, connection
    refused, no HTTP answer): a configuration error, reported at once, never retried
    (``cdc_common.first_contact``). ``problem`` names the endpoint and what to fix."""

    template = "{problem}"


class TunnelServiceError(TunnelError):
    """The Tablestore Tunnel service refused a request; ``code`` and ``message`` are its own."""

    template = "{endpoint} {operation}: {code} (HTTP {http_status}): {message}"


class TunnelParameterError(TunnelServiceError):
    """OTSParameterInvalid: the service says the request is malformed or out of range."""


class TunnelExpiredError(TunnelServiceError):
    """OTSTunnelExpired: the tunnel's base stage did not finish within the stream retention."""


class TunnelAuthError(TunnelServiceError):
    """OTSAuthFailed / OTSPermissionDenied, or a response whose signature does not verify;
    ``hint`` names the options that fix it."""

    template = "{endpoint} {operation}: {code} (HTTP {http_status}): {message}; {hint}"


# --- protocol invariants -------------------------------------------------------------------


class ReplayDivergedError(CdcError):
    """A replay read could not reproduce a recorded end checkpoint: the source changed history."""

    template = (
        "batch {uuid!r} channel {channel_id!r}: replay expected {expected} records ending at "
        "{expected_token!r} but the tunnel gave {got} ending at {got_token!r}"
    )


class MalformedOffsetError(CheckpointMismatchError):
    """An offset in Spark's checkpoint is not one this source wrote (hand-edited, foreign)."""

    template = (
        "the checkpoint location holds an offset this source cannot read: {offset!r} "
        "({problem}); use the checkpoint location this query wrote, or a new one"
    )


class TunnelBindingError(CdcError):
    """The meta namespace holds committed batches of a tunnel that is no longer the one
    under this name: its positions mean nothing to the current tunnel."""


class TunnelReplacedError(TunnelBindingError):
    template = (
        "tunnel {tunnel!r} on table {table!r} was deleted and created again: the meta namespace "
        "{namespace!r} holds committed batches of tunnel id {recorded_id!r}, but the tunnel now "
        "has id {current_id!r}. Its positions do not apply to the new tunnel, so the query is "
        "refused instead of skipping or re-reading changes. To read the new tunnel from its "
        "start: use a new checkpoint location and clear the namespace with `tablestore-cdc meta "
        "reset --namespace {namespace!r} --yes`; or re-point the query at the tunnel.name (or "
        "meta.store) it was reading"
    )


class TunnelGoneError(TunnelBindingError):
    template = (
        "tunnel {tunnel!r} on table {table!r} no longer exists, but the meta namespace "
        "{namespace!r} holds committed batches of it (tunnel id {recorded_id!r}); a new tunnel "
        "is not created under it, as its positions would not apply. To start over: use a new "
        "checkpoint location and clear the namespace with `tablestore-cdc meta reset "
        "--namespace {namespace!r} --yes`; or re-point the query at the tunnel.name (or "
        "meta.store) it was reading"
    )


class CheckpointBehindMetaError(CdcError):
    """Spark's checkpoint resumes from a batch the meta table no longer holds."""

    template = (
        "Spark's checkpoint resumes from batch {uuid!r}, which meta namespace {namespace!r} no "
        "longer holds, while it holds {retained} newer batch(es): the checkpoint was restored "
        "from a backup (or its newest offsets/ and commits/ files deleted) to a point older than "
        "the meta table keeps (metaRetentionBatches={retention}), or rows were deleted by hand. "
        "The batches after it cannot be replayed exactly. Restore the meta store from the same "
        "point in time as the checkpoint, or use a new checkpoint location (it starts from the "
        "tunnel's pushed checkpoints)"
    )


# --- the installed Spark ---------------------------------------------------------------------


class UnsupportedSparkError(CdcError, ImportError):
    """The installed PySpark is outside the supported range (``connector.spark_compat``,
    raised when the Spark side of the package is imported)."""

    template = (
        "tablestore-cdc supports PySpark {supported}, found {found}: install a PySpark in that "
        "range (pip install 'pyspark{supported}'), the one matching your cluster's Spark"
    )


class SparkCallOrderError(CdcError):
    """PySpark < 4.2 (which does not pass ``latestOffset`` its start) asked for a batch in an
    order where the start is not known: the source refuses rather than guess it."""

    template = (
        "PySpark {version} asked the source for the next batch before telling it where the "
        "checkpoint's offset log ends ({detail}); the source never guesses where a batch starts. "
        "With PySpark before 4.2 this happens under the internal setting "
        "spark.sql.streaming.triggerAvailableNowWrapper.enabled=true, which this source does not "
        "support: unset it (Trigger.AvailableNow then runs as one batch per run), or use "
        "PySpark 4.2 or newer, where Spark passes the start to latestOffset"
    )
