"""Crash points for the fault-injection harness (integration/faults). Inert in production.

Reached only through the seam, ``connector.clients.crash_point`` (which calls ``fault_point``
only when ``TABLESTORE_CDC_FAULT_DIR`` is set: no product path enters this module otherwise),
at protocol steps on the driver and on executors. The harness sets the variable on the Spark
driver it starts (Spark passes the environment on to its Python workers and, in
``local-cluster`` mode, to the executor JVMs and their workers) to a directory; a file
``arm-<name>`` there arms the point. ``fault_point(name)`` then consumes that file (an atomic
rename to ``fired-<name>``: one process fires it, once), writes ``hit-<name>`` (the process id)
and acts on the armed file's content:

- empty or ``park``: block forever, so the harness can SIGKILL the whole Spark process tree
  while the process is parked exactly at that step;
- ``raise``: raise ``InjectedFault`` (a task failure on an executor; Spark retries the task when
  the master allows retries, e.g. ``local[2,4]``);
- ``hold``: pickle the call's ``context`` (e.g. the input partition being read) to
  ``hit-<name>.pkl`` and block until the harness creates ``release-<name>``, then go on. The
  harness uses the pause to run a concurrent duplicate of the same read.

Transient errors (``testkit/flaky.py``) and the planner's clock are the seam's injected
collaborators, not here.
"""

from __future__ import annotations

import os
import pickle
import time
from typing import Any

FAULT_DIR_ENV = "TABLESTORE_CDC_FAULT_DIR"

#: how long a ``hold`` waits for its release before going on by itself
HOLD_TIMEOUT_S = 600.0

#: Every named point, for the harness and the docs (where it runs: what is durable there).
POINTS = (
    # driver: the previous batch is in Spark's commit log; the source's commit of it (the
    # catch-up in latestOffset, and Spark's own later commit() call) has not run yet
    "latest_offset_start",
    # driver: end UUID minted, before Spark writes its offset log
    "after_latest_offset",
    # driver: Spark's offset log holds the batch; its manifest may not be written yet
    "plan_start",
    # executor: the channel's records are fetched, its end is not claimed yet
    "read_before_claim",
    # executor: end checkpoint claimed, before rows are handed out
    "mid_read",
    # driver (foreachBatch): batch stored (all its ends recorded), Spark's commit log not written
    "after_sink_write",
    # driver: Spark's commit log holds the batch; nothing of it is pushed to the tunnel yet
    "commit_start",
    # driver: some channels' checkpoints pushed, others not
    "mid_commit_push",
    # driver (the apply sink): the batch's schema change is made -- Delta: committed on its
    # own, the batch's data not yet; Iceberg: staged in the batch's one catalog commit, nothing
    # committed -- reached only by a batch that changes the target's schema
    "after_schema_change",
    # driver (the Delta/Iceberg apply sink, tablestore_cdc.lakehouse): the batch's commit is
    # prepared (Iceberg: its data files written) but not committed
    "before_target_commit",
    # driver (the apply sink): the batch committed into the table; Spark's commit log not written
    "after_target_commit",
    # driver (a multi-table query's latestOffset, connector.multiplex): one table's end
    # minted (its previous batch's commit caught up), the next table's not; Spark's offset log
    # not written
    "between_table_offsets",
    # driver (the multi-table partitions): one table's batch planned (its manifest written),
    # the next table's not
    "between_table_plans",
    # driver (the multi-table commit): Spark's commit log holds the batch; one table's commit
    # made (its checkpoints pushed when due), the next table's not
    "between_table_commits",
    # driver (the multi-table apply, tablestore_cdc.pipeline.multi_table): one table's target
    # commit of the batch made, the next table's not; the apply query's commit log not written
    "between_table_applies",
    # driver (the multi-table apply): every table of the batch committed into its target; the
    # apply query's commit log not written
    "after_table_applies",
    # driver (a re-snapshot's repair, tablestore_cdc.resnapshot): the repair's change batch is
    # built from the source, not committed; the signal is marked running
    "resnapshot_before_commit",
    # driver (the repair): its commit is in the table, the signal not yet marked done
    "resnapshot_after_commit",
)


class InjectedFault(RuntimeError):
    """Raised by a crash point armed with ``raise``: a failure the harness asked for."""


def fault_point(name: str, context: Any = None) -> None:
    """A crash point (driver or executor); a no-op unless the harness armed ``name``."""
    directory = os.environ.get(FAULT_DIR_ENV)
    if not directory:
        return
    armed = os.path.join(directory, f"arm-{name}")
    fired = os.path.join(directory, f"fired-{name}")
    try:
        os.rename(armed, fired)  # atomic: fires once
    except FileNotFoundError:
        return
    with open(fired) as f:
        mode = f.read().strip() or "park"
    hit = os.path.join(directory, f"hit-{name}")
    if mode == "hold" and context is not None:
        with open(hit + ".pkl.tmp", "wb") as f:
            pickle.dump(context, f)
        os.rename(hit + ".pkl.tmp", hit + ".pkl")
    with open(hit + ".tmp", "w") as marker:  # renamed: the harness never sees it empty
        marker.write(str(os.getpid()))
    os.rename(hit + ".tmp", hit)
    if mode == "raise":
        raise InjectedFault(f"injected fault at {name} (pid {os.getpid()})")
    if mode == "hold":
        release = os.path.join(directory, f"release-{name}")
        deadline = time.monotonic() + HOLD_TIMEOUT_S
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)
        return
    while True:  # parked until the harness kills the process tree
        time.sleep(1)
