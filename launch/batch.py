"""``pycoll-run batch``: write (and optionally submit) a Slurm or PBS script
whose body runs pycoll-run with the same options, so the job inside the
allocation gets the same launcher choice, tagging and failure handling."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from typing import Callable, List, Optional, Sequence, Tuple

PROG = "pycoll-run batch"
_TIME = re.compile(r"^(\d+-)?\d{1,3}(:\d{2}){0,2}$")
_NAME = re.compile(r"[A-Za-z0-9._+-]+")  # a job name both schedulers take as it is
_NAME_BAD = re.compile(r"[^A-Za-z0-9._+-]")
# Options of pycoll-run itself that the script's body passes on unchanged.
_PASSED_ON = (
    "bind",
    "env",
    "env_forward",
    "gpus_per_rank",
    "no_tag",
    "output_dir",
    "timeout",
    "start_timeout",
    "launcher",
)


def parser(launch_options: Callable[[argparse.ArgumentParser], None]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} --scheduler {{slurm,pbs}} --nodes N --ppn N --time HH:MM:SS "
        f"[options] (script.py | -m module | -- command) [args...]",
        description="Write a batch script that runs pycoll-run inside the allocation "
        "(to stdout, or --output FILE); --submit also submits it.",
    )
    g = p.add_argument_group("batch")
    g.add_argument("--scheduler", choices=("slurm", "pbs"), required=True)
    g.add_argument("--nodes", type=int, required=True)
    g.add_argument("--time", required=True, metavar="HH:MM:SS", help="wall-clock limit")
    g.add_argument("--partition", metavar="P", help="partition (Slurm) or queue (PBS)")
    g.add_argument("--account", metavar="A")
    g.add_argument("--gpus-per-node", type=int, metavar="G")
    g.add_argument("--job-name", metavar="NAME")
    g.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="LINE",
        help="an extra directive line, e.g. '#SBATCH --mem=0' (repeatable)",
    )
    g.add_argument("--output", metavar="FILE", help="write the script here instead of stdout")
    g.add_argument("--submit", action="store_true", help="submit it and print the job id")
    launch_options(p)
    return p


def _check(args: argparse.Namespace) -> None:
    if args.nodes < 1:
        raise ValueError(f"--nodes {args.nodes}: need at least one node")
    if not args.ppn or args.ppn < 1:
        raise ValueError("--ppn N: give the ranks per node (the allocation is nodes x ppn)")
    if not _TIME.match(args.time):
        raise ValueError(f"--time {args.time!r}: write HH:MM:SS (or D-HH:MM:SS for Slurm)")
    if args.scheduler == "pbs" and "-" in args.time:
        raise ValueError(f"--time {args.time!r}: PBS takes HH:MM:SS, without days")
    if args.hosts or args.hostfile:
        raise ValueError("--hosts/--hostfile: the scheduler chooses the hosts of a batch job")
    for flag, value in (
        ("--job-name", args.job_name),
        ("--partition", args.partition),
        ("--account", args.account),
        ("--time", args.time),
        *(("--extra", line) for line in args.extra),
    ):
        if value is None:
            continue
        bad = next((c for c in value if ord(c) < 32 or ord(c) == 127), None)
        if bad is not None:
            raise ValueError(
                f"{flag} {value!r}: a batch directive is one line, so it cannot hold "
                f"{bad!r} (a newline would start a command of its own); give the value "
                f"without control characters"
            )
    if args.job_name is not None and not _NAME.fullmatch(args.job_name):
        raise ValueError(
            f"--job-name {args.job_name!r}: use letters, digits and . _ - + only "
            f"(the scheduler reads the directive up to the first space)"
        )
    prefix = "#SBATCH" if args.scheduler == "slurm" else "#PBS"
    for line in args.extra:
        if not line.startswith(prefix):
            raise ValueError(f"--extra {line!r}: a {args.scheduler} directive starts with {prefix}")
    if args.np is not None and args.np > args.nodes * args.ppn:
        raise ValueError(f"-n {args.np} is more than --nodes x --ppn = {args.nodes * args.ppn}")


def _passed_on(args: argparse.Namespace) -> List[str]:
    out: List[str] = []
    for name in _PASSED_ON:
        value = getattr(args, name)
        flag = "--" + name.replace("_", "-")
        if value is None or value is False or value == []:
            continue
        if name == "start_timeout" and value == 120.0:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, list):
            for item in value:
                out += [flag, str(item)]
        else:
            out += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return out


def render(args: argparse.Namespace, kind: str, target: List[str]) -> str:
    """The batch script, commented, ready for sbatch or qsub."""
    name = args.job_name or _NAME_BAD.sub("_", target[0].rsplit("/", 1)[-1] if target else "pycoll")
    if kind == "command" and target and target[0].endswith(".py"):
        kind = "script"  # -- train.py: written as pycoll-run train.py, as a user would
    total = args.nodes * args.ppn
    launch = [sys.executable, "-m", "pycoll.launch"]
    if args.np is not None:
        launch += ["-n", str(args.np)]
    launch += _passed_on(args)
    launch += {"script": [], "module": ["-m"], "command": ["--"]}[kind] + target
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["#!/bin/bash"]
    slurm = args.scheduler == "slurm"
    if slurm:
        lines += [
            f"#SBATCH --job-name={name}",
            f"#SBATCH --nodes={args.nodes}",
            f"#SBATCH --ntasks-per-node={args.ppn}",
            f"#SBATCH --time={args.time}",
            "#SBATCH --output=%x-%j.out",
        ]
        queue, account = "#SBATCH --partition=", "#SBATCH --account="
    else:
        gpus = f":ngpus={args.gpus_per_node}" if args.gpus_per_node else ""
        lines += [
            f"#PBS -N {name}",
            f"#PBS -l select={args.nodes}:ncpus={args.ppn}:mpiprocs={args.ppn}{gpus}",
            f"#PBS -l walltime={args.time}",
            "#PBS -j oe",
        ]
        queue, account = "#PBS -q ", "#PBS -A "
    if args.partition:
        lines.append(queue + args.partition)
    if args.account:
        lines.append(account + args.account)
    if slurm and args.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={args.gpus_per_node}")
    lines += args.extra
    lines += [
        "",
        f"# Written by pycoll-run batch on {stamp}: {args.nodes} node(s) x {args.ppn} "
        f"rank(s) = {total} rank(s).",
        "# pycoll-run reads the hosts and rank count from the allocation, picks the MPI",
        "# launcher, tags each output line with its rank, and ends the whole job (with",
        "# the failing rank's traceback) as soon as one rank fails.",
        "set -euo pipefail",
        "# Run where the job was submitted from, as sbatch does and qsub does not.",
        'cd "$SLURM_SUBMIT_DIR"' if args.scheduler == "slurm" else 'cd "$PBS_O_WORKDIR"',
    ]
    if sys.prefix != sys.base_prefix:  # a virtual environment: activate it, as users do
        lines += [
            "# The Python environment this script was written from.",
            f"source {shlex.quote(os.path.join(sys.prefix, 'bin', 'activate'))}",
        ]
    else:
        lines.append(f"# Python: {sys.executable} (named in full below).")
    lines.append(f"exec {shlex.join(launch)}")
    return "\n".join(lines) + "\n"


def submit(scheduler: str, path: Optional[str], text: str) -> str:
    """Submit the script (the file, or ``text`` on stdin); return the job id."""
    tool = "sbatch" if scheduler == "slurm" else "qsub"
    exe = shutil.which(tool)
    if exe is None:
        raise ValueError(f"--submit: {tool} is not on PATH (is this a {scheduler} login node?)")
    cmd = [exe, "--parsable"] if scheduler == "slurm" else [exe]
    if path is not None:
        cmd.append(path)
    out = subprocess.run(
        cmd, input=None if path else text, capture_output=True, text=True, timeout=120
    )
    if out.returncode != 0:
        raise ValueError(f"{tool} refused the job: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout.strip().split(";")[0]


def main(
    argv: Sequence[str],
    launch_options: Callable[[argparse.ArgumentParser], None],
    split: Callable[[Sequence[str]], Tuple[List[str], List[str], str]],
) -> int:
    p = parser(launch_options)
    options, target, kind = split(argv)
    args = p.parse_args(options)
    try:
        _check(args)
        if not target:
            raise ValueError("nothing to run: give a script, -m module, or -- command")
        text = render(args, kind, target)
        path: Optional[str] = args.output
        if path is not None:
            with open(path, "w") as f:
                f.write(text)
        elif not args.submit:
            sys.stdout.write(text)
        if args.submit:
            print(submit(args.scheduler, path, text))
    except ValueError as exc:
        p.exit(2, f"{PROG}: error: {exc}\n")
    return 0
