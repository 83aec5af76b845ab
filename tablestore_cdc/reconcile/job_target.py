"""The target a table's ``replicate`` job writes, from the job's own record in the meta table.

Every ``replicate`` job (``--table T`` and ``--tables``) writes each table's ``TableStatus``
into the meta store beside the table's namespace (``tablestore_cdc.table_status``), with the
target it applies the table into: the URI after the ``{table}`` template, the job's
``--config`` and its defaults were applied (``--output``'s ``OUT/TABLE`` or ``OUT/lake/TABLE``
included), redacted of secrets. ``reconcile`` and ``resnapshot`` read it here, so neither needs
``--target``: ``job_target`` opens the meta store the source flags name (``--option
meta.store=...``, read-only, never created) at the namespace of the table and tunnel, and
returns the record's target; ``JobRecordMissingError`` when no job recorded one (none ran with
that source, tunnel and meta store, or it ran before jobs recorded their targets).

A secret the job's target held (a query key such as ``s3.secret-access-key``) is not in the
record: the reader takes it from the environment or ``--target-option``, as ``replicate`` does.

``output_target`` is the fallback for such an old job when ``--output`` is given: the Delta
table at either default layout. Runs in the CLI's process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cdc_common.uris import redact_uri
from connector.clients import Clients
from meta_store.errors import MetaTableMissingError
from tablestore_cdc.reconcile.errors import JobRecordMissingError, OutputLayoutError
from tablestore_cdc.reconcile.source import SourceSpec
from tablestore_cdc.table_status import load_table_status


@dataclass(frozen=True)
class JobTarget:
    """What a table's job recorded of where it writes the table."""

    table: str
    #: the target URI as the job recorded it (no secret)
    target: str
    #: the job's output directory (``replicate --output``)
    job: str
    #: the job's selection: its ``--tables`` patterns, or the table itself (``--table``)
    selection: str


def job_target(spec: SourceSpec) -> JobTarget:
    """The target the job replicating ``spec``'s table (with its tunnel and meta store)
    recorded. ``OptionError`` for bad source options, ``JobRecordMissingError`` when there is
    no record (or no meta table)."""
    options = spec.source_options()
    meta = redact_uri(options.meta_store)
    missing = JobRecordMissingError(table=spec.table, tunnel=spec.tunnel, meta=meta)
    try:
        store = Clients().meta_store(options.meta_store, options.meta_store_credentials,
                                     create=False)
    except MetaTableMissingError:
        raise missing from None
    try:
        status = load_table_status(store, options.source_identity)
    finally:
        store.close()
    if status is None or not status.target:
        raise missing
    return JobTarget(table=spec.table, target=status.target, job=status.job,
                     selection=status.selection)


def output_target(output: Path, table: str) -> str:
    """The Delta table a job with ``--output OUTPUT`` and no other target writes: at
    ``OUTPUT/TABLE`` (``--table``) or ``OUTPUT/lake/TABLE`` (``--tables``), whichever holds
    one; ``OutputLayoutError`` when neither or both do."""
    layouts = [output / table, output / "lake" / table]
    found = [path for path in layouts if (path / "_delta_log").is_dir()]
    if len(found) != 1:
        raise OutputLayoutError(table=table, paths=" and ".join(map(str, layouts)),
                                problem="neither holds" if not found else "both hold")
    return f"delta://{found[0]}"
