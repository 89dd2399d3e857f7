"""Inputs and independently computed expectations for the collective tests.

Every rank can compute every other rank's input (it depends only on the rank),
so each rank checks its result against numpy's own reduction of all inputs.
Values are small integers, so sums and products are exact in every dtype
(bfloat16 included) and the order MPI reduces in cannot change the result.
"""

from __future__ import annotations

import functools
import glob
import os
import signal
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
INTS = [
    np.dtype(t)
    for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
]
FLOATS = [np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.float64)]
COMPLEX = [np.dtype(np.complex64), np.dtype(np.complex128)]
BOOL = [np.dtype(np.bool_)]
ALL_DTYPES = BOOL + INTS + FLOATS + COMPLEX

# Which ops each dtype class supports, written out here rather than taken
# from pycoll, so a wrong table in pycoll fails the tests.
VALID_OPS = {
    "bool": ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"],
    "int": ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"],
    "float": ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM"],
    "complex": ["SUM", "PRODUCT", "AVG", "PREMUL_SUM"],
}
ALL_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG", "PREMUL_SUM"]
PREMUL_SCALE = 0.5


def rop(name: str) -> Any:
    """pycoll's ReduceOp of that name; PREMUL_SUM scaled by PREMUL_SCALE."""
    import pycoll

    if name == "PREMUL_SUM":
        return pycoll.make_premul_sum(PREMUL_SCALE)
    return getattr(pycoll.ReduceOp, name)


def dtype_class(dtype: np.dtype) -> str:
    if dtype in BOOL:
        return "bool"
    if dtype in INTS:
        return "int"
    if dtype in COMPLEX:
        return "complex"
    return "float"


# Real-GPU tests skip without a GPU; PYCOLL_TEST_GPU=1 makes that a failure.
REQUIRE_GPU = os.environ.get("PYCOLL_TEST_GPU", "") == "1"

# PYCOLL_TEST_MATRIX=lean (scripts/test's 3- and 4-rank passes and torch's 4-rank pass) runs
# the op x dtype matrices lean: every dtype with SUM, and every op of a dtype class
# with the dtypes that stand for it (the 16-bit floats each: their arithmetic
# is pycoll's own kernels). The other passes run them whole: each (op, dtype)
# pair still runs under both MPIs at 2 ranks, blocking and bounded, and at 1.
MATRIX = os.environ.get("PYCOLL_TEST_MATRIX", "full")
if MATRIX not in ("full", "lean"):
    raise ValueError(f"PYCOLL_TEST_MATRIX must be full or lean, got {MATRIX!r}")
LEAN_STAND_INS = {
    np.dtype(t) for t in (np.bool_, np.int32, np.uint8, np.float16, np.float32, np.complex64)
} | {BF16}


def valid_pairs():
    return [
        (op, dt)
        for dt in ALL_DTYPES
        for op in VALID_OPS[dtype_class(dt)]
        if MATRIX == "full" or op == "SUM" or dt in LEAN_STAND_INS
    ]


def invalid_pairs():
    return [(op, dt) for dt in ALL_DTYPES for op in ALL_OPS if op not in VALID_OPS[dtype_class(dt)]]


def data(rank: int, dtype: np.dtype, shape=(6,), salt: int = 0) -> np.ndarray:
    """Rank ``rank``'s input: small integers (or their complex/bool analogue)."""
    k = np.arange(int(np.prod(shape, dtype=np.int64))) + salt
    if dtype == np.bool_:
        return ((k + rank) % 3 == 0).reshape(shape)
    v = (rank + 1) * (k % 3 + 1)
    if dtype in COMPLEX:
        return (v + 1j * ((k + rank) % 2)).astype(dtype).reshape(shape)
    return v.astype(np.float64).astype(dtype).reshape(shape)


# numpy's elementwise form of each op, written out here (not taken from pycoll).
# AVG and PREMUL_SUM reduce as a sum; their division and scaling come around it.
UFUNCS = {
    "SUM": np.add,
    "AVG": np.add,
    "PREMUL_SUM": np.add,
    "PRODUCT": np.multiply,
    "MIN": np.minimum,
    "MAX": np.maximum,
    "BAND": np.bitwise_and,
    "BOR": np.bitwise_or,
    "BXOR": np.bitwise_xor,
}
# bool, as torch reduces it: SUM and MAX are "any", PRODUCT and MIN are "all".
LOGICAL_UFUNCS = {
    "SUM": np.logical_or,
    "MAX": np.logical_or,
    "BOR": np.logical_or,
    "PRODUCT": np.logical_and,
    "MIN": np.logical_and,
    "BAND": np.logical_and,
    "BXOR": np.logical_xor,
}


def ufunc(op: str, dtype: np.dtype):
    """numpy's ufunc for ``op`` on arrays of ``dtype``."""
    return (LOGICAL_UFUNCS if dtype == np.bool_ else UFUNCS)[op]


def reduce_all(op: str, arrays: List[np.ndarray], n: int) -> np.ndarray:
    """numpy's reduction of ``arrays`` under ``op``."""
    dtype = arrays[0].dtype
    if op == "PREMUL_SUM":
        arrays = [(a * PREMUL_SCALE).astype(dtype) for a in arrays]
    fn = ufunc(op, dtype)
    out = functools.reduce(lambda a, b: fn(a, b).astype(dtype), arrays)
    if op == "AVG":
        out = (out / np.array(n, dtype=dtype)).astype(dtype)
    return out


def assert_equal(actual: np.ndarray, expected: np.ndarray) -> None:
    """Exact equality, dtype included (bfloat16 compared through float32)."""
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if actual.dtype == BF16:
        actual, expected = actual.astype(np.float32), expected.astype(np.float32)
    np.testing.assert_array_equal(actual, expected)


def bad_root_lists(arg: str, root: str) -> Dict[str, Tuple[Callable[[int], Any], str]]:
    """The wrong lists of 3-element float64 arrays a root can pass as ``arg``
    (gather_list, whose root is ``dst``; scatter_list, ``src``), the root
    rank 0, by name: a function of the group's size making the list, and
    what the error says."""
    length = "must hold one entry per rank of the group"
    return {
        "missing": (lambda n: None, rf"{arg} is required on {root} \(0\)"),
        "too short": (lambda n: [np.ones(3)] * max(n - 1, 0), length),
        "too long": (lambda n: [np.ones(3)] * (n + 1), length),
        "dtype": (lambda n: [np.ones(3, np.float32)] * n, "float32"),
        "shape": (lambda n: [np.ones(4)] * n, rf"{arg}\[0\] has shape \(4,\)"),
    }


def count_starts(monkeypatch, cls: Any, sends: Callable[[Any], Any]) -> List[int]:
    """Record the group's sequence number at every ``cls.start`` (one of
    pycoll's staged paths: the ring, the doubling, the pairwise exchange,
    the reduce to a root) where ``sends(self)`` is true (the call has
    something to send on this rank), the real method still doing the work."""
    started: List[int] = []
    real = cls.start

    def start(self):
        if sends(self):
            started.append(self.pg._seq)
        return real(self)

    monkeypatch.setattr(cls, "start", start)
    return started


def spy_path(monkeypatch, func: str, name: str) -> List[int]:
    """Record every call of ``func`` that starts its registered path
    ``name`` (pycoll.paths), the real start still doing the work."""
    from pycoll import paths

    taken: List[int] = []
    path = paths.path(func, name)

    def start(*args: Any) -> Any:
        taken.append(1)
        return path.start(*args)

    monkeypatch.setitem(paths._REGISTRY[func], name, path._replace(start=start))
    return taken


def record_arg(monkeypatch, owner: Any, name: str, at: int) -> List[Any]:
    """Record the positional argument at index ``at`` of every call of
    ``owner.name`` (a module's function, or a class's method with ``self``
    at 0), the real function still making the call."""
    made: List[Any] = []
    real = getattr(owner, name)

    def recording(*args: Any, **kwargs: Any) -> Any:
        made.append(args[at])
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, recording)
    return made


def settle(work: Any, async_op: bool) -> None:
    """What a collective handed back: with ``async_op`` a Work that completes
    successfully, without it None."""
    import pycoll

    if async_op:
        assert isinstance(work, pycoll.Work)
        assert work.wait() is True
        assert work.is_completed() and work.is_success()
    else:
        assert work is None


def count_rings(monkeypatch) -> List[int]:
    """:func:`count_starts` of the ring all_reduce (pycoll.collectives.ring;
    on one rank a ring has nothing to send)."""
    from pycoll.collectives.ring import Ring

    return count_starts(monkeypatch, Ring, lambda ring: ring._steps)


def json_reports(out: str) -> List[dict]:
    """The JSON reports ranks of a job printed, one object per line (a
    launcher may glue lines of different ranks together)."""
    import json

    decoder = json.JSONDecoder()
    found, i = [], 0
    while (i := out.find('{"rank"', i)) >= 0:
        obj, end = decoder.raw_decode(out, i)
        found.append(obj)
        i = end
    return found


def shared_dir(pg):
    """A fixture body (``pytest.fixture(support.shared_dir)``): a temporary
    directory every rank of the job writes into (rank 0 makes it, and removes
    it once every rank is done)."""
    import shutil
    import tempfile

    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    made = tempfile.mkdtemp(prefix="pycoll-test-") if comm.Get_rank() == 0 else None
    path = comm.bcast(made)
    yield path
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


# Launcher variables of the job running a test (under mpiexec a test's
# process is itself a rank of another job): they must not leak into a job the
# test starts itself.
LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "HYDRA_", "MPI_LOCALRANKID", "OMPI_COMM_WORLD", "PRTE_JOB")


def job_env() -> dict:
    """This process's environment for a job a test starts: without the
    launcher variables of the job running the test."""
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}


def run_mpiexec(n: int, argv: List[str], env: dict, timeout: float, cwd=None, **kwargs):
    """``mpiexec -n N argv...`` with the MPI next to this Python, as a job the
    test starts itself (skipped where there is none), more ranks than cores
    allowed; a ``subprocess.CompletedProcess`` with text output.

    The launcher is started again (three starts at most) when it failed at
    start-up for a passing reason its family is known for, as pycoll-run
    does (Open MPI 5's prterun now and then cannot start its PMIx listener
    on a busy machine): none of the job ran, so the test sees the job, not
    the launcher's bad moment."""
    import subprocess
    import sys
    from pathlib import Path

    import pytest

    from pycoll.launch.families import FAMILIES, family_of_mpiexec
    from pycoll.launch.supervisor import START_ATTEMPTS

    mpiexec = Path(sys.executable).with_name("mpiexec")
    if not mpiexec.exists():
        pytest.skip(f"no mpiexec next to {sys.executable}")
    family = FAMILIES[family_of_mpiexec(str(mpiexec))]
    flags = ["--oversubscribe"] if family.name == "openmpi" else []
    command = [str(mpiexec), *flags, "-n", str(n), *argv]
    for _ in range(START_ATTEMPTS):
        proc = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd, **kwargs
        )
        said = proc.stdout + proc.stderr
        if proc.returncode == 0 or not family.transient_start_failure(said):
            break
    return proc


def stray_messages(world, tag: int) -> int:
    """Messages waiting on the next two communicators made from ``world``
    (this rank alone, by MPI_Comm_create_group with ``tag``, then a
    duplicate), which take the lowest free context ids: a message sent on a
    communicator after this rank freed it lands there (Open MPI aborts at the
    single-rank one). Collective over ``world``; both are freed after."""
    from mpi4py import MPI

    mine = world.Get_group().Incl([world.Get_rank()])
    alone = world.Create_group(mine, tag=tag)
    mine.Free()
    pair = world.Dup()
    world.Barrier()
    strays = 0
    for _ in range(2000):
        strays += bool(alone.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG))
        strays += bool(pair.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG))
    world.Barrier()
    alone.Free()
    pair.Free()
    return strays


def _running(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status  # a zombie has ended; only its parent has not looked


def still_alive(pids: List[int], within: float = 10.0) -> List[int]:
    """The pids still running after waiting (polling) at most ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        alive = [pid for pid in pids if _running(pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


@contextmanager
def reaped(proc: Any) -> Iterator[Any]:
    """``proc`` (a subprocess.Popen), killed and reaped on leaving if it still
    runs: a test that fails while waiting on it leaves no process behind
    (Popen's own ``with`` would wait for it without a bound)."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def signals_as(disposition: Any) -> Any:
    """A ``preexec_fn`` that starts the child with SIGINT and SIGTERM set to
    ``disposition`` (``signal.SIG_DFL`` or ``signal.SIG_IGN``), whatever this
    process has: a suite started as a shell's background job ignores SIGINT,
    and its children would inherit that."""

    def preexec() -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, disposition)

    return preexec


@contextmanager
def at_detail() -> Iterator[None]:
    """Inside, the debug level is DETAIL (every call checked against the
    other ranks' before it runs); after, what it was."""
    import pycoll

    before = pycoll.get_debug_level()
    pycoll.set_debug_level(pycoll.DebugLevel.DETAIL)
    try:
        yield
    finally:
        pycoll.set_debug_level(before)


# The timeout of a group whose first call one rank never joins: the others'
# wait ends at it however long it is, and nothing before it has to fit in it.
LATE_TIMEOUT = timedelta(seconds=1)


def late_rank_named(call: Any, func: str, rank: int, late: int) -> None:
    """A collective one rank never joins: on every other rank ``call()`` (the
    first call on a group whose timeout is :data:`LATE_TIMEOUT`) raises
    DistTimeoutError well within a minute, naming the call and the late rank;
    then every rank meets at the world's barrier."""
    import pycoll
    from pycoll.errors import DistTimeoutError

    if rank != late:
        started = time.monotonic()
        try:
            call()
        except DistTimeoutError as exc:
            message = str(exc)
        else:
            raise AssertionError(f"{func} returned without rank {late}")
        assert time.monotonic() - started < 60  # bounded by the group's timeout
        assert f"{func} (seq 1)" in message, message
        assert f"rank {late}: has not reached it" in message, message
    pycoll.barrier()


def two_rank_reduce_checked(
    work: Any,
    x: Any,
    before: Any,
    op: str,
    dtype: Any,
    shape: Any,
    rank: int,
    dst: int,
    async_op: bool,
) -> bool:
    """Check a reduce to group rank ``dst`` on a group of ranks 0 and 1 whose
    inputs were ``data(r, dtype, shape)``: outside the group nothing came
    back and ``x`` is as it was (then False); inside, an async call's Work
    completes with ``[x]``, the root holds the reduction and the other rank
    its input (then True)."""
    if rank >= 2:
        assert work is None
        assert_equal(x, before)
        return False
    if async_op:
        assert work.wait() is True and work.result() == [x]
    if rank == dst:
        assert_equal(x, reduce_all(op, [data(r, dtype, shape) for r in range(2)], 2))
    else:
        assert_equal(x, before)
    return True


def reduce_around(least: int, rank: int, world_size: int, group: Any) -> None:
    """A float32 SUM reduce to rank 0 one element below ``least`` bytes and one
    at it, each checked on every rank (the root's sum, the others' arrays as
    they were)."""
    import pycoll

    count = least // 4
    for size in (count - 1, count):
        x = np.full(size, rank + 1.0, np.float32)
        pycoll.reduce(x, dst=0, group=group)
        want = world_size * (world_size + 1) / 2 if rank == 0 else rank + 1.0
        assert_equal(x, np.full(size, want, np.float32))


def fresh_group() -> Iterator[Any]:
    """For a fixture (``yield from fresh_group()``): a new group of every
    rank, destroyed after the test unless a fault broke it (a broken group's
    ranks cannot all come to destroy it)."""
    import pycoll

    g = pycoll.new_group()
    yield g
    if g._broken is None:
        pycoll.destroy_process_group(g)


def rule_only(monkeypatch, g: Any) -> None:
    """Make group ``g``'s large all_reduces take the built-in rule, as
    PYCOLL_TUNING=off makes them: no live trials (pycoll.autotune), which on
    two ranks would choose their path by timing instead."""
    from pycoll import tuning

    monkeypatch.setattr(g, "_live_from", tuning.NEVER)


def window_chunk(g: Any) -> Optional[int]:
    """The chunk size of the group's shared window
    (pycoll.collectives.shm), or None where it has made none."""
    made = g.attached("shm.window")
    return made.chunk if made else None


def small_window(monkeypatch, world_size: int, chunk: int, *thresholds: Tuple[Any, str]) -> None:
    """Make calls of 16 bytes or more take the node's shared window, in
    chunks of ``chunk`` bytes: each ``(module, name)`` threshold of
    ``thresholds`` set to 16, pycoll.collectives.shm.CHUNK to ``chunk``.
    Skips on one rank, which shares a window with no one."""
    import pytest

    from pycoll.collectives import shm

    if world_size == 1:
        pytest.skip("one rank shares no window")
    for module, name in thresholds:
        monkeypatch.setattr(module, name, 16)
    monkeypatch.setattr(shm, "CHUNK", chunk)


def check_reduce_scatter_list_form(
    group: Any, op: str, dtype: Any, where: str, rows: int, rank: int, world_size: int
) -> None:
    """reduce_scatter(output, input_list) of ``(rows, 2)`` arrays, the output
    apart, the list's own entry for this rank (reduced in place), or
    another rank's (aside): the output holds the reduction of every rank's
    entry for this rank, the list's other entries are left as they were."""
    import pycoll

    n, shape = world_size, (rows, 2)
    ins = [data(rank, dtype, shape, salt=d) for d in range(n)]
    originals = [x.copy() for x in ins]
    out = {"apart": np.zeros(shape, dtype), "mine": ins[rank]}.get(where, ins[(rank + 1) % n])
    pycoll.reduce_scatter(out, ins, op=rop(op), group=group)
    want = reduce_all(op, [data(r, dtype, shape, salt=rank) for r in range(n)], n)
    assert_equal(out, want)
    for x, original in zip(ins, originals):
        if x is not out:
            assert_equal(x, original)


def group_record(name: str) -> dict:
    """This rank's flight record of the group named ``name``, as dumped
    (pycoll.trace.recorder.snapshot)."""
    from pycoll.trace import recorder

    (found,) = [g for g in recorder.snapshot()["groups"] if g["name"] == name]
    return found


# MPICH's and Open MPI's shared-memory segments. A job killed on purpose (the
# hang scenarios, the launcher's and the harness's timeouts) leaves its own in
# /dev/shm, memory held until reboot: about 100 MB a run of scripts/test.
SEGMENTS = ("/dev/shm/mpich_shm_*", "/dev/shm/sm_segment.*")


def shm_segments() -> set:
    """The MPI shared-memory segments in /dev/shm now."""
    return {path for pattern in SEGMENTS for path in glob.glob(pattern)}


def _mapped() -> set:
    """The files some live process has mapped (read from /proc/*/maps)."""
    paths = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                fields = [line.split(None, 5) for line in f]
        except OSError:
            continue  # (a process that ended, or one this user cannot read)
        paths.update(line[5].rstrip("\n") for line in fields if len(line) == 6)
    return paths


def remove_stale_segments(paths: set, min_age: float = 0.0) -> None:
    """Remove those of ``paths`` that no live process maps and that were last
    changed ``min_age`` seconds ago or more: another job may be running beside
    the test's (scripts/test runs two at once), and its segments are mapped
    from the moment it makes them on."""
    if not paths:
        return
    mapped = _mapped()
    now = time.time()
    for path in paths - mapped:
        try:
            if now - os.stat(path).st_mtime >= min_age:
                os.unlink(path)
        except OSError:
            pass  # (gone already, or another user's)
