"""``runnerscale node-sim``: run the node simulator against the API emulator."""

from __future__ import annotations

import argparse
import signal
import sys

import anyio

from services.embedded.gc_tuning import tune_gc
from shared.log import configure_logging, get_logger

log = get_logger("services.embedded.node_sim")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="runnerscale node-sim",
        description="Schedule and 'run' pods for the Kubernetes API emulator (scheduler + kubelet).",
    )
    p.add_argument("--kubeconfig", required=True, help="kubeconfig of the API emulator")
    p.add_argument(
        "--actions-url",
        default=None,
        help="Actions simulator base URL runner pods talk to (default: the serverUrl in each JIT config)",
    )
    p.add_argument("--node-name", default="node-sim", help="node name pods are bound to (default: node-sim)")
    p.add_argument(
        "--namespace",
        action="append",
        default=None,
        help="only pods of this namespace (repeatable; default: all namespaces)",
    )
    p.add_argument(
        "--exec-image",
        action="append",
        default=None,
        metavar="GLOB",
        help="images whose first container runs as a real subprocess (repeatable; default: *runnerscale*)",
    )
    p.add_argument(
        "--fail-image-pull",
        action="append",
        default=[],
        metavar="PATTERN",
        help="pulls of images matching this glob/substring fail (repeatable)",
    )
    p.add_argument(
        "--max-grace-seconds", type=float, default=30.0, help="cap on a pod's termination grace period (default: 30)"
    )
    p.add_argument(
        "--restart-backoff",
        type=float,
        default=1.0,
        help="first CrashLoopBackOff delay in seconds, doubling (default: 1)",
    )
    p.add_argument(
        "--restart-backoff-max", type=float, default=10.0, help="CrashLoopBackOff cap in seconds (default: 10)"
    )
    p.add_argument("--host-ip", default="127.0.0.1", help="the node's IP (status.hostIP; podIP of process pods)")
    p.add_argument("--state-dir", default="", help="where process pods' volumes are written (default: a temp dir)")
    p.add_argument(
        "--runner-version", default=None, help="version the simulated runners report (default: the runner agent's)"
    )
    p.add_argument(
        "--control-port",
        type=int,
        default=None,
        help="serve the fault/inspection endpoint on this port (0: any free port)",
    )
    p.add_argument("--control-host", default="127.0.0.1")
    p.add_argument("--log-level", default="info")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging(args.log_level)
    from .control import serve_control
    from .node import NodeSim, NodeSimConfig

    # A full collection walks every pod the node holds and everything imported (issue 10: at 1,000
    # pods 0.2 s each, seven of them in a burst as the heap grew by a quarter each time, a quarter of
    # node-sim's CPU; with the full ones deferred, the young and middle ones still took a fifth of
    # node-sim's CPU at 3,000 pods, 1,300 young collections and 120 middle ones). What exists once
    # node-sim is set up is frozen out of collections, and they run after 50,000 net allocations
    # instead of 700, as in the API emulator (services/embedded/gc_tuning.py).
    tune_gc()

    cfg = NodeSimConfig(
        kubeconfig=args.kubeconfig,
        actions_url=args.actions_url,
        node_name=args.node_name,
        namespace=",".join(args.namespace) if args.namespace else None,
        exec_images=args.exec_image or ["*runnerscale*"],
        fail_image_pulls=args.fail_image_pull,
        max_grace_seconds=args.max_grace_seconds,
        restart_backoff_base=args.restart_backoff,
        restart_backoff_max=args.restart_backoff_max,
        host_ip=args.host_ip,
        state_dir=args.state_dir,
    )
    if args.runner_version:
        cfg.runner_version = args.runner_version
    node = NodeSim(cfg)

    async def run() -> None:
        async with anyio.create_task_group() as tg:

            async def on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for sig in signals:
                        log.info("stopping", signal=signal.Signals(sig).name)
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(on_signal)
            if args.control_port is not None:
                port = await tg.start(serve_control, node, args.control_host, args.control_port)
                print(f"control http://{args.control_host}:{port}", flush=True)
            await tg.start(node.run)

    try:
        anyio.run(run)
    except FileNotFoundError as exc:
        print(f"runnerscale node-sim: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
