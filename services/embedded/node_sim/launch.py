"""Exec shim for process pods: ``python -m services.embedded.node_sim.launch PARENT_PID -- ARGV...``.

It asks Linux to SIGKILL the process when the node simulator dies (PR_SET_PDEATHSIG survives
exec), then execs the container's command. Without it a node sim killed with SIGKILL would leave
its pods' processes running, and the restarted node sim would start a second copy of each (two
listeners on one scale set). Elsewhere than Linux it just execs.
"""

from __future__ import annotations

import os
import signal
import sys


def _die_with_parent(parent: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(137)


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m services.embedded.node_sim.launch PARENT_PID -- COMMAND [ARGS...]", file=sys.stderr)
        os._exit(2)
    _die_with_parent(int(argv[0]))
    try:
        os.execvp(argv[2], argv[2:])
    except OSError as exc:
        # The container runtime's words for a missing executable; 128 like a failed start.
        print(f'exec: "{argv[2]}": {exc.strerror or exc}', file=sys.stderr)
        os._exit(128)


if __name__ == "__main__":
    main(sys.argv[1:])
