"""The closing summary of scripts/test: where the time went, and the counts.

Usage: python scripts/summary.py REPORTS_DIR TIMES_FILE CPU_FILE FAILED_RUNS

REPORTS_DIR holds each pass's JUnit XML; TIMES_FILE a line
"wall seconds<TAB>CPU seconds<TAB>pass" per run (scripts/test's ``run``: the
CPU time, user and system, of the processes the run started and waited
for); CPU_FILE the lines of /proc/stat's "cpu" taken at the start and the end
of the passes (and of the set-up before them).
Prints the time per pass, the 20 slowest tests, the 15 files that cost the
most over all passes, how busy the cores were, then the closing line
"totals: N passed, N failed, N skipped" (a run that failed outside pytest,
a lint or a time-out, counts as a failure).
"""

from __future__ import annotations

import glob
import os
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from typing import Dict, List, Tuple


def busy(lines: List[str]) -> List[Tuple[str, float]]:
    """(label, share of the cores' time that was busy) between marks of CPU_FILE."""
    marks = []
    for line in lines:
        label, _, rest = line.partition("\t")
        fields = [int(v) for v in rest.split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        marks.append((label, sum(fields), idle))
    shares = []
    for (label, total0, idle0), (_, total1, idle1) in zip(marks, marks[1:]):
        spent = total1 - total0
        shares.append((label, 1 - (idle1 - idle0) / spent if spent else 0.0))
    return shares


def main(reports: str, times: str, cpu: str, failed_runs: int) -> int:
    totals = dict(tests=0, failures=0, errors=0, skipped=0)
    slow: List[Tuple[float, str, str]] = []
    per_file: Dict[str, float] = defaultdict(float)
    for path in sorted(glob.glob(os.path.join(reports, "*.xml"))):
        run = os.path.basename(path)[: -len(".xml")]
        for suite in ET.parse(path).getroot().iter("testsuite"):
            for key in totals:
                totals[key] += int(suite.get(key, 0))
        for case in ET.parse(path).getroot().iter("testcase"):
            seconds = float(case.get("time", 0) or 0)
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            slow.append((seconds, run, name))
            per_file[case.get("classname", "") or "?"] += seconds  # (the module's dotted path)
    if os.path.exists(times):
        rows = [line.split("\t", 2) for line in open(times).read().splitlines() if line]
        print("\n== time per pass (wall and CPU seconds; several run at once)")
        print("   wall      cpu  pass")
        for seconds, cpu_s, name in sorted(rows, key=lambda r: -float(r[0])):
            print(f"{float(seconds):7.0f}  {float(cpu_s):7.0f}  {name}")
        total = sum(float(r[1]) for r in rows)
        print(f"         {total:7.0f}  CPU seconds of every pass")
    if slow:
        print("\n== the 20 slowest tests (seconds, pass, test)")
        for seconds, run, name in sorted(slow, reverse=True)[:20]:
            print(f"{seconds:7.1f}  {run:24s} {name}")
        print("\n== the 15 costliest test modules, over every pass (seconds)")
        for name, seconds in sorted(per_file.items(), key=lambda kv: -kv[1])[:15]:
            print(f"{seconds:7.0f}  {name}")
    if os.path.exists(cpu):
        print("\n== how busy the two cores were")
        for label, share in busy(open(cpu).read().splitlines()):
            print(f"{100 * share:5.0f}%  {label}")
    bad = totals["failures"] + totals["errors"]
    passed = totals["tests"] - bad - totals["skipped"]
    if failed_runs and not bad:
        bad = 1  # a run that failed outside pytest (lint, a crash, a time-out)
    print(f"\ntotals: {passed} passed, {bad} failed, {totals['skipped']} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
