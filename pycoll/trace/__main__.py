"""python -m pycoll.trace (merge | summarize | flight) DIR: the tools that read
what pycoll.trace wrote (see pycoll.trace.merge and pycoll.trace.flight)."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from . import flight, merge


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pycoll.trace", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="merge the ranks' timelines into DIR/trace.json")
    m.add_argument("directory")
    m.add_argument("-o", "--output", help="write the merged file here instead")
    s = sub.add_parser("summarize", help="per call kind and size; who arrives last")
    s.add_argument("directory")
    f = sub.add_parser("flight", help="the ranks' flight records: who is behind, doing what")
    f.add_argument("directory")
    f.add_argument("--job", help="the job whose records to read (default: the newest)")
    args = parser.parse_args(argv)
    try:
        if args.command == "merge":
            print(merge.merge(args.directory, args.output))
        elif args.command == "summarize":
            sys.stdout.write(merge.summarize(args.directory))
        else:
            sys.stdout.write(flight.analyze(args.directory, args.job))
    except FileNotFoundError as exc:
        parser.exit(1, f"python -m pycoll.trace: {exc}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
