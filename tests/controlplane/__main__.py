"""A real Kubernetes control plane on loopback: ``python -m tests.controlplane {build,up,down,env,status}``.

- ``build``  builds etcd, kube-apiserver and kube-controller-manager from the Go module proxy (cached
  per version under ``${XDG_CACHE_HOME:-~/.cache}/runnerscale/controlplane/``) and prints their directory;
- ``up``     builds if needed, starts the three components with fresh PKI and prints the ``env`` lines;
- ``env``    prints ``export RUNNERSCALE_KUBECONFIG=… KUBECONFIG=…`` for the running control plane;
- ``status`` says what is built and whether the control plane is up and ready (exit 0 when ready);
- ``down``   stops everything and removes the state directory.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from . import build as build_mod
from . import cluster


def default_state_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"runnerscale-controlplane-{os.getuid()}"


def _env_lines(running: cluster.Running) -> str:
    return f"export RUNNERSCALE_KUBECONFIG={running.kubeconfig}\nexport KUBECONFIG={running.kubeconfig}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.controlplane", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["build", "up", "down", "env", "status"])
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=default_state_dir(),
        help="where the running control plane keeps its PKI, data, kubeconfig and logs (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    state_dir: Path = args.state_dir.resolve()
    try:
        if args.command == "build":
            print(build_mod.build(echo=True))
            return 0
        running = cluster.Running.load(state_dir)
        if args.command == "up":
            if running is not None and cluster.is_ready(running):
                print(f"already up: {running.server} (state in {state_dir})", file=sys.stderr)
                print(_env_lines(running))
                return 0
            if running is not None:
                cluster.stop(running)
            bin_dir = build_mod.build(echo=True)
            running = cluster.start(bin_dir, state_dir)
            print(f"up: {running.server} (state in {state_dir}; stop with `down`)", file=sys.stderr)
            print(_env_lines(running))
            return 0
        if args.command == "down":
            if running is None:
                print(f"not running (no {state_dir / cluster.STATE_FILE})", file=sys.stderr)
                return 0
            cluster.stop(running)
            print(f"stopped and removed {state_dir}", file=sys.stderr)
            return 0
        if args.command == "env":
            if running is None:
                print(f"not running (no {state_dir / cluster.STATE_FILE}); start it with `up`", file=sys.stderr)
                return 1
            print(_env_lines(running))
            return 0
        # status
        versions = build_mod.pinned_versions()
        cached = build_mod.cached_bin_dir()
        print(f"versions: Kubernetes {versions.kubernetes}, etcd {versions.etcd}")
        print(f"binaries: {cached or 'not built (run `build`)'}")
        if running is None:
            print(f"control plane: not running (state dir {state_dir})")
            return 1
        ready = cluster.is_ready(running)
        print(f"control plane: {running.server} {'ready' if ready else 'NOT ready'} (state dir {state_dir})")
        for comp in running.components:
            print(f"  {comp.name}: pid {comp.pid} {'running' if cluster.alive(comp) else 'gone'}, log {comp.log}")
        return 0 if ready else 1
    except (build_mod.BuildError, cluster.StartError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
