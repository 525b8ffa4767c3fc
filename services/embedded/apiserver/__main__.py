"""``runnerscale apiserver``: serve the Kubernetes API emulator on loopback until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from services.embedded.gc_tuning import tune_gc
from shared.log import get_logger

log = get_logger("services.embedded.apiserver")
# The names in-cluster clients may use for the API server.
IN_CLUSTER_NAMES = (
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="runnerscale apiserver", description="Kubernetes API emulator (in memory, loopback only)"
    )
    p.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0 = a free port)")
    p.add_argument("--kubeconfig-out", required=True, help="write a kubeconfig for kubectl / kubernetes-asyncio here")
    p.add_argument(
        "--crds", action="append", default=[], help="install the CRDs in this YAML file or directory (repeatable)"
    )
    p.add_argument("--namespace", default="default", help="namespace of the kubeconfig's context")
    p.add_argument(
        "--tls",
        action="store_true",
        help="serve HTTPS with a generated CA (the kubeconfig carries it; every namespace's kube-root-ca.crt holds it), "
        "as in-cluster clients need",
    )
    return p


async def _serve(args: argparse.Namespace) -> int:
    from .server import Emulator, emulator_tls_material

    emu = Emulator(port=args.port, tls=emulator_tls_material() if args.tls else None)
    for path in args.crds:
        emu.load_crds(path)
    url = await emu.start()
    # The store keeps every object as a tree of dicts and lists: with Python's default thresholds
    # full collections walked every stored object (issue 10: a tenth of the emulator's CPU in a
    # burst of 1,000, though stored JSON holds no cycles).
    tune_gc()
    emu.write_kubeconfig(args.kubeconfig_out, args.namespace)
    print(url, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("apiserver emulator stopping")
    await emu.stop()
    return 0


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        return asyncio.run(_serve(args))
    except OSError as exc:
        print(f"runnerscale apiserver: cannot serve: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
