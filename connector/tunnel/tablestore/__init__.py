"""The Tablestore Tunnel wire backend (``http://`` and ``https://`` endpoints).

- ``endpoint``: the endpoint's options, its typed form (credentials ``SecretStr``), the default
  meta table, ``tunnel.id`` (looked up by the registry's rules, ``connector.tunnel``);
- ``messages``: the Tunnel protobuf messages (built at runtime, published field numbers);
- ``plainbuffer``: the PlainBuffer row codec (CRC-8, sequence-info extension);
- ``records``: a ReadRecords page -> ``connector.tunnel.base.Record`` or a page's columns;
- ``transport``: v2-signed POSTs, response validation, bounded retries;
- ``client``: ``TablestoreTunnelService``, the interface's three roles over all of it
  (``calls``, ``admin``, ``positions`` with ``channel_probes``, ``reading``).

See docs/tablestore.md. The ``tablestore`` SDK is imported only by ``admin.table_schema``.
"""
