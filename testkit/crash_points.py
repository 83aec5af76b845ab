"""The fault harness's crash points (integration/faults): what a process does at an armed one.

The product names its protocol steps through its seam, ``connector.crash_hook.crash_point``,
and does nothing there unless a hook is installed. This module is the harness's hook,
``fault_point``, and how it reaches every process of a query the harness starts:

- ``environment(fault_dir)`` is what the harness adds to the environment of the process it
  starts: ``TABLESTORE_CDC_FAULT_DIR`` (the run's fault directory) and a ``PYTHONPATH`` that
  starts with ``testkit/crash_site`` (and names the checkout). Python runs that directory's
  ``sitecustomize`` at every start, which calls ``install_from_environment()``: the hook is
  installed in the driver, and -- Spark passes its environment on to the Python processes it
  starts (the streaming source's planning runner, the workers; in ``local-cluster`` mode through
  the executor JVMs, given ``spark_conf(fault_dir)`` too; the product's own
  ``connector/worker_site/sitecustomize.py`` runs the one it shadows) -- in every one of them;
- a test in one process calls ``install(fault_dir)`` and ``uninstall()`` itself.

A file ``arm-<name>`` in the fault directory arms the point (``testkit.processes.
arm_crash_point``). ``fault_point(name)`` then consumes that file (an atomic rename to
``fired-<name>``: one process fires it, once), writes ``hit-<name>`` (the process id) and acts
on the armed file's content:

- empty or ``park``: block forever, so the harness can SIGKILL the whole Spark process tree
  while the process is parked exactly at that step;
- ``raise``: raise ``InjectedFault`` (a task failure on an executor; Spark retries the task when
  the master allows retries, e.g. ``local[2,4]``);
- ``hold``: pickle the call's ``context`` (e.g. the input partition being read) to
  ``hit-<name>.pkl`` and block until the harness creates ``release-<name>``, then go on. The
  harness uses the pause to run a concurrent duplicate of the same read.

Transient errors (``testkit/flaky.py``) and the planner's clock are the client seam's injected
collaborators (``connector.clients.ClientHooks``), not here.
"""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path
from typing import Any

from connector import crash_hook

FAULT_DIR_ENV = "TABLESTORE_CDC_FAULT_DIR"
#: the directory whose ``sitecustomize`` installs the hook at a process's start
SITE = Path(__file__).resolve().parent / "crash_site"
#: the checkout (``testkit``'s parent): the processes import ``testkit`` from there
REPO = SITE.parent.parent

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


def environment(fault_dir: Path | str, path: str | None = None) -> dict[str, str]:
    """The variables that install the hook in a started process and every Python process
    Spark starts for it (module docstring), its fault directory ``fault_dir``. ``path``: the
    ``PYTHONPATH`` to extend (default: this process's)."""
    rest = os.environ.get("PYTHONPATH", "") if path is None else path
    return {FAULT_DIR_ENV: str(fault_dir),
            "PYTHONPATH": os.pathsep.join([str(SITE), str(REPO), *([rest] if rest else [])])}


def spark_conf(fault_dir: Path | str) -> dict[str, str]:
    """``environment(fault_dir)`` as Spark settings (``spark.executorEnv.*``), for executors
    that do not inherit the driver's environment whole: a ``local-cluster`` or standalone
    worker starts an executor with the application's ``spark.executorEnv`` over its own
    environment, and ``connector.spark.local_session`` always sets a ``PYTHONPATH`` there (its
    ``worker_site``, before what is given), which replaces the inherited one."""
    return {f"spark.executorEnv.{key}": value
            for key, value in environment(fault_dir, "").items()}


def install_from_environment() -> bool:
    """Install the hook when ``TABLESTORE_CDC_FAULT_DIR`` is set (``crash_site``'s
    ``sitecustomize``, at a process's start); whether it did."""
    if not os.environ.get(FAULT_DIR_ENV):
        return False
    crash_hook.install(fault_point)
    return True


def install(fault_dir: Path | str) -> None:
    """Arm this process for the crash points of ``fault_dir`` (a test in one process)."""
    os.environ[FAULT_DIR_ENV] = str(fault_dir)
    crash_hook.install(fault_point)


def uninstall() -> None:
    """Undo ``install``: the product's crash points do nothing again."""
    os.environ.pop(FAULT_DIR_ENV, None)
    crash_hook.install(None)


def fault_point(name: str, context: Any = None) -> None:
    """The harness's hook (``connector.crash_hook.CrashHook``; driver or executor): acts on
    ``name`` when the fault directory holds ``arm-<name>`` (module docstring)."""
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
