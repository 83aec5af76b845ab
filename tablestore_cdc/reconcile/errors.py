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


class JobRecordMissingError(ReconcileError):
    """No ``replicate`` job recorded the table's target in the meta table
    (``job_target``)."""

    template = ("table {table}: no replicate job has recorded its target in the meta store "
                "{meta} (tunnel {tunnel}): none ran there yet, or it ran before jobs recorded "
                "their targets; pass --target URI")


class JobOutputError(ReconcileError):
    """``--output`` names another job than the one that recorded the table's target."""

    template = ("--output {output}: table {table} is replicated by the job with --output "
                "{job} (into {target}); drop --output, or pass --target URI")


class OutputLayoutError(ReconcileError):
    """``--output`` of a job without a record: no single Delta table at its default paths."""

    template = ("--output: {problem} a Delta table for {table} ({paths}); pass --target URI")
