"""The demo's closing summary, shown under `make demo` at the top of the README: jobs run, latencies, writes.

Pure: the demo collects the facts (the Actions simulator's job times, when each runner was first
seen Running and when it disappeared, the API emulator's request counters) and this module turns
them into numbers and lines.

- **job queued → runner Running**: for each completed job, the time from being queued until the
  runner that ran it was Running (0 when a warm, already Running runner took it);
- **job finished → runner removed**: from the job's end until its runner's EphemeralRunner was gone;
- **API writes per runner**: create/update/patch/delete requests on ``ephemeralrunners``, ``pods``
  and ``secrets`` (a runner's lifecycle objects) divided by the runners that existed; all writes
  to the API server are shown next to it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import msgspec

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
RUNNER_RESOURCES = frozenset({"ephemeralrunners", "pods", "secrets"})


class JobTimes(msgspec.Struct, frozen=True):
    runner_name: str
    queued: float
    finished: float | None


class RequestCount(msgspec.Struct, frozen=True):
    verb: str
    resource: str
    count: int
    group: str = ""
    subresource: str = ""


class Summary(msgspec.Struct, frozen=True):
    jobs: int
    runners: int
    queued_to_running: list[float]
    finished_to_removed: list[float]
    runner_writes: int | None  # None: no request counters (a real cluster)
    all_writes: int | None

    def lines(self) -> list[str]:
        out = [f"summary: {self.jobs} job(s) run on {self.runners} runner(s)"]
        out.append("  job queued -> runner Running:   " + _percentiles(self.queued_to_running))
        out.append("  job finished -> runner removed: " + _percentiles(self.finished_to_removed))
        if self.runner_writes is None or self.all_writes is None:
            out.append("  API writes per runner: n/a (no request counters on this API server)")
        else:
            per = f"{self.runner_writes / self.runners:.1f}" if self.runners else "n/a"
            out.append(
                f"  API writes per runner: {per} (ephemeralrunners, pods, secrets: {self.runner_writes} writes;"
                f" all resources: {self.all_writes})"
            )
        return out


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def _percentiles(values: Sequence[float]) -> str:
    if not values:
        return "n/a (no sample)"
    return f"p50 {percentile(values, 50):.2f}s  p99 {percentile(values, 99):.2f}s  (n={len(values)})"


def summarize(
    jobs: Iterable[JobTimes],
    running_at: Mapping[str, float],
    removed_at: Mapping[str, float],
    requests: Iterable[RequestCount] | None,
    runners_seen: int,
) -> Summary:
    """``running_at``/``removed_at``: runner (EphemeralRunner) name → when it was first seen
    Running / seen gone, on the same clock as the job times."""
    done = [j for j in jobs if j.finished is not None and j.runner_name]
    q2r = [max(0.0, running_at[j.runner_name] - j.queued) for j in done if j.runner_name in running_at]
    f2r = [
        max(0.0, removed_at[j.runner_name] - j.finished)
        for j in done
        if j.runner_name in removed_at and j.finished is not None
    ]
    runner_writes = all_writes = None
    if requests is not None:
        counted = [r for r in requests if r.verb in WRITE_VERBS]
        all_writes = sum(r.count for r in counted)
        runner_writes = sum(r.count for r in counted if r.resource in RUNNER_RESOURCES)
    return Summary(len(done), runners_seen, q2r, f2r, runner_writes, all_writes)
