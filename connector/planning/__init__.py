"""The pieces of the driver protocol; ``connector.protocol.StreamProtocol`` tells the story of one
micro-batch by calling them. All of them live in Spark's planning process on the driver.

- ``offsets``: the offset JSON Spark logs, and the derived UUIDs of initial offsets (pure);
- ``positions``: where each channel stands after a batch (pure; the progress feed uses it too);
- ``read_limits``: each channel's cap in a new batch (pure);
- ``logs``: the planner's logger and its setup.

Nothing is imported here, so a caller of one piece (the feed imports ``positions``) loads only
that piece.
"""
