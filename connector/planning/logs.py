"""The planner's log: one logger for the driver protocol and its setup in Spark's planning process.

Every piece of the driver protocol (``connector.protocol`` and ``connector.planning``) writes to
the logger ``connector.protocol``: the name docs/operations.md lists for its lines, whichever
module writes them.
"""

from __future__ import annotations

import logging
import os

#: the environment variable holding the planner's log level (default INFO)
LOG_LEVEL_ENV = "TABLESTORE_CDC_LOG_LEVEL"

log = logging.getLogger("connector.protocol")


def configure_planner_logging() -> None:
    """Spark's planning process starts with no logging configured, which would drop the
    per-batch INFO line: log this package to stderr (Spark's driver log) at the level in
    ``TABLESTORE_CDC_LOG_LEVEL`` (default INFO), unless the process already configured logging.
    Called by ``StreamProtocol`` when it opens."""
    package = logging.getLogger("connector")
    if package.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    package.addHandler(handler)
    package.setLevel(os.environ.get(LOG_LEVEL_ENV, "INFO").upper())
