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

The modules build on each other in this order (each one's line: docs/index.md): ``reading``,
``shapes``, ``tunnel_view``, ``polling``, ``snapshot``.

Everything here only reads the meta store and the tunnel. The one record that joins the feed
from elsewhere, Spark's own numbers for each batch, is written by the listener
(``tablestore_cdc.query_record``, beside ``tablestore_cdc.listener``).

Runs wherever the CLI or the dashboard runs (an operator's shell, a sidecar next to the driver);
never on executors.
"""
