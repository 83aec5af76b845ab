"""The meta store's errors, on the product's root error ``CdcError`` (``cdc_common.errors``).

``CdcError`` is re-exported here, so code of the meta-store layer imports every error it needs
from this module; ``connector.errors`` re-exports all of these in turn, and the rest of the
product imports errors from there. Every error is raised with keyword fields only
(``UnknownBatchError(uuid=..., namespace=...)``), renders its message from its ``template`` and
survives pickling (``CdcError.__reduce__``). Nothing here imports pyspark or an SDK.
"""

from __future__ import annotations

from typing import Any

from cdc_common.errors import CdcError as CdcError


class MetaStoreError(CdcError):
    """Root of meta-store errors (any backend)."""


class UnknownBatchError(MetaStoreError, KeyError):
    template = "no batch {uuid!r} in meta-store namespace {namespace!r}"


class EndCheckpointConflictError(MetaStoreError):
    """A different end checkpoint is already recorded for (UUID, channel). ``stored`` holds it."""

    stored: Any  # meta_store.base.EndCheckpoint (not imported: errors import nothing)

    template = (
        "batch {uuid!r} channel {channel_id!r}: an end checkpoint is already recorded "
        "({stored_summary}); this attempt's ({attempted_summary}) was not written"
    )


class CorruptMetaRecordError(MetaStoreError):
    template = "meta store {store}: record {key!r} is corrupt or foreign: {reason}"


class MetaTableMissingError(MetaStoreError):
    template = (
        "meta table {table!r} does not exist at {location}; create it or pass "
        "create_table=true in the meta-store URI"
    )


class MetaStoreAbsentError(MetaTableMissingError):
    """A meta store opened without creating it (``open_meta_store(create=False)``) is not
    there: a SQLite file that does not exist."""

    template = "no meta store at {table}: the file does not exist"


class MetaStoreUriError(MetaStoreError, ValueError):
    template = "meta-store URI {uri!r}: {reason}"


class TransientMetaStoreError(MetaStoreError):
    retryable = True
    template = "meta store temporarily unavailable: {detail}"


class MetaStoreRequestError(MetaStoreError):
    """The meta store's backend refused a request for a reason retrying will not fix
    (access denied, validation, an item too large, a read-only or full disk, ...)."""

    template = "meta store {store}: {operation} failed: {reason}"
