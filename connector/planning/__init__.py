"""The pieces of the driver protocol; ``connector.protocol.StreamProtocol`` tells the story of one
micro-batch by calling them. All of them live in Spark's planning process on the driver.

- ``binding``: binding a query to its meta store, namespace, tunnel and lease at its first
  call, every refusal before anything is created;
- ``lease``: one live query per source (a lease in the meta store, taken over at once by a
  restart of the same query);
- ``offsets``: the offset JSON Spark logs, and the derived UUIDs of initial offsets (pure);
- ``namespace``: the namespace's record in the meta table: its tunnel binding and the
  generations of initial offsets;
- ``positions``: where each channel stands after a batch (pure; the progress feed uses it too);
- ``tracker``: which channels a new batch reads: discovery, lineage, terminated channels, the
  AvailableNow bound (Flink's SplitTracker);
- ``read_limits``: whether a batch runs now (``minOffsetsPerTrigger``, ``maxTriggerDelay``) and
  each channel's record cap and byte budget in a new batch (pure);
- ``backlog``: records waiting beyond a batch's positions, counted up to what a decision needs;
- ``starting``: ``startingTimestamp``'s checks when a query's initial offset is created;
- ``pushes``: commit catch-up and checkpoint pushes to the tunnel;
- ``logs``: the planner's logger and its setup.

Nothing is imported here, so a caller of one piece (the feed imports ``positions``) loads only
that piece.
"""
