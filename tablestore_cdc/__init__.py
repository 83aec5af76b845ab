"""The application around the source: the ``tablestore-cdc`` command and what it runs.

Layers, each standing only on those before it (tests/test_layering.py keeps it so):

0. ``cdc_common``          the foundation: the root error type, the ``FINISHED`` token, URI
                           redaction and query models, the backend registry, credential names;
1. ``meta_store``          the meta table: interface, SQLite/DynamoDB/Tablestore backends;
2. ``connector``           the Spark source: options, protocol (driver), reader (executors),
                           tunnel interface and backends, the embedded store;
3. ``tablestore_emulator`` a local Tablestore server over the embedded store;
4. ``tablestore_cdc``      this package: every command of the CLI (``commands``, the
                           inspection commands in ``commands.meta``), the pipeline library
                           (``pipeline``), the demo (``demo``), sinks and verification, the
                           apply-changes sink into Delta Lake and Iceberg (``lakehouse``), the
                           progress listener, the progress feed and dashboard.

The map of every folder: docs/index.md.
"""
