"""One outcome from many ranks: the rules every mode of the harness shares.

A test passes only if it passed on every rank; it fails if it failed on any
(with each failing rank's report, labelled); it is skipped only if every rank
skipped it; ranks that disagree (one skipped, one passed) fail it, since a
test that does something different on different ranks is a bug to see.
"""

from __future__ import annotations

import re
from typing import List, Optional, Sequence, Tuple

RankOutcome = Tuple[int, str, str]  # (rank, "passed" | "failed" | "skipped", report text)


def combine(outcomes: Sequence[RankOutcome]) -> Tuple[str, Optional[str]]:
    """The merged outcome, and the text to report (None: keep rank 0's report)."""
    failed = [(rank, text) for rank, outcome, text in outcomes if outcome == "failed"]
    if failed:
        return "failed", labelled(failed)
    kinds = {outcome for _, outcome, _ in outcomes}
    if len(kinds) > 1:
        return "failed", "ranks disagree on the outcome: " + ", ".join(
            f"rank {rank} {outcome}" for rank, outcome, _ in outcomes
        )
    return kinds.pop(), None


def labelled(texts: Sequence[Tuple[int, str]]) -> str:
    return "\n".join(f"---------- rank {rank} ----------\n{text}" for rank, text in texts)


# Frames of pytest, pluggy, runpy and pycoll-run's boot in a faulthandler dump:
# left out of reports, as pytest leaves its own frames out of tracebacks.
_MACHINERY = re.compile(
    r'^  File "(?:[^"]*/(?:_pytest|pluggy)/|[^"]*/pytest/__main__\.py|<frozen runpy>'
    r'|[^"]*/launch/boot\.py)'
)


def prefixed(lines: List[Tuple[Optional[int], str]]) -> str:
    """Job output as pycoll-run prints it, each line with its rank, without the
    test machinery's frames in stack dumps."""
    return "\n".join(
        line if rank is None else f"[{rank}] {line}"
        for rank, line in lines
        if not _MACHINERY.match(line)
    )
