"""The progress feed: what the meta table (and the tunnel, and Spark) say about a query's batches.

One versioned JSON shape (``FEED_SCHEMA_VERSION``; the JSON Schema is
``docs/progress-feed.schema.json``, the contract ``docs/progress-feed.md``) consumed by three
front ends:

- ``tablestore-cdc progress`` prints one **batch record** per line (JSON lines; ``--follow`` polls
  and prints only new or changed batches) — ``polling.follow_feed``;
- ``tablestore-cdc dashboard`` serves ``/api/progress``, a **snapshot** (recent batch records,
  per-channel positions and lag, the channel tree, throughput) — ``snapshot.dashboard_snapshot``,
  served by ``tablestore_cdc.dashboard``;
- ``tablestore-cdc meta ...`` (``tablestore_cdc.commands.meta``) uses the same read-only helpers
  (``open_existing_meta_store``, ``resolve_namespace``, ``find_batch``, ``channel_view``).

The modules, in the order they build on each other:

- ``reading``: the meta store as inspection reads it (opened without creating, corrupt rows
  skipped and named, namespaces, batches by UUID prefix) and the errors of a bad request;
- ``shapes``: the JSON shapes (a position, a batch record, the channel tree), from plain data;
- ``tunnel_view``: what the tunnel says now (channel status, lineage, pushed checkpoints, lag);
- ``polling``: the feed's records, once or followed;
- ``snapshot``: the dashboard's document (throughput, whether the query is alive).

Everything here only reads the meta store and the tunnel. The one record that joins the feed
from elsewhere, Spark's own numbers for each batch, is written by the listener
(``tablestore_cdc.query_record``, beside ``tablestore_cdc.listener``).

Runs wherever the CLI or the dashboard runs (an operator's shell, a sidecar next to the driver);
never on executors.
"""
