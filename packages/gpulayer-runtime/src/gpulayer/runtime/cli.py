"""The ``gpulayer`` command: ``gpulayer launch`` (torchrun's flags), ``gpulayer env``, and the commands other
distributions add under the ``gpulayer.commands`` entry point (``plot``: gpulayer-trainer)."""

from __future__ import annotations

import argparse
import os
import platform
import signal
import sys
from importlib.metadata import EntryPoint, entry_points

COMMANDS_GROUP = "gpulayer.commands"
BUILT_IN = ("launch", "env")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # `gpulayer launch` starts every job: it skips the scan of installed metadata (~40 ms) and imports nothing added.
    scan = not argv or argv[0] not in BUILT_IN
    added = {point.name: point for point in entry_points(group=COMMANDS_GROUP)} if scan else {}
    if argv and argv[0] in added:  # loaded only when asked for
        return added[argv[0]].load()(argv[1:])
    parser = _parser(added)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return args.run(args, args.parser)


def _parser(added: dict[str, EntryPoint]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpulayer", description="Place and launch PyTorch training processes.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    launch = commands.add_parser(
        "launch",
        help="start a script on N processes per node (torchrun's flags)",
        description="Start SCRIPT (or -m MODULE) on every process, as torchrun does, with its environment.",
    )
    flag = launch.add_argument
    flag(
        "--nproc-per-node",
        "--nproc_per_node",
        default="1",
        help="processes per node: N, 'gpu', 'cpu' or 'auto' (default 1)",
    )
    flag("--nnodes", default="1", help="nodes: N, or MIN:MAX for an elastic job (default 1)")
    flag("--node-rank", "--node_rank", type=int, default=0, help="this node's rank, for --rdzv-backend static")
    flag("--rdzv-endpoint", "--rdzv_endpoint", default=None, help="HOST:PORT of the rendezvous, the same on every node")
    flag(
        "--rdzv-backend",
        "--rdzv_backend",
        default="c10d",
        choices=("c10d", "static"),
        help="rendezvous backend (default c10d)",
    )
    flag("--rdzv-id", "--rdzv_id", default=None, help="job id, the same on every node")
    flag("--rdzv-conf", "--rdzv_conf", default="", help="rendezvous settings, KEY=VALUE,KEY=VALUE")
    flag("--max-restarts", "--max_restarts", type=int, default=0, help="restarts of the worker group before failing")
    flag("--monitor-interval", "--monitor_interval", type=float, default=0.1, help="seconds between worker checks")
    flag("--local-addr", "--local_addr", default=None, help="this node's address as the other nodes reach it")
    flag(
        "--standalone", action="store_true", help="single node, private loopback rendezvous (the default for one node)"
    )
    flag("-m", "--module", action="store_true", help="run SCRIPT as a module name, like python -m")
    flag("script", help="the script (or with -m, the module) each process runs")
    flag("script_args", nargs=argparse.REMAINDER, help="its arguments")
    launch.set_defaults(run=_launch, parser=launch)

    env = commands.add_parser("env", help="print where this process would run, torch's version, backends and devices")
    env.set_defaults(run=_env, parser=env)
    for name, point in sorted(added.items()):
        commands.add_parser(name, help=f"from {point.dist.name if point.dist else point.value}: gpulayer {name} --help")
    return parser


def _launch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from gpulayer.runtime.launch import WorkerFailedError, launch

    _check_flags(args, parser)
    try:
        launch(
            args.script,
            *args.script_args,
            nproc_per_node=_nproc_per_node(args.nproc_per_node, parser),
            nnodes=args.nnodes,
            node_rank=args.node_rank,
            rdzv_endpoint=args.rdzv_endpoint,
            rdzv_backend=args.rdzv_backend,
            rdzv_id=args.rdzv_id,
            rdzv_conf=_rdzv_conf(args.rdzv_conf, parser),
            max_restarts=args.max_restarts,
            monitor_interval=args.monitor_interval,
            module=args.module,
            local_addr=args.local_addr,
        )
    except WorkerFailedError as failed:
        print(f"gpulayer launch: {failed}", file=sys.stderr)
        return 1
    except SignalException as signalled:  # SIGTERM from Slurm or Kubernetes: torch's agent passed it to the workers
        name = signal.Signals(signalled.sigval).name
        print(f"gpulayer launch: received {name}; the workers were sent it and have ended", file=sys.stderr)
        return 128 + signalled.sigval  # the shell's status for a process ended by that signal (143 for SIGTERM)
    except (ValueError, TypeError, FileNotFoundError) as bad:
        parser.error(str(bad))
    except RuntimeError as failed:  # e.g. a rendezvous that never completed, or a nested launch
        print(f"gpulayer launch: error: {failed}", file=sys.stderr)
        return 1
    return 0


def _check_flags(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """The flags named as typed; launch() checks the same values again, by its own argument names."""
    if args.standalone and (args.rdzv_endpoint or args.nnodes != "1"):
        parser.error("--standalone is for one node: drop --rdzv-endpoint and --nnodes")
    low, _, high = args.nnodes.partition(":")
    high = high or low
    if not (low.isdigit() and high.isdigit() and 1 <= int(low) <= int(high)):
        parser.error(f"--nnodes {args.nnodes!r}: expected a whole number of at least 1, or MIN:MAX")
    if not 0 <= args.node_rank < int(high):
        parser.error(f"--node-rank {args.node_rank}: expected a rank in [0, {high}) for --nnodes {args.nnodes}")
    if args.max_restarts < 0:
        parser.error(f"--max-restarts {args.max_restarts}: expected a whole number of at least 0")
    if not args.monitor_interval > 0:
        parser.error(f"--monitor-interval {args.monitor_interval}: expected a number of seconds above 0")


def _nproc_per_node(value: str, parser: argparse.ArgumentParser) -> int:
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    named = {"gpu": gpus, "cpu": os.cpu_count() or 1, "auto": gpus or os.cpu_count() or 1}
    if value in named:
        if named[value] < 1:
            parser.error(f"--nproc-per-node {value}: this machine has no CUDA device")
        return named[value]
    if not value.isdigit() or int(value) < 1:
        parser.error(f"--nproc-per-node {value!r}: expected a whole number of at least 1, 'gpu', 'cpu' or 'auto'")
    return int(value)


def _rdzv_conf(text: str, parser: argparse.ArgumentParser) -> dict[str, str]:
    pairs = [item for item in text.split(",") if item]
    if any("=" not in item for item in pairs):
        parser.error(f"--rdzv-conf {text!r}: expected KEY=VALUE,KEY=VALUE")
    return dict(item.split("=", 1) for item in pairs)


def _env(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import torch
    import torch.distributed as dist

    from gpulayer.runtime import __version__
    from gpulayer.runtime.placement import Placement

    try:
        placement = repr(Placement.detect())
    except ValueError as bad:
        placement = f"not detected: {bad}"
    backends = [name for name in ("gloo", "nccl", "mpi") if getattr(dist, f"is_{name}_available")()]
    cuda = torch.cuda.is_available()
    devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
    for key, value in (
        ("gpulayer-runtime", __version__),
        ("python", platform.python_version()),
        ("torch", torch.__version__),
        ("placement", placement),
        ("backends", ", ".join(backends) or "none"),
        ("cuda", f"{len(devices)} device(s): {', '.join(devices)}" if cuda else "not available"),
        ("cpus", os.cpu_count()),
    ):
        print(f"{key:17} {value}")
    return 0


def entry() -> None:
    sys.exit(main())
