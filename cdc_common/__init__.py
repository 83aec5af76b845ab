"""The foundation every other package of the product stands on; it imports none of them.

    cdc_common  <-  meta_store  <-  connector  <-  tablestore_emulator  <-  tablestore_cdc

What lives here is what more than one layer needs, written once:

- ``errors``: the root error ``CdcError`` (message template, keyword fields, pickling);
- ``tokens``: the tunnel tokens every layer compares against (``FINISHED``);
- ``uris``: the one redaction of URIs, the one rule for which query keys are secrets, and the
  helper that validates a backend URI's query with a pydantic model;
- ``registry``: backends chosen by URI scheme, imported lazily, with a ``pip install`` hint
  (used by the tunnel backends and the meta-store backends);
- ``credentials``: the environment variable names of each cloud's credentials;
- ``aws_errors``: which AWS error codes are worth retrying (DynamoDB meta store and DynamoDB
  Streams tunnel);
- ``tls``: which CA bundle verifies an https Tablestore endpoint, and how a TLS failure is
  worded (the Tunnel wire client and the Tablestore meta store);
- ``first_contact``: when a network error at a query's start is a configuration error;
- ``sdk_notices``: the ``tablestore`` SDK's import notices, quieted here once for every layer.

Nothing here imports pyspark or a cloud SDK.
"""

from cdc_common.sdk_notices import quiet_sdk_import_notices

quiet_sdk_import_notices()
