"""``tablestore-cdc resnapshot``: the running apply job repairs its target from the source
between two of its batches (docs/resnapshot.md).

- ``repair``: one signal's repair: reconcile's comparison, the source's rows of the differences
  not in flight, one idempotent commit through the apply sink;
- ``hook``: the apply query's ``foreachBatch`` wrapped: it looks for a due signal every few
  seconds and runs its repair before the batch;
- ``command``: the command that adds, waits for and lists signals; its ``--from`` / ``--to``
  range is ``tablestore_cdc.reconcile.keyrange`` (reconcile's readers read only that range).

The signals themselves live in the meta table (``meta_store.signals``).
"""
