"""Run the network-fault scenarios, the cluster scenarios or the soak; one line per scenario.

    python -m integration.netfaults [--quick] [--only NAME] [--seed S] [--json FILE]
    python -m integration.netfaults cluster [--long]          (root: network namespaces)
    python -m integration.netfaults soak [--minutes 20] [--changes 1000000] [--channels 64]

Exit status 0 when every scenario passed. Work files go to ``--workdir`` (default: a
temporary directory); a failed scenario's files are kept and named in its line.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any, NoReturn


def _terminate(signum: int, frame: Any) -> NoReturn:
    raise SystemExit(128 + signum)  # unwind: every scenario's cleanup runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m integration.netfaults",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", default="faults", choices=("faults", "cluster", "soak"))
    parser.add_argument("--quick", action="store_true", help="the default suite's bounded form")
    parser.add_argument("--long", action="store_true", help="cluster: the longer version")
    parser.add_argument("--only", action="append", default=[], help="scenario name (repeat)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--minutes", type=float, default=20.0, help="soak: how long")
    parser.add_argument("--changes", type=int, default=1_000_000, help="soak: changes to write")
    parser.add_argument("--channels", type=int, default=64, help="soak: channels")
    parser.add_argument("--kill-every", type=float, default=60.0, help="soak: seconds")
    parser.add_argument("--retention", type=int, default=10,
                        help="soak: the query's metaRetentionBatches")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    signal.signal(signal.SIGTERM, _terminate)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="netfaults-"))
    results: list[Any] = []
    if args.what == "faults":
        from integration.netfaults import scenarios
        from integration.netfaults.harness import run_net_scenario

        chosen = scenarios.quick() if args.quick else scenarios.full()
        if args.only:
            chosen = [s for s in chosen if s.name in args.only]
        for scenario in chosen:
            result = run_net_scenario(scenario, workdir, seed=args.seed)
            print(result.line(), flush=True)
            results.append(result)
    elif args.what == "cluster":
        from integration.netfaults import netns
        from integration.netfaults.cluster import ClusterScenario, run_cluster_scenario

        reason = netns.unavailable()
        if reason:
            print(f"cluster scenarios skipped: {reason}", file=sys.stderr)
            return 2
        scenario = (ClusterScenario("cluster-long", kill_worker=2, cut_worker=2, tail_s=30.0)
                    if args.long else ClusterScenario("cluster-short"))
        result = run_cluster_scenario(scenario, workdir, seed=args.seed)
        print(result.line(), flush=True)
        results.append(result)
    else:
        from integration.netfaults.soak import Soak

        soak = Soak(workdir, minutes=args.minutes, changes=args.changes, channels=args.channels,
                    kill_every_s=args.kill_every, retention=args.retention, seed=args.seed)
        result = soak.run()
        print(result.report(), flush=True)
        results.append(result)
    if args.json:
        args.json.write_text(json.dumps([r.to_dict() for r in results], indent=2, default=str))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
