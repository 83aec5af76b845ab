"""Run the benchmark suite: ``python -m benchmarks [--quick] [--repeat N] [--json FILE]``.

Every figure is a measurement of this run on this machine (see docs/performance.md for what
each one covers); targets are ratios or per-batch costs measured side by side, because the
machine may be shared. ``--quick`` finishes in under 10 minutes on 2 cores; the default (full)
preset takes longer. ``--only`` runs a subset, e.g. ``--only protocol,throughput``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from benchmarks.suite import BENCHMARKS, PRESETS, combine, format_table, run_suite, summary
from connector.planning.logs import LOG_LEVEL_ENV


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="the quick preset (under 10 minutes on 2 cores)")
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="a preset by name (overrides --quick); 'smoke' is the smallest")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results here")
    parser.add_argument("--only", default=",".join(BENCHMARKS),
                        help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run the selection N times; report the median and min .. max of "
                        "every figure and the load average of each run")
    parser.add_argument("--workdir", type=Path,
                        help="keep stores, checkpoints and logs here (default: a temp dir, "
                        "removed afterwards)")
    args = parser.parse_args(argv)
    only = tuple(b.strip() for b in args.only.split(",") if b.strip())
    unknown = [b for b in only if b not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}")
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    preset = PRESETS[args.preset or ("quick" if args.quick else "full")]
    # the planner's one INFO line per batch would bury the progress lines (hundreds of batches);
    # also inherited by Spark's planning processes. An explicit setting wins.
    os.environ.setdefault(LOG_LEVEL_ENV, "WARNING")

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    runs = []
    for i in range(args.repeat):
        if args.repeat > 1:
            log(f"--- run {i + 1} of {args.repeat} ---")
        workdir = args.workdir
        if workdir is not None and args.repeat > 1:
            workdir = workdir / f"run-{i + 1}"
        runs.append(summary(run_suite(preset, only=only, workdir=workdir, log=log)))
    results = combine(runs)
    print(format_table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        log(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
