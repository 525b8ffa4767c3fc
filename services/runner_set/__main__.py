"""``runnerscale runner-set [worker flags] [runner-set flags]``: reconcile EphemeralRunnerSets (README "runner-set worker")."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import anyio

from services.runner_set.controller import WORKER_NAME, make_setup
from services.runner_set.settings import add_runner_set_arguments, load_failure_policy
from shared.worker import SettingsError, add_worker_arguments, load_worker_settings, run_worker


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=f"runnerscale {WORKER_NAME}",
        description="reconcile EphemeralRunnerSets: runners, typed revision state, desired state from the listener, failed-runner TTL and failure budget",
    )
    add_worker_arguments(parser)
    add_runner_set_arguments(parser)
    args = parser.parse_args(list(argv))
    try:
        settings = load_worker_settings(args)
        policy = load_failure_policy(args)
    except SettingsError as exc:
        print(f"runnerscale {WORKER_NAME}: {exc}", file=sys.stderr)
        return 2
    return anyio.run(run_worker, WORKER_NAME, settings, make_setup(policy))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
