"""The root of the product's typed errors, and the meta store's own errors.

This is the bottom layer: ``meta_store`` depends on nothing else of the product, and
``connector.errors`` (tunnel, option and protocol errors) builds on the root defined here and
re-exports everything below, so callers import errors from ``connector.errors`` as before.

Every error is raised with keyword fields only (``UnknownBatchError(uuid=..., namespace=...)``)
and renders its message from the class's ``template``. Errors raised on executors travel back to
the driver by pickling; ``__reduce__`` rebuilds them from their fields, so they keep their type
and fields on the way. Nothing here imports pyspark or an SDK.
"""

from __future__ import annotations

from typing import Any, ClassVar


def _rebuild(cls: type[CdcError], fields: dict[str, Any]) -> CdcError:
    return cls(**fields)


class CdcError(Exception):
    """Root of every error this product raises on purpose."""

    template: ClassVar[str] = "{detail}"
    #: True when retrying the same call later may succeed (throttling, a service restart).
    retryable: ClassVar[bool] = False

    def __init__(self, **fields: Any) -> None:
        self.fields = fields
        for key, value in fields.items():
            setattr(self, key, value)
        try:
            message = self.template.format(**fields)
        except (KeyError, IndexError):  # a field missing from the call: still say something
            message = f"{self.template} {fields}"
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.fields))

    def __str__(self) -> str:
        # The rendered message as is: KeyError (a base of the Unknown*Error classes) would
        # otherwise quote it like a repr.
        return str(self.args[0]) if self.args else ""


# --- meta store -----------------------------------------------------------------------------


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


class MetaStoreUriError(MetaStoreError, ValueError):
    template = "meta-store URI {uri!r}: {reason}"


class TransientMetaStoreError(MetaStoreError):
    retryable = True
    template = "meta store temporarily unavailable: {detail}"


class MetaStoreRequestError(MetaStoreError):
    """The meta store's backend refused a request for a reason retrying will not fix
    (access denied, validation, an item too large, a read-only or full disk, ...)."""

    template = "meta store {store}: {operation} failed: {reason}"
