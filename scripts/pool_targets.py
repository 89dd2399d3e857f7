#!/usr/bin/env python3
"""Pool several `pycoll-bench --targets --json` runs into one table.

    mpiexec -n 2 pycoll-bench --targets --json > run1.json   # and run2, run3
    .venv/bin/python scripts/pool_targets.py run1.json run2.json run3.json [--json]

Each ratio is the median of all the runs' rounds together (see
pycoll.bench.extras.pool_targets); docs/benchmarks.md quotes tables made so.
"""

import json
import sys

from pycoll.bench import extras


def main(argv: list) -> int:
    as_json = "--json" in argv
    files = [a for a in argv if a != "--json"]
    if not files:
        print(__doc__, file=sys.stderr)
        return 2
    reports = []
    for name in files:
        with open(name) as f:
            reports.append(json.load(f))
    pooled = extras.pool_targets(reports)
    print(json.dumps(pooled, indent=1) if as_json else extras.targets_table(pooled))
    return 1 if pooled["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
