"""Pool several ``pycoll-bench --targets --json`` runs into one table.

    mpiexec -n 2 pycoll-bench --targets --json > run1.json   # and run2, run3
    python -m pycoll.bench.pool run1.json run2.json run3.json [--json]

Each ratio is the median of all the runs' rounds together
(:func:`pycoll.bench.extras.pool_targets`); docs/benchmarks.md quotes tables
made so. Needs no MPI job: it reads the files.
"""

from __future__ import annotations

import json
import sys
from typing import List, Optional

from . import extras


def main(argv: Optional[List[str]] = None) -> int:
    """Print the pooled table (or JSON with ``--json``); exit 1 if a run saw a
    wrong result, 2 without files."""
    args = sys.argv[1:] if argv is None else argv
    as_json = "--json" in args
    files = [a for a in args if a != "--json"]
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
    sys.exit(main())
