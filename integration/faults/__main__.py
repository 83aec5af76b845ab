"""``python -m integration.faults``: run the fault-injection scenarios, one line per scenario.

    python -m integration.faults [--quick] [--seed S] [--kills N] [--only TEXT] [--keep]
                                 [--workdir DIR] [--json FILE] [-v]

Runs in the harness process; each scenario starts its own Spark runner processes (one at a
time: never more than one Spark driver). Prints one line per scenario and a final line
``N scenarios, N passed, N failed, lost=N duplicated=N``; exits 1 if any scenario failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import tempfile
import time
from pathlib import Path

import psutil

from integration.faults import scenarios as catalog
from integration.faults.harness import Result, run_scenario


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m integration.faults",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="the bounded CI subset instead of the full matrix")
    parser.add_argument("--seed", type=int, default=1, help="seed of kill times and writes")
    parser.add_argument("--kills", type=int, default=None,
                        help="random kills in all (default: 50 full, 2 quick)")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="run only scenarios whose name contains TEXT (repeatable)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where scenario files go (default: a new temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the files of passed scenarios")
    parser.add_argument("--json", type=Path, default=None, help="also write results as JSON")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)

    if args.quick:
        chosen = catalog.quick(args.seed, 2 if args.kills is None else args.kills)
    else:
        chosen = catalog.full(args.seed, 50 if args.kills is None else args.kills)
    if args.only:
        chosen = [s for s in chosen if any(text in s.name for text in args.only)]
    if args.list:
        for s in chosen:
            print(f"{s.name:<30} kills={s.kills:<3d} {s.why}")
        return 0
    if not chosen:
        print("no scenario selected", file=sys.stderr)
        return 2

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tablestore-cdc-faults-"))
    workdir.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    results: list[Result] = []
    for scenario in chosen:
        results.append(run_scenario(scenario, workdir, seed=args.seed, keep=args.keep,
                                    on_done=lambda r: print(r.line(), flush=True)))
    seconds = time.monotonic() - began
    passed = sum(r.ok for r in results)
    lost = sum(r.lost for r in results)
    duplicated = sum(r.duplicated for r in results)
    totals = {
        "scenarios": len(results), "passed": passed, "failed": len(results) - passed,
        "kills": sum(r.kills for r in results), "changes": sum(r.changes for r in results),
        "lost": lost, "duplicated": duplicated,
        "out_of_order": sum(r.out_of_order for r in results),
        "replays": sum(r.replays for r in results), "seconds": round(seconds, 1),
        "seed": args.seed, "quick": args.quick,
        "machine": f"{platform.system()} {platform.machine()}, {psutil.cpu_count()} cores, "
                   f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python "
                   f"{platform.python_version()}",
    }
    if args.json:
        args.json.write_text(json.dumps({"totals": totals,
                                         "results": [r.to_dict() for r in results]}, indent=2))
    print(f"# {totals['kills']} kills, {totals['changes']} changes verified, "
          f"{totals['replays']} replays checked, {seconds / 60:.1f} min, seed {args.seed}",
          flush=True)
    print(f"{len(results)} scenarios, {passed} passed, {len(results) - passed} failed, "
          f"lost={lost} duplicated={duplicated}", flush=True)
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
