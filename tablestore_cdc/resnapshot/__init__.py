"""``tablestore-cdc resnapshot``: the running replication job repairs a table's target from the
source between two of its batches, whatever its selection of tables (docs/resnapshot.md).

- ``repair``: one signal's repair of one table: reconcile's comparison, the source's rows of
  the differences, one idempotent commit through the job's apply sink of the table;
- ``hook``: ``RepairRunner``, the due repairs of a job's tables, looked for every few seconds
  before a batch (the apply's ``foreachBatch``) and on an idle stream (the job's watch loop),
  under one lock;
- ``command``: the command that adds, waits for and lists signals; its ``--from`` / ``--to``
  range is ``tablestore_cdc.reconcile.keyrange`` (reconcile's readers read only that range).

The signals themselves live in the meta table (``meta_store.signals``).
"""
