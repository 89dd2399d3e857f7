"""Runs a rank's Python target (a script or ``-m module``) the way ``python``
would, with two additions for pycoll-run. faulthandler: SIGUSR1 (sent on
--timeout) prints every thread's stack, and a crash prints where it
happened. An exception hook: it hands an uncaught exception's traceback to
the rank wrapper (printed once, labelled, by pycoll-run) and ends the
process at once instead of letting MPI's finalisation wait for ranks that
will never come. A non-zero ``sys.exit`` ends the process at once for the
same reason (atexit handlers do not run), as ``python -m mpi4py`` does.

    python .../pycoll/launch/boot.py script.py args...
    python .../pycoll/launch/boot.py -m package.module args...

Standalone and run by path, so the target's process imports nothing of
pycoll's that the target does not.
"""

from __future__ import annotations

import faulthandler
import os
import runpy
import signal
import sys
from types import TracebackType

# Imported only where used, so each rank's start does not pay for them: typing
# for the type checker (mypy takes this name as true), traceback when an
# exception is uncaught. Together they were half of what boot added to a rank.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional, Type

TRACEBACK_FD = "PYCOLL_RUN_TRACEBACK_FD"  # as in wire.py (not imported: boot stays standalone)


def user_frames(tb: Optional[TracebackType], value: object = None) -> Optional[TracebackType]:
    """The traceback from the user's code on: without the leading frames of
    this module and runpy, and, for pycoll's own errors, without pycoll's
    frames (pycoll.errors.user_frames: it ends at the user's call). pycoll's
    errors exist only where the target imported pycoll, so this imports
    nothing of it."""
    here = os.path.abspath(__file__)
    while tb is not None and (
        os.path.abspath(tb.tb_frame.f_code.co_filename) == here
        or tb.tb_frame.f_globals.get("__name__") == "runpy"
    ):
        tb = tb.tb_next
    errors = sys.modules.get("pycoll.errors")
    return tb if errors is None else errors.user_frames(tb, value)


def _hook(fd: int):
    def hook(kind: Type[BaseException], value: BaseException, tb: Optional[TracebackType]) -> None:
        import traceback

        text = "".join(traceback.format_exception(kind, value, user_frames(tb, value)))
        _flush()
        data = text.encode("utf-8", "replace")
        while data:
            data = data[os.write(fd, data) :]
        os.close(fd)
        # Exit now: MPI's finalisation at exit could wait forever for ranks
        # that are still inside a collective this rank will never join.
        os._exit(1)

    return hook


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)  # sys.exit("message"), as the interpreter does
    return 1


def main(argv: List[str]) -> None:
    try:
        _run(argv)
    except SystemExit as exc:
        status = _exit_status(exc.code)
        if status:
            _flush()
            os._exit(status)
        raise


def _run(argv: List[str]) -> None:
    # A private copy of stderr: the target may redirect descriptor 2 (pytest's
    # output capture does), and the stacks must still reach the wrapper.
    stacks = os.fdopen(os.dup(2), "w")
    faulthandler.enable(file=stacks, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    # pycoll's flight recorder also answers SIGUSR1; it registers these stacks
    # again, chained to its own handler (pycoll.trace.recorder.install_signal).
    # (pid:fd: a child process inherits the variable, not the descriptor)
    os.environ["PYCOLL_STACKS_FD"] = f"{os.getpid()}:{stacks.fileno()}"
    fd = os.environ.pop(TRACEBACK_FD, None)
    if fd is not None:
        sys.excepthook = _hook(int(fd))
    if argv[:1] == ["-m"] and len(argv) >= 2:
        sys.path[0] = os.getcwd()  # as python -m puts it, instead of this folder
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv:
        script = argv[0]
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")
    else:
        sys.exit("usage: boot.py (script.py | -m module) [args...]")


if __name__ == "__main__":
    main(sys.argv[1:])
