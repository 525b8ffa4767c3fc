"""The cyclic garbage collector's settings for the embedded doubles' processes (issue 10).

The API emulator and node-sim hold one tree of dicts and lists per object or pod: with CPython's
default thresholds (700, 10, 10) the young collections run every few requests and each full
collection walks everything the process ever imported and holds, so a full collection costs more
the more the process holds, and a burst of N pays more per pod at 3,000 than at 300. What exists
once the process is set up (modules, classes, functions) is frozen out of every collection, and
collections run after ``thresholds[0]`` net container allocations: the garbage cycles of requests
(futures, exceptions, tasks) are still collected, later.
"""

from __future__ import annotations

import gc

#: (young, middle, full): a young collection after 50,000 net allocations instead of 700, a middle
#: one every 20 young ones, a full one every 100 middle ones (and only once the objects promoted
#: since the last full one are a quarter of the old generation, CPython's own rule).
THRESHOLDS = (50_000, 20, 100)


def tune_gc(thresholds: tuple[int, int, int] = THRESHOLDS) -> None:
    """Collect once, freeze what survives (the process's setup) and set ``thresholds``: call it in
    the process's own ``main`` after its imports, never on import (a double run in-process leaves
    the host's settings alone)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)
