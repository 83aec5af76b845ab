"""Quiet import notices of the official ``tablestore`` SDK.

The SDK (6.4) logs at WARNING when it is imported on a platform without its native codec:
``Native C++ encoder not available, using Python implementation`` (logger
``tablestore.encoder``) and the same for the decoder (``tablestore.decoder``). With no logging
configured, Python's last-resort handler prints both to stderr -- on every CLI command that
opens a Tablestore meta store or endpoint, and in Spark's logs. The product does not use the
SDK's codec on its hot path (the Tunnel client has its own decoder), so the notice says nothing
a user can act on.

``quiet_sdk_import_notices`` raises those two loggers to ERROR unless the process configured
them itself (a level already set is left alone). ``cdc_common`` calls it when imported, so
every layer importing the SDK is covered; setting a logger's level imports nothing.
"""

from __future__ import annotations

import logging

#: the SDK's loggers that announce, at import, that the native codec is missing
SDK_NOTICE_LOGGERS = ("tablestore.encoder", "tablestore.decoder")


def quiet_sdk_import_notices() -> None:
    for name in SDK_NOTICE_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.ERROR)
