"""The ``pycoll-run`` command line.

pycoll-run -n 4 [options] script.py args...
pycoll-run -n 4 [options] -m package.module args...
pycoll-run -n 4 [options] -- command args...
pycoll-run batch --scheduler slurm --nodes 2 --ppn 4 --time 01:00:00 [...] -- script.py args...
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import socket
import sys
from typing import List, Optional, Sequence, Tuple

from .families import BINDINGS, FAMILIES, Job, LauncherError, choose
from .hosts import Host, HostError, allocation, merge, parse_host_list, parse_hostfile
from .supervisor import Options, Supervisor
from .wire import ADDR_ENV, RANK_VARS_ENV, TOKEN_ENV, exit_now

PROG = "pycoll-run"
# wrap.py and boot.py run by path on the ranks. (os.path rather than pathlib:
# pathlib, with the urllib.parse it imports, was 3 ms of every pycoll-run start.)
HERE = os.path.dirname(os.path.realpath(__file__))
# Options that take no value; every other option takes exactly one.
_FLAGS = {"-h", "--help", "--dry-run", "--no-tag", "--submit"}


class UsageError(ValueError):
    pass


def _launch_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("launch")
    g.add_argument(
        "-n",
        "--np",
        type=int,
        metavar="N",
        help="number of ranks (default: the allocation's task count, or the hosts' slots)",
    )
    g.add_argument("--hosts", metavar="H1:N,H2:N", help="hosts and their slots")
    g.add_argument(
        "--hostfile",
        metavar="FILE",
        help="hostfile: 'host:N' (MPICH), 'host slots=N' (Open MPI, DeepSpeed)",
    )
    g.add_argument("--ppn", type=int, metavar="N", help="ranks per node")
    g.add_argument("--bind", choices=BINDINGS, help="bind each rank to a core or socket")
    g.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="set K=V on every rank (repeatable)",
    )
    g.add_argument(
        "--env-forward",
        action="append",
        default=[],
        metavar="K",
        help="pass this variable's value here on to every rank (repeatable)",
    )
    g.add_argument(
        "--gpus-per-rank", metavar="N|auto", help="set CUDA_VISIBLE_DEVICES per local rank"
    )
    g.add_argument(
        "--no-tag",
        action="store_true",
        help="do not prefix output lines with [rank] (or [rank@host] across hosts)",
    )
    g.add_argument("--output-dir", metavar="DIR", help="also write one log per rank into DIR")
    g.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="end the job after this long, printing every rank's Python stack (and "
        "writing pycoll's flight records: python -m pycoll.trace flight)",
    )
    g.add_argument(
        "--trace",
        metavar="DIR",
        help="record every rank's timeline of pycoll's operations (PYCOLL_TRACE=DIR) and "
        "merge them into DIR/trace.json when the job ends",
    )
    g.add_argument(
        "--start-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long ranks may take to start (default 120)",
    )
    g.add_argument(
        "--launcher", choices=sorted(FAMILIES), help="the MPI launcher family (default: detected)"
    )
    g.add_argument(
        "--dry-run",
        action="store_true",
        help="print the command and environment it would run, and nothing else",
    )


def _split(argv: Sequence[str]) -> Tuple[List[str], List[str], str]:
    """Options, then the target: ('script', [script, args]), ('module', [mod, args])
    or ('command', [cmd, args])."""
    options: List[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return options, list(argv[i + 1 :]), "command"
        if token == "-m":
            return options, list(argv[i + 1 :]), "module"
        if not token.startswith("-") or token == "-":
            return options, list(argv[i:]), "script"
        options.append(token)
        if token not in _FLAGS and "=" not in token and i + 1 < len(argv):
            options.append(argv[i + 1])
            i += 1
        i += 1
    return options, [], "script"


_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")


def _python_target(command: List[str]) -> Optional[List[str]]:
    """For ``python script.py ...`` or ``python -m module ...`` (any Python,
    with no options of its own), the same interpreter running the target
    through boot; else None. So the command form ends the job on an uncaught
    exception exactly as the script form does."""
    if len(command) < 2 or not _PYTHON.fullmatch(os.path.basename(command[0])):
        return None
    rest = command[1:]
    if rest[0] == "-m" and len(rest) >= 2 or not rest[0].startswith("-"):
        return [command[0], os.path.join(HERE, "boot.py"), *rest]
    return None


def target_argv(kind: str, target: List[str]) -> List[str]:
    """What each rank runs after the wrapper: Python targets go through boot,
    a Python interpreter given as the command with its script included."""
    if not target:
        raise UsageError(
            "nothing to run: give a script (pycoll-run -n 4 train.py), a module "
            "(-m package.module) or a command after --"
        )
    if kind == "command":
        through_boot = _python_target(target)
        if through_boot is not None:
            return through_boot
        if not (target[0].endswith(".py") and not os.access(target[0], os.X_OK)):
            return target
        kind = "script"  # -- train.py: a script that is not a program of its own
    boot = [sys.executable, os.path.join(HERE, "boot.py")]
    return boot + (["-m"] if kind == "module" else []) + target


def rank_program(kind: str, target: List[str]) -> List[str]:
    """What the launcher starts on each rank: the wrapper, then the target.
    The wrapper needs the standard library only, so its interpreter skips
    ``site`` (-S): a few to fifteen milliseconds a rank, at every start."""
    return [sys.executable, "-S", os.path.join(HERE, "wrap.py"), *target_argv(kind, target)]


def _script_or_command(token: str, check: bool) -> str:
    """``pycoll-run -n 4 train.py`` runs a script; ``pycoll-run -n 4 python
    train.py`` (as with mpirun) or ``./a.out`` a command, as if after ``--``."""
    if not token.endswith(".py") and (
        shutil.which(token) or os.path.isfile(token) and os.access(token, os.X_OK)
    ):
        return "command"  # an executable: python, ./a.out, /usr/bin/env
    if os.path.isfile(token):
        return "script"
    if check:
        raise UsageError(
            f"{token}: no such script here, nor a command on PATH (for a program that "
            f"exists only on the ranks' hosts, write -- {token} ...)"
        )
    return "script"


def _env_pairs(items: List[str], forward: List[str], trace: Optional[str] = None) -> dict:
    env = {}
    if trace:
        env["PYCOLL_TRACE"] = os.path.abspath(trace)
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--env {item!r}: write --env KEY=VALUE")
        env[key] = value
    for key in forward:
        if key not in os.environ:
            raise UsageError(f"--env-forward {key}: {key} is not set here")
        env[key] = os.environ[key]
    return env


def _local(hosts: Optional[List[Host]]) -> bool:
    names = {"localhost", "127.0.0.1", socket.gethostname(), socket.gethostname().split(".")[0]}
    return hosts is None or all(h.name in names for h in hosts)


def _resolve_all(hosts: List[Host], where: str) -> None:
    """Every host given must resolve here, before anything starts: the MPI
    launchers' own ssh error for such a host was seen lost when they killed
    the ranks already started, leaving only "rank 0 was killed"."""
    for host in hosts:
        try:
            socket.getaddrinfo(host.name, None)
        except OSError as exc:
            raise UsageError(
                f"{where}: host {host.name!r} does not resolve here ({exc.strerror or exc}): "
                "check its name, or give it an entry in /etc/hosts or DNS"
            ) from None


def plan(args: argparse.Namespace, kind: str, target: List[str]):
    """The family, launcher, job and supervisor options the arguments ask for."""
    family, launcher, srun_mpi = choose(args.launcher, os.environ)
    hosts: Optional[List[Host]] = None
    if args.hosts and args.hostfile:
        raise UsageError("give --hosts or --hostfile, not both")
    if args.hosts:
        hosts = merge(parse_host_list(args.hosts))
    elif args.hostfile:
        hosts = merge(parse_hostfile(args.hostfile))
    if hosts is not None and not args.dry_run:
        _resolve_all(hosts, "--hosts" if args.hosts else "--hostfile")
    alloc = allocation()
    nprocs = args.np
    if nprocs is None:
        if hosts is not None:
            nprocs = args.ppn * len(hosts) if args.ppn else sum(h.slots for h in hosts)
        elif alloc is not None:
            nprocs = args.ppn * len(alloc.hosts) if args.ppn else alloc.ntasks
        else:
            raise UsageError("how many ranks? give -n N (or --hosts/--hostfile)")
    if nprocs < 1:
        raise UsageError(f"-n {nprocs}: need at least one rank")
    if args.ppn is not None and args.ppn < 1:
        raise UsageError(f"--ppn {args.ppn}: need at least one rank per node")
    if hosts is None and alloc is not None and family.name != "srun":
        hosts = alloc.hosts  # the allocation, handed to mpiexec explicitly
    if args.gpus_per_rank is not None and args.gpus_per_rank != "auto":
        if not args.gpus_per_rank.isdigit() or int(args.gpus_per_rank) < 1:
            raise UsageError(f"--gpus-per-rank {args.gpus_per_rank!r}: give a count or 'auto'")
    if kind == "script" and target:
        kind = _script_or_command(target[0], check=not args.dry_run and _local(hosts))
    job = Job(
        nprocs=nprocs,
        program=rank_program(kind, target),
        hosts=hosts,
        ppn=args.ppn,
        bind=args.bind,
        env=_env_pairs(args.env, args.env_forward, args.trace),
        srun_mpi=srun_mpi,
    )
    # Where the ranks reach pycoll-run: loopback only when every rank runs on
    # this host (the hosts given, else the allocation's, which srun spreads
    # the ranks over without being handed them).
    spread = hosts if hosts is not None else (alloc.hosts if alloc is not None else None)
    advertise = "127.0.0.1" if _local(spread) else socket.getfqdn()
    options = Options(
        tag=not args.no_tag,
        tag_host=not _local(spread),
        output_dir=args.output_dir,
        timeout=args.timeout,
        start_timeout=args.start_timeout,
        gpus_per_rank=args.gpus_per_rank,
        advertise=advertise,
    )
    return family, launcher, job, options


def dry_run(family, launcher: str, job: Job) -> str:
    """The exact command and the variables pycoll-run would add, as text."""
    env = dict(family.defaults())
    env.update(job.env)
    lines = [
        f"# {family.label}. At start pycoll-run also sets {ADDR_ENV} (where it listens)",
        f"# and {TOKEN_ENV} (this job's key), and passes them the same way.",
    ]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines.append(shlex.join(family.command(launcher, job)))
    return "\n".join(lines)


def _merge_trace(directory: str) -> None:
    """Merge the ranks' timelines (pycoll.trace.merge), saying where the result is."""
    from pycoll.trace import merge  # numpy and pycoll only when asked for

    try:
        path = merge.merge(directory)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"{PROG}: --trace: no merged timeline: {exc}\n")
    else:
        sys.stderr.write(
            f"{PROG}: timeline of every rank in {path} (open it in https://ui.perfetto.dev); "
            f"python -m pycoll.trace summarize {directory}\n"
        )


def launch_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} [-n N] [options] (script.py | -m module | -- command) [args...]\n"
        f"       {PROG} batch --scheduler {{slurm,pbs}} ... -- script.py [args...]",
        description="Run a Python script, module or command on the ranks of an MPI job, "
        "with tagged output, torch-style environment variables, and a failed rank "
        "ending the whole job.",
    )
    _launch_options(parser)
    return parser


def console() -> None:
    """The ``pycoll-run`` command: :func:`main`, then an immediate exit.

    The job is over and reported when main returns; the interpreter's own
    teardown (a module at a time) would only add about 10 ms to every job.
    """
    exit_now(main())


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["batch"]:
        from . import batch as batch_mod  # (here: a job's start need not import it)

        return batch_mod.main(argv[1:], _launch_options, _split)
    parser = launch_parser()
    options, target, kind = _split(argv)
    args = parser.parse_args(options)
    try:
        family, launcher, job, sup_options = plan(args, kind, target)
        if args.dry_run:
            job.env.setdefault(RANK_VARS_ENV, family.rank_vars)
            print(dry_run(family, launcher, job))
            return 0
        code = Supervisor(family, launcher, job, sup_options).run()
        if args.trace:
            _merge_trace(args.trace)
        return code
    except (UsageError, HostError, LauncherError) as exc:
        parser.exit(2, f"{PROG}: error: {exc}\n")
    return 2
