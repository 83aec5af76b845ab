"""A duplicate attempt of one Spark partition, in its own process (harness helper).

    python -m integration.faults.duplicate CONTEXT.pkl OUT.json

Loads the pickled context of a crash point armed with ``hold`` in ``connector.reader`` while a
Spark task reading the partition is paused there: the ``ChannelPartition`` and the end
checkpoint that task has claimed or is about to claim. Reads the partition with
``testkit.partition_reads.read_partition``, exactly as a speculative or retried attempt on
another executor would: it claims the channel's end if nobody has, or replays the claimed
end. Writes the channel id, the end UUID, the records' (channel id, sequence) pairs and the held
task's record count as JSON, for the harness to compare with what Spark delivered.
"""

from __future__ import annotations

import json
import pickle
import sys


def main(argv: list[str] | None = None) -> int:
    partition_path, out_path = (argv if argv is not None else sys.argv[1:])[:2]
    from testkit.partition_reads import read_partition

    with open(partition_path, "rb") as f:
        context = pickle.load(f)
    partition, held_end = context["partition"], context["end"]
    records = read_partition(partition)
    with open(out_path, "w") as f:
        json.dump({
            "channel_id": partition.channel_id,
            "end_uuid": partition.end_uuid,
            "records": [[partition.channel_id, r.sequence] for r in records],
            "held_records": held_end.records,
        }, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
