"""``tablestore-cdc resnapshot``: the running apply job repairs its target from the source
between two of its batches (docs/resnapshot.md).

- ``keyrange``: the ``--from`` / ``--to`` range of the first key column, checked against the
  table's key type;
- ``repair``: one signal's repair: reconcile's comparison, the source's rows of the differences
  not in flight, one idempotent commit through the apply sink;
- ``hook``: the apply query's ``foreachBatch`` wrapped: it looks for a due signal every few
  seconds and runs its repair before the batch;
- ``command``: the command that adds, waits for and lists signals.

The signals themselves live in the meta table (``meta_store.signals``).
"""
