"""Pure computations behind the end-to-end benchmark's latency, overhead and RSS rows (bench_e2e.py).

Every input is a timestamp on this host's wall clock (the Actions simulator's job records and the
benchmark's own watch of the API server share it) or a ``/proc/<pid>/status`` text.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import msgspec


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0..100) of a non-empty sequence (as the demo's summary)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def p50_p99(values: Sequence[float]) -> str:
    if not values:
        return "n/a (no sample)"
    return f"{percentile(values, 50):.2f} s / {percentile(values, 99):.2f} s (n={len(values)})"


class Job(msgspec.Struct, frozen=True):
    """One job as the simulator recorded it (``GET /_sim/jobs``)."""

    runner_name: str
    queued: float
    assigned: float | None  # the service handed it to a runner (runner_assign_time)
    finished: float | None


def jobs_from_sim(raw: Iterable[Mapping[str, object]]) -> list[Job]:
    def t(v: object) -> float | None:
        return float(v) if isinstance(v, int | float) else None

    return [
        Job(
            str(j.get("runner_name") or ""),
            t(j.get("queue_time")) or 0.0,
            t(j.get("runner_assign_time")),
            t(j.get("finish_time")),
        )
        for j in raw
    ]


def queued_to_running(jobs: Iterable[Job], running_at: Mapping[str, float]) -> list[float]:
    """Per job that a runner took: queued → that runner's pod first seen Running (0 when the pod was
    Running before the job was queued: a warm runner)."""
    return [max(0.0, running_at[j.runner_name] - j.queued) for j in jobs if j.runner_name in running_at]


def queued_to_assigned(jobs: Iterable[Job]) -> list[float]:
    """Per job: queued → the service handed it to a runner (the runner connected and asked)."""
    return [j.assigned - j.queued for j in jobs if j.assigned is not None and j.runner_name]


def finished_to_gone(jobs: Iterable[Job], gone_at: Mapping[str, float]) -> list[float]:
    """Per finished job: job finished → its runner's EphemeralRunner deleted."""
    return [
        max(0.0, gone_at[j.runner_name] - j.finished)
        for j in jobs
        if j.finished is not None and j.runner_name in gone_at
    ]


def job_wait(jobs: Iterable[Job], running_at: Mapping[str, float]) -> list[float]:
    """Per job: its runner's pod first Running → the service handed the job to that runner (how
    long a ready runner waited for its job; 0 when the runner asked before its pod's Running status
    was written)."""
    return [
        max(0.0, j.assigned - running_at[j.runner_name])
        for j in jobs
        if j.assigned is not None and j.runner_name in running_at
    ]


def stage(starts: Mapping[str, float], ends: Mapping[str, float]) -> list[float]:
    """Per name in both: end − start (one stage of a runner's start, e.g. EphemeralRunner created →
    pod created)."""
    return [ends[n] - starts[n] for n in starts if n in ends]


def first_after(times: Sequence[float], jobs: Iterable[Job]) -> list[float]:
    """Per job: queued → the first of ``times`` at or after its queue time (e.g. the listener's next
    desired-state publish). Jobs with no such time are left out."""
    ordered = sorted(times)
    out = []
    for j in jobs:
        later = [t for t in ordered if t >= j.queued]
        if later:
            out.append(later[0] - j.queued)
    return out


def replacement_gaps(
    finishes: Iterable[float], new_runners: Iterable[tuple[float, float]]
) -> list[tuple[float, float]]:
    """Job end → replacement runner Running, under a sustained queue.

    ``finishes``: when jobs finished; ``new_runners``: (EphemeralRunner created, pod Running) of the
    runners created meanwhile, both from the start of the sustained load (so that a runner is never
    paired with a later job than the one it replaced). Each new runner, in creation order, replaces
    the earliest finished job not yet replaced that ended before it was created; a runner created
    with no such job is a scale-up, not a replacement. Returns (finish, Running − finish) per
    replacement, in finish order.
    """
    pending = sorted(finishes)
    gaps = []
    i = 0
    for created, running in sorted(new_runners):
        if i < len(pending) and pending[i] <= created:
            gaps.append((pending[i], running - pending[i]))
            i += 1
    return gaps


class Replacement(msgspec.Struct, frozen=True):
    """One replacement under a sustained queue, its second half stage by stage: the replaced
    runner's EphemeralRunner gone → the replacement's EphemeralRunner created (runner-set) → its pod
    created (runner worker: JIT config, Secret, pod) → pod Running (node-sim) → a job handed to it
    (the service). A later stage not reached yet is None."""

    name: str  # the replacement runner
    gone: float  # the replaced runner's EphemeralRunner deleted
    created: float
    pod_created: float | None
    running: float | None
    handed: float | None


def replacement_chain(
    gones: Iterable[float],
    created: Mapping[str, float],
    pod_added: Mapping[str, float],
    pod_running: Mapping[str, float],
    handed: Mapping[str, float],
) -> list[Replacement]:
    """Pair each runner created under a sustained queue (``created``: name → EphemeralRunner
    created) with the runner it replaced: in creation order, the earliest EphemeralRunner gone
    (``gones``) not yet paired and gone at or before the new one was created (the runner-set creates a
    replacement only once the runner it replaces is gone); a runner created with none is a scale-up.
    ``handed``: runner name → when the service handed it a job. In order of the replaced runner's
    end."""
    pending = sorted(gones)
    out = []
    i = 0
    for at, name in sorted((t, n) for n, t in created.items()):
        if i < len(pending) and pending[i] <= at:
            out.append(Replacement(name, pending[i], at, pod_added.get(name), pod_running.get(name), handed.get(name)))
            i += 1
    return out


def chain_stages(replacements: Iterable[Replacement]) -> dict[str, list[float]]:
    """The stage durations of ``replacements`` (only the stages both ends of which were seen):
    ``gone→created``, ``created→pod``, ``pod→running``, ``running→handed`` (0 when the runner asked
    before its pod's Running status was written) and ``gone→running``."""
    out: dict[str, list[float]] = {
        k: [] for k in ("gone→created", "created→pod", "pod→running", "running→handed", "gone→running")
    }
    for r in replacements:
        out["gone→created"].append(r.created - r.gone)
        if r.pod_created is not None:
            out["created→pod"].append(r.pod_created - r.created)
            if r.running is not None:
                out["pod→running"].append(r.running - r.pod_created)
        if r.running is not None:
            out["gone→running"].append(r.running - r.gone)
            if r.handed is not None:
                out["running→handed"].append(max(0.0, r.handed - r.running))
    return out


def cycle_overhead(slots: int, completed: int, window: float, job_seconds: float) -> float:
    """Per-runner overhead from throughput: each of ``slots`` runners spends ``slots·window/completed``
    per job, of which ``job_seconds`` is the job; the rest is the runner's own cost."""
    if completed <= 0 or window <= 0:
        return math.inf
    return slots * window / completed - job_seconds


def vm_rss_mb(status_text: str) -> float | None:
    """``VmRSS`` of a ``/proc/<pid>/status`` text, in MB (10⁶ bytes); None if absent."""
    for line in status_text.splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                unit = parts[2].lower() if len(parts) > 2 else "kb"
                scale = {"kb": 1024, "mb": 1024**2, "b": 1}.get(unit, 1024)
                return int(parts[1]) * scale / 1e6
    return None


def extrapolate(n1: int, rss1: float, n2: int, rss2: float, target: int) -> float | None:
    """Linear extrapolation of RSS to ``target`` runners from two measured points (None when the
    points cannot define a line)."""
    if n2 == n1:
        return None
    slope = (rss2 - rss1) / (n2 - n1)
    return rss2 + slope * (target - n2)
