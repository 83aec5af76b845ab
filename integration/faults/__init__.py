"""Fault-injection harness: prove exactly-once and per-key order by really killing processes.

    python -m integration.faults [--quick] [--seed S] [--kills N]

- ``harness``: runs one scenario (store, writer, Spark runner process, kills, restarts,
  verification) in the harness process;
- ``scenarios``: the full matrix and the quick CI subset;
- ``workload``: the writer thread (changes, channel splits and merges);
- ``duplicate``: a second attempt of one partition, in its own process.

See docs/reliability.md for what each scenario does and the figures of a full run.
"""
