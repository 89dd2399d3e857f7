"""pycoll.trace: what every rank did (the timeline) and what it was doing
when the job stopped (the flight recorder).

    with pycoll.trace("traces"):        # collective: every rank enters it
        train()                          # -> traces/trace-rank<r>.json
    pycoll.trace.start("traces"); ...; pycoll.trace.stop()
    PYCOLL_TRACE=traces python train.py  # the same, from init to the end
    pycoll-run --trace traces -n 4 python train.py   # and merged: traces/trace.json

    pycoll.dump_flight_record()          # this rank's last operations, now

    python -m pycoll.trace merge traces       # one file for Perfetto / chrome://tracing
    python -m pycoll.trace summarize traces   # per call kind and size; who arrives last
    python -m pycoll.trace flight DIR         # the ranks' flight records: who is behind

docs/guide/trace.md is the guide.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any, Optional

from .recorder import dump as _dump

__all__ = ["dump_flight_record", "start", "stop", "tracing"]

# start, stop and tracing live in pycoll.trace.timeline, which needs the
# groups: loaded on first use (pycoll.groups imports this package's recorder).
_TIMELINE = ("start", "stop", "tracing", "is_tracing")


def __getattr__(name: str) -> Any:
    if name in _TIMELINE:
        return getattr(importlib.import_module(".timeline", __name__), name)
    raise AttributeError(f"module 'pycoll.trace' has no attribute {name!r}")


def dump_flight_record(directory: Optional[str] = None) -> str:
    """Write this rank's flight record now (JSON and text) into ``directory``
    (default: PYCOLL_FLIGHT_DIR, else <tmp>/pycoll-flight); return the JSON's path.
    Not collective: each rank that calls it writes its own."""
    return _dump("pycoll.dump_flight_record()", directory)


class _Callable(types.ModuleType):
    """``pycoll.trace(directory)``: the timeline recorded while a block runs
    (pycoll.trace.timeline.tracing; collective)."""

    def __call__(self, directory: str) -> Any:
        return importlib.import_module(".timeline", __name__).tracing(directory)


sys.modules[__name__].__class__ = _Callable
