"""Crash points for the fault-injection harness (integration/faults). Inert in production.

``fault_point(name)`` is called at protocol steps on the driver and on executors. It does
nothing unless the environment variable ``TABLESTORE_CDC_FAULT_DIR`` names a directory holding a
file ``arm-<name>``. Then it consumes that file, writes ``hit-<name>`` and blocks, so the harness
can SIGKILL the whole Spark process tree while the process is parked exactly at that step.
"""

from __future__ import annotations

import os
import time

FAULT_DIR_ENV = "TABLESTORE_CDC_FAULT_DIR"

#: Every named point, for the harness and the docs.
POINTS = (
    "after_latest_offset",  # driver: end UUID minted, before Spark writes its offset log
    "mid_read",  # executor: end checkpoint claimed, before rows are handed out
    "mid_commit_push",  # driver: some channels' checkpoints pushed, others not
    "after_sink_write",  # driver (foreachBatch): batch stored, Spark's commit log not written
)


def fault_point(name: str) -> None:
    directory = os.environ.get(FAULT_DIR_ENV)
    if not directory:
        return
    armed = os.path.join(directory, f"arm-{name}")
    try:
        os.rename(armed, os.path.join(directory, f"fired-{name}"))  # atomic: fires once
    except FileNotFoundError:
        return
    with open(os.path.join(directory, f"hit-{name}"), "w") as marker:
        marker.write(str(os.getpid()))
    while True:  # parked until the harness kills the process tree
        time.sleep(1)
