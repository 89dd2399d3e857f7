"""torch's own distributed test suite, run on every rank of one MPI job.

Usage: ``mpiexec -n 3 python torch_suite.py BACKEND OUT_DIR [TEST ...]``
(tests/torch_backend/test_torch_suite.py starts it, for "gloo" and "pycoll").

torch ships ``DistributedTest._DistTestBase`` (torch/testing/_internal/
distributed/distributed_test.py): about 285 tests, each written to run on
every rank of a group. torch runs them by starting a fresh set of processes
per test; torch's MPI backend ran them the way this does: one MPI rank per
process, the default group started once, then every test run in turn on
every rank, with torch's own file barrier before and after each.

The suite decides what to skip by backend name, at import: "Only gloo
backend supports timeouts", sparse all_reduce "Only Gloo", the backends
listed for DDP and subgroups. Its bodies branch on the name too, to take the
CPU path where the backend is gloo (or mpi) and the CUDA one for nccl. So it
is imported under gloo's name, and then its BACKEND becomes the backend it
really runs on, under a name that also answers to "gloo" (GlooLike):
every test that runs for gloo on CPU runs here, takes gloo's CPU branches,
and makes its groups with the backend given. The sets of backends that have
a feature get it where they list gloo. (tests/torch_backend/test_torch_suite.py
lists the few tests written for gloo alone, each with its reason.)

Each rank writes one JSON line per test to OUT_DIR/rank{N}.jsonl as it
goes, so a job that dies still says how far it got: the test's name, its
outcome on this rank (passed, failed, skipped) and what was said.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback
import unittest
from datetime import timedelta
from typing import Any, Dict, List

RANK = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
SIZE = int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
PG_TIMEOUT_S = 60  # the suite's default_pg_timeout


class GlooLike(str):
    """A backend's name that compares equal to "gloo" too: the suite's bodies
    take gloo's CPU branches, while what they pass to torch is the name itself."""

    def __eq__(self, other: object) -> bool:
        return other == "gloo" or str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = str.__hash__


def load(backend: str) -> Any:
    """distributed_test, imported under gloo's name, then set to ``backend``."""
    os.environ["BACKEND"] = "gloo"  # the name gates are evaluated at import
    os.environ["WORLD_SIZE"] = str(SIZE)
    import torch.testing._internal.distributed.distributed_test as suite
    from torch.testing._internal.common_distributed import DistTestCases

    os.environ["BACKEND"] = backend  # what the bodies read at run time
    suite.BACKEND = GlooLike(backend)
    for names in DistTestCases.backend_feature.values():
        if "gloo" in names:
            names.add(backend)
    return suite


def main(backend: str, out_dir: str, wanted: List[str]) -> None:
    import torch.distributed as dist
    from torch.testing._internal.common_distributed import TEST_SKIPS
    from torch.testing._internal.common_utils import TestCase

    if backend == "pycoll":
        import pycoll.torch  # noqa: F401  (registers the backend)
    suite = load(backend)
    CUSTOM_PG_TIMEOUT = suite.CUSTOM_PG_TIMEOUT
    skips = {s.exit_code: s.message for s in TEST_SKIPS.values()}

    class Suite(TestCase, suite.DistributedTest._DistTestBase):
        """The attributes the tests read of torch's TestDistBackend."""

        rank = RANK
        file_name = ""  # the test's init file, set before each test

        @property
        def world_size(self) -> str:  # TestDistBackend's is the variable's text
            return os.environ["WORLD_SIZE"]

        @property
        def init_method(self) -> str:
            return os.environ["INIT_METHOD"]

        @property
        def destroy_pg_upon_exit(self) -> bool:
            return False

    names = sorted(n for n in dir(suite.DistributedTest._DistTestBase) if n.startswith("test_"))
    if wanted:
        names = [n for n in names if n in wanted]
    out = open(os.path.join(out_dir, f"rank{RANK}.jsonl"), "w")
    init_dir = os.path.join(os.environ["TEMP_DIR"], "init_dir")
    from mpi4py import MPI

    meet = MPI.COMM_WORLD.Dup()  # the harness's own, for the ranks to meet between tests
    for name in names:
        method = getattr(Suite, name)
        if getattr(method, "__unittest_skip__", False):  # skipped by its decorators at import
            record(out, name, "skipped", method.__unittest_skip_why__, 0.0)
            continue
        # A default group of its own for each test, as TestDistBackend's fresh
        # processes have: a test may leave its group broken on purpose (the
        # timeouts) or remake it with a timeout of a second.
        url = f"file://{init_dir}/{name}"
        os.environ["INIT_METHOD"] = suite.INIT_METHOD = url
        Suite.file_name = url[len("file://") :]
        start = time.monotonic()
        dist.init_process_group(
            backend,
            init_method=url,
            world_size=SIZE,
            rank=RANK,
            timeout=timedelta(seconds=CUSTOM_PG_TIMEOUT.get(name, PG_TIMEOUT_S)),
        )
        if dist.get_backend() != backend:  # (what the whole run stands on)
            raise SystemExit(f"the default group runs on {dist.get_backend()}, not {backend}")
        outcome, said = run_one(Suite(name), skips)
        if not met(meet, PG_TIMEOUT_S) and outcome != "failed":  # a rank is stuck in it
            outcome, said = "failed", f"the ranks did not meet within {PG_TIMEOUT_S} s after it"
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as exc:  # the test's groups did not end well: it failed
                outcome, said = "failed", f"destroy_process_group after the test: {exc}\n{said}"
        record(out, name, outcome, said, time.monotonic() - start)
    out.write(json.dumps({"done": True}) + "\n")
    out.close()
    sys.stdout.flush()
    os._exit(0)  # a test may have left a group broken: no teardown that could wait


def record(out: Any, name: str, outcome: str, said: str, seconds: float) -> None:
    line = {"test": name, "outcome": outcome, "said": said[-3000:], "seconds": round(seconds, 2)}
    out.write(json.dumps(line) + "\n")
    out.flush()


def met(comm: Any, seconds: float) -> bool:
    """A barrier on ``comm``, given up after ``seconds``; whether every rank came."""
    request = comm.Ibarrier()
    end = time.monotonic() + seconds
    while not request.Test():
        if time.monotonic() > end:
            return False
        time.sleep(1e-3)
    return True


def run_one(case: Any, skips: Dict[int, str]) -> Any:
    """(outcome, what was said) of one test on this rank."""
    result = unittest.TestResult()
    case.run(result)
    problems = result.failures + result.errors
    for _, text in problems:  # the suite's GPU and world-size skips exit the process
        exited = re.search(r"^SystemExit: (\d+)\s*$", text, re.M)
        if exited and int(exited.group(1)) in skips and len(problems) == 1:
            return "skipped", skips[int(exited.group(1))]
    if problems:
        return "failed", "\n".join(text for _, text in problems)
    for _, text in result.skipped:
        return "skipped", text
    if result.unexpectedSuccesses:
        return "failed", "unexpected success"
    return "passed", ""


if __name__ == "__main__":
    try:
        main(sys.argv[1], sys.argv[2], sys.argv[3:])
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
