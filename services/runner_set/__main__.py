"""``runnerscale runner-set [worker flags]``: reconcile EphemeralRunnerSets (docs/runner-set.md)."""

from __future__ import annotations

import sys

from services.runner_set.controller import WORKER_NAME, setup
from shared.worker import worker_main


def main(argv: list[str]) -> int:
    return worker_main(WORKER_NAME, argv, setup, description="reconcile EphemeralRunnerSets: runners, typed revision state, desired state from the listener")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
