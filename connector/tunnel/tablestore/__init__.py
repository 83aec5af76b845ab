"""The Tablestore Tunnel wire backend (``http://`` and ``https://`` endpoints).

- ``messages``: the Tunnel protobuf messages (built at runtime, published field numbers);
- ``plainbuffer``: the PlainBuffer row codec (CRC-8, sequence-info extension);
- ``records``: a ReadRecords page -> ``connector.tunnel.base.Record``;
- ``transport``: v2-signed POSTs, response validation, bounded retries;
- ``client``: ``TablestoreTunnelService``, the ``TunnelService`` over all of it.

See docs/tablestore.md. The ``tablestore`` SDK is imported only by ``client.table_schema``.
"""
