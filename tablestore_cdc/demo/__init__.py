"""``tablestore-cdc demo``: the whole pipeline on an embedded store with a live writer, verified.

``run.py`` builds an embedded store, starts the pipeline (``tablestore_cdc.pipeline``), runs
``writer.py``'s writer with channel splits and a merge while the pipeline runs, shows live
counts, then verifies nothing was lost or doubled and that the Delta table equals the source
table row by row. With ``backend="emulator"`` everything goes over the wire: the writer uses
the official SDK, the source the Tunnel API, the meta table is in the emulated instance.
"""
