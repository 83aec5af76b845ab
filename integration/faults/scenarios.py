"""The scenario catalog: the full matrix and the bounded CI subset (harness process).

Full run (``python -m integration.faults``):

- **crash points**: every protocol step in ``MATRIX_POINTS`` x ``commitInterval`` 1 and 5, one
  SIGKILL of the whole Spark tree parked exactly at that step, then a restart;
- **random kills**: ``kills`` SIGKILLs at seeded random times, split over three scenarios
  (commitInterval 1; commitInterval 5 with ``maxOffsetsPerTrigger``; with 10% transient errors);
- **task retry**: tasks raise after and before their claim under ``local[2,4]``;
- **duplicate read**: a second process reads a partition a Spark task is holding;
- **transient errors**: 10% of tunnel and meta-store calls fail (before or after taking effect);
- **cluster**: ``local-cluster[2,1,1024]`` (separate executor JVMs) with the DynamoDB meta store
  on a moto server, a kill at ``mid_read`` on an executor and a random kill.

Quick run (``--quick``, the ``faults`` pytest marker, what CI runs): four crash points merged
into two scenarios of two kills each (``mid_read`` and ``after_sink_write`` with commitInterval
1, ``commit_start`` and ``mid_commit_push`` with 5), task retry, duplicate read, transient
errors and two random kills.
"""

from __future__ import annotations

import random

from integration.faults.harness import (
    CrashAt,
    DuplicateRead,
    FailTask,
    Scenario,
    random_kills,
)

#: the protocol steps a crash is injected at, in the order a batch passes them
MATRIX_POINTS = (
    "latest_offset_start",  # previous batch in Spark's commit log, its source commit not run
    "after_latest_offset",  # end UUID minted, Spark's offset log not written
    "plan_start",  # Spark's offset log written, manifest not yet
    "mid_read",  # one partition claimed its end and parks; others may have claimed
    "after_sink_write",  # every end recorded, batch stored, Spark's commit log not written
    "commit_start",  # Spark's commit log written, nothing pushed
    "mid_commit_push",  # some channels' checkpoints pushed to the tunnel, others not
)

WHY = {
    "latest_offset_start": "the previous batch's commit is lost: latestOffset must catch it up",
    "after_latest_offset": "a minted UUID never reaches Spark's offset log: an orphan",
    "plan_start": "Spark replays a batch whose manifest may not exist yet",
    "mid_read": "a batch is cut with some ends claimed: the replay must read exactly to them",
    "after_sink_write": "the sink has the batch but Spark does not know: an identical replay",
    "commit_start": "Spark's commit is never re-sent: the next commit must catch it up",
    "mid_commit_push": "the tunnel holds a mix of old and new checkpoints",
}

TRANSIENT_RATE = 0.1


def crash_matrix() -> list[Scenario]:
    return [
        Scenario(name=f"crash/{point}/ci{interval}", why=WHY[point],
                 steps=(CrashAt(point),), commit_interval=interval)
        for point in MATRIX_POINTS for interval in (1, 5)
    ]


def random_kill_scenarios(kills: int, seed: int) -> list[Scenario]:
    """``kills`` random kills over three scenarios (40% / 40% / 20%)."""
    rng = random.Random(f"random-kills:{seed}")
    a = round(kills * 0.4)
    b = round(kills * 0.4)
    c = kills - a - b
    scenarios = [
        Scenario(name="random/ci1", why="kills at random times, commitInterval 1",
                 steps=random_kills(a, rng), commit_interval=1, rate=20.0),
        Scenario(name="random/ci5-maxrows",
                 why="kills at random times, commitInterval 5, maxOffsetsPerTrigger 100",
                 steps=random_kills(b, rng), commit_interval=5, rate=20.0,
                 options=(("maxOffsetsPerChannel", "40"), ("maxOffsetsPerTrigger", "100"))),
        Scenario(name="random/flaky",
                 why="kills at random times while 10% of service calls fail transiently",
                 steps=random_kills(c, rng), commit_interval=2, flaky=TRANSIENT_RATE,
                 rate=20.0),
    ]
    return [s for s in scenarios if s.steps]


def other_faults() -> list[Scenario]:
    return [
        Scenario(name="task-retry",
                 why="tasks fail after and before their claim; Spark retries them (local[2,4])",
                 steps=(FailTask("mid_read"), FailTask("read_before_claim")),
                 master="local[2,4]"),
        Scenario(name="duplicate-read",
                 why="a second process reads a partition a Spark task is reading",
                 steps=(DuplicateRead("read_before_claim"), DuplicateRead("mid_read")),
                 # no cap: the held attempt reads what is there, the duplicate reads further
                 options=(("maxOffsetsPerChannel", "100000"),)),
        Scenario(name="transient-errors",
                 why="10% of tunnel and meta-store calls fail, before or after taking effect",
                 steps=(), flaky=TRANSIENT_RATE, tail_s=20.0, commit_interval=2),
    ]


def cluster_scenarios(seed: int) -> list[Scenario]:
    rng = random.Random(f"cluster:{seed}")
    return [
        Scenario(name="cluster/dynamodb",
                 why="local-cluster[2,1,1024] executor JVMs, DynamoDB meta store on moto",
                 steps=(CrashAt("mid_read"), *random_kills(1, rng)),
                 master="local-cluster[2,1,1024]", meta="dynamodb", commit_interval=2,
                 conf=(("spark.executor.memory", "512m"),)),
    ]


def lakehouse_scenarios(seed: int, wire: bool) -> list[Scenario]:
    """The query also applies every batch into a Delta or an Iceberg table
    (``tablestore_cdc.lakehouse``), killed before and after the table's commit and at a random
    time; on the embedded store, or over the wire (the emulator serves the store file)."""
    rng = random.Random(f"lakehouse:{seed}:{wire}")
    where = "over the emulator" if wire else "on the embedded store"
    prefix = "lakehouse/wire-" if wire else "lakehouse/"
    target_kills = (CrashAt("before_target_commit"), CrashAt("after_target_commit"))
    # each batch also commits into the table: a gentler writer and larger batches let the
    # query catch up with it between kills on a loaded 2-core machine
    pace = {"rate": 12.0, "options": (("maxOffsetsPerChannel", "100"),)}
    return [
        Scenario(name=f"{prefix}delta-scd{1 if wire else 2}",
                 why=f"kills around the Delta commit {where}; the table equals the source"
                 + ("" if wire else ", its history the change log's"),
                 steps=(*target_kills, *random_kills(1, rng)), commit_interval=2,
                 target="delta", scd=1 if wire else 2, wire=wire, **pace),
        Scenario(name=f"{prefix}iceberg-scd2",
                 why=f"kills around the Iceberg commit {where}; the table equals the source, "
                 "its history the change log's",
                 steps=target_kills, commit_interval=2, target="iceberg", scd=2, wire=wire,
                 **pace),
        *([] if wire else first_load_scenarios()),
    ]


def first_load_scenarios() -> list[Scenario]:
    """A table of 3,000 rows loaded by the query's first batches (every key new: appended, not
    merged), killed before an appended batch's commit, then the stream (merges). The data
    files are written by Spark's executors (the kill falls between their writes and the
    driver's commit)."""
    return [
        Scenario(name=f"lakehouse/first-load-{kind}",
                 why=f"a kill before the commit of an appended first-load batch into {kind}"
                 " (files written by the executors); then merges; the table equals the source",
                 steps=(CrashAt("before_target_commit", early=True),
                        CrashAt("after_target_commit")),
                 commit_interval=2, target=kind, scd=1, preload=3000, rate=12.0,
                 options=(("maxOffsetsPerChannel", "200"),),
                 executor_write_rows=1)
        for kind in ("delta", "iceberg")
    ]


def full(seed: int = 1, kills: int = 50) -> list[Scenario]:
    """The full matrix (``faults_full``)."""
    return [*crash_matrix(), *random_kill_scenarios(kills, seed), *other_faults(),
            *cluster_scenarios(seed), *lakehouse_scenarios(seed, wire=False),
            *lakehouse_scenarios(seed, wire=True)]


def quick(seed: int = 1, kills: int = 2) -> list[Scenario]:
    """The bounded subset CI runs (``faults``): a few minutes."""
    rng = random.Random(f"quick:{seed}")
    return [
        Scenario(name="quick/crash-ci1", why="kills mid-read and after the sink write, "
                 "commitInterval 1", steps=(CrashAt("mid_read"), CrashAt("after_sink_write")),
                 commit_interval=1),
        Scenario(name="quick/crash-ci5", why="kills after Spark's commit log and mid-push, "
                 "commitInterval 5", steps=(CrashAt("commit_start"), CrashAt("mid_commit_push")),
                 commit_interval=5),
        *other_faults(),
        Scenario(name="quick/random", why="kills at random times",
                 steps=random_kills(kills, rng), commit_interval=2),
        # one kill before the Delta commit keeps the default suite within its budget; both
        # targets, every commit kill and the emulator run in the full matrix
        Scenario(name="quick/lakehouse-delta-scd2",
                 why="a kill before the Delta commit on the embedded store; the table equals "
                 "the source, its history the change log's",
                 steps=(CrashAt("before_target_commit"),), commit_interval=2, target="delta",
                 scd=2, rate=12.0, options=(("maxOffsetsPerChannel", "100"),)),
    ]
