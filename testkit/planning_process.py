"""A stand-in for Spark's planning process of a streaming query, for the lease tests.

``python -m testkit.planning_process META_URI WHERE`` takes a query's lease in its main thread
as the source does (``QueryLease.take``, which installs the SIGTERM handler: this module
declares itself the planning module first), prints ``ready`` and then waits the way PySpark's
runner (``pyspark.sql.streaming.python_streaming_source_runner``) does, inside a
``try: ... finally: stop`` that releases the lease:

- ``WHERE=socket``: blocked reading its input, as the runner waits for the JVM's next call;
- ``WHERE=meta-call``: inside a meta-store call that holds the store's lock (a planning call
  under load, where SIGTERM most often finds the process).

Used by ``tests/test_lease_sigterm.py``, which sends SIGTERM and checks the lease is gone.
"""

from __future__ import annotations

import sys
import time

import connector.planning.lease as lease_module
from connector.identity import SourceIdentity
from connector.planning.lease import QueryLease
from meta_store import open_meta_store

#: the source whose lease the stand-in holds
IDENTITY = SourceIdentity(kind="local", service="/tmp/store.db", table="t", tunnel="handover")


def _hold_the_meta_store(meta: object) -> None:
    """Sit inside a meta-store call of the SQLite backend (its lock held), or, for a backend
    with no lock of its own, inside a long call of the process (a listing loop)."""
    run = getattr(meta, "_run", None)
    if run is not None:
        run("planning call", lambda conn: time.sleep(600))
    else:
        while True:
            meta.list_batches(IDENTITY.namespace)  # type: ignore[attr-defined]


def main(meta_uri: str, where: str) -> None:
    lease_module.PLANNING_MODULE = __spec__.name  # this process plays the planning process
    meta = open_meta_store(meta_uri)
    lease = QueryLease(meta, IDENTITY)
    lease.take(IDENTITY.namespace, None)
    print("ready", flush=True)
    try:
        if where == "meta-call":
            _hold_the_meta_store(meta)
        else:
            sys.stdin.read()  # the JVM's socket: nothing comes
    finally:  # the runner's ``finally: reader.stop()``
        lease.release()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
