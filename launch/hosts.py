"""Where the ranks run: host lists from the command line, hostfiles, and the
batch scheduler's allocation.

Three hostfile dialects are read, so a file written for another tool works
as it is: MPICH's ``host:slots``, Open MPI's ``host slots=N [max_slots=M]``
and DeepSpeed's ``host slots=N``. A bare ``host`` is one slot. ``#`` starts a
comment. Anything else is an error that names the file and line.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Dict, List, Mapping, NamedTuple, Optional


class HostError(ValueError):
    """A host list or hostfile that cannot be read; the message says where."""


# Records here and in families.py and supervisor.py are NamedTuples and plain
# classes, not dataclasses: importing dataclasses and building its classes was
# a quarter of pycoll-run's own start (15 ms), paid by every job.
class Host(NamedTuple):
    name: str
    slots: int


_KEYS = re.compile(r"^(?P<key>[A-Za-z_]+)=(?P<value>\S+)$")


def _slots(text: str, where: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise HostError(f"{where}: slot count {text!r} is not a positive integer")
    return int(text)


def parse_host_list(text: str) -> List[Host]:
    """``h1:4,h2:4`` (slots optional, default 1) as given to ``--hosts``."""
    hosts = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise HostError(f"--hosts {text!r}: empty host name (write h1:4,h2:4)")
        name, sep, count = item.rpartition(":")
        if not sep or not count.isdigit():
            name, count = item, "1"
        if not name or any(c.isspace() for c in name):
            raise HostError(f"--hosts {text!r}: {item!r} is not a host (write h1:4,h2:4)")
        hosts.append(Host(name, _slots(count, f"--hosts {text!r}")))
    return hosts


def parse_hostfile(path: str) -> List[Host]:
    """Read a hostfile in MPICH, Open MPI or DeepSpeed format."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise HostError(f"hostfile {path}: {exc.strerror}") from None
    hosts = []
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"hostfile {path}, line {number} ({raw.strip()!r})"
        fields = line.split()
        name, sep, count = fields[0].rpartition(":")
        if sep:  # MPICH: host:slots
            if not name or len(fields) > 1:
                raise HostError(f"{where}: expected 'host:slots' alone on the line (MPICH)")
            hosts.append(Host(name, _slots(count, where)))
            continue
        name, options = fields[0], fields[1:]
        if "=" in name:
            raise HostError(
                f"{where}: expected 'host', 'host:slots' (MPICH) or 'host slots=N' "
                f"(Open MPI, DeepSpeed)"
            )
        slots = 1
        for option in options:
            kv = _KEYS.match(option)
            if not kv:
                raise HostError(f"{where}: {option!r} is not key=value (write slots=N)")
            key = kv["key"].lower()
            if key in ("slots", "cpu"):
                slots = _slots(kv["value"], where)
            elif key in ("max_slots", "max-slots"):
                _slots(kv["value"], where)  # a limit, not a count: checked, then unused
            else:
                raise HostError(f"{where}: unknown key {kv['key']!r} (known: slots, max_slots)")
        hosts.append(Host(name, slots))
    if not hosts:
        raise HostError(f"hostfile {path}: no hosts in it")
    return hosts


def merge(hosts: List[Host]) -> List[Host]:
    """One entry per host name, slots added, in order of first appearance."""
    slots: Dict[str, int] = {}
    for h in hosts:
        slots[h.name] = slots.get(h.name, 0) + h.slots
    return [Host(n, s) for n, s in slots.items()]


def _expand_slurm_nodelist(nodelist: str) -> List[str]:
    scontrol = shutil.which("scontrol")
    if scontrol:
        out = subprocess.run(
            [scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30
        )
        if out.returncode == 0 and out.stdout.split():
            return out.stdout.split()
    if "[" in nodelist:
        raise HostError(
            f"SLURM_JOB_NODELIST={nodelist!r} needs 'scontrol show hostnames' to expand, "
            f"and scontrol is not on PATH"
        )
    return nodelist.split(",")


def _slurm_tasks_per_node(text: str) -> List[int]:
    counts: List[int] = []
    for item in text.split(","):  # "4(x2),3"
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not m:
            raise HostError(f"SLURM_TASKS_PER_NODE={text!r} is not in Slurm's format")
        counts += [int(m[1])] * int(m[2] or 1)
    return counts


class Allocation(NamedTuple):
    """What a batch scheduler granted this job: its hosts and rank count."""

    scheduler: str
    hosts: List[Host]
    ntasks: int


def allocation(environ: Optional[Mapping[str, str]] = None) -> Optional[Allocation]:
    """The Slurm or PBS allocation this process runs in, or None outside one."""
    env = os.environ if environ is None else environ
    if env.get("SLURM_JOB_ID") and env.get("SLURM_JOB_NODELIST"):
        names = _expand_slurm_nodelist(env["SLURM_JOB_NODELIST"])
        per_node = env.get("SLURM_TASKS_PER_NODE")
        counts = _slurm_tasks_per_node(per_node) if per_node else [1] * len(names)
        if len(counts) != len(names):
            counts = [counts[0]] * len(names)
        hosts = [Host(n, c) for n, c in zip(names, counts)]
        ntasks = int(env.get("SLURM_NTASKS") or sum(counts))
        return Allocation("slurm", hosts, ntasks)
    if env.get("PBS_JOBID") and env.get("PBS_NODEFILE"):
        try:
            with open(env["PBS_NODEFILE"]) as f:
                names = f.read().split()
        except OSError as exc:
            raise HostError(f"PBS_NODEFILE {env['PBS_NODEFILE']}: {exc.strerror}") from None
        hosts = merge([Host(n, 1) for n in names])
        return Allocation("pbs", hosts, len(names))
    return None
