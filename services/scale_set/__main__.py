"""``runnerscale scale-set`` / ``python -m services.scale_set``."""

import sys

from services.scale_set.worker import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
