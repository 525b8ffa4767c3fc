"""``runnerscale runner-set`` / ``python -m services.runner_set``."""

import sys

from services.runner_set.worker import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
