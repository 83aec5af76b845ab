"""``tablestore-cdc reconcile``'s own errors: each says what is wrong and which flag fixes it."""

from __future__ import annotations

from connector.errors import CdcError


class ReconcileError(CdcError):
    """Root of the reconcile errors."""


class TargetMissingError(ReconcileError):
    """The ``--target`` table does not exist (yet)."""

    template = ("target {target}: no table there yet (the stream creates it with its first "
                "batch); check --target")


class TargetLayoutError(ReconcileError):
    """The target cannot hold the source's rows as the apply sink writes them."""

    template = "target {target}: {problem}; {hint}"


class SourceReadError(ReconcileError):
    """The source table could not be read (the service refused, a value it cannot carry)."""

    template = "source {source}: {problem}"
