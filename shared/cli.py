"""The `runnerscale` command: one entry point, one subcommand per process or tool.

Subcommands are registered by dotted path so that importing the CLI stays cheap and each
process only imports what it needs. A subcommand entry is ``module:function`` where the
function takes ``argv: list[str]`` and returns an exit code.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "version": ("shared.cli:_version", "print the runnerscale version"),
    "crds": ("shared.crds:cli_main", "print the CRD YAML of deploy/crds/"),
    "demo": (
        "services.embedded.demo.__main__:main",
        "run the embedded default: everything local, a demo workload scaling runners",
    ),
    "apiserver": ("services.embedded.apiserver.__main__:main", "run the Kubernetes API emulator"),
    "actions-sim": ("services.embedded.actions_sim.__main__:main", "run the GitHub Actions service simulator"),
    "listener": ("services.listener.__main__:main", "run the scale-set listener (one Actions message session)"),
    "listener-pod": (
        "services.listener_pod.worker:main",
        "run the listener-pod worker (AutoscalingListener: config secret, RBAC, listener pod)",
    ),
    "node-sim": (
        "services.embedded.node_sim.__main__:main",
        "run the node simulator (scheduler + kubelet for the API emulator)",
    ),
    "scale-set": (
        "services.scale_set.worker:main",
        "run the scale-set worker (AutoscalingRunnerSet: registration, runner set, listener)",
    ),
    "runner": (
        "services.runner.worker:main",
        "run the runner worker (EphemeralRunners: JIT secret, runner pod, status)",
    ),
    "runner-set": ("services.runner_set.worker:main", "run the runner-set worker (EphemeralRunnerSets)"),
    "adopt": (
        "services.scale_set.adopt_cli:main",
        "print, object by object, what taking over a Go ARC install changes (--dry-run)",
    ),
    "bus": ("shared.bus.cli:main", "set up (streams, buckets) or inspect (status) the NATS bus"),
}


def _version(argv: list[str]) -> int:
    from shared.version import version

    print(version())
    return 0


def _usage() -> str:
    width = max(len(n) for n in SUBCOMMANDS)
    lines = ["usage: runnerscale <command> [options]", "", "commands:"]
    for name, (_, help_text) in SUBCOMMANDS.items():
        lines.append(f"  {name.ljust(width)}  {help_text}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    entry = SUBCOMMANDS.get(name)
    if entry is None:
        print(f"runnerscale: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, func_name = entry[0].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            print(f"runnerscale: command {name!r} is not available in this build", file=sys.stderr)
            return 2
        raise
    return int(getattr(module, func_name)(rest) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
