"""The network misbehaving, and more than one host.

- ``proxy``: a fault-injecting HTTP proxy for one hop (tunnel API, Tablestore meta table,
  DynamoDB), scripted per request or per time window;
- ``scenarios``: fault runs on a real local Spark over the emulator behind one proxy per hop,
  verified like the kill tests (``python -m integration.netfaults``);
- ``cluster``: a Spark standalone cluster whose driver, workers and services live in separate
  network namespaces (root only);
- ``soak``: a long run with splits, merges and query kills, sampling memory and meta-table size.

See docs/reliability.md for the figures and the commands that reproduce them.
"""
