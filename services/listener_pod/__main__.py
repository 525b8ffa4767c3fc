"""``python -m services.listener_pod`` = ``runnerscale listener-pod``."""

from __future__ import annotations

import sys

from services.listener_pod.worker import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
