"""``tablestore-cdc reconcile``: compare a source table with its lakehouse copy (docs/reconcile.md).

The parts, each its own module:

- ``source``: the source table, read a page at a time; one reader per backend, chosen by
  endpoint scheme;
- ``target``: the target table's current rows at one version, and the newest batch the stream
  applied to it; one reader per format;
- ``layout``: the one Arrow layout both sides are put into, and what "equal" means;
- ``compare``: buckets of row hashes, then the rows of unequal buckets: MISSING, EXTRA,
  DIFFERENT;
- ``inflight``: the position of the change stream the target holds (the meta table's end
  checkpoints and commit times), and which differing keys changed after it (IN-FLIGHT);
- ``keyrange``: a range of the first key column (a re-snapshot's ``--from`` / ``--to``), which
  both sides' readers read only;
- ``job_target``: the target a table's ``replicate`` job writes, from the job's own record in
  the meta table (so neither ``reconcile`` nor ``resnapshot`` needs ``--target``);
- ``run``: one table start to end (``reconcile_table``), ``command``: the CLI command.

The source and target readers are the pieces a re-snapshot reuses.
"""

from tablestore_cdc.reconcile.run import TableReport, reconcile_table
from tablestore_cdc.reconcile.source import SourceSpec, SourceTable, open_source_table
from tablestore_cdc.reconcile.target import AppliedBatch, TargetTable, open_target_table

__all__ = ["AppliedBatch", "SourceSpec", "SourceTable", "TableReport", "TargetTable",
           "open_source_table", "open_target_table", "reconcile_table"]
