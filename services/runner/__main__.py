"""``runnerscale runner`` / ``python -m services.runner``."""

from __future__ import annotations

import sys

from services.runner.worker import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
